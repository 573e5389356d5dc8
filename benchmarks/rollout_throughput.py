"""Rollout throughput, side by side in one run: the raw env replaying the framework's own
actions vs gyre-ma's batched rollout at several ``rollout.num_envs``, on Ray, and flat PPO.

Per env (techtree_v0 and workflow_v0 by default, the learned manager with parameter noise):

* ``raw_same_actions`` — ``reset``/``step`` replaying the primitive actions the
  framework's episodes took (recorded in an untimed pass over the same task seeds): the
  env's own cost for exactly the framework's work;
* ``local_<n>`` — the local backend with ``rollout.num_envs = n`` (1, 4, 16, 64 by
  default): episodes in flight, one batched decision per round. Batched decisions do not
  change an episode (a row's forward pass does not depend on its batch-mates), so every
  ``n`` plays the same episodes;
* ``ray`` — the Ray backend, ``--workers`` actors with the default ``num_envs``, after an
  untimed warm-up that starts them and ships the weights;
* ``processes`` — the ceiling Ray is measured against: ``--workers`` plain processes, each
  a local backend with the default ``num_envs``, playing an even share of the round at
  once and returning only their step counts (no trajectories cross, no Ray). What this
  machine gives that many processes at once; ``ray_over_processes`` is the share of it
  the Ray backend keeps;
* ``flat_<n>`` — flat PPO's rollout (one decision per agent per primitive step, techtree)
  on the local backend at ``num_envs`` 16 and 64 (``--flat-num-envs``), ``--flat-episodes``
  per round (enough to keep every slot busy), against ``flat_raw``: its own actions
  replayed; ``flat_over_raw`` is the best of them, at ``flat_best_num_envs``.

Every path runs in every round, in a rotating order; each ratio is the median over rounds
of the paired per-round ratio, so a burst of noise on this shared machine spoils one round
rather than the result. Also reported: decisions/s, and each worker's resident memory
(this process after each ``num_envs``; each Ray actor). Prints one JSON object.

Targets (issue #19): framework ÷ raw same actions ≥ 0.9 at the best ``num_envs``; flat ÷
raw ≥ 0.5 at its best ``num_envs``; Ray with 2 actors ÷ local (default ``num_envs``) ≥ 1.7.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from gyre_ma.agents.noise import NoiseSetting
from gyre_ma.backends import make_backend
from gyre_ma.backends.worker import policy_weights
from gyre_ma.config import RolloutConfig, parse_config
from gyre_ma.roles import RolloutTask

DEFAULT_NUM_ENVS = RolloutConfig().num_envs


def config(env_id: str, manager: str, num_envs: int, env_kwargs: dict[str, Any] | None = None) -> Any:
    return parse_config({"seed": 0, "env": {"id": env_id, "kwargs": env_kwargs or {}},
                         "manager": {"kind": manager, "hidden": 64}, "rollout": {"num_envs": num_envs}})


class _Recorder:
    """Env proxy that records each episode's primitive actions (untimed passes only)."""

    def __init__(self, env: Any, episodes: list) -> None:
        self.env, self.episodes = env, episodes

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["env"], name)

    def reset(self, seed: int | None = None, options: dict | None = None) -> Any:
        self.episodes.append((seed, []))
        self._actions = self.episodes[-1][1]
        return self.env.reset(seed=seed, options=options)

    def step(self, actions: dict[str, Any]) -> Any:
        self._actions.append(dict(actions))
        return self.env.step(actions)


def record(backend: Any, weights: Any, batch: list[RolloutTask]) -> list[tuple[int, list[dict]]]:
    """The primitive actions of ``batch``'s episodes, played once (untimed) on ``backend``."""
    kit = backend.worker.kit
    episodes: list[tuple[int, list[dict]]] = []
    made = kit.make_env
    kit._envs = {slot: _Recorder(env, episodes) for slot, env in kit._envs.items()}
    kit.make_env = lambda: _Recorder(made(), episodes)
    try:
        backend.collect(weights, 0, batch)
    finally:
        kit._envs = {slot: env.env for slot, env in kit._envs.items()}
        kit.make_env = made
    return episodes


