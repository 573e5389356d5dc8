"""Wall time of ``gyre-ma`` commands that should not pay for torch, Lightning or Ray.

``python benchmarks/cli_startup.py [--repeats 5]`` runs, each in a fresh subprocess,
``gyre-ma --help``, ``gyre-ma train --help``, ``gyre-ma check configs/quickstart.yaml``,
``gyre-ma eval`` of a quickstart checkpoint on one episode (it needs torch, not the
learner's Lightning; the checkpoint comes from an untimed one-iteration run) and, for
reference, ``python -c "import torch"``, ``"import lightning"``, and the imports of what
``gyre-ma eval`` builds now (``gyre_ma.player``) and built before session 39 (``gyre_ma.loop``,
the learner); it reports the median and the spread of the wall times and which of
torch/lightning/ray each command imported (a ``-X importtime`` run, counted apart). Prints
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "lightning", "ray")
CLI = [sys.executable, "-m", "gyre_ma.cli"]
CASES = {
    "help": [*CLI, "--help"],
    "train_help": [*CLI, "train", "--help"],
    "check_quickstart": [*CLI, "check", "configs/quickstart.yaml"],
    "import_torch": [sys.executable, "-c", "import torch"],
    "import_lightning": [sys.executable, "-c", "import lightning"],
    # what gyre-ma eval imports to play a checkpoint: the Player since session 39, the whole
    # learner (gyre_ma.loop, with Lightning) before
    "import_player": [sys.executable, "-c", "import gyre_ma.player"],
    "import_loop": [sys.executable, "-c", "import gyre_ma.loop"],
}


def eval_case(root: Path) -> list[str]:
    """``gyre-ma eval`` of one episode, on the checkpoint of a one-iteration quickstart run in ``root``."""
    subprocess.run([*CLI, "train", "configs/quickstart.yaml", "--iterations", "1", "--quiet", "--run-root", str(root)],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return [*CLI, "eval", str(root / "quickstart" / "checkpoints" / "final.pt"), "--episodes", "1"]


def wall_time(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def heavy_imports(cmd: list[str]) -> list[str]:
    """Top-level packages among HEAVY that the command imported, read from ``-X importtime``."""
    env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    seen = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return [m for m in HEAVY if m in seen]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per command (after one warm-up)")
    args = parser.parse_args()
    out: dict[str, object] = {"benchmark": "cli_startup", "target_help_s": 1.0, "repeats": args.repeats,
                              "load_average_1min": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="gyre-cli-startup-") as root:
        cases = CASES | {"eval_quickstart_1_episode": eval_case(Path(root))}
        for name, cmd in cases.items():
            wall_time(cmd)  # warm the file cache
            times = [wall_time(cmd) for _ in range(args.repeats)]
            out[name] = {"median_s": round(statistics.median(times), 3), "min_s": round(min(times), 3),
                         "max_s": round(max(times), 3), "imports": heavy_imports(cmd)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
