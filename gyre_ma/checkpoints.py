"""Checkpoints: atomic files loaded with ``weights_only=True``, and the three-slot manager.

:func:`save_checkpoint` / :func:`load_checkpoint` write and read one file (the CLI's
``final.pt``). :class:`CheckpointManager` keeps three slots in one folder — ``latest``
(latest stable), ``pre_update`` (before the last large update), ``best`` (best
validation) — behind a JSON manifest holding each slot file's SHA-256, each also under a
stable name (``best.pt``, ``latest.pt``, ``pre_update.pt``); it rolls back to
the best slot when validation drops, with a learning-rate cut. :class:`NanGuard` skips
updates with non-finite numbers and asks for a rollback after ``K`` in a row.

Arbitrary nested state (tensors, numbers, strings, lists, tuples, dicts, numpy arrays and
scalars, ``numpy.random.Generator``) round-trips through :func:`to_storable` /
:func:`from_storable`, which reduce it to what ``torch.load(weights_only=True)`` accepts.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import pickle
import random
import re
import shutil
import time
import zipfile
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from gyre_ma.files import atomic_write, fsync_dir, write_json

Slot = Literal["latest", "pre_update", "best"]
SLOTS: tuple[Slot, ...] = ("latest", "pre_update", "best")
MANIFEST = "manifest.json"


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` atomically: temp file in the same folder, fsync, rename, fsync folder.

    A crash at any moment leaves either the previous file or the new one, never half.
    """
    path = Path(path)
    buf = io.BytesIO()
    torch.save(to_storable(state), buf)
    atomic_write(path, buf.getvalue())
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint; a missing or corrupt file is a ValueError naming it."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"checkpoint {str(path)!r} does not exist")
    if path.is_dir():
        raise ValueError(f"checkpoint {str(path)!r} is a directory; pass a checkpoint file in it, e.g. "
                         f"{str(path / 'checkpoints' / 'best.pt')!r}")
    if not zipfile.is_zipfile(path):  # what torch.save writes; random bytes would read as a refused pickle
        raise ValueError(f"checkpoint {str(path)!r} cannot be read: it is damaged or not a checkpoint (not the "
                         "zip archive torch.save writes)")
    data = path.read_bytes()
    expected = _manifest_record(path)
    if expected is not None and hashlib.sha256(data).hexdigest() != expected[1]:
        what = f"the run's {expected[0]!r} slot" if expected[0] in SLOTS else f"the run's {expected[0]}"
        raise ValueError(f"checkpoint {str(path)!r} is {what}, but its SHA-256 is not the one the folder's "
                         f"{MANIFEST} records (corrupt or replaced since it was written)")
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "GLOBAL" in str(exc):  # weights_only refused to import a callable: loading it would run code
            raise ValueError(f"checkpoint {str(path)!r} was refused: it holds objects other than tensors and "
                             "plain data, and loading those would run code; gyre-ma loads data only") from None
        raise ValueError(f"checkpoint {str(path)!r} cannot be read: it is damaged or not a checkpoint "
                         "(UnpicklingError)") from None
    except Exception as exc:  # torch raises many types for a damaged file or a file of another kind
        raise ValueError(f"checkpoint {str(path)!r} cannot be read: it is damaged or not a checkpoint "
                         f"({type(exc).__name__})") from None
    if not isinstance(state, dict) or "policy" not in state or "config" not in state:
        raise ValueError(f"checkpoint {str(path)!r} is not a gyre-ma checkpoint (no policy/config)")
    try:
        return from_storable(state)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"checkpoint {str(path)!r} is damaged: {str(exc)[:200]}") from None


