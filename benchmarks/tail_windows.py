"""The last update's policy against tail averages of the manager's weights, paired, from one
run per seed: each run trains once (``train.average_last`` 0, so the last update's weights
are the run's own), keeps the uniform average of its updated weights over each window's
last fraction of iterations beside it, and plays every policy on the same held-out task
seeds and evaluation stream, sampled and greedy, so two policies' figures differ by their
choices alone. Prints one JSON object: per run seed and policy (``last`` or the window),
``generalisation.py``'s summary; per window, the paired mean difference from ``last``.

    python benchmarks/tail_windows.py --env coverage --seeds 12 --first-seed 6 --jobs 2 --eval-episodes 500
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import generalisation as G
import numpy as np


def run(name: str, seed: int, iterations: int | None, windows: list[float], eval_seeds: list[int]) -> dict[str, Any]:
    from gyre_ma.roles import evaluation_tasks
    from gyre_ma.trainers.averaging import TailAverage

    averages = {w: TailAverage() for w in windows}

    def add(gyre: Any, i: int, metrics: dict[str, float]) -> None:
        for w, average in averages.items():  # from where train.average_last = w would start averaging
            if i >= gyre.config.train.model_copy(update={"average_last": w}).average_start:
                average.add(gyre.policy)

    with G.trained(name, seed, iterations, {"train.average_last": 0.0}, add) as (gyre, _):
        last = copy.deepcopy(gyre.policy.state_dict())
        out = {}
        for k, window in enumerate(["last", *windows]):
            gyre.policy.load_state_dict(last)
            if window != "last":
                averages[window].load_into(gyre.policy)
            out[str(window)] = {mode: G._summary(gyre.backend.collect(
                gyre.weights(), gyre.version + 1 + k, evaluation_tasks(eval_seeds, greedy=greedy)))
                for mode, greedy in (("sampled", False), ("greedy", True))}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="coverage", choices=list(G.ENVS))
    p.add_argument("--windows", default="0.05,0.1,0.25", help="comma-separated fractions of the run")
    p.add_argument("--seeds", type=int, default=6)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--iterations", type=int, default=None, help="default: the env's budget in generalisation.py")
    p.add_argument("--eval-episodes", type=int, default=500)
    p.add_argument("--eval-seed", type=int, default=2_000_000)
    p.add_argument("--jobs", type=int, default=1)
    args = p.parse_args()
    windows = [float(w) for w in args.windows.split(",") if w]
    eval_seeds = list(range(args.eval_seed, args.eval_seed + args.eval_episodes))
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run, args.env, s, args.iterations, windows, eval_seeds) for s in seeds]
        runs = {str(s): f.result() for s, f in zip(seeds, futures, strict=True)}
    paired: dict[str, Any] = {}
    for w in map(str, windows):
        paired[w] = {}
        for mode in ("sampled", "greedy"):
            diff = np.array([runs[s][w][mode]["success"] - runs[s]["last"][mode]["success"] for s in runs])
            half = float(2.0 * diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else None
            paired[w][mode] = {"mean_difference": float(diff.mean()), "about_95_half_width": half,
                               "better_runs": int((diff > 0).sum()), "worse_runs": int((diff < 0).sum())}
    print(json.dumps({"benchmark": "tail_windows", "env": args.env, "windows": windows, "seeds": seeds,
                      "eval_seeds": [eval_seeds[0], eval_seeds[-1]], "wall_seconds": time.perf_counter() - start,
                      "paired": paired, "runs": runs}))


if __name__ == "__main__":
    main()
