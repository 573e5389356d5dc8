"""Greedy evaluation of checkpoints with and without one of greedy play's rules, side by
side: the same checkpoint, seeds and stream, the rule off (``old``) and at its default
(``new``). ``--rule detour``: an unlikely option no goal needs is no fallback
(``GREEDY_DETOUR``, session 55); ``--rule repeat``: an option whose call did work its agent
sees may be chosen again (``GREEDY_REPEATS_VISIBLE_WORK``, session 58). Prints one JSON object.

    python benchmarks/greedy_fallback.py --config configs/quickstart.yaml \\
        runs/quickstart/checkpoints/final.pt --episodes 500 [--rule repeat]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile

RULES = {"detour": ("GREEDY_DETOUR", 1e-300), "repeat": ("GREEDY_REPEATS_VISIBLE_WORK", False)}
"""Per rule: its setting in ``gyre_ma.agents.noise`` and the value that turns it off (1e-300:
no option is that unlikely)."""


def judge(checkpoint: str, config: str | None, episodes: int, rule: str) -> dict:
    import gyre_ma.agents.noise as noise
    from gyre_ma.cli import main

    name, off = RULES[rule]
    default, out = getattr(noise, name), {"checkpoint": checkpoint}
    try:
        for label, value in (("old", off), ("new", default)):
            setattr(noise, name, value)
            with tempfile.TemporaryDirectory() as folder:
                path = os.path.join(folder, "eval.json")
                argv = ["eval", checkpoint, "--trust-config", "--episodes", str(episodes), "--greedy", "--json", path]
                with contextlib.redirect_stdout(io.StringIO()):
                    code = main(argv + (["--config", config] if config else []))
                if code:
                    raise SystemExit(f"gyre-ma eval {checkpoint} failed ({code})")
                with open(path) as f:
                    r = json.load(f)
            out[label] = {"success": r["success_rate"], "ci95": [r["success_ci95_low"], r["success_ci95_high"]],
                          "mean_length": r["episode_length"]}
    finally:
        setattr(noise, name, default)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--config", help="the config to rebuild the env from (default: each run's own)")
    p.add_argument("--episodes", type=int, default=500)
    p.add_argument("--rule", choices=sorted(RULES), default="detour", help="the rule turned off for 'old'")
    args = p.parse_args()
    sys.path.insert(0, os.getcwd())  # a user's env modules, as gyre-ma imports them
    print(json.dumps({"episodes": args.episodes, "rule": args.rule,
                      "runs": [judge(c, args.config, args.episodes, args.rule) for c in args.checkpoints]}))


if __name__ == "__main__":
    main()
