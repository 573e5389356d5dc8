"""gyre-ma from Python: the commands as functions.

Each does exactly what its ``gyre-ma`` command does (the same run directory and files, lock,
checkpoints, checks and refusals; ``train`` writes ``metrics.csv``, the spot checks,
``initial.pt``, ``final.pt`` and ``summary.json`` as the command does) and returns its figures
rather than an exit code. Where the command would exit 2 (a config, a checkpoint, a seed it
refuses), the function raises that one-line error (a ``ValueError``, worded as the command's,
flags and all). ``overrides`` are what ``--set`` gives: dotted keys and their values;
``quiet`` leaves out the command's tables and progress.

    from gyre_ma import api

    api.check("my_task.yaml", play=40)
    summary = api.train("my_task.yaml", overrides={"seed": 1, "name": "my_task_s1"})
    figures = api.evaluate(summary["run_dir"], trust_config=True, episodes=200)
    figures["success_rate"], figures["success_ci95_low"], figures["success_ci95_high"]
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _sets(overrides: Mapping[str, Any] | None) -> list[str]:
    import yaml

    out: list[str] = []
    for key, value in (overrides or {}).items():
        out += ["--set", f"{key}={yaml.safe_dump(value, default_flow_style=True, width=10**9).strip()}"]
        if out[-1].endswith("\n..."):  # a scalar's document end marker
            out[-1] = out[-1][:-4].rstrip()
    return out


def _run(argv: list[str], quiet: bool = False) -> None:
    """Run a command; ``quiet``: without its tables and progress on stdout (warnings and errors stay)."""
    from gyre_ma.cli import COMMANDS, UsageError, _warnings_in_one_line, build_parser

    args = build_parser().parse_args(argv)
    try:
        with _warnings_in_one_line(args.command), \
                contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
            code = COMMANDS[args.command](args)
    except UsageError as exc:  # the command's advice in this API's words, not its flags'
        text = str(exc)
        for flag, argument in _ARGUMENTS:
            text = text.replace(flag, argument)
        raise UsageError(text) from None
    if code:
        raise RuntimeError(f"gyre-ma {' '.join(argv)} ended with exit code {code}")


_ARGUMENTS = (("--config FILE.yaml", "config='FILE.yaml'"), ("--trust-config", "trust_config=True"),
              ("--force-config", "force_config=True"), ("--resume", "resume=True"), ("--greedy", "greedy=True"))
"""A command's flags, as a message names them, and this API's arguments (a session-57 user
was told to "pass --trust-config" by ``api.evaluate``)."""


def check(source: str | Path, *, play: int = 2, overrides: Mapping[str, Any] | None = None,
          quiet: bool = False) -> None:
    """``gyre-ma check``: validate a config, experiment file or option library and play
    ``play`` seeded episodes of a config's env (each replayed); raises on the first problem."""
    _run(["check", str(source), "--play", str(play), *_sets(overrides)], quiet)


def train(config: str | Path, *, overrides: Mapping[str, Any] | None = None, iterations: int | None = None,
          run_root: str | Path | None = None, resume: bool = False, force_config: bool = False,
          quiet: bool = False) -> dict[str, Any]:
    """``gyre-ma train``: train the config's run (``resume``: continue it from its latest
    checkpoint); returns the final iteration's figures (``summary.json``) and ``run_dir``."""
    from gyre_ma.config import load_config

    argv = ["train", str(config), *_sets(overrides)]
    argv += ["--iterations", str(iterations)] if iterations is not None else []
    argv += ["--run-root", str(run_root)] if run_root is not None else []
    argv += ["--resume"] * resume + ["--force-config"] * force_config + ["--quiet"] * quiet
    _run(argv, quiet)
    sets = dict(overrides or {}) | ({"run_root": str(run_root)} if run_root is not None else {})
    run_dir = load_config(config, sets).run_dir
    summary = run_dir / "summary.json"
    return (json.loads(summary.read_text()) if summary.is_file() else {}) | {"run_dir": str(run_dir)}


def evaluate(target: str | Path, *, config: str | Path | None = None, trust_config: bool = False,
             episodes: int = 20, seed: int = 1_000_000, greedy: bool = False, stream: int = 0,
             overrides: Mapping[str, Any] | None = None, quiet: bool = False) -> dict[str, Any]:
    """``gyre-ma eval``: play ``episodes`` held-out task seeds from ``seed`` with a checkpoint,
    a run directory (its ``final.pt``) or a config whose manager does not learn; returns what
    ``--json`` writes: success with its 95 % interval, lengths, milestones, rewards, and each
    episode (``episodes``)."""
    with tempfile.TemporaryDirectory(prefix="gyre-eval-") as folder:
        out = Path(folder) / "eval.json"
        argv = ["eval", str(target), "--episodes", str(episodes), "--seed", str(seed), "--stream", str(stream),
                "--json", str(out), *_sets(overrides)]
        argv += ["--config", str(config)] if config is not None else []
        argv += ["--trust-config"] * trust_config + ["--greedy"] * greedy
        _run(argv, quiet)
        return json.loads(out.read_text())


def compare(first: str | Path | Mapping[str, Any], second: str | Path | Mapping[str, Any], *,
            quiet: bool = False) -> dict[str, Any]:
    """``gyre-ma compare``: two evaluations (what ``evaluate`` returned, or the files ``eval
    --json`` wrote) paired on the task seeds both played; returns the difference in success
    (first − second) with its interval, the McNemar p-value and the seeds each alone solved."""
    with tempfile.TemporaryDirectory(prefix="gyre-compare-") as folder:
        paths = []
        for name, given in (("first", first), ("second", second)):
            if isinstance(given, Mapping):  # evaluate's figures, as eval --json would have written them
                path = Path(folder) / f"{name}.json"
                path.write_text(json.dumps(given))
                given = path
            paths.append(str(given))
        out = Path(folder) / "compare.json"
        _run(["compare", *paths, "--json", str(out)], quiet)
        return json.loads(out.read_text())


def experiment(file: str | Path, *, jobs: int | None = None, root: str | Path | None = None,
               quiet: bool = False) -> Path:
    """``gyre-ma experiment``: train (or resume) every run of the experiment file in ``jobs``
    local processes and evaluate each on held-out seeds; returns the experiment's folder."""
    from gyre_ma.experiment import load_experiment

    argv = ["experiment", str(file)] + (["--jobs", str(jobs)] if jobs is not None else [])
    argv += (["--root", str(root)] if root is not None else []) + ["--quiet"] * quiet
    _run(argv, quiet)
    return load_experiment(file, root=None if root is None else str(root)).folder


def report(exp_dir: str | Path, *, reps: int | None = None, quiet: bool = False) -> dict[str, Any]:
    """``gyre-ma report``: write the experiment's report (Markdown, PNG curves, ``runs.csv``)
    under ``exp_dir/report``; returns ``report.json``'s figures."""
    _run(["report", str(exp_dir), *(["--reps", str(reps)] if reps is not None else [])], quiet)
    return json.loads((Path(exp_dir) / "report" / "report.json").read_text())