def replay(env: Any, episodes: list[tuple[int, list[dict]]]) -> tuple[int, float]:
    steps, start = 0, time.perf_counter()
    for seed, actions in episodes:
        env.reset(seed=seed)
        for a in actions:
            env.step(a)
        steps += len(actions)
    return steps, time.perf_counter() - start


def tasks(n: int, offset: int, noise: NoiseSetting) -> list[RolloutTask]:
    return [RolloutTask("executor", offset + i, 0, noise) for i in range(n)]


SUBPOLICY_SECONDS: dict[str, float] = {}
"""Per path: seconds spent inside the options' sub-policies (the library's code), summed."""


DRIVER_CPU_SECONDS: dict[str, float] = {}
"""Per path: this process's CPU seconds during its collects (for Ray: the driver's share of
the machine, taken from the actors)."""


def collect(backend: Any, weights: Any, batch: list[RolloutTask], path: str) -> tuple[int, float, int]:
    """Steps, wall seconds and decisions of one collect."""
    start, cpu = time.perf_counter(), time.process_time()
    trajectories = backend.collect(weights, 0, batch)
    secs = time.perf_counter() - start
    DRIVER_CPU_SECONDS[path] = DRIVER_CPU_SECONDS.get(path, 0.0) + time.process_time() - cpu
    SUBPOLICY_SECONDS[path] = SUBPOLICY_SECONDS.get(path, 0.0) + sum(t.subpolicy_seconds for t in trajectories)
    steps, decisions = _steps_and_decisions(trajectories)
    return steps, secs, decisions


def _steps_and_decisions(trajectories: list[Any]) -> tuple[int, int]:
    return sum(t.length for t in trajectories), sum(len(t.calls) for t in trajectories)


_PROCESS_BACKEND: Any = None
"""In a ``processes`` worker: its local backend."""


def _process_start(env_id: str, kwargs: dict[str, Any]) -> None:
    global _PROCESS_BACKEND
    import torch

    torch.set_num_threads(1)
    _PROCESS_BACKEND = make_backend("local", config(env_id, "learned", DEFAULT_NUM_ENVS, kwargs))


def _process_play(weights: Any, batch: list[RolloutTask]) -> tuple[int, int]:
    """Play ``batch`` in a ``processes`` worker: its steps and decisions (no trajectories cross)."""
    return _steps_and_decisions(_PROCESS_BACKEND.collect(weights, 0, batch))


def collect_processes(pool: ProcessPoolExecutor, workers: int, weights: Any,
                      batch: list[RolloutTask]) -> tuple[int, float, int]:
    """Steps, wall seconds and decisions of ``batch`` split evenly over the pool's processes."""
    start = time.perf_counter()
    done = [f.result() for f in [pool.submit(_process_play, weights, batch[k::workers]) for k in range(workers)]]
    return sum(s for s, _ in done), time.perf_counter() - start, sum(d for _, d in done)


