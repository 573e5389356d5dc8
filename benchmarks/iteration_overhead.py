"""Seconds per iteration the learner spends outside rollout and update (quickstart config).

Each iteration's wall time is split into the rollout (the backend playing episodes), the
update (the trainers' fit) and the rest — scoring, batch building, validation,
checkpoint serialisation, hashing and the state copies around the update. The script
times ``Gyre.rollout`` and ``Gyre.update`` by wrapping them, so it measures any version
of the learner that has those two methods: run it on two checkouts, side by side, to
compare them (``--code`` puts another checkout first on ``sys.path``).

    python benchmarks/iteration_overhead.py --iterations 20
    python benchmarks/iteration_overhead.py --iterations 20 --code /tmp/old-checkout

Prints one JSON object: medians over the iterations after the first (which warms up).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(iterations: int, config_path: Path) -> dict[str, float]:
    import numpy as np

    from gyre_ma.config import load_config
    from gyre_ma.loop import Gyre

    config = load_config(config_path)
    spent: dict[str, float] = {"rollout": 0.0, "update": 0.0}

    def timed(name: str, method):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - start
        return run

    rows = []
    with tempfile.TemporaryDirectory() as run_dir:
        gyre = Gyre(config, run_dir)
        gyre.rollout, gyre.update = timed("rollout", gyre.rollout), timed("update", gyre.update)
        for i in range(iterations):
            spent.update(rollout=0.0, update=0.0)
            start = time.perf_counter()
            gyre.iteration(i)
            total = time.perf_counter() - start
            rows.append((total, spent["rollout"], spent["update"], total - spent["rollout"] - spent["update"]))
        gyre.close()
    med = np.median(np.array(rows[1:]), axis=0)
    return {"iteration_s": float(med[0]), "rollout_s": float(med[1]), "update_s": float(med[2]),
            "other_s": float(med[3])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--config", default=str(ROOT / "configs" / "quickstart.yaml"))
    parser.add_argument("--code", help="a checkout whose gyre_ma to measure instead of the installed one")
    args = parser.parse_args()
    if args.code:
        sys.path.insert(0, args.code)
    import gyre_ma

    result = measure(args.iterations, Path(args.config))
    print(json.dumps({"code": str(Path(gyre_ma.__file__).parent), "iterations": args.iterations, **result}))


if __name__ == "__main__":
    main()
