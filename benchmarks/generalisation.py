"""The default learner on tasks gyre-ma did not develop beside: held-out success and path
length against the oracle and a random eligible order.

Every env goes through the public adapters with an option library written for it as a
user would, and trains with the DEFAULT config — only the env, its library and the run
seed are set; nothing is tuned per env. The budget is the config's iterations, or for an
env with short episodes its own ``iterations`` in :data:`ENVS` (a budget, set as iterations
so that the learning-rate and noise schedules, which run over ``train.iterations``, span
it). After training, the final policy plays ``--eval-episodes`` task seeds no training or
validation episode used (seeds from ``--eval-seed``, below 2^30: see ``gyre_ma.roles``),
sampled and greedy; the env's scripted oracle and a uniformly random eligible order play
the same seeds. A seed no training episode used may still start an instance one did (Taxi
has 300 start states): each run also reports the share of its held-out episodes that
start on a trained instance (``eval_on_trained_instances``, by :func:`instance_key`) and
its figures on the others alone (``sampled_unseen_instances``, ``greedy_unseen_instances``,
against the oracle on the same seeds, ``unseen_oracle``).

    python benchmarks/generalisation.py --seeds 3 --jobs 2 --png benchmarks/results/generalisation.png \
        > benchmarks/results/generalisation.json
    python benchmarks/generalisation.py --envs coverage --seeds 1 --iterations 5   # a smoke run
    python benchmarks/generalisation.py --set train.lr_schedule=linear   # a candidate default, every env

Targets (issue #17): held-out success ≥ 90 % where the oracle has ≥ 95 %; learned ÷ oracle
mean length ≤ 1.2 sampled and ≤ 1.1 greedy; better than random everywhere. Lengths are
mean primitive steps over all held-out episodes (a failure counts its full length).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np


def _taxi(observation: str | None = None, **library_kwargs: Any) -> dict[str, Any]:
    """Gymnasium's Taxi with its library (``taxi_library(**library_kwargs)``) and oracle.
    A budget, not a setting: 50 default iterations of Taxi are ~45k env steps, 8 episodes
    of 2 task seeds an iteration, and the first choice of an episode depends on which of
    300 start states it is; 300 iterations are ~120k steps (session 40: at 50 and 150 the
    paths were still shortening)."""
    env: dict[str, Any] = {"id": "gyre_ma.envs.taxi_tasks:make_taxi"}
    if observation is not None:
        env["kwargs"] = {"observation": observation}
    return {"env": env, "library": "gyre_ma.envs.taxi_tasks:taxi_library",
            **({"library_kwargs": library_kwargs} if library_kwargs else {}),
            "oracle": "gyre_ma.envs.taxi_tasks:TaxiOracle", "iterations": 300}


def _mpe(**library_kwargs: Any) -> dict[str, Any]:
    """PettingZoo MPE's simple_spread (mpe2) with ``spread_library(**library_kwargs)``, its
    oracle and the fixed assignment: 25-step episodes, so a budget like coverage's: 600
    iterations are ~90k env steps."""
    return {"env": {"id": "gyre_ma.envs.mpe_tasks:make_spread"}, "library": "gyre_ma.envs.mpe_tasks:spread_library",
            **({"library_kwargs": library_kwargs} if library_kwargs else {}),
            "oracle": "gyre_ma.envs.mpe_tasks:SpreadOracle",
            "references": {"fixed": "gyre_ma.envs.mpe_tasks:FixedAssignment"}, "iterations": 600}


ENVS: dict[str, dict[str, Any]] = {
    "obstructed_maze": {"env": {"id": "gyre_ma.envs.minigrid_tasks:make_obstructed_maze"},
                        "library": "gyre_ma.envs.minigrid_tasks:obstructed_maze_library",
                        "oracle": "gyre_ma.envs.minigrid_tasks:ObstructedMazeOracle"},
    "locked_room": {"env": {"id": "gyre_ma.envs.minigrid_tasks:make_locked_room"},
                    "library": "gyre_ma.envs.minigrid_tasks:locked_room_library",
                    "oracle": "gyre_ma.envs.minigrid_tasks:LockedRoomOracle"},
    "overcooked_cramped_room": {"env": {"id": "gyre_ma.envs.overcooked_kitchen:make_env",
                                        "kwargs": {"layout": "cramped_room"}},
                                "library": "gyre_ma.envs.overcooked_kitchen:make_library",
                                "oracle": "gyre_ma.envs.overcooked_kitchen:OracleManager"},
    "overcooked_asymmetric_advantages": {"env": {"id": "gyre_ma.envs.overcooked_kitchen:make_env",
                                                 "kwargs": {"layout": "asymmetric_advantages"}},
                                         "library": "gyre_ma.envs.overcooked_kitchen:make_library",
                                         "oracle": "gyre_ma.envs.overcooked_kitchen:OracleManager"},
    "pursuit": {"env": {"id": "gyre_ma.envs.pursuit_tasks:make_pursuit"},
                "library": "gyre_ma.envs.pursuit_tasks:pursuit_library",
                "oracle": "gyre_ma.envs.pursuit_tasks:PursuitOracle",
                "references": {"independent": "gyre_ma.envs.pursuit_tasks:IndependentChase",
                               "follow": "gyre_ma.envs.pursuit_tasks:MutualFollow"}},
    "taxi": _taxi(),  # its budget: _taxi's docstring
    "taxi_decoded": _taxi(observation="decoded"),
    # the index with the library's options not describing themselves (as until session 45)
    "taxi_plain": _taxi(features=False),
    "mpe_spread": _mpe(),
    "mpe_spread_hold": _mpe(hold=True),
    # the same libraries without the go_to options' features (as until session 44)
    "mpe_spread_plain": _mpe(features=False),
    "mpe_spread_hold_plain": _mpe(hold=True, features=False),
    "coverage": {"env": {"id": "coverage_v0"}, "library": None,
                 "oracle": "gyre_ma.envs.coverage.oracle:OracleManager",
                 "references": {"fixed": "gyre_ma.envs.coverage.oracle:FixedAssignment",
                                "nearest": "gyre_ma.envs.coverage.oracle:NearestFirst"},
                 # a budget, not a setting: 50 default iterations of its 9-step episodes are 3.4k
                 # env steps; the issue measured the old learner at up to 99k. 1,200 iterations
                 # are ~80k steps. (Until session 13 the budget was "80k env steps" past the
                 # default 50 iterations, so both schedules had ended at 4 % of it.)
                 "iterations": 1200},
}


def config(name: str, seed: int, iterations: int | None, overrides: dict[str, Any] | None = None,
           run_root: str | None = None) -> Any:
    """The default config: the env, its library and the run seed, nothing else — unless
    ``overrides`` (dotted keys, ``--set``) name a candidate default to measure. A run made
    from it writes under ``run_root`` (the config's default where None)."""
    from gyre_ma.config import parse_config, with_overrides

    spec = ENVS[name]
    raw: dict[str, Any] = {"name": f"{name}-{seed}", "seed": seed, "env": spec["env"]}
    if run_root is not None:
        raw["run_root"] = run_root
    if spec["library"]:
        raw["library"] = spec["library"]
    if spec.get("library_kwargs"):
        raw["library_kwargs"] = spec["library_kwargs"]
    iterations = iterations if iterations is not None else spec.get("iterations")
    if iterations is not None:
        raw["train"] = {"iterations": iterations}
    return parse_config(with_overrides(raw, overrides or {}))


def _summary(trajectories: list[Any]) -> dict[str, Any]:
    from gyre_ma.metrics import wilson_interval

    wins = sum(t.success for t in trajectories)
    low, high = wilson_interval(wins, len(trajectories))
    lengths = [t.length for t in trajectories]
    return {"success": wins / len(trajectories), "success_ci95": [low, high], "mean_length": float(np.mean(lengths)),
            "dead_ends": float(np.mean([bool(t.dead_ends) for t in trajectories]))}


def env_and_library(name: str, overrides: dict[str, Any] | None = None) -> tuple[Any, Any, Any]:
    """``(config, env, library)`` of ``name`` as its default config (and ``overrides``) builds them."""
    from gyre_ma.envs.registry import make_env, make_library

    cfg = config(name, 0, 1, overrides)
    env = make_env(cfg.env.id, **cfg.env.kwargs)
    return cfg, env, make_library(cfg.env.id, env, cfg.library, cfg.library_kwargs)


def instance_key(env: Any, seed: int) -> str:
    """What task seed ``seed`` makes of ``env``: a digest of every agent's observation after
    ``reset(seed=seed)`` and, where the env has one, its global ``state()``. Seeds with one
    key start the same instance: Taxi has 300 start states and an Overcooked layout a few
    hundred start placements, so after a few hundred training episodes most held-out seeds
    replay a start the learner trained on. Where the observations miss part of an instance,
    two instances share a key, which counts an unseen one as seen, never the reverse."""
    import hashlib

    observations, _ = env.reset(seed=seed)
    digest = hashlib.sha256()

    def feed(x: Any) -> None:
        if isinstance(x, dict):
            for k in sorted(x, key=repr):
                digest.update(repr(k).encode())
                feed(x[k])
        elif isinstance(x, (list, tuple)):
            digest.update(b"[")
            for v in x:
                feed(v)
            digest.update(b"]")
        elif isinstance(x, np.ndarray | np.generic | int | float):
            a = np.asarray(x)
            digest.update(f"{a.dtype}{a.shape}".encode() + np.ascontiguousarray(a).tobytes())
        else:
            digest.update(repr(x).encode())

    feed(observations)
    with contextlib.suppress(AttributeError, NotImplementedError, TypeError):
        feed(env.state())
    return digest.hexdigest()


def unseen_seeds(name: str, gyre: Any, eval_seeds: list[int], overrides: dict[str, Any] | None = None) -> set[int]:
    """The seeds of ``eval_seeds`` whose start instance (:func:`instance_key`) none of the run's
    training seeds made, counting one iteration past the run's (an asynchronous run has
    submitted it)."""
    _, env, _ = env_and_library(name, overrides)
    trained_on = {instance_key(env, t.task_seed)
                  for i in range(gyre.config.train.iterations + 1) for t in gyre.tasks(i)}
    return {s for s in eval_seeds if instance_key(env, s) not in trained_on}


def reference(name: str, seeds: list[int], overrides: dict[str, Any] | None = None,
              only: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Oracle, random eligible order and the env's other ``references`` (managers built
    from ``library``: coverage's fixed assignment and nearest-first heuristic, Pursuit's
    uncoordinated and mutually following pursuers) on ``seeds``; ``only`` those named."""
    from gyre_ma.agents.baselines import RandomManager
    from gyre_ma.envs.registry import make_oracle
    from gyre_ma.options.library import resolve
    from gyre_ma.rollout import run_episode

    cfg, env, library = env_and_library(name, overrides)
    managers = {"oracle": lambda s: make_oracle(cfg.env.id, env, library, ENVS[name]["oracle"]),
                "random": lambda s: RandomManager(s)}
    for key, source in ENVS[name].get("references", {}).items():
        managers[key] = lambda s, key=key, source=source: resolve(source, key)(library=library)
    return {key: _summary([run_episode(env, library, build(s), seed=s) for s in seeds])
            for key, build in managers.items() if only is None or key in only}


SCRATCH = "gyre-generalisation-"
"""Prefix of a training run's temporary folder, followed by its process id."""


def sweep_scratch(folder: str | None = None) -> list[str]:
    """Remove the run folders in ``folder`` (the temporary directory) that killed runs left:
    each is named with its process's id, and one whose process is gone is no one's. Returns
    what it removed. A folder of a live process, or one not named so, is left alone."""
    import shutil
    from pathlib import Path

    removed = []
    for path in Path(folder or tempfile.gettempdir()).glob(f"{SCRATCH}*"):
        pid = path.name[len(SCRATCH):].split("-", 1)[0]
        if path.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


@contextlib.contextmanager
def trained(name: str, seed: int, iterations: int | None, overrides: dict[str, Any] | None = None,
            on_iteration: Callable[[Any, int, dict[str, float]], None] | None = None) -> Iterator[tuple[Any, float]]:
    """The default learner trained on ``name`` with run seed ``seed`` (one torch thread),
    as ``(gyre, training seconds)``; closed on leaving. ``on_iteration(gyre, i, metrics)`` is
    called after each iteration. Its run directory (checkpoints) is a temporary one, removed on
    leaving; those of runs killed before they could remove theirs are removed first
    (:func:`sweep_scratch`)."""
    import torch

    from gyre_ma.loop import Gyre

    torch.set_num_threads(1)
    sweep_scratch()
    with tempfile.TemporaryDirectory(prefix=f"{SCRATCH}{os.getpid()}-") as root:
        cfg = config(name, seed, iterations, overrides, run_root=root)
        gyre = Gyre(cfg, os.path.join(cfg.run_root, cfg.name))
        try:
            start = time.perf_counter()
            for i in range(cfg.train.iterations):
                metrics = gyre.iteration(i)
                if on_iteration is not None:
                    on_iteration(gyre, i, metrics)
            yield gyre, time.perf_counter() - start
        finally:
            gyre.close()


def train(name: str, seed: int, iterations: int | None, eval_seeds: list[int],
          overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train the default learner; evaluate its final policy on ``eval_seeds``, sampled and greedy."""
    from gyre_ma.roles import evaluation_tasks

    curve: list[dict[str, Any]] = []

    def record(gyre: Any, i: int, m: dict[str, float]) -> None:
        curve.append({k: m.get(k) for k in ("env_steps", "success_rate", "validation/sampled_success",
                                             "validation/greedy_success", "episode_length")})

    with trained(name, seed, iterations, overrides, record) as (gyre, seconds):
        out = {"env_steps": gyre.env_steps, "train_seconds": seconds, "iterations": len(curve),
               "rollbacks": len(gyre.checkpoints.rollbacks) if gyre.checkpoints else 0,
               "hacking_alarms": [a.name for a in gyre.rewards.monitor.fired], "curve": curve}
        unseen = unseen_seeds(name, gyre, eval_seeds, overrides)
        out["eval_on_trained_instances"] = 1 - len(unseen) / len(eval_seeds)
        out["unseen_oracle"] = (reference(name, sorted(unseen), overrides, only=("oracle",))["oracle"]
                                if unseen else None)
        for mode, greedy in (("sampled", False), ("greedy", True)):
            tasks = evaluation_tasks(eval_seeds, greedy=greedy)
            played = gyre.backend.collect(gyre.weights(), gyre.version, tasks)
            out[mode] = _summary(played)
            fresh = [t for t in played if t.task_seed in unseen]  # started where training never did
            out[f"{mode}_unseen_instances"] = _summary(fresh) | {"episodes": len(fresh)} if fresh else None
    return out


def verdict(env: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, per env, from the seeds' mean figures."""
    oracle, random = env["reference"]["oracle"], env["reference"]["random"]
    runs = env["runs"]
    out: dict[str, Any] = {}
    for mode in ("sampled", "greedy"):
        success = [r[mode]["success"] for r in runs]
        ratio = [r[mode]["mean_length"] / oracle["mean_length"] for r in runs]
        out[f"{mode}_success"] = success
        out[f"{mode}_length_ratio"] = ratio
        target = 1.2 if mode == "sampled" else 1.1
        out[f"{mode}_meets_length_target"] = bool(max(ratio) <= target)
        out[f"{mode}_meets_success_target"] = bool(oracle["success"] < 0.95 or min(success) >= 0.9)
        out[f"{mode}_beats_random"] = bool(all(
            s > random["success"] or (s == random["success"] and r * oracle["mean_length"] < random["mean_length"])
            for s, r in zip(success, ratio, strict=True)))
    out["random_length_ratio"] = random["mean_length"] / oracle["mean_length"]
    # the held-out episodes that start on an instance the run trained on, and the figures of those that do not
    out["eval_on_trained_instances"] = [r.get("eval_on_trained_instances") for r in runs]
    for mode in ("sampled", "greedy"):
        fresh = [r.get(f"{mode}_unseen_instances") for r in runs]
        out[f"{mode}_success_unseen_instances"] = [f and f["success"] for f in fresh]
        out[f"{mode}_length_ratio_unseen_instances"] = [f and f["mean_length"] / r["unseen_oracle"]["mean_length"]
                                                        for f, r in zip(fresh, runs, strict=True)]
    return out


def plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["envs"])
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.4), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        env = result["envs"][name]
        for k, (seed, run) in enumerate(zip(result["seeds"], env["runs"], strict=True)):
            steps = [p["env_steps"] for p in run["curve"]]
            ax.plot(steps, [p["validation/sampled_success"] for p in run["curve"]], color=f"C{k}",
                    label=f"seed {seed} sampled")
            ax.plot(steps, [p["validation/greedy_success"] for p in run["curve"]], color=f"C{k}", ls="--",
                    label=f"seed {seed} greedy")
        ax.axhline(env["reference"]["oracle"]["success"], color="black", lw=0.8, label="oracle")
        ax.axhline(env["reference"]["random"]["success"], color="grey", lw=0.8, ls=":", label="random")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("env steps")
        ax.set_ylim(-0.05, 1.05)
    axes[0][0].set_ylabel("held-out validation success")
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_arguments(p: argparse.ArgumentParser, *, seeds: int, eval_episodes: int, iterations: str) -> None:
    """The options every training benchmark here shares: run seeds, budget, held-out
    seeds, processes and candidate defaults (``--set``)."""
    p.add_argument("--seeds", type=int, default=seeds)
    p.add_argument("--first-seed", type=int, default=0, help="run seeds first-seed .. first-seed + seeds - 1")
    p.add_argument("--iterations", type=int, default=None, help=f"default: {iterations}")
    p.add_argument("--eval-episodes", type=int, default=eval_episodes)
    p.add_argument("--eval-seed", type=int, default=2_000_000)
    p.add_argument("--jobs", type=int, default=1)
    candidate_argument(p)