def rss_mib(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def measure(env_id: str, args: argparse.Namespace, noise: NoiseSetting) -> dict[str, Any]:
    kwargs = {"milestone_rewards": True} if env_id == "techtree_v0" else {}
    locals_ = {n: make_backend("local", config(env_id, "learned", n, kwargs)) for n in args.num_envs}
    first = locals_[args.num_envs[0]].worker.kit
    weights = policy_weights(first.policy, first.critic)
    rss: dict[str, float] = {}
    for n, backend in locals_.items():  # warm up, make every slot's env
        backend.collect(weights, 0, tasks(n, 90_000, noise))
        rss[f"local_{n}"] = rss_mib()
    reference = locals_[DEFAULT_NUM_ENVS] if DEFAULT_NUM_ENVS in locals_ else locals_[args.num_envs[-1]]
    recorded = [record(reference, weights, tasks(args.episodes, 1000 * r, noise)) for r in range(args.rounds)]
    replay_env = first.env_for(0)
    paths = ["raw_same_actions", *(f"local_{n}" for n in args.num_envs)]
    ray_backend = None
    if args.workers:
        ray_backend = make_backend("ray", config(env_id, "learned", DEFAULT_NUM_ENVS, kwargs), workers=args.workers,
                                   cpus_per_worker=1.0)
        ray_backend.collect(weights, 0, tasks(2 * args.workers * DEFAULT_NUM_ENVS, 20_000, noise))
        rss |= {f"ray_actor_{a['worker_id']}": rss_mib(a["pid"]) for a in ray_backend.actor_info()}
        paths.append("ray")
        pool = ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_process_start, initargs=(env_id, kwargs))
        collect_processes(pool, args.workers, weights, tasks(2 * args.workers * DEFAULT_NUM_ENVS, 20_000, noise))
        paths.append("processes")
    per_round: dict[str, list[tuple[int, float, int]]] = {p: [] for p in paths}
    for r in range(args.rounds):
        seed = 1000 * r
        for name in paths[r % len(paths):] + paths[: r % len(paths)]:
            if name == "raw_same_actions":
                per_round[name].append((*replay(replay_env, recorded[r]), 0))
            elif name == "processes":
                per_round[name].append(collect_processes(pool, args.workers, weights,
                                                         tasks(args.episodes, seed, noise)))
            elif name == "ray":
                per_round[name].append(collect(ray_backend, weights, tasks(args.episodes, seed, noise),
                                               f"{env_id}/ray"))
            else:
                per_round[name].append(collect(locals_[int(name.split("_")[1])], weights,
                                               tasks(args.episodes, seed, noise), f"{env_id}/{name}"))
    if ray_backend is not None:
        ray_backend.close()
        pool.shutdown()
    for backend in locals_.values():
        backend.close()
    best = max((f"local_{n}" for n in args.num_envs), key=lambda p: _ratio(per_round, p, "raw_same_actions"))
    out = {
        "steps_per_s": {p: round(_sps(per_round[p]), 1) for p in paths},
        "decisions_per_s": {p: round(sum(d for *_, d in per_round[p]) / sum(t for _, t, _ in per_round[p]), 1)
                            for p in paths if p != "raw_same_actions"},
        "over_raw_same_actions": {p: round(_ratio(per_round, p, "raw_same_actions"), 3) for p in paths[1:]},
        "best_num_envs": int(best.split("_")[1]),
        "best_over_raw_same_actions": round(_ratio(per_round, best, "raw_same_actions"), 3),
        # the same, with the time inside the library's sub-policies (its own code, which the
        # raw replay does not run) taken out of the framework's: gyre-ma's overhead alone
        "best_over_raw_excluding_subpolicies": round(
            sum(s for s, *_ in per_round[best]) / (sum(t for _, t, _ in per_round[best])
                                                   - SUBPOLICY_SECONDS[f"{env_id}/{best}"])
            / _sps(per_round["raw_same_actions"]), 3),
        "subpolicy_share_of_time": {p: round(SUBPOLICY_SECONDS[f"{env_id}/{p}"] / sum(t for _, t, _ in per_round[p]), 3)
                                    for p in paths if p.startswith("local_")},
        "rss_mib": rss,
        "mean_episode_steps": round(sum(s for s, *_ in per_round[paths[1]]) / (args.rounds * args.episodes), 1),
    }
    if "ray" in per_round:
        default = f"local_{DEFAULT_NUM_ENVS}" if DEFAULT_NUM_ENVS in args.num_envs else best
        out["ray_over_local"] = round(_ratio(per_round, "ray", default), 3)
        out["ray_over_local_reference"] = default
        out["processes_over_local"] = round(_ratio(per_round, "processes", default), 3)
        out["ray_over_processes"] = round(_ratio(per_round, "ray", "processes"), 3)
        # the driver's CPU while Ray's actors play (receiving their trajectories): a share of a
        # small machine the actors do not get
        out["ray_driver_cpu_share"] = round(DRIVER_CPU_SECONDS[f"{env_id}/ray"]
                                            / sum(t for _, t, _ in per_round["ray"]), 3)
    return out