def _manifest_record(path: Path) -> tuple[str, str] | None:
    """The slot and SHA-256 its folder's manifest records for the checkpoint at ``path``
    (a slot file, or a hard link to one: ``latest.pt``), where it records one. A copy of a
    slot file under another name is not checked: it may be an older slot, whole."""
    manifest = path.parent / MANIFEST
    try:
        manifest_data = json.loads(manifest.read_text()) if manifest.is_file() else {}
        slots = manifest_data.get("slots", {})
    except (OSError, ValueError, AttributeError):
        return None  # a manifest that cannot be read says nothing here; training refuses it
    files = manifest_data.get("files", {}) if isinstance(manifest_data, dict) else {}
    if isinstance(files, dict) and isinstance(files.get(path.name), str):  # final.pt, initial.pt
        return path.name, files[path.name]
    for slot, record in slots.items() if isinstance(slots, dict) else ():
        name = record.get("file") if isinstance(record, dict) else None
        if not isinstance(name, str) or not _SLOT_FILE.match(name) or not isinstance(record.get("sha256"), str):
            continue
        target = path.parent / name
        if name == path.name or (target.is_file() and os.path.samefile(target, path)):
            return str(slot), record["sha256"]
    return None


# --------------------------------------------------------------------------- storable state
_NDARRAY, _GENERATOR = "__gyre_ndarray__", "__gyre_numpy_generator__"
_SLOT_FILE = re.compile(r"^[a-z_]+-[0-9a-f]{16}\.pt$")
"""A slot file's name as the manager writes it (``<slot>-<hash16>.pt``), in its own folder."""
_BIT_GENERATORS = frozenset({"PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64"})


