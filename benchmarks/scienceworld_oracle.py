"""ScienceWorld's task families: the scripted oracle order vs a random eligible order, on
held-out variations (the simulator's *test* split: task seeds below 2^30 map to it).

Prints ONE JSON object: per family, the oracle's and the random manager's verified success,
mean episode length and the variations played. A trained manager is judged on the same
seeds with ``gyre-ma eval RUN --episodes 75 --seed 0``.

    python benchmarks/scienceworld_oracle.py [--families F ...] [--episodes 75] [--first-seed 0]

A family's test split may hold fewer variations than ``--episodes``: seed ``s`` plays
``test[s % len(test)]``, so the variations repeat (listed under ``variations``).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.envs import scienceworld_env as sw
from gyre_ma.rollout import Trajectory, run_episode


def _summary(trajs: list[Trajectory], seconds: float) -> dict[str, Any]:
    won = [t.length for t in trajs if t.success]
    return {"success_rate": float(np.mean([t.success for t in trajs])),
            "mean_length": round(float(np.mean([t.length for t in trajs])), 1),
            "mean_success_length": round(float(np.mean(won)), 1) if won else None,
            "episodes": len(trajs), "seconds": round(seconds, 1)}


def _play(env: Any, library: Any, make_manager: Any, seeds: list[int]) -> dict[str, Any]:
    start = time.perf_counter()
    trajs = [run_episode(env, library, make_manager(s), seed=s) for s in seeds]
    return _summary(trajs, time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", nargs="+", default=list(sw.FAMILIES))
    p.add_argument("--episodes", type=int, default=75, help="held-out task seeds per family")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--max-cycles", type=int, default=sw.DEFAULT_MAX_CYCLES)
    args = p.parse_args()
    seeds = list(range(args.first_seed, args.first_seed + args.episodes))
    out: dict[str, Any] = {"what": "scripted oracle order vs random eligible order on held-out (test split) "
                                   "variations; success = the simulator's task completed (score 100)",
                           "seeds": [seeds[0], seeds[-1]], "max_cycles": args.max_cycles, "families": {}}
    for family in args.families:
        env = sw.make_env(family, max_cycles=args.max_cycles)
        library = sw.make_library(env)
        oracle = _play(env, library, lambda s: sw.OracleManager(library=library), seeds)
        random = _play(env, library, lambda s: RandomManager(s), seeds)
        out["families"][family] = {"task_graph": sw.GRAPH_OF[family],
                                   "variations": sorted({sw.variation(family, s) for s in seeds}),
                                   "oracle": oracle, "random": random}
        env.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
