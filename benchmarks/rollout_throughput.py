"""Primitive env steps/s: the raw env vs gyre-ma's rollout, local and on Ray, one run.

* ``raw`` — ``reset``/``step`` with random actions (drawn before the clock starts), no
  options, no manager: what the environment alone costs. Random actions make other
  (shorter, cheaper) episodes than a manager does, so ``raw_same_actions`` also replays
  the primitive actions the framework's episodes took: same env work, none of ours.
* ``local`` — the framework's rollout on the local backend: RolloutWorker → role →
  manager → options → ``run_episode`` → RoleTrajectory.
* ``ray`` — the same tasks on the Ray backend with ``--workers`` rollout actors (after a
  warm-up collect that starts the actors and ships the weights, which is not timed).

``raw`` and ``local`` alternate in rounds so machine noise hits both; Ray runs after.
Targets: local ≥ 0.85 × raw; Ray with 2 actors ≥ 1.5 × local on an env-bound workload
(needs 2 free cores). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np

from gyre_ma.agents.noise import NoiseSetting
from gyre_ma.agents.roles import RolloutTask, policy_weights
from gyre_ma.backends import make_backend
from gyre_ma.config import parse_config


def config(env_id: str, manager: str, env_kwargs: dict[str, Any]) -> Any:
    return parse_config({"seed": 0, "env": {"id": env_id, "kwargs": env_kwargs},
                         "manager": {"kind": manager, "hidden": 64}})


def raw_steps(env: Any, episodes: int, seed: int) -> tuple[int, float]:
    """Steps and seconds of ``episodes`` random-action episodes."""
    pool = {a: [env.action_space(a).sample() for _ in range(4096)] for a in env.possible_agents}
    for a in env.possible_agents:
        env.action_space(a).seed(seed)
    steps, start = 0, time.perf_counter()
    for e in range(episodes):
        env.reset(seed=seed + e)
        while env.agents:
            i = steps % 4096
            env.step({a: pool[a][i] for a in env.agents})
            steps += 1
    return steps, time.perf_counter() - start


class _Recorder:
    """Env proxy that records each episode's primitive actions (not timed)."""

    def __init__(self, env: Any) -> None:
        self.env, self.episodes = env, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["env"], name)

    def reset(self, seed: int | None = None, options: dict | None = None) -> Any:
        self.episodes.append((seed, []))
        return self.env.reset(seed=seed, options=options)

    def step(self, actions: dict[str, Any]) -> Any:
        self.episodes[-1][1].append(dict(actions))
        return self.env.step(actions)


def replay_steps(env: Any, episodes: list[tuple[int, list[dict[str, Any]]]]) -> tuple[int, float]:
    steps, start = 0, time.perf_counter()
    for seed, actions in episodes:
        env.reset(seed=seed)
        for a in actions:
            env.step(a)
        steps += len(actions)
    return steps, time.perf_counter() - start


def tasks(n: int, offset: int, noise: NoiseSetting) -> list[RolloutTask]:
    return [RolloutTask("executor", offset + i, 0, noise) for i in range(n)]


def timed_collect(backend: Any, weights: Any, batch: list[RolloutTask]) -> tuple[int, float, float]:
    """Steps, wall seconds, and seconds the workers spent inside episodes."""
    start = time.perf_counter()
    trajectories = backend.collect(weights, 0, batch)
    wall = time.perf_counter() - start
    return sum(t.length for t in trajectories), wall, sum(t.seconds for t in trajectories)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="workflow_v0")
    parser.add_argument("--manager", default="oracle", choices=["oracle", "random", "learned"])
    parser.add_argument("--episodes", type=int, default=40, help="episodes per round and path")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-cycles", type=int, default=None)
    args = parser.parse_args()

    kwargs = {} if args.max_cycles is None else {"max_cycles": args.max_cycles}
    cfg = config(args.env, args.manager, kwargs)
    noise = NoiseSetting("param", 0.1) if args.manager == "learned" else NoiseSetting()
    local = make_backend("local", cfg)
    kit = local.worker.kit
    weights = policy_weights(kit.policy, kit.critic) if kit.learns else None
    env = kit.env

    raw_steps(env, 2, 10_000)  # warm up both paths
    local.collect(weights, 0, tasks(2, 10_000, noise))
    recorder = _Recorder(env)
    kit.env = recorder
    for r in range(args.rounds):
        local.collect(weights, 0, tasks(args.episodes, 1000 * r, noise))
    kit.env = env
    recorded = [recorder.episodes[r * args.episodes:(r + 1) * args.episodes] for r in range(args.rounds)]
    totals = {"raw": [0, 0.0], "raw_same_actions": [0, 0.0], "local": [0, 0.0]}
    for r in range(args.rounds):
        order = ("raw", "raw_same_actions", "local") if r % 2 == 0 else ("local", "raw_same_actions", "raw")
        for name in order:
            seed = 1000 * r
            if name == "raw":
                steps, secs = raw_steps(env, args.episodes, seed)
            elif name == "raw_same_actions":
                steps, secs = replay_steps(env, recorded[r])
            else:
                steps, secs = timed_collect(local, weights, tasks(args.episodes, seed, noise))[:2]
            totals[name][0] += steps
            totals[name][1] += secs
    local.close()

    import ray

    ray.init(num_cpus=max(args.workers, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False)
    ray_totals = [0, 0.0, 0.0]
    try:
        backend = make_backend("ray", cfg, workers=args.workers, cpus_per_worker=1.0)
        backend.collect(weights, 0, tasks(2 * args.workers, 20_000, noise))  # start actors, ship weights
        for r in range(args.rounds):
            steps, secs, busy = timed_collect(backend, weights, tasks(args.episodes, 1000 * r, noise))
            ray_totals[0] += steps
            ray_totals[1] += secs
            ray_totals[2] += busy
        backend.close()
    finally:
        ray.shutdown()

    raw_sps = totals["raw"][0] / totals["raw"][1]
    same_sps = totals["raw_same_actions"][0] / totals["raw_same_actions"][1]
    local_sps = totals["local"][0] / totals["local"][1]
    ray_sps = ray_totals[0] / ray_totals[1]
    print(json.dumps({
        "env": args.env, "manager": args.manager, "episodes_per_round": args.episodes, "rounds": args.rounds,
        "ray_workers": args.workers, "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0],
        "raw_steps_per_s": round(raw_sps, 1),
        "raw_same_actions_steps_per_s": round(same_sps, 1),
        "local_steps_per_s": round(local_sps, 1),
        "ray_steps_per_s": round(ray_sps, 1),
        "local_over_raw": round(local_sps / raw_sps, 3),
        "local_over_raw_same_actions": round(local_sps / same_sps, 3),
        "ray_over_local": round(ray_sps / local_sps, 3),
        "ray_parallelism": round(ray_totals[2] / ray_totals[1], 3),
        "ray_in_episode_steps_per_s_per_actor": round(ray_totals[0] / ray_totals[2], 1),
        "mean_episode_steps": {"raw": round(totals["raw"][0] / (args.rounds * args.episodes), 1),
                               "framework": round(totals["local"][0] / (args.rounds * args.episodes), 1)},
        "targets": {"local_over_raw": 0.85, "ray_over_local": 1.5},
    }))


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