def to_storable(obj: Any, where: str = "state") -> Any:
    """Reduce nested state to types ``torch.load(weights_only=True)`` accepts.

    numpy arrays become ``{_NDARRAY: uint8 tensor, dtype, shape}``, numpy scalars Python
    numbers, a ``numpy.random.Generator`` its bit-generator state. Anything else that is
    not a tensor, number, string, bytes, None, list, tuple or dict is a TypeError naming
    its place (``where``).
    """
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, torch.Tensor)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise TypeError(f"{where}: numpy arrays of objects cannot be stored")
        arr = np.ascontiguousarray(obj)
        return {_NDARRAY: torch.frombuffer(bytearray(arr.tobytes()), dtype=torch.uint8) if arr.nbytes
                else torch.zeros(0, dtype=torch.uint8), "dtype": arr.dtype.str, "shape": list(obj.shape)}
    if isinstance(obj, np.random.Generator):
        return {_GENERATOR: to_storable(obj.bit_generator.state, where)}
    if isinstance(obj, OrderedDict):  # a module's state_dict: keep its type and _metadata
        out = OrderedDict((k, to_storable(v, f"{where}.{k}")) for k, v in obj.items())
        if hasattr(obj, "_metadata"):
            out._metadata = obj._metadata  # type: ignore[attr-defined]
        return out
    if isinstance(obj, Mapping):
        return {k: to_storable(v, f"{where}.{k}") for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(to_storable(v, f"{where}[{i}]") for i, v in enumerate(obj))
    if isinstance(obj, list):
        return [to_storable(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    raise TypeError(f"{where}: cannot store a {type(obj).__name__} in a checkpoint; "
                    "expected tensors, numbers, strings, lists, tuples, dicts or numpy arrays")


def from_storable(obj: Any) -> Any:
    """Inverse of :func:`to_storable` (a stored Generator comes back as a Generator)."""
    if isinstance(obj, OrderedDict):
        out = OrderedDict((k, from_storable(v)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):
            out._metadata = obj._metadata  # type: ignore[attr-defined]
        return out
    if isinstance(obj, dict):
        if _NDARRAY in obj:
            raw = obj[_NDARRAY].numpy().tobytes()
            dtype = np.dtype(obj["dtype"])
            if dtype.hasobject:
                raise ValueError("a stored numpy array of objects")
            return np.frombuffer(raw, dtype=dtype).reshape(tuple(obj["shape"])).copy()
        if _GENERATOR in obj:
            state = from_storable(obj[_GENERATOR])
            name = state.get("bit_generator") if isinstance(state, dict) else None
            if name not in _BIT_GENERATORS:
                raise ValueError(f"stored random generator {str(name)[:100]!r} is not one of {sorted(_BIT_GENERATORS)}")
            bit_generator = getattr(np.random, name)()
            bit_generator.state = state
            return np.random.Generator(bit_generator)
        return {k: from_storable(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(from_storable(v) for v in obj)
    if isinstance(obj, list):
        return [from_storable(v) for v in obj]
    return obj


def rng_snapshot(*, torch_generators: Mapping[str, torch.Generator] | None = None,
                 numpy_generators: Mapping[str, np.random.Generator] | None = None) -> dict[str, Any]:
    """Every RNG state a resume needs: torch (global and given generators), numpy (legacy
    global and given Generators), Python's ``random``. Storable as is."""
    return {
        "torch": torch.get_rng_state(),
        "torch_generators": {k: g.get_state() for k, g in (torch_generators or {}).items()},
        "numpy_global": np.random.get_state(),
        "numpy_generators": {k: g.bit_generator.state for k, g in (numpy_generators or {}).items()},
        "python": random.getstate(),
    }


def restore_rng(snapshot: Mapping[str, Any], *, torch_generators: Mapping[str, torch.Generator] | None = None,
                numpy_generators: Mapping[str, np.random.Generator] | None = None) -> None:
    """Put back the states of :func:`rng_snapshot` (after a :func:`from_storable` round trip)."""
    torch.set_rng_state(snapshot["torch"])
    for name, g in (torch_generators or {}).items():
        g.set_state(snapshot["torch_generators"][name])
    np.random.set_state(tuple(snapshot["numpy_global"]))
    for name, g in (numpy_generators or {}).items():
        g.bit_generator.state = snapshot["numpy_generators"][name]
    version, internal, gauss = snapshot["python"]
    random.setstate((version, tuple(internal), gauss))


# --------------------------------------------------------------------------- decisions
@dataclass(frozen=True)
class Rollback:
    """One rollback, as recorded in the manifest and returned to the loop."""

    slot: Slot
    """The slot restored."""
    reason: str
    step: int | None
    score: float | None
    """The validation score (or None) that triggered it."""
    best_score: float | None
    lr_scale: float
    """Cumulative learning-rate multiplier after the cut (relative to the configured LR)."""
    time: float


@dataclass(frozen=True)
class ValidationDecision:
    """What :meth:`CheckpointManager.validate` decided, and what the loop must do."""

    action: Literal["improved", "kept", "rollback"]
    score: float
    best_score: float | None
    lr_scale: float
    """Apply with :func:`apply_lr_scale` (it changes only on a rollback)."""
    state: dict[str, Any] | None = None
    """On a rollback: the restored state, to pass to ``load_state_dict``."""
    purge_latest_batch: bool = False
    """On a rollback: drop the latest batch from the buffer (``TrajectoryBuffer.purge``)."""
    rollback: Rollback | None = None

    @property
    def rolled_back(self) -> bool:
        return self.action == "rollback"


def load_weights(module: Any, state: Any, what: str) -> None:
    """``module.load_state_dict(state)``; a checkpoint whose network does not fit the one the
    config builds (another ``manager.hidden``, library or env) is one error naming ``what``
    and the weights that differ, with both shapes, not a traceback. Weights that are not
    finite are refused: a policy of NaNs picks the first eligible option at every decision
    (every logit NaN), and an evaluation of it looked like a policy that had learned."""
    if isinstance(state, Mapping):
        broken = [name for name, t in state.items()
                  if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all())]
        if broken:
            raise ValueError(f"checkpoint {what}: weights {broken[:4]}{' …' if len(broken) > 4 else ''} hold NaN or "
                             "infinite values (training never writes them: its updates skip non-finite steps); the "
                             "file was damaged or edited: use another checkpoint of the run (best.pt, latest.pt)")
    try:
        module.load_state_dict(state)
    except RuntimeError as exc:
        own = module.state_dict()
        differ = [f"{name}: checkpoint {tuple(t.shape)}, this config {tuple(own[name].shape)}"
                  for name, t in state.items() if name in own and isinstance(t, torch.Tensor)
                  and t.shape != own[name].shape] if isinstance(state, Mapping) else []
        text = "; ".join(differ[:4]) if differ else " ".join(str(exc).split())
        raise ValueError(f"checkpoint {what}: its weights do not fit the network this config builds ("
                         f"{text[:400]}{'…' if len(text) > 400 else ''}); the config's manager, library or env "
                         "differs from the run that wrote it (a layer's size follows manager.hidden, the library's "
                         "options and the env's observations): use that run's config") from None


def apply_lr_scale(optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer], lr_scale: float) -> None:
    """Set every param group's ``lr`` to its base LR × ``lr_scale``.

    The base LR is remembered in the group (``base_lr``) the first time, so that scales
    are absolute, and survives ``optimizer.state_dict()``.
    """
    if isinstance(optimizers, torch.optim.Optimizer):
        optimizers = [optimizers]
    for opt in optimizers:
        for group in opt.param_groups:
            group.setdefault("base_lr", group["lr"])
            group["lr"] = group["base_lr"] * lr_scale


def parameter_step_size(before: Mapping[str, torch.Tensor], after: Mapping[str, torch.Tensor]) -> float:
    """Relative L2 size of an update, ‖θ' − θ‖ / (‖θ‖ + ε), over floating-point tensors."""
    num = den = 0.0
    for name, old in before.items():
        if not torch.is_tensor(old) or not old.is_floating_point():
            continue
        new = after[name]
        num += float((new.detach().double() - old.detach().double()).pow(2).sum())
        den += float(old.detach().double().pow(2).sum())
    return math.sqrt(num) / (math.sqrt(den) + 1e-12)


# --------------------------------------------------------------------------- the manager
def _place(source: Path, target: Path) -> None:
    """``target`` becomes ``source``'s file, atomically: a hard link (a copy where the
    filesystem has none) under a temporary name, renamed over ``target``, the folder fsynced."""
    if target.exists() and os.path.samefile(source, target):
        return  # already (rename() of one hard link onto another of the same file does nothing)
    tmp = target.with_name(f".{target.name}.link.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)
    fsync_dir(target.parent)


@dataclass
class _SlotRecord:
    file: str
    sha256: str
    bytes: int
    saved_at: float
    step: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)


class CheckpointManager:
    """Three checkpoint slots behind a hash-checked manifest, with rollback.

    Each save writes a new slot file ``<slot>-<sha256[:16]>.pt`` atomically, then the
    manifest atomically, then removes the slot's previous file: a crash at any moment
    leaves a manifest whose every entry names a whole file with the recorded hash.
    Leftovers of a crash (temporary and unreferenced slot files) are removed on open.
    """

    def __init__(self, directory: str | Path, *, rollback_threshold: float = 0.1, lr_cut: float = 0.5,
                 min_lr_scale: float = 1e-3, large_update_kl: float | None = 0.05,
                 large_update_step: float | None = None, higher_is_better: bool = True) -> None:
        checks = [
            ("rollback_threshold", rollback_threshold, rollback_threshold >= 0, ">= 0"),
            ("lr_cut", lr_cut, 0 < lr_cut <= 1, "in (0, 1]"),
            ("min_lr_scale", min_lr_scale, 0 < min_lr_scale <= 1, "in (0, 1]"),
            ("large_update_kl", large_update_kl, large_update_kl is None or large_update_kl > 0, "None or > 0"),
            ("large_update_step", large_update_step, large_update_step is None or large_update_step > 0,
             "None or > 0"),
        ]
        for name, value, ok, expected in checks:
            if not ok:
                raise ValueError(f"`{name}` ({value!r}) must be {expected}")
        self.directory = Path(directory)
        self.rollback_threshold = rollback_threshold
        self.lr_cut = lr_cut
        self.min_lr_scale = min_lr_scale
        self.large_update_kl = large_update_kl
        self.large_update_step = large_update_step
        self.higher_is_better = higher_is_better
        self.directory.mkdir(parents=True, exist_ok=True)
        self._manifest = self._read_manifest()
        self._clean()

    # ----------------------------------------------------------- manifest
    @property
    def manifest_path(self) -> Path:
        return self.directory / MANIFEST

    def _read_manifest(self) -> dict[str, Any]:
        path = self.manifest_path
        if not path.exists():
            return {"format": 1, "slots": {}, "best_score": None, "lr_scale": 1.0, "rollbacks": []}
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict) or not isinstance(data.get("slots"), dict):
                raise ValueError("no 'slots' mapping")
            for slot, record in data["slots"].items():  # a slot names a file in this folder, nothing else
                name = record.get("file") if isinstance(record, dict) else None
                if slot not in SLOTS or not isinstance(name, str) or not _SLOT_FILE.match(name):
                    raise ValueError(f"slot {str(slot)[:50]!r} names {str(name)[:100]!r}, not a slot file of this "
                                     "folder")
        except (ValueError, json.JSONDecodeError) as exc:
            raise ValueError(f"checkpoint manifest {str(path)!r} cannot be read ({exc})") from None
        return data

    def _write_manifest(self) -> None:
        write_json(self.manifest_path, self._manifest)  # strict: a rollback on a NaN score records null

    def _clean(self) -> None:
        """Remove temp files and slot files the manifest does not name (crash leftovers)."""
        keep = {rec["file"] for rec in self._manifest["slots"].values()}
        pattern = re.compile(rf"^({'|'.join(SLOTS)})-[0-9a-f]{{16}}\.pt$")
        for p in self.directory.iterdir():
            if p.name.endswith(".tmp") or (pattern.match(p.name) and p.name not in keep):
                p.unlink(missing_ok=True)
        for slot in SLOTS:  # a crash may have left a stable name on the slot's previous file
            record = self._manifest["slots"].get(slot)
            if record is not None and (self.directory / record["file"]).is_file():
                _place(self.directory / record["file"], self.directory / f"{slot}.pt")
            elif record is None:
                (self.directory / f"{slot}.pt").unlink(missing_ok=True)

    @property
    def manifest(self) -> dict[str, Any]:
        return json.loads(json.dumps(self._manifest))

    @property
    def best_score(self) -> float | None:
        return self._manifest["best_score"]

    @property
    def best_episodes(self) -> int | None:
        """How many episodes the best score was measured on (None: not recorded)."""
        return self._manifest.get("best_episodes")

    @property
    def best_length(self) -> float | None:
        """The mean episode length behind the best score (None: not recorded): among
        validations of equal success, the shorter paths are the better policy."""
        return self._manifest.get("best_length")

    @property
    def lr_scale(self) -> float:
        return float(self._manifest["lr_scale"])

    @property
    def rollbacks(self) -> list[Rollback]:
        return [Rollback(**r) for r in self._manifest["rollbacks"]]

    _DECISIONS = ("best_score", "best_episodes", "best_length", "lr_scale", "rollbacks")

    def decisions(self) -> dict[str, Any]:
        """What validation decides from — the best score and its episodes, the LR scale,
        the rollbacks so far — to be stored in the ``latest`` slot with the learner."""
        return {k: json.loads(json.dumps(self._manifest.get(k))) for k in self._DECISIONS}

    def restore_decisions(self, decisions: Mapping[str, Any]) -> None:
        """Set the decision state back to what :meth:`decisions` stored (a resume): a kill
        between a mid-iteration save (a new best, a rollback) and that iteration's
        ``latest`` left the manifest one iteration ahead of the learner it resumes; the
        iteration is then replayed and decides the same again."""
        for k in self._DECISIONS:
            self._manifest[k] = json.loads(json.dumps(decisions.get(k)))
        self._manifest["lr_scale"] = float(self._manifest["lr_scale"] if self._manifest["lr_scale"] is not None
                                           else 1.0)
        self._manifest["rollbacks"] = self._manifest["rollbacks"] or []
        self._write_manifest()

    def has(self, slot: Slot) -> bool:
        return slot in self._manifest["slots"]

    def path(self, slot: Slot) -> Path:
        self._check_slot(slot)
        if not self.has(slot):
            raise ValueError(f"checkpoint slot {slot!r} is empty in {str(self.directory)!r}")
        return self.directory / self._manifest["slots"][slot]["file"]

    @staticmethod
    def _check_slot(slot: str) -> None:
        if slot not in SLOTS:
            raise ValueError(f"checkpoint slot {slot!r} does not exist; expected one of {list(SLOTS)}")

    # ----------------------------------------------------------- save / load
    def save(self, slots: Slot | Sequence[Slot], state: Mapping[str, Any], *, step: int | None = None,
             metrics: Mapping[str, float] | None = None) -> Path:
        """Write ``state`` (any nested storable state, see :func:`to_storable`) to one slot or
        several, serialised and hashed once; returns the first slot's file."""
        slots = (slots,) if isinstance(slots, str) else tuple(slots)
        for slot in slots:
            self._check_slot(slot)
        buf = io.BytesIO()
        torch.save(to_storable(dict(state)), buf)
        data = buf.getvalue()
        digest = hashlib.sha256(data).hexdigest()
        paths = [self._put(slot, digest, len(data), step=step, metrics=metrics, data=data) for slot in slots]
        return paths[0]

    def promote(self, source: Slot, target: Slot, *, step: int | None = None,
                metrics: Mapping[str, float] | None = None) -> Path:
        """Give ``target`` ``source``'s file as it is (a hard link where the filesystem has
        them): nothing re-serialised, re-hashed or rewritten."""
        self._check_slot(target)
        record = self._manifest["slots"].get(source) if source in SLOTS else None
        if record is None:
            raise ValueError(f"cannot copy checkpoint slot {source!r} to {target!r}: {source!r} is empty "
                             f"in {str(self.directory)!r}")
        return self._put(target, record["sha256"], record["bytes"], step=step, metrics=metrics,
                         source=self.directory / record["file"])

    def _put(self, slot: Slot, digest: str, nbytes: int, *, step: int | None, metrics: Mapping[str, float] | None,
             data: bytes | None = None, source: Path | None = None) -> Path:
        """Make ``slot``'s new file from ``data`` (written atomically) or ``source`` (linked),
        then write the manifest, then drop the slot's old file."""
        name = f"{slot}-{digest[:16]}.pt"
        old = self._manifest["slots"].get(slot, {}).get("file")
        if data is not None:
            atomic_write(self.directory / name, data)
        else:
            _place(source, self.directory / name)
        record = _SlotRecord(name, digest, nbytes, time.time(), step,
                             {k: float(v) for k, v in (metrics or {}).items()})
        self._manifest["slots"][slot] = asdict(record)
        self._write_manifest()
        # ``<slot>.pt`` (best.pt, latest.pt, pre_update.pt): the slot's file under a name a user can
        # pass to ``gyre-ma eval``; the hashed file the manifest names stays the record
        _place(self.directory / name, self.directory / f"{slot}.pt")
        if old and old != name:
            (self.directory / old).unlink(missing_ok=True)
        return self.directory / name

    def load(self, slot: Slot) -> dict[str, Any]:
        """The state in ``slot``; a missing, corrupt or mismatched file is a ValueError naming it."""
        path = self.path(slot)
        record = self._manifest["slots"][slot]
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ValueError(f"checkpoint slot {slot!r}: file {path.name!r} cannot be read ({exc})") from None
        digest = hashlib.sha256(data).hexdigest()
        if digest != record["sha256"]:
            raise ValueError(f"checkpoint slot {slot!r}: file {path.name!r} has SHA-256 {digest[:16]}…, "
                             f"the manifest says {record['sha256'][:16]}… (corrupt or replaced)")
        try:
            state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - torch raises many types for a damaged file
            raise ValueError(f"checkpoint slot {slot!r}: file {path.name!r} cannot be loaded "
                             f"({type(exc).__name__}: {exc})") from None
        return from_storable(state)

    def record_file(self, path: str | Path) -> None:
        """Record the SHA-256 of a checkpoint written beside the slots (``final.pt``) in
        the manifest, so that loading it checks it as a slot's is."""
        path = Path(path)
        self._manifest.setdefault("files", {})[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
        self._write_manifest()

    def verify(self) -> dict[str, bool]:
        """Whether each filled slot's file matches its manifest hash."""
        out = {}
        for slot in self._manifest["slots"]:
            path = self.directory / self._manifest["slots"][slot]["file"]
            out[slot] = path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == \
                self._manifest["slots"][slot]["sha256"]
        return out

    # ----------------------------------------------------------- large updates
    def is_large_update(self, *, kl: float | None = None, step_size: float | None = None) -> bool:
        """KL or relative step size above its threshold (a non-finite one counts as large)."""
        for value, limit in ((kl, self.large_update_kl), (step_size, self.large_update_step)):
            if value is not None and limit is not None and not (value <= limit):
                return True
        return False

    def after_update(self, pre_update_state: Mapping[str, Any] | None, *, kl: float | None = None,
                     step_size: float | None = None, step: int | None = None) -> bool:
        """Keep the state from before the update in ``pre_update`` if the update was large;
        return whether it was. ``pre_update_state`` None: it is the one in ``latest`` (the
        learner saves ``latest`` at the end of every iteration, before the next update), which
        is copied as it is."""
        large = self.is_large_update(kl=kl, step_size=step_size)
        if large and pre_update_state is None and not self.has("latest"):
            return large  # the run's first update: no earlier state was stored to keep
        if large:
            metrics = {k: v for k, v in (("kl", kl), ("step_size", step_size)) if v is not None}
            if pre_update_state is None:
                self.promote("latest", "pre_update", step=step, metrics=metrics)
            else:
                self.save("pre_update", pre_update_state, step=step, metrics=metrics)
        return large

    # ----------------------------------------------------------- validation and rollback
    def validate(self, score: float, state: Mapping[str, Any] | None, *, step: int | None = None,
                 episodes: int | None = None, length: float | None = None,
                 allow_rollback: bool = True) -> ValidationDecision:
        """Record a validation score for the judged ``state``.

        Better than the best — or as good, with a shorter mean episode ``length`` than the
        best's (so that where success saturates early, best is not the first policy to reach
        it, however long its paths) → ``best`` ← state (and ``latest``). Worse than the best
        by more than ``rollback_threshold`` (or non-finite) → rollback to ``best``. Otherwise
        ``latest`` ← state. ``state`` None: the judged state is the one in ``latest``; it is
        copied to ``best`` as it is, and ``latest`` is left to the caller. ``episodes``, the
        number behind ``score``, is kept with a new best (:attr:`best_episodes`), as is
        ``length`` (:attr:`best_length`); with ``allow_rollback`` False a drop is only
        recorded as ``kept``.
        """
        score = float(score)
        best = self.best_score
        sign = 1.0 if self.higher_is_better else -1.0
        shorter = (score == best and length is not None and math.isfinite(length)
                   and self.best_length is not None and length < self.best_length)
        if math.isfinite(score) and (best is None or sign * (score - best) > 0 or shorter):
            kept = {k: self._manifest.get(k) for k in ("best_score", "best_episodes", "best_length")}
            self._manifest["best_score"] = score  # written with the best slot, atomically
            self._manifest["best_episodes"] = episodes
            self._manifest["best_length"] = length if length is not None and math.isfinite(length) else None
            try:
                if state is None:
                    self.promote("latest", "best", step=step, metrics={"score": score})
                else:
                    self.save(("best", "latest"), state, step=step, metrics={"score": score})
            except BaseException:
                self._manifest.update(kept)
                raise
            return ValidationDecision("improved", score, score, self.lr_scale)
        if allow_rollback and best is not None and (not math.isfinite(score)
                                                     or sign * (best - score) > self.rollback_threshold):
            worse = "<" if self.higher_is_better else ">"
            reason = f"validation {score:.4g} {worse} best {best:.4g} by more than {self.rollback_threshold:g}"
            return self.rollback(reason=reason, step=step, score=score)
        if math.isfinite(score) and state is not None:  # no best yet: keep nothing from a broken state
            self.save("latest", state, step=step, metrics={"score": score})
        return ValidationDecision("kept", score, best, self.lr_scale)

    def rollback(self, *, reason: str, step: int | None = None, score: float | None = None,
                 order: tuple[Slot, ...] = ("best", "latest", "pre_update")) -> ValidationDecision:
        """Restore the first filled slot of ``order``, cut the LR, ask for a buffer purge.

        The restored state is also written to ``latest`` so that a crash right after the
        rollback resumes from it. Raises ValueError when every slot of ``order`` is empty.
        """
        slot = next((s for s in order if self.has(s)), None)
        if slot is None:
            raise ValueError(f"cannot roll back ({reason}): checkpoint slots {list(order)} are all empty "
                             f"in {str(self.directory)!r}")
        state = self.load(slot)
        scale = max(self.lr_scale * self.lr_cut, self.min_lr_scale)
        record = Rollback(slot=slot, reason=reason, step=step, score=score, best_score=self.best_score,
                          lr_scale=scale, time=time.time())
        self._manifest["lr_scale"] = scale
        self._manifest["rollbacks"].append(asdict(record))
        if slot != "latest":
            self.save("latest", state, step=step, metrics={"rolled_back_from": 1.0})
        else:
            self._write_manifest()
        return ValidationDecision("rollback", float("nan") if score is None else score, self.best_score, scale,
                                  state=state, purge_latest_batch=True, rollback=record)


# --------------------------------------------------------------------------- NaN guard
@dataclass(frozen=True)
class GuardDecision:
    skip: bool
    """Do not apply this update."""
    consecutive: int
    """Non-finite updates in a row, this one included."""
    rollback: bool
    """``max_consecutive`` reached: call :meth:`CheckpointManager.rollback`."""
    reason: str = ""


class NanGuard:
    """Skips updates whose rewards, advantages or loss are non-finite; after
    ``max_consecutive`` skips in a row it asks for a rollback (and starts counting anew)."""

    def __init__(self, max_consecutive: int = 3) -> None:
        if max_consecutive < 1:
            raise ValueError(f"`max_consecutive` ({max_consecutive}) must be >= 1")
        self.max_consecutive = max_consecutive
        self.consecutive = 0
        self.total_skipped = 0

    def check(self, **values: Any) -> GuardDecision:
        """``check(loss=..., rewards=..., advantages=...)``: tensors, arrays or numbers."""
        bad = [name for name, v in values.items() if v is not None and not _all_finite(v)]
        if not bad:
            self.consecutive = 0
            return GuardDecision(False, 0, False)
        self.consecutive += 1
        self.total_skipped += 1
        count = self.consecutive
        rollback = count >= self.max_consecutive
        if rollback:
            self.consecutive = 0
        return GuardDecision(True, count, rollback, f"non-finite {', '.join(bad)} ({count} in a row)")

    def state_dict(self) -> dict[str, int]:
        return {"consecutive": self.consecutive, "total_skipped": self.total_skipped}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.consecutive, self.total_skipped = int(state["consecutive"]), int(state["total_skipped"])


def _all_finite(value: Any) -> bool:
    if torch.is_tensor(value):
        return bool(torch.isfinite(value).all()) if value.is_floating_point() or value.is_complex() else True
    if isinstance(value, Mapping):
        return all(_all_finite(v) for v in value.values())
    arr = np.asarray(value, dtype=np.float64)
    return bool(np.isfinite(arr).all())


__all__ = [
    "SLOTS", "CheckpointManager", "GuardDecision", "NanGuard", "Rollback", "ValidationDecision",
    "apply_lr_scale", "from_storable", "load_checkpoint", "parameter_step_size", "restore_rng",
    "rng_snapshot", "save_checkpoint", "to_storable",
]
