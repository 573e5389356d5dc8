"""What option features cost in training time: seconds per iteration of the default
learner on a library whose options describe themselves (``Option.features``) against the
same library without, side by side.

Per pair of benchmark envs (``generalisation.py``'s: Taxi's index with and without
``PlaceFeatures``, MPE's hold library with and without ``LandmarkFeatures``), both runs
start from run seed 0 and play their iterations in alternating blocks (``--block``
iterations each, ``--rounds`` rounds), so a change of the machine's load falls on both;
each row gives the median seconds per iteration of each and the median per-round ratio.
The runs learn as they go, so their episodes change length as training does; the ratio
is of whole iterations (rollout and update), what a user waits for. Prints one JSON object.

    python benchmarks/option_features_cost.py > benchmarks/results/option_features_cost.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

PAIRS = {"taxi": ("taxi", "taxi_plain"), "mpe_spread_hold": ("mpe_spread_hold", "mpe_spread_hold_plain")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", default=",".join(PAIRS), help=f"comma-separated, of {', '.join(PAIRS)}")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block", type=int, default=10, help="iterations of each run per round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from generalisation import config  # benchmarks/ is on sys.path when run as a script

    from gyre_ma.loop import Gyre

    out: dict[str, Any] = {"benchmark": "option_features_cost", "rounds": args.rounds, "block": args.block,
                           "threads": 1, "pairs": {}}
    root = tempfile.mkdtemp()
    for pair in args.pairs.split(","):
        if pair not in PAIRS:
            parser.error(f"--pairs: unknown pair {pair!r}; expected some of {list(PAIRS)}")
        runs = {name: Gyre(config(name, 0, args.rounds * args.block, run_root=str(Path(root) / name)))
                for name in PAIRS[pair]}
        seconds: dict[str, list[float]] = {name: [] for name in runs}
        done = 0
        for _ in range(args.rounds):
            for name, gyre in runs.items():
                start = time.perf_counter()
                for i in range(done, done + args.block):
                    gyre.iteration(i)
                seconds[name].append((time.perf_counter() - start) / args.block)
            done += args.block
        with_, without = PAIRS[pair]
        out["pairs"][pair] = {
            "seconds_per_iteration": {name: round(float(np.median(s)), 4) for name, s in seconds.items()},
            "features_over_plain": round(float(np.median(np.divide(seconds[with_], seconds[without]))), 2),
            "option_features": int(runs[with_].featurizer.option_features),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
