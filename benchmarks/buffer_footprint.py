"""Bytes per primitive step of the on-disk trajectory store, on real workflow_v0 episodes.

Runs the workflow oracle (regular, compresses well) and the random manager (irregular,
the worse case) under a StepRecorder, commits each episode to a TrajectoryBuffer backed
by a store in a temporary folder (fsync on), and prints one JSON object: store bytes per
env step (all agents' records of that step) and per agent step — the worse of the two
managers at the top level, each under its name — against the 64-byte target, the
uncompressed record sizes, and the mean commit time.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.buffer import StepRecorder, TrajectoryBuffer
from gyre_ma.envs import workflow_v0
from gyre_ma.envs.workflow.options import make_library
from gyre_ma.envs.workflow.oracle import OracleManager
from gyre_ma.rollout import run_episode

TARGET_BYTES_PER_STEP = 64


def measure(manager_name: str, episodes: int, seed: int) -> dict[str, object]:
    env = StepRecorder(workflow_v0.parallel_env())
    library = make_library()
    manager = OracleManager() if manager_name == "oracle" else RandomManager(seed=seed)
    commit_s = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trajectories.log"
        buffer = TrajectoryBuffer.open(path, capacity=1_000_000, dedup=False)
        for i in range(episodes):
            traj = run_episode(env, library, manager, seed=seed + i)
            start = time.perf_counter()
            buffer.add(traj, step_log=env.log)
            commit_s += time.perf_counter() - start
        store = buffer.store
        size = path.stat().st_size
        steps, agent_steps = store.env_steps, store.n_steps
        calls = store.to_pandas("calls")
        step_table = store.to_pandas("steps")
        readable = len(step_table) == agent_steps
        raw = (step_table.drop(columns="traj_id").to_records(index=False).itemsize * agent_steps
               + calls.drop(columns=["traj_id", "call", "milestone_names", "termination"])
               .to_records(index=False).itemsize * len(calls))
        calls = len(calls)
        buffer.close()
    return {
        "trajectories": episodes,
        "steps": steps,
        "agent_steps": agent_steps,
        "option_calls": calls,
        "store_bytes": size,
        "bytes_per_step": round(size / steps, 3),
        "bytes_per_agent_step": round(size / agent_steps, 3),
        "uncompressed_bytes_per_step": round(raw / steps, 3),
        "commit_ms_mean": round(1000 * commit_s / episodes, 3),
        "pandas_readable": readable,
    }


def run(episodes: int, seed: int) -> dict[str, object]:
    results = {name: measure(name, episodes, seed) for name in ("oracle", "random")}
    worst = max(results.values(), key=lambda r: r["bytes_per_step"])
    return {
        "benchmark": "buffer_footprint",
        "env": "workflow_v0",
        "bytes_per_step": worst["bytes_per_step"],
        "bytes_per_agent_step": worst["bytes_per_agent_step"],
        "steps": sum(r["steps"] for r in results.values()),
        "trajectories": sum(r["trajectories"] for r in results.values()),
        "target_bytes_per_step": TARGET_BYTES_PER_STEP,
        "within_target": worst["bytes_per_step"] <= TARGET_BYTES_PER_STEP,
        **results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=16, help="episodes to store per manager")
    parser.add_argument("--seed", type=int, default=0, help="first task seed")
    args = parser.parse_args()
    print(json.dumps(run(args.episodes, args.seed)))


if __name__ == "__main__":
    main()
