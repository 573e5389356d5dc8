"""Bytes per primitive step of the on-disk trajectory store, on real workflow_v0 episodes.

Runs the workflow oracle (regular, compresses well) and the random manager (irregular,
the worse case) under a StepRecorder, commits each episode to a TrajectoryBuffer backed
by a Parquet store in a temporary folder (fsync on), and prints one JSON object: store
bytes per env step (all agents' records of that step) and per agent step — the worse of
the two managers at the top level, each under its name — against the 64-byte target, the
in-memory Arrow size of the same tables, the chunks written and the mean commit time.
A chunk is written every ``--episodes-per-chunk`` episodes, as the loop writes one per
iteration (8 episodes by default); 1 is the store's worst case.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import pandas as pd

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.buffer import TrajectoryBuffer
from gyre_ma.envs import workflow_v0
from gyre_ma.envs.workflow.options import make_library
from gyre_ma.envs.workflow.oracle import OracleManager
from gyre_ma.rollout import run_episode
from gyre_ma.store import KINDS, StepRecorder, TrajectoryStore

TARGET_BYTES_PER_STEP = 64


def measure(manager_name: str, episodes: int, seed: int, per_chunk: int) -> dict[str, object]:
    env = StepRecorder(workflow_v0.parallel_env())
    library = make_library()
    manager = OracleManager() if manager_name == "oracle" else RandomManager(seed=seed)
    commit_s = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        store = TrajectoryStore(root)
        buffer = TrajectoryBuffer(1_000_000, dedup=False, store=store)
        for i in range(episodes):
            traj = run_episode(env, library, manager, seed=seed + i)
            start = time.perf_counter()
            buffer.add(traj, step_log=env.log)
            if (i + 1) % per_chunk == 0 or i + 1 == episodes:
                store.flush()
            commit_s += time.perf_counter() - start
        buffer.close()
        size = sum(p.stat().st_size for p in root.rglob("*.parquet"))
        steps, agent_steps, chunks = store.env_steps, store.n_steps, len(store.chunks)
        with TrajectoryStore(root) as reopened:
            arrow_bytes = sum(reopened.table(kind).nbytes for kind in KINDS)
            calls = reopened.table("calls").num_rows
        readable = len(pd.read_parquet(root / "steps")) == agent_steps
    return {
        "trajectories": episodes,
        "steps": steps,
        "agent_steps": agent_steps,
        "option_calls": calls,
        "chunks": chunks,
        "store_bytes": size,
        "bytes_per_step": round(size / steps, 3),
        "bytes_per_agent_step": round(size / agent_steps, 3),
        "arrow_bytes_per_step": round(arrow_bytes / steps, 3),
        "commit_ms_mean": round(1000 * commit_s / episodes, 3),
        "pandas_readable": readable,
    }


def run(episodes: int, seed: int, per_chunk: int) -> dict[str, object]:
    results = {name: measure(name, episodes, seed, per_chunk) for name in ("oracle", "random")}
    worst = max(results.values(), key=lambda r: r["bytes_per_step"])
    return {
        "benchmark": "buffer_footprint",
        "env": "workflow_v0",
        "bytes_per_step": worst["bytes_per_step"],
        "bytes_per_agent_step": worst["bytes_per_agent_step"],
        "steps": sum(r["steps"] for r in results.values()),
        "trajectories": sum(r["trajectories"] for r in results.values()),
        "episodes_per_chunk": per_chunk,
        "target_bytes_per_step": TARGET_BYTES_PER_STEP,
        "within_target": worst["bytes_per_step"] <= TARGET_BYTES_PER_STEP,
        **results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=16, help="episodes to store per manager")
    parser.add_argument("--seed", type=int, default=0, help="first task seed")
    parser.add_argument("--episodes-per-chunk", type=int, default=8,
                        help="episodes the store stages before writing a chunk (the loop: one iteration's)")
    args = parser.parse_args()
    if args.episodes_per_chunk < 1:
        parser.error(f"--episodes-per-chunk ({args.episodes_per_chunk}) must be >= 1")
    print(json.dumps(run(args.episodes, args.seed, args.episodes_per_chunk)))


if __name__ == "__main__":
    main()
