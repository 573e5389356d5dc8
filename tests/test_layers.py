"""Imports point one way: options → envs → agents → the core in gyre_ma/, and form no cycle.

Read from the sources' ASTs, so a lazy import inside a function counts as much as one at
the top of a module; only imports under ``if TYPE_CHECKING:`` are exempt.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
# source folder → (dotted package, layer rank); a module may import its own layer or lower
LAYERS = {"options": ("gyre_ma.options", 0), "envs": ("gyre_ma.envs", 1), "agents": ("gyre_ma.agents", 2),
          "gyre_ma": ("gyre_ma", 3)}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, (package, _) in LAYERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def layer(module: str) -> int:
    for package, rank in sorted(LAYERS.values(), key=lambda v: -len(v[0])):
        if module == package or module.startswith(package + "."):
            return rank
    raise KeyError(module)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def imports(module: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """The project modules ``module`` imports, with the line of each import."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _type_checking_nodes(tree)
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out += [(t, node.lineno) for t in targets if t in known]
    return out


def graph() -> nx.DiGraph:
    mods = _modules()
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for module, path in mods.items():
        for target, line in imports(module, path, set(mods)):
            if target != module:
                g.add_edge(module, target, line=line, path=path)
    return g


def test_the_source_tree_is_found() -> None:
    mods = _modules()
    assert {"gyre_ma.options.graph", "gyre_ma.envs.base", "gyre_ma.agents.manager", "gyre_ma.loop"} <= set(mods)


def test_no_import_points_up_a_layer() -> None:
    g = graph()
    up = [f"{d['path'].relative_to(ROOT)}:{d['line']}: {a} imports {b}"
          for a, b, d in g.edges(data=True) if layer(b) > layer(a)]
    assert not up, "imports pointing up a layer (options → envs → agents → gyre_ma):\n" + "\n".join(up)


def test_no_import_cycle() -> None:
    cycles = list(nx.simple_cycles(graph()))
    assert not cycles, "import cycles:\n" + "\n".join(" → ".join([*c, c[0]]) for c in cycles)


def test_no_production_module_is_named_testing() -> None:
    named = [m for m in _modules() if m.rsplit(".", 1)[-1] == "testing"]
    assert not named, f"production code ships modules named 'testing': {named}"


@pytest.mark.parametrize(("source", "expected"), [
    ("from gyre_ma.loop import Gyre\n", "gyre_ma.loop"),
    ("import gyre_ma.agents.manager\n", "gyre_ma.agents.manager"),
    ("from . import graph\n", "gyre_ma.options.graph"),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gyre_ma.loop import Gyre\n", None),
    ("def f():\n    from gyre_ma.loop import Gyre\n", "gyre_ma.loop"),
])
def test_the_reader_sees_each_kind_of_import(tmp_path: Path, source: str, expected: str | None) -> None:
    path = tmp_path / "mod.py"
    path.write_text(source)
    known = {"gyre_ma.loop", "gyre_ma.agents.manager", "gyre_ma.options.graph", "gyre_ma.options"}
    found = [t for t, _ in imports("gyre_ma.options.library", path, known)]
    assert found == ([expected] if expected else [])
