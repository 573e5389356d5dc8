"""Reading YAML users write: one clear error for a missing file, bad YAML or a hostile one.

Limits, so that a broken or malicious file fails in a moment with one line instead of a
traceback, a hang or an exhausted memory: a file of at most :data:`MAX_BYTES`, UTF-8 text,
nesting at most :data:`MAX_DEPTH` deep and at most :data:`MAX_NODES` values once its aliases
are expanded (a "billion laughs" bomb expands a few aliases exponentially once the data is
walked; the count is taken on the node graph, without expanding it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 4 << 20
MAX_DEPTH = 64
MAX_NODES = 1_000_000


def read_yaml(path: str | Path, what: str, error: type[ValueError] = ValueError) -> Any:
    """Parse ``path``; a missing, oversized, non-UTF-8 or invalid file raises ``error``
    naming ``what`` and the file (the parser's first line says where)."""
    p = Path(path)
    if not p.is_file():
        relative = "" if p.is_absolute() else (
            f" (a relative path is read from the current folder, {str(Path.cwd())!r}; a config's library and rules "
            "file also from the config's own folder)")
        raise error(f"{what} {str(p)!r} does not exist{relative}")
    size = p.stat().st_size
    if size > MAX_BYTES:
        raise error(f"{what} {str(p)!r} is {size:,} bytes; a YAML file of at most {MAX_BYTES:,} is read")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {str(p)!r} is not UTF-8 text (byte {exc.start})") from None
    return load_yaml(text, f"{what} {str(p)!r}", error)


def load_yaml(text: str, what: str, error: type[ValueError] = ValueError) -> Any:
    """Parse YAML ``text`` within the limits; ``what`` names it in the error."""
    try:
        depth = 0
        aliases = False
        for event in yaml.parse(text, Loader=yaml.SafeLoader):  # iterative: no recursion on deep input
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    raise error(f"{what} nests deeper than {MAX_DEPTH} levels")
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
            elif isinstance(event, yaml.AliasEvent):
                aliases = True
        if aliases and _expanded_size(yaml.compose(text, Loader=yaml.SafeLoader)) > MAX_NODES:
            raise error(f"{what} expands to more than {MAX_NODES:,} values through its YAML aliases (*name); "
                        "refused, as aliases can expand exponentially")
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{what} is not valid YAML ({str(exc).splitlines()[0]})") from None


def _expanded_size(root: yaml.Node | None) -> int:
    """Values in the composed document with every alias expanded, counted on the node
    graph (shared nodes once each, memoised), so a bomb is measured without expanding it."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        sizes[id(node)] = MAX_NODES + 1  # a node inside itself (a recursive alias) counts as too big
        if isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(v) for v in node.value)
        else:
            total = 1
        sizes[id(node)] = total = min(total, MAX_NODES + 1)
        return total

    return 0 if root is None else size(root)