def candidate_argument(p: argparse.ArgumentParser) -> None:
    """``--set``: a candidate default to measure, read by :func:`parsed_overrides`."""
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a candidate default to measure (dotted key, YAML value); repeatable")


def parsed_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """``--set`` as dotted overrides; a bad one exits with its one-line message."""
    from gyre_ma.cli import UsageError, set_overrides

    try:
        return set_overrides(args.set)
    except UsageError as exc:
        raise SystemExit(str(exc)) from None


def run_seeds(args: argparse.Namespace) -> tuple[list[int], list[int]]:
    """``(held-out task seeds, run seeds)`` of :func:`run_arguments`' options."""
    from gyre_ma.roles import check_held_out_seeds

    try:
        check_held_out_seeds(args.eval_seed, args.eval_episodes, "--eval-seed")
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    return (list(range(args.eval_seed, args.eval_seed + args.eval_episodes)),
            list(range(args.first_seed, args.first_seed + args.seeds)))


def _missing_packages(names: list[str]) -> dict[str, str]:
    """The envs of ``names`` whose module (an optional extra's) does not import, with why."""
    import importlib

    missing = {}
    for name in names:
        source = ENVS[name]["env"]["id"]
        if ":" in source:
            try:
                importlib.import_module(source.split(":")[0])
            except ImportError as exc:
                missing[name] = str(exc)
    return missing


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--envs", default=",".join(ENVS), help=f"comma-separated, from {list(ENVS)}")
    run_arguments(p, seeds=3, eval_episodes=100, iterations="the config's train.iterations")
    p.add_argument("--png", default=None)
    args = p.parse_args()
    overrides = parsed_overrides(args)
    names = [n for n in args.envs.split(",") if n]
    unknown = [n for n in names if n not in ENVS]
    if unknown:
        raise SystemExit(f"--envs: unknown {unknown}; known: {list(ENVS)}")
    missing = _missing_packages(names)
    if missing:  # before any training: a run of every env would otherwise end at the first one missing
        raise SystemExit("--envs: " + "; ".join(f"{n} cannot be imported ({e})" for n, e in missing.items()))
    eval_seeds, seeds = run_seeds(args)
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        refs = {n: pool.submit(reference, n, eval_seeds, overrides) for n in names}
        runs = {n: [pool.submit(train, n, s, args.iterations, eval_seeds, overrides) for s in seeds]
                for n in names}
        envs = {n: {"reference": refs[n].result(), "runs": [f.result() for f in runs[n]]} for n in names}
    for env in envs.values():
        env["verdict"] = verdict(env)
    result = {"benchmark": "generalisation",
              "config": f"defaults with {overrides}" if overrides else "defaults (env, library, seed only)",
              "seeds": seeds, "eval_episodes": args.eval_episodes, "eval_seeds": [eval_seeds[0], eval_seeds[-1]],
              "iterations": args.iterations, "wall_seconds": time.perf_counter() - start, "envs": envs}
    if args.png:
        plot(result, args.png)
        result["png"] = args.png
    print(json.dumps(result))


if __name__ == "__main__":
    main()
