"""Greedy evaluation of checkpoints with and without the detour rule (``GREEDY_DETOUR``),
side by side: the same checkpoint, seeds and stream, the rule off (``old``) and at its
default (``new``). Prints one JSON object.

    python benchmarks/greedy_fallback.py --config configs/quickstart.yaml \\
        runs/quickstart/checkpoints/final.pt --episodes 500
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile


def judge(checkpoint: str, config: str | None, episodes: int) -> dict:
    import gyre_ma.agents.noise as noise
    from gyre_ma.cli import main

    default, out = noise.GREEDY_DETOUR, {"checkpoint": checkpoint}
    try:
        for name, value in (("old", 1e-300), ("new", default)):  # 1e-300: no option is that unlikely
            noise.GREEDY_DETOUR = value
            with tempfile.TemporaryDirectory() as folder:
                path = os.path.join(folder, "eval.json")
                argv = ["eval", checkpoint, "--trust-config", "--episodes", str(episodes), "--greedy", "--json", path]
                with contextlib.redirect_stdout(io.StringIO()):
                    code = main(argv + (["--config", config] if config else []))
                if code:
                    raise SystemExit(f"gyre-ma eval {checkpoint} failed ({code})")
                with open(path) as f:
                    r = json.load(f)
            out[name] = {"success": r["success_rate"], "ci95": [r["success_ci95_low"], r["success_ci95_high"]],
                         "mean_length": r["episode_length"]}
    finally:
        noise.GREEDY_DETOUR = default
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--config", help="the config to rebuild the env from (default: each run's own)")
    p.add_argument("--episodes", type=int, default=500)
    args = p.parse_args()
    sys.path.insert(0, os.getcwd())  # a user's env modules, as gyre-ma imports them
    print(json.dumps({"episodes": args.episodes, "runs": [judge(c, args.config, args.episodes)
                                                          for c in args.checkpoints]}))


if __name__ == "__main__":
    main()
