"""Where the default learner fails on coverage_v0: held-out failures split by layout and cause.

Trains the DEFAULT learner on coverage_v0 exactly as ``generalisation.py`` does (same
config, budget and held-out seeds; ``--set`` names a candidate default), then plays the
final policy on the held-out seeds, sampled and greedy, and splits what it got wrong:

- by layout: whether the nearest-first heuristic (each agent in turn walks to the nearest
  open landmark) verifies the layout — most layouts; on the rest the slowest agent has no
  slack and only the bottleneck-optimal assignment wins;
- by cause: failed episodes in which an agent that could still move chose ``stay`` at
  step 0 (an idle choice that loses the race), and idle ``stay`` choices per episode.

    python benchmarks/coverage_failures.py --seeds 6 --jobs 2
    python benchmarks/coverage_failures.py --seeds 6 --jobs 2 --set credit.mode=gigpo

Prints one JSON object: per run seed and mode, success overall and on the two kinds of
layout, mean length ÷ the oracle's (as ``generalisation.py`` reports it), failures,
failures with a step-0 idle stay, idle stays per episode.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
from generalisation import ENVS, env_and_library, parsed_overrides, reference, run_arguments, run_seeds, trained

ENV = "coverage"


def nearest_first_wins(seeds: list[int]) -> dict[int, bool]:
    """Per held-out seed, whether the nearest-first heuristic verifies every landmark."""
    from gyre_ma.options.library import resolve
    from gyre_ma.rollout import run_episode

    _, env, library = env_and_library(ENV)
    nearest = resolve(ENVS[ENV]["references"]["nearest"], "nearest")(library=library)
    return {s: bool(run_episode(env, library, nearest, seed=s).success) for s in seeds}


def train(seed: int, iterations: int | None, eval_seeds: list[int], overrides: dict[str, Any]) -> dict[str, Any]:
    """Train; per mode, each held-out episode's seed, success and idle stays."""
    from gyre_ma.roles import evaluation_tasks

    out: dict[str, Any] = {"seed": seed}
    with trained(ENV, seed, iterations, overrides) as (gyre, _):
        stay = gyre.library.index("stay")
        out["env_steps"] = gyre.env_steps
        for mode, greedy in (("sampled", False), ("greedy", True)):
            episodes = []
            for t in gyre.backend.collect(gyre.weights(), gyre.version,
                                          evaluation_tasks(eval_seeds, greedy=greedy)):
                idle = [c for c in t.calls if c.option == stay and int(c.mask.sum()) > 1]  # stayed, could move
                episodes.append({"seed": t.task_seed, "success": bool(t.success), "length": t.length,
                                 "idle_at_start": any(c.start_step == 0 for c in idle), "idle": len(idle)})
            out[mode] = episodes
    return out


def split(episodes: list[dict[str, Any]], wins: dict[int, bool], oracle_length: float) -> dict[str, Any]:
    def rate(rows: list[dict[str, Any]]) -> float | None:
        return float(np.mean([r["success"] for r in rows])) if rows else None

    failed = [r for r in episodes if not r["success"]]
    return {"success": rate(episodes),
            "length_over_oracle": float(np.mean([r["length"] for r in episodes])) / oracle_length,
            "success_where_nearest_first_wins": rate([r for r in episodes if wins[r["seed"]]]),
            "success_where_nearest_first_loses": rate([r for r in episodes if not wins[r["seed"]]]),
            "failures": len(failed),
            "failures_with_idle_stay_at_step_0": sum(r["idle_at_start"] for r in failed),
            "idle_stays_per_episode": float(np.mean([r["idle"] for r in episodes]))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    run_arguments(p, seeds=6, eval_episodes=500, iterations="the benchmark's coverage budget")
    args = p.parse_args()
    overrides = parsed_overrides(args)
    eval_seeds, seeds = run_seeds(args)
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        wins_future = pool.submit(nearest_first_wins, eval_seeds)
        refs = pool.submit(reference, ENV, eval_seeds)  # the oracle's lengths, as generalisation.py divides by
        runs = list(pool.map(train, seeds, [args.iterations] * args.seeds,
                             [eval_seeds] * args.seeds, [overrides] * args.seeds))
        wins, oracle_length = wins_future.result(), refs.result()["oracle"]["mean_length"]
    result = {"benchmark": "coverage_failures",
              "config": f"defaults with {overrides}" if overrides else "defaults (env, library, seed only)",
              "eval_seeds": [eval_seeds[0], eval_seeds[-1]],
              "nearest_first_wins": float(np.mean(list(wins.values()))),
              "oracle_mean_length": oracle_length,
              "runs": [{"seed": r["seed"], "env_steps": r["env_steps"]}
                       | {mode: split(r[mode], wins, oracle_length) for mode in ("sampled", "greedy")} for r in runs],
              "wall_seconds": time.perf_counter() - start}
    for mode in ("sampled", "greedy"):
        result[f"{mode}_success_mean"] = float(np.mean([r[mode]["success"] for r in result["runs"]]))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
