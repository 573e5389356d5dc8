"""One run of an experiment, in the child process :func:`gyre_ma.experiment.play_run`
starts: ``python -m gyre_ma.experiment_run RUN_DIR --episodes N --seed S [--checkpoint
final|best] [-- TRAIN ARGS]`` trains the run with ``gyre-ma train`` (the arguments after
``--``; none when it is already trained), then evaluates it on held-out task seeds. With
``--sb3 JSON --train-seed S`` it trains Stable-Baselines3 PPO instead
(:mod:`gyre_ma.experiment_sb3`) and evaluates that.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from gyre_ma import cli
from gyre_ma.experiment import evaluate_run
from gyre_ma.files import strict_json


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m gyre_ma.experiment_run", description=__doc__)
    parser.add_argument("run_dir")
    parser.add_argument("--episodes", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--checkpoint", choices=("final", "best"), default="final")
    parser.add_argument("--sb3", help="an SB3 variant's settings as JSON: train SB3 PPO, not gyre-ma")
    parser.add_argument("--train-seed", type=int, default=0, help="the SB3 run's seed")
    argv = list(argv)
    train = argv[argv.index("--") + 1:] if "--" in argv else []  # gyre-ma train's own arguments
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if train:
        rc = cli.main(train)
        if rc != 0:
            return rc
    try:
        if args.sb3 is not None:
            from gyre_ma import experiment_sb3 as sb3

            model = sb3.train(Path(args.run_dir), sb3.SB3Spec.model_validate_json(args.sb3), args.train_seed)
            result = sb3.evaluate(Path(args.run_dir), model, episodes=args.episodes, seed=args.seed)
        else:
            result = evaluate_run(Path(args.run_dir), episodes=args.episodes, seed=args.seed,
                                  checkpoint=args.checkpoint)
    except (ValueError, OSError) as exc:
        print(f"gyre-ma experiment: evaluating {args.run_dir}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(strict_json({k: v for k, v in result.items() if k in ("sampled", "greedy")}, indent=None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
