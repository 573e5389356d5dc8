"""Reading YAML files users write: one clear error for a missing file or bad YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def read_yaml(path: str | Path, what: str, error: type[ValueError] = ValueError) -> Any:
    """Parse ``path``; a missing file or invalid YAML raises ``error`` naming ``what`` and
    the file (the parser's first line says where)."""
    p = Path(path)
    if not p.is_file():
        raise error(f"{what} {str(p)!r} does not exist")
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise error(f"{what} {str(p)!r} is not valid YAML ({str(exc).splitlines()[0]})") from None
