"""Files written whole or not at all: a temp file in the same folder, fsync, rename."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, sync_dir: bool = True) -> None:
    """Temp file in the same folder, fsync, ``os.replace``, fsync of the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:  # a write's error names no file: name it
            raise named(exc, path) from exc
        raise
    if sync_dir:
        fsync_dir(path.parent)


def named(exc: OSError, path: Path) -> OSError:
    """``exc`` (a full disk, a size limit …) as an ``OSError`` of the same errno that names
    ``path``, the file being written."""
    return OSError(exc.errno, exc.strerror or str(exc), str(path))


def strict_json(obj: Any, *, indent: int | None = 2) -> str:
    """``obj`` as strict JSON: NaN and ±inf (which ``json`` would emit as the non-JSON
    tokens ``NaN`` / ``Infinity``) become ``null``."""

    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    return json.dumps(clean(obj), indent=indent, allow_nan=False)


def write_json(path: Path, obj: Any) -> None:
    """``obj`` as strict JSON (:func:`strict_json`), written atomically."""
    atomic_write(Path(path), strict_json(obj).encode())


def write_text(path: Path, text: str) -> None:
    """``text`` written atomically (UTF-8)."""
    atomic_write(Path(path), text.encode())


def lock_folder(folder: Path, what: str, advice: str) -> Any:
    """An exclusive lock on ``folder`` for as long as the returned handle is open
    (``fcntl.flock`` on ``folder/.lock``, which holds the owner's pid): a second process
    doing ``what`` in it is refused with ``advice``, not interleaved."""
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    handle = (folder / ".lock").open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        owner = handle.read().strip() or "another process"
        handle.close()
        raise FolderInUse(f"{str(folder)!r} is in use by another {what} ({owner}); {advice}") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}")
    handle.flush()
    return handle


class FolderInUse(ValueError):
    """Another process holds the folder's lock."""
