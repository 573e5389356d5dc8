"""Parameter-space vs action-space noise, and async vs sync rollouts, on a tech-tree task.

Each variant trains the quickstart tech-tree task (configs/quickstart.yaml) from the same
seeds; reported: env steps until the verified success rate first reaches 90 %, and the
final success (mean of the last 5 iterations). Prints one JSON object.

    python benchmarks/noise_ablation.py --seeds 3
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from gyre_ma.config import load_config
from gyre_ma.loop import Gyre

QUICKSTART = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"

VARIANTS: dict[str, dict[str, Any]] = {
    "param_noise": {},
    "action_noise_epsilon": {
        "roles.explorer_noise": {"kind": "epsilon", "start": 0.3, "end": 0.05, "schedule": "cosine"},
        "roles.executor_noise": {"kind": "epsilon", "start": 0.05, "end": 0.005, "schedule": "exponential"},
    },
    "no_noise": {"roles.explorer_noise": {"kind": "none"}, "roles.executor_noise": {"kind": "none"}},
    "param_noise_async": {"backend.async_rollouts": True},
}


def run(overrides: dict[str, Any], seed: int, iterations: int) -> dict[str, Any]:
    cfg = load_config(QUICKSTART, {"seed": seed, "train.iterations": iterations, "checkpoints.enabled": False,
                                   **overrides})
    gyre = Gyre(cfg)
    curve = []
    start = time.perf_counter()
    for i in range(iterations):
        m = gyre.iteration(i)
        curve.append((m["env_steps"], m["success_rate"]))
    to_90 = next((s for s, r in curve if r >= 0.9), None)
    return {"steps_to_90": to_90, "final_success": float(np.mean([r for _, r in curve[-5:]])),
            "env_steps": curve[-1][0], "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    args = parser.parse_args()
    out: dict[str, Any] = {"benchmark": "noise_ablation", "task": "configs/quickstart.yaml",
                           "seeds": args.seeds, "iterations": args.iterations, "variants": {}}
    for name in args.variants:
        runs = [run(VARIANTS[name], seed, args.iterations) for seed in range(args.seeds)]
        reached = [r["steps_to_90"] for r in runs if r["steps_to_90"] is not None]
        out["variants"][name] = {
            "runs": runs,
            "reached_90": f"{len(reached)}/{len(runs)}",
            "median_steps_to_90": float(np.median(reached)) if reached else None,
            "final_success_mean": float(np.mean([r["final_success"] for r in runs])),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
