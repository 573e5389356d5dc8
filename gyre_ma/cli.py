"""The ``gyre-ma`` command line. User mistakes exit with code 2 and one line, no traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from gyre_ma.config import ConfigError, ExperimentConfig, load_config

console = Console(stderr=False, highlight=False)
err_console = Console(stderr=True, highlight=False)


class UsageError(ValueError):
    """A mistake in how the command was called."""


def _load_library_and_config(source: str) -> tuple[Any, ExperimentConfig | None]:
    """A config YAML, a library YAML, or ``module:callable`` → (OptionLibrary, config)."""
    from gyre_ma.envs.registry import make_env, make_library
    from gyre_ma.options.library import OptionLibrary

    path = Path(source)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.exists():
            raise UsageError(f"file {source!r} does not exist")
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path.name}: not valid YAML ({str(exc).splitlines()[0]})") from None
        if isinstance(data, dict) and "options" in data and "graph" in data:
            return OptionLibrary.from_spec(data, where=path.name), None
        config = load_config(path)
        env = make_env(config.env.id, **config.env.kwargs)
        return make_library(config.env.id, env, config.library), config
    return OptionLibrary.load(source), None


def cmd_check(args: argparse.Namespace) -> int:
    library, config = _load_library_and_config(args.source)
    graph = library.graph
    length, path = graph.critical_path()
    table = Table(title=f"option library {library.name!r}: {len(library)} options")
    for col in ("option", "milestone", "kind", "max_steps"):
        table.add_column(col)
    for opt in library:
        kind = "repeatable" if opt.repeatable else "upkeep" if opt.milestone is None else "one-shot"
        table.add_row(opt.name, opt.milestone or "—", kind, str(opt.max_steps))
    console.print(table)
    console.print(
        f"task graph: {len(graph)} milestones, goals {list(graph.goals)}; "
        f"critical path {length:g} steps: {' → '.join(path)}"
    )
    if config is not None:
        console.print(f"config {args.source!r}: valid (experiment {config.name!r}, env {config.env.id})")
    console.print("[green]ok[/green]")
    return 0


def cmd_graph(args: argparse.Namespace) -> int:
    library, _ = _load_library_and_config(args.source)
    achieved = [a for a in (args.achieved or "").split(",") if a]
    for a in achieved:
        if a not in library.graph:
            raise UsageError(f"--achieved: {a!r} is not a milestone; known: {list(library.graph.names)}")
    out = Path(args.out)
    if out.suffix.lower() == ".dot":
        out.write_text(library.graph.to_dot(achieved))
    elif out.suffix.lower() == ".png":
        library.graph.draw(str(out), achieved=achieved, title=f"{library.name} — task graph")
    else:
        raise UsageError(f"--out: expected a .png or .dot file, got {args.out!r}")
    if args.dot:
        Path(args.dot).write_text(library.graph.to_dot(achieved))
    console.print(f"wrote {out}")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"check": cmd_check, "graph": cmd_graph}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gyre-ma", description=__doc__)
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check", help="validate a config or option library without running it")
    p.add_argument("source", help="config YAML, library YAML, or module:callable")
    p = sub.add_parser("graph", help="draw a library's task graph")
    p.add_argument("source", help="config YAML, library YAML, or module:callable")
    p.add_argument("--out", default="graph.png", help="output .png or .dot")
    p.add_argument("--dot", help="also write DOT text here")
    p.add_argument("--achieved", help="comma-separated milestones to colour as achieved")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed its one-line usage error
        return int(exc.code or 0)
    try:
        return COMMANDS[args.command](args)
    except (ValueError, TypeError) as exc:  # ConfigError and UsageError are ValueErrors
        if args.debug:
            raise
        err_console.print(f"gyre-ma {args.command}: error: {exc}", markup=False, soft_wrap=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
