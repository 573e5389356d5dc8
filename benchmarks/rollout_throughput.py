"""Primitive env steps/s: the raw env vs gyre-ma's rollout, local and on Ray, one run.

* ``raw`` — ``reset``/``step`` with random actions (drawn before the clock starts), no
  options, no manager: what the environment alone costs. Random actions make other
  (shorter, cheaper) episodes than a manager does, so ``raw_same_actions`` also replays
  the primitive actions the framework's episodes took: same env work, none of ours.
* ``local`` — the framework's rollout on the local backend: RolloutWorker → role →
  manager → options → ``run_episode`` → RoleTrajectory.
* ``ray`` — the same tasks on the Ray backend with ``--workers`` rollout actors (after a
  warm-up collect that starts the actors and ships the weights, which is not timed), each
  with ``--pipeline-depth`` calls queued so it never waits on the driver between two, a
  call playing up to ``--episodes-per-call`` episodes (the backend's defaults: 2 and 4).
  On 2 cores the driver's per-call cost (submission, ``ray.wait``, bookkeeping: about
  1 ms of its CPU per call) is taken from the actors; chunks of 4 halve it per episode.

A round is 80 episodes (about 20k steps, about 0.5 s on Ray): long enough that starting and
draining the actors at its ends is a small share; with 40 that share alone cost Ray ~10 %.

All four paths run in every round, in a rotating order, and each ratio is the median over
rounds of the paired per-round ratio, so a burst of noise on this shared machine spoils one
round rather than the result; the steps/s figures are totals.
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
from gyre_ma.backends import make_backend
from gyre_ma.backends.worker import policy_weights
from gyre_ma.config import parse_config
from gyre_ma.roles import RolloutTask


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
    parser.add_argument("--episodes", type=int, default=80, help="episodes per round and path")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pipeline-depth", type=int, default=2, help="calls queued per Ray actor")
    parser.add_argument("--episodes-per-call", type=int, default=4, help="most episodes one Ray call plays")
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

    import ray

    ray.init(num_cpus=max(args.workers, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False)
    paths = ("raw", "raw_same_actions", "local", "ray")
    per_round: dict[str, list[tuple[int, float]]] = {p: [] for p in paths}
    busy = 0.0
    try:
        backend = make_backend("ray", cfg, workers=args.workers, cpus_per_worker=1.0,
                               pipeline_depth=args.pipeline_depth, episodes_per_call=args.episodes_per_call)
        backend.collect(weights, 0, tasks(2 * args.workers, 20_000, noise))  # start actors, ship weights
        for r in range(args.rounds):
            seed = 1000 * r
            for name in paths[r % 4:] + paths[: r % 4]:  # rotate the order: noise hits every path
                if name == "raw":
                    steps, secs = raw_steps(env, args.episodes, seed)
                elif name == "raw_same_actions":
                    steps, secs = replay_steps(env, recorded[r])
                elif name == "local":
                    steps, secs = timed_collect(local, weights, tasks(args.episodes, seed, noise))[:2]
                else:
                    steps, secs, inside = timed_collect(backend, weights, tasks(args.episodes, seed, noise))
                    busy += inside
                per_round[name].append((steps, secs))
        backend.close()
    finally:
        ray.shutdown()
        local.close()

    def sps(name: str) -> float:
        return sum(s for s, _ in per_round[name]) / sum(t for _, t in per_round[name])

    def ratio(num: str, den: str) -> float:
        """Median over rounds of the paired ratio: a burst of machine noise spoils one round."""
        return float(np.median([(a / t) / (b / u) for (a, t), (b, u) in zip(per_round[num], per_round[den])]))

    ray_steps = sum(s for s, _ in per_round["ray"])
    ray_secs = sum(t for _, t in per_round["ray"])
    print(json.dumps({
        "env": args.env, "manager": args.manager, "episodes_per_round": args.episodes, "rounds": args.rounds,
        "ray_workers": args.workers, "pipeline_depth": args.pipeline_depth,
        "episodes_per_call": args.episodes_per_call, "cpu_count": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
        "raw_steps_per_s": round(sps("raw"), 1),
        "raw_same_actions_steps_per_s": round(sps("raw_same_actions"), 1),
        "local_steps_per_s": round(sps("local"), 1),
        "ray_steps_per_s": round(sps("ray"), 1),
        "local_over_raw": round(ratio("local", "raw"), 3),
        "local_over_raw_same_actions": round(ratio("local", "raw_same_actions"), 3),
        "ray_over_local": round(ratio("ray", "local"), 3),
        "ray_parallelism": round(busy / ray_secs, 3),
        "ray_in_episode_steps_per_s_per_actor": round(ray_steps / busy, 1),
        "mean_episode_steps": {"raw": round(sum(s for s, _ in per_round["raw"]) / (args.rounds * args.episodes), 1),
                               "framework": round(sum(s for s, _ in per_round["local"]) / (args.rounds * args.episodes), 1)},
        "per_round_steps_per_s": {p: [round(a / t) for a, t in per_round[p]] for p in paths},
        "targets": {"local_over_raw": 0.85, "ray_over_local": 1.5},
    }))


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
