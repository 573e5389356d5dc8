"""A shipped config, trained on several run seeds, judged on held-out task seeds only.

For each run seed: train the config as ``gyre-ma train`` would (its own settings, nothing
changed but the seed and a candidate default given with ``--set``), then play
``--eval-episodes`` task seeds from ``--eval-seed`` (a range no training or validation
episode draws from, see ``gyre_ma.roles``) with the final policy and with ``best.pt``,
sampled and greedy, each with a 95 % Wilson interval. The last training iterations'
success (on their own training seeds) is printed beside them, with the held-out
validation the learner saw during training.

    python benchmarks/heldout.py --config configs/quickstart.yaml --seeds 3 --jobs 2 \
        > benchmarks/results/quickstart_heldout.json

``--curve-every K`` also judges the policy every K iterations on ``--curve-episodes``
held-out seeds (a range of their own), sampled and greedy: a learning curve against env
steps and training wall time (the time spent judging is not counted).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from generalisation import candidate_argument, parsed_overrides

from gyre_ma.roles import check_held_out_seeds

ROOT = Path(__file__).resolve().parents[1]


def _judge(gyre: Any, seeds: list[int]) -> dict[str, Any]:
    from gyre_ma.metrics import wilson_interval
    from gyre_ma.roles import evaluation_tasks

    out = {}
    for mode, greedy in (("sampled", False), ("greedy", True)):
        runs = gyre.backend.collect(gyre.weights(), gyre.version, evaluation_tasks(seeds, greedy=greedy))
        wins = sum(t.success for t in runs)
        out[mode] = {"success": wins / len(runs), "ci95": list(wilson_interval(wins, len(runs))),
                     "mean_length": sum(t.length for t in runs) / len(runs)}
    return out


def run(config_path: str, seed: int, eval_seeds: list[int], curve_every: int = 0,
        curve_seeds: list[int] | None = None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    import torch

    from gyre_ma.config import load_config
    from gyre_ma.loop import Gyre

    torch.set_num_threads(1)
    cfg = load_config(config_path, {**(overrides or {}), "seed": seed,
                                    "run_root": tempfile.mkdtemp(prefix="gyre-heldout-")})
    gyre = Gyre(cfg, cfg.run_dir)
    history, curve, seconds = [], [], 0.0
    if curve_every:  # where it starts: the untrained policy
        judged = _judge(gyre, curve_seeds)
        curve.append({"iteration": 0, "env_steps": 0, "train_seconds": 0.0,
                      "sampled": judged["sampled"]["success"], "greedy": judged["greedy"]["success"]})
    for i in range(cfg.train.iterations):
        start = time.perf_counter()
        history.append(gyre.iteration(i))
        seconds += time.perf_counter() - start
        if curve_every and ((i + 1) % curve_every == 0 or i + 1 == cfg.train.iterations):
            judged = _judge(gyre, curve_seeds)
            curve.append({"iteration": i + 1, "env_steps": gyre.env_steps, "train_seconds": seconds,
                          "sampled": judged["sampled"]["success"], "greedy": judged["greedy"]["success"]})
    last = history[-3:]

    def mean(key: str) -> float | None:
        values = [m[key] for m in last if key in m]
        return sum(values) / len(values) if values else None

    out = {"seed": seed, "train_seconds": seconds, "env_steps": gyre.env_steps,
           "training_success_last3": mean("success_rate"),
           "validation_sampled_last3": mean("validation/sampled_success"),
           "validation_greedy_last3": mean("validation/greedy_success"),
           "rollbacks": len(gyre.checkpoints.rollbacks), "final": _judge(gyre, eval_seeds)}
    if curve:
        out["curve"] = curve
    if gyre.checkpoints.has("best"):
        gyre.load_state_dict(gyre.checkpoints.load("best"))
        out["best"] = _judge(gyre, eval_seeds)
    gyre.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "quickstart.yaml"))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--eval-episodes", type=int, default=200)
    p.add_argument("--eval-seed", type=int, default=3_000_000)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--curve-every", type=int, default=0, help="judge every K iterations (0: only at the end)")
    p.add_argument("--curve-episodes", type=int, default=50)
    candidate_argument(p)
    args = p.parse_args()
    overrides = parsed_overrides(args)
    try:
        check_held_out_seeds(args.eval_seed, args.eval_episodes, "--eval-seed")
        check_held_out_seeds(args.eval_seed + 500_000, args.curve_episodes, "--eval-seed (the curve's, 500,000 on)")
    except ValueError as exc:
        p.error(str(exc))
    eval_seeds = list(range(args.eval_seed, args.eval_seed + args.eval_episodes))
    curve_seeds = list(range(args.eval_seed + 500_000, args.eval_seed + 500_000 + args.curve_episodes))
    n = args.seeds
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        runs = list(pool.map(run, [args.config] * n, range(n), [eval_seeds] * n, [args.curve_every] * n,
                             [curve_seeds] * n, [overrides] * n))
    out = {"benchmark": "heldout", "config": os.path.relpath(args.config, ROOT),
           **({"overrides": overrides} if overrides else {}),
           "eval_seeds": [eval_seeds[0], eval_seeds[-1]], "runs": runs}
    if args.curve_every:
        out["curve_seeds"] = [curve_seeds[0], curve_seeds[-1]]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
