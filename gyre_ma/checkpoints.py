"""Checkpoint files: atomic writes, loaded with ``weights_only=True``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` atomically: temp file in the same folder, fsync, rename, fsync folder.

    A crash at any moment leaves either the previous file or the new one, never half.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint; a missing or corrupt file is a ValueError naming it."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"checkpoint {str(path)!r} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a damaged file
        raise ValueError(f"checkpoint {str(path)!r} cannot be read ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict) or "policy" not in state or "config" not in state:
        raise ValueError(f"checkpoint {str(path)!r} is not a gyre-ma checkpoint (no policy/config)")
    return state