def measure_flat(args: argparse.Namespace) -> dict[str, Any]:
    kwargs = {"milestone_rewards": True}
    backends = {f"flat_{n}": make_backend("local", config("techtree_v0", "flat", n, kwargs))
                for n in args.flat_num_envs}
    first = next(iter(backends.values())).worker.kit
    weights = policy_weights(first.policy, first.critic)
    noise = NoiseSetting("param", 0.1)
    n = args.flat_episodes
    for backend in backends.values():  # warm up, make every slot's env
        backend.collect(weights, 0, tasks(n, 90_000, noise))
    reference = backends[f"flat_{args.flat_num_envs[-1]}"]
    recorded = [record(reference, weights, tasks(n, 1000 * r, noise)) for r in range(args.rounds)]
    env = first.env_for(0)
    paths = ["flat_raw", *backends]
    per_round: dict[str, list[tuple[int, float, int]]] = {p: [] for p in paths}
    for r in range(args.rounds):
        for name in paths[r % len(paths):] + paths[: r % len(paths)]:
            if name == "flat_raw":
                per_round[name].append((*replay(env, recorded[r]), 0))
            else:
                per_round[name].append(collect(backends[name], weights, tasks(n, 1000 * r, noise), name))
    for backend in backends.values():
        backend.close()
    ratios = {p: _ratio(per_round, p, "flat_raw") for p in paths[1:]}
    best = max(ratios, key=ratios.get)
    return {"steps_per_s": {p: round(_sps(v), 1) for p, v in per_round.items()},
            "decisions_per_s": {p: round(sum(d for *_, d in per_round[p]) / sum(t for _, t, _ in per_round[p]), 1)
                                for p in paths[1:]},
            "over_raw": {p: round(v, 3) for p, v in ratios.items()},
            "flat_best_num_envs": int(best.split("_")[1]), "flat_over_raw": round(ratios[best], 3),
            "episodes_per_round": n,
            "mean_episode_steps": round(sum(s for s, *_ in per_round["flat_raw"]) / (args.rounds * n), 1)}


def _sps(rows: list[tuple[int, float, int]]) -> float:
    return sum(s for s, *_ in rows) / sum(t for _, t, _ in rows)


def _ratio(per_round: dict[str, list[tuple[int, float, int]]], num: str, den: str) -> float:
    """Median over rounds of the paired ratio: a burst of machine noise spoils one round."""
    return float(np.median([(a / t) / (b / u) for (a, t, _), (b, u, _) in
                            zip(per_round[num], per_round[den], strict=True)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default="techtree_v0,workflow_v0")
    parser.add_argument("--num-envs", default="1,4,16,64", help="rollout.num_envs values to compare")
    parser.add_argument("--episodes", type=int, default=64, help="episodes per round and path")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2, help="Ray actors (0: no Ray path)")
    parser.add_argument("--no-flat", action="store_true", help="skip flat PPO")
    parser.add_argument("--flat-num-envs", default="16,64", help="rollout.num_envs values for flat PPO")
    parser.add_argument("--flat-episodes", type=int, default=128,
                        help="flat PPO episodes per round and path (short episodes: enough to fill 64 slots)")
    args = parser.parse_args()
    args.num_envs = [int(n) for n in args.num_envs.split(",")]
    args.flat_num_envs = [int(n) for n in args.flat_num_envs.split(",")]

    noise = NoiseSetting("param", 0.1)
    if args.workers:
        import ray

        ray.init(num_cpus=max(args.workers, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False)
    try:
        results = {env_id: measure(env_id, args, noise) for env_id in args.envs.split(",")}
        flat = None if args.no_flat else measure_flat(args)
    finally:
        if args.workers:
            import ray

            ray.shutdown()
    print(json.dumps({
        "episodes_per_round": args.episodes, "rounds": args.rounds, "num_envs": args.num_envs,
        "default_num_envs": DEFAULT_NUM_ENVS, "ray_workers": args.workers, "cpu_count": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0], "envs": results, "flat": flat,
        "targets": {"best_over_raw_same_actions": 0.9, "flat_over_raw": 0.5, "ray_over_local": 1.7},
    }))


if __name__ == "__main__":
    main()
