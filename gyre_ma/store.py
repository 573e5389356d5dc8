"""TrajectoryStore: committed trajectories on disk as Parquet, for analysis and restarts.

One dataset per kind of record under the store's folder, each a folder of zstd-compressed
Parquet files, one file per *chunk*, numbered in commit order::

    root/steps/000007.parquet         one row per agent per primitive step (STEPS)
    root/calls/000007.parquet         one row per option call (CALLS)
    root/trajectories/000007.parquet  one row per trajectory (TRAJECTORIES)

Every table has ``traj_id``; ``steps.call`` is the ``calls.call`` that ran the step.
Observations are not stored. Any Parquet reader reads a folder as one table::

    pandas.read_parquet(root / "calls")
    polars.scan_parquet(f"{root}/steps/*.parquet")
    duckdb.sql(f"select option, avg(reward) from '{root}/calls/*.parquet' group by option")

A chunk holds the trajectories appended since the previous one; it is written once
``chunk_steps`` step rows are staged, and on :meth:`TrajectoryStore.flush` and ``close``.
Its three files are written under hidden temporary names, fsynced, then renamed into
place, the trajectories file last: a trajectory listed in ``trajectories/`` is whole in
the other two. Opening the store deletes temporary files and the step and call files of
a chunk whose trajectories file never arrived, so a crash leaves whole trajectories only
(those still staged are lost). Once the files pass ``max_bytes``, the oldest chunks are
deleted, trajectories file first.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self, TextIO, get_args

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from gyre_ma.files import fsync_dir
from gyre_ma.rewards.breakdown import COMPONENTS
from gyre_ma.rollout import Trajectory

if TYPE_CHECKING:
    import pandas as pd

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX
    fcntl = None  # type: ignore[assignment]

Kind = Literal["steps", "calls", "trajectories"]
KINDS: tuple[Kind, ...] = get_args(Kind)
StepLog = list[tuple[Mapping[str, Any], Mapping[str, float]]]
"""One ``(actions, rewards)`` pair of dicts per env step, as ``env.step`` saw them."""

DEFAULT_MAX_BYTES = 1 << 30
DEFAULT_CHUNK_STEPS = 65_536
"""Step rows staged before a chunk is written: large enough that Parquet's per-file overhead
is small, small enough that a crash loses little."""
MAX_ACTION_ELEMENTS = 16
"""Wider actions (images, text) are not stored: their ``action`` is null."""

STEPS = pa.schema([
    ("traj_id", pa.int64()), ("step", pa.int32()), ("agent", pa.string()), ("call", pa.int32()),
    ("option", pa.int16()), ("reward", pa.float32()), ("action", pa.list_(pa.float64())),
])
"""``reward`` and ``action`` (the flattened primitive action) are null unless the episode's
step log was given; rows come grouped by call, calls in decision order."""
CALLS = pa.schema([
    ("traj_id", pa.int64()), ("call", pa.int32()), ("agent", pa.string()), ("option", pa.int16()),
    ("start_step", pa.int32()), ("duration", pa.int32()), ("reward", pa.float32()),
    ("raw_reward", pa.float32()), ("log_prob", pa.float32()), ("value", pa.float32()),
    ("milestones", pa.list_(pa.string())), ("termination", pa.string()), ("terminated", pa.bool_()),
    ("truncated", pa.bool_()), ("policy_version", pa.int32()),
    *((f"r_{k}", pa.float32()) for k in COMPONENTS),
])
"""``termination`` is null while the option still ran; ``r_<component>`` is the call's
reward breakdown, null until the evaluator scored it."""
TRAJECTORIES = pa.schema([
    ("traj_id", pa.int64()), ("task_seed", pa.int64()), ("policy_version", pa.int32()),
    ("length", pa.int32()), ("horizon", pa.int32()), ("success", pa.bool_()),
    ("total_reward", pa.float64()), ("milestone_steps", pa.map_(pa.string(), pa.int32())),
    ("tool_calls", pa.int32()), ("n_calls", pa.int32()), ("n_steps", pa.int32()),
])
"""``length`` counts team env steps, ``n_steps`` step rows (one per agent per step)."""
SCHEMAS: dict[Kind, pa.Schema] = {"steps": STEPS, "calls": CALLS, "trajectories": TRAJECTORIES}

_CHUNK = re.compile(r"^(\d+)\.parquet$")


@dataclass(frozen=True)
class _Summary:
    """What the store remembers of a trajectory without reading its files."""

    length: int
    n_steps: int
    milestone_steps: dict[str, int]


@dataclass(frozen=True)
class _Chunk:
    number: int
    ids: tuple[int, ...]
    nbytes: int


class TrajectoryStore:
    """Parquet datasets of whole trajectories, bounded on disk; see the module docstring.

    One writer at a time (an exclusive ``flock`` on ``root/.lock``); readers need no lock.
    """

    def __init__(self, root: str | Path, *, max_bytes: int | None = DEFAULT_MAX_BYTES,
                 chunk_steps: int = DEFAULT_CHUNK_STEPS, fsync: bool = True) -> None:
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"`max_bytes` ({max_bytes!r}) must be >= 1 or None")
        if chunk_steps < 1:
            raise ValueError(f"`chunk_steps` ({chunk_steps!r}) must be >= 1")
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.chunk_steps = chunk_steps
        self.fsync = fsync
        for kind in KINDS:
            (self.root / kind).mkdir(parents=True, exist_ok=True)
        self._lock = self._acquire_lock()
        self._chunks: dict[int, _Chunk] = {}
        self._summaries: dict[int, _Summary] = {}
        self._staged: list[dict[Kind, pa.Table]] = []
        self._staged_ids: list[int] = []
        self._recover()
        self._enforce_bound()

    def _acquire_lock(self) -> TextIO:
        lock = open(self.root / ".lock", "a")  # noqa: SIM115 - held until close()
        if fcntl is not None:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                lock.close()
                raise ValueError(f"trajectory store {str(self.root)!r} is open in another process") from None
        return lock

    def _path(self, kind: Kind, number: int) -> Path:
        return self.root / kind / f"{number:06d}.parquet"

    # ----------------------------------------------------------- recovery
    def _recover(self) -> None:
        """Delete what a crash left (temporary files, chunks without a trajectories file),
        then index the committed chunks."""
        numbers: dict[Kind, set[int]] = {}
        for kind in KINDS:
            numbers[kind] = set()
            for path in (self.root / kind).iterdir():
                if path.name.startswith(".") and path.name.endswith(".tmp"):
                    path.unlink()
                elif match := _CHUNK.match(path.name):
                    numbers[kind].add(int(match.group(1)))
        committed = numbers["trajectories"]
        for kind in ("steps", "calls"):
            for number in numbers[kind] - committed:
                self._path(kind, number).unlink()
            if missing := committed - numbers[kind]:
                raise ValueError(f"trajectory store {str(self.root)!r}: {kind}/ lacks the chunks "
                                 f"{sorted(missing)} that trajectories/ lists; it was edited by hand")
        for number in sorted(committed):
            path = self._path("trajectories", number)
            try:
                rows = pq.read_table(path, columns=["traj_id", "length", "n_steps", "milestone_steps"])
            except pa.ArrowInvalid as exc:
                raise ValueError(f"{path}: not a readable Parquet file ({exc})") from exc
            ids = []
            for row in rows.to_pylist():
                self._summaries[row["traj_id"]] = _Summary(row["length"], row["n_steps"],
                                                           dict(row["milestone_steps"]))
                ids.append(row["traj_id"])
            nbytes = sum(self._path(kind, number).stat().st_size for kind in KINDS)
            self._chunks[number] = _Chunk(number, tuple(ids), nbytes)

    # ----------------------------------------------------------- writing
    def append(self, traj_id: int, traj: Trajectory, *, step_log: StepLog | None = None) -> None:
        """Stage one whole trajectory; it is written with the next chunk.

        ``step_log[t]`` holds the actions and rewards of env step ``t`` (see
        :class:`StepRecorder`); without it, ``steps.action`` and ``steps.reward`` are null.
        Each call's ``breakdown`` (a RewardBreakdown or a mapping of its components) fills
        the ``r_<component>`` columns. Bad input raises before anything is staged.
        """
        if traj_id in self._summaries:
            raise ValueError(f"trajectory id {traj_id} is already in store {str(self.root)!r}")
        end = max((c.start_step + c.duration for c in traj.calls), default=0)
        if step_log is not None and len(step_log) < end:
            raise ValueError(f"step_log has {len(step_log)} steps; the trajectory's calls run to step {end}")
        tables: dict[Kind, pa.Table] = {
            "steps": _steps_table(traj_id, traj, step_log),
            "calls": _calls_table(traj_id, traj),
        }
        tables["trajectories"] = _trajectory_table(traj_id, traj, n_steps=tables["steps"].num_rows)
        self._staged.append(tables)
        self._staged_ids.append(traj_id)
        self._summaries[traj_id] = _Summary(traj.length, tables["steps"].num_rows, dict(traj.milestone_steps))
        if sum(t["steps"].num_rows for t in self._staged) >= self.chunk_steps:
            self.flush()

    def flush(self) -> int:
        """Write the staged trajectories as one chunk, then evict past ``max_bytes``;
        returns the bytes written (0 with nothing staged)."""
        if not self._staged:
            return 0
        number = max(self._chunks, default=-1) + 1
        temps: dict[Kind, Path] = {}
        try:
            for kind in KINDS:
                table = pa.concat_tables([t[kind] for t in self._staged])
                temps[kind] = self._write_temp(self._path(kind, number), table)
            for kind in KINDS:  # trajectories last: its arrival commits the chunk
                os.replace(temps[kind], self._path(kind, number))
        except BaseException:  # nothing of the chunk stays; the trajectories stay staged
            for kind, tmp in temps.items():
                tmp.unlink(missing_ok=True)
                self._path(kind, number).unlink(missing_ok=True)
            raise
        if self.fsync:
            for kind in KINDS:
                fsync_dir(self.root / kind)
        nbytes = sum(self._path(kind, number).stat().st_size for kind in KINDS)
        self._chunks[number] = _Chunk(number, tuple(self._staged_ids), nbytes)
        self._staged, self._staged_ids = [], []
        self._enforce_bound()
        return nbytes

    def _write_temp(self, path: Path, table: pa.Table) -> Path:
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as f:
            pq.write_table(table, f, compression="zstd")
            if self.fsync:
                f.flush()
                os.fsync(f.fileno())
        return tmp

    def _enforce_bound(self) -> None:
        """Delete the oldest chunks while the files exceed ``max_bytes``; the newest stays."""
        while self.max_bytes is not None and self.nbytes > self.max_bytes and len(self._chunks) > 1:
            self._delete_chunk(next(iter(self._chunks)))

    def _delete_chunk(self, number: int) -> None:
        """Delete a committed chunk, trajectories file first (so a crash midway leaves the
        other two, which the next open removes), and forget its trajectories."""
        chunk = self._chunks.pop(number)
        for kind in ("trajectories", "calls", "steps"):
            self._path(kind, number).unlink()
        for tid in chunk.ids:
            del self._summaries[tid]

    def discard_from(self, traj_id: int) -> list[int]:
        """Delete every trajectory with an id of ``traj_id`` or more, staged or written;
        returns the ids deleted. A resumed run calls it with the id sequence of the
        checkpoint it resumes from, so the trajectories a killed run wrote after that
        checkpoint (and will play again) are not held twice.

        Whole chunks go, trajectories file first; a checkpoint flushes the store, so a
        chunk never holds ids from both sides of one."""
        gone = [tid for tid in self._staged_ids if tid >= traj_id]
        keep = [k for k, tid in enumerate(self._staged_ids) if tid < traj_id]
        self._staged = [self._staged[k] for k in keep]
        self._staged_ids = [self._staged_ids[k] for k in keep]
        for tid in gone:
            del self._summaries[tid]
        for number, chunk in list(self._chunks.items()):
            after = [tid for tid in chunk.ids if tid >= traj_id]
            if not after:
                continue
            if len(after) < len(chunk.ids):
                raise ValueError(f"trajectory store {str(self.root)!r}: chunk {number} holds trajectories "
                                 f"{min(chunk.ids)}–{max(chunk.ids)}, on both sides of {traj_id}; "
                                 "it was not written by this run's checkpoints")
            self._delete_chunk(number)
            gone += after
        if gone and self.fsync:
            for kind in KINDS:
                fsync_dir(self.root / kind)
        return sorted(gone)

    # ----------------------------------------------------------- reading
    def __len__(self) -> int:
        return len(self._summaries)

    def ids(self) -> list[int]:
        """Held trajectories (written or staged), oldest first."""
        return list(self._summaries)

    @property
    def chunks(self) -> list[int]:
        """Numbers of the chunks on disk, oldest first."""
        return list(self._chunks)

    @property
    def nbytes(self) -> int:
        """Bytes of the chunk files on disk (staged trajectories not yet counted)."""
        return sum(c.nbytes for c in self._chunks.values())

    @property
    def n_steps(self) -> int:
        """Step rows held: one per agent per primitive step."""
        return sum(s.n_steps for s in self._summaries.values())

    @property
    def env_steps(self) -> int:
        """Primitive (team) env steps held."""
        return sum(s.length for s in self._summaries.values())

    def milestones_of(self, traj_id: int) -> dict[str, int]:
        """First verification step of each milestone in a held trajectory."""
        if traj_id not in self._summaries:
            raise KeyError(f"trajectory {traj_id} is not in store {str(self.root)!r}")
        return dict(self._summaries[traj_id].milestone_steps)

    def table(self, kind: Kind = "steps") -> pa.Table:
        """One table of ``kind`` over every held trajectory, staged ones included."""
        if kind not in KINDS:
            raise ValueError(f"kind: expected one of {list(KINDS)}, got {kind!r}")
        files = [str(self._path(kind, n)) for n in self._chunks]
        parts = [ds.dataset(files, schema=SCHEMAS[kind], format="parquet").to_table()] if files else []
        parts += [t[kind] for t in self._staged]
        return pa.concat_tables(parts) if parts else SCHEMAS[kind].empty_table()

    def to_pandas(self, kind: Kind = "steps") -> pd.DataFrame:
        """:meth:`table` as a DataFrame (``milestone_steps`` as dicts)."""
        return self.table(kind).to_pandas(maps_as_pydicts="strict")

    def close(self) -> None:
        """Write what is staged and let go of the lock."""
        if not self._lock.closed:
            try:
                self.flush()
            finally:
                self._lock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- tables
def _steps_table(traj_id: int, traj: Trajectory, step_log: StepLog | None) -> pa.Table:
    calls = traj.calls
    durations = np.array([c.duration for c in calls], dtype=np.int64)
    total = int(durations.sum())
    first_row = np.cumsum(durations) - durations
    reward = np.zeros(total, np.float32)
    widths = np.zeros(total, np.int32)
    has_action = np.zeros(total, bool)
    values = []
    if step_log is not None:
        for c, lo in zip(calls, first_row, strict=True):
            span = step_log[c.start_step:c.start_step + c.duration]
            rows = slice(lo, lo + c.duration)
            reward[rows] = [float(r.get(c.agent, 0.0)) for _, r in span]
            action = _action_rows([a.get(c.agent) for a, _ in span])
            if action is not None:
                widths[rows], has_action[rows] = action.shape[1], True
                values.append(action.ravel())

    def per_row(values: list[Any], dtype: Any) -> np.ndarray:
        return np.repeat(np.asarray(values, dtype=dtype), durations)

    columns = {
        "traj_id": np.full(total, traj_id, np.int64),
        "step": per_row([c.start_step - lo for c, lo in zip(calls, first_row, strict=True)], np.int64)
        + np.arange(total),
        "agent": per_row([c.agent for c in calls], object),
        "call": per_row(list(range(len(calls))), np.int32),
        "option": per_row([c.option for c in calls], np.int16),
        "reward": pa.array(reward, pa.float32(), mask=np.full(total, step_log is None)),
        "action": pa.ListArray.from_arrays(
            pa.array(np.concatenate([[0], np.cumsum(widths)]), pa.int32()),
            pa.array(np.concatenate(values) if values else np.zeros(0), pa.float64()),
            mask=pa.array(~has_action)),
    }
    return pa.table(columns, schema=STEPS)


def _action_rows(actions: Sequence[Any]) -> np.ndarray | None:
    """One call's primitive actions as a (steps, width) float array, or None when they are
    missing, not numeric or wider than MAX_ACTION_ELEMENTS."""
    try:
        a = np.asarray(actions)
    except (ValueError, TypeError):
        return None
    if a.dtype.kind not in "biuf" or not len(a):
        return None
    a = a.reshape(len(a), -1)
    return a.astype(np.float64) if a.shape[1] <= MAX_ACTION_ELEMENTS else None


def _calls_table(traj_id: int, traj: Trajectory) -> pa.Table:
    calls = traj.calls
    parts = [_components(i, c.breakdown) for i, c in enumerate(calls)]
    columns: dict[str, Any] = {
        "traj_id": [traj_id] * len(calls), "call": list(range(len(calls))),
        **{name: [getattr(c, name) for c in calls] for name in (
            "agent", "option", "start_step", "duration", "reward", "raw_reward", "log_prob", "value",
            "terminated", "truncated", "policy_version")},
        "milestones": [list(c.milestones) for c in calls],
        "termination": [None if c.termination is None else c.termination.value for c in calls],
        **{f"r_{k}": [p[j] for p in parts] for j, k in enumerate(COMPONENTS)},
    }
    return pa.table(columns, schema=CALLS)


def _components(index: int, breakdown: Any) -> list[float | None]:
    """A call's reward breakdown (a RewardBreakdown or a mapping) → values in COMPONENTS order."""
    if breakdown is None:
        return [None] * len(COMPONENTS)
    if isinstance(breakdown, Mapping):
        if unknown := sorted(set(breakdown) - set(COMPONENTS)):
            raise ValueError(f"breakdown of call {index}: unknown components {unknown}; "
                             f"expected some of {list(COMPONENTS)}")
        return [None if breakdown.get(k) is None else float(breakdown[k]) for k in COMPONENTS]
    if not all(hasattr(breakdown, k) for k in COMPONENTS):
        raise TypeError(f"breakdown of call {index}: expected a RewardBreakdown, a mapping of "
                        f"{list(COMPONENTS)} or None, got {type(breakdown).__name__}")
    return [float(getattr(breakdown, k)) for k in COMPONENTS]


def _trajectory_table(traj_id: int, traj: Trajectory, *, n_steps: int) -> pa.Table:
    row = {
        "traj_id": traj_id, "task_seed": traj.task_seed, "policy_version": traj.policy_version,
        "length": traj.length, "horizon": traj.horizon, "success": traj.success,
        "total_reward": traj.total_reward, "milestone_steps": list(traj.milestone_steps.items()),
        "tool_calls": traj.tool_calls, "n_calls": len(traj.calls), "n_steps": n_steps,
    }
    return pa.Table.from_pylist([row], schema=TRAJECTORIES)


# --------------------------------------------------------------------------- recording steps
class StepRecorder:
    """Env proxy that logs each ``step``'s actions and rewards into ``self.log``.

    ``run_episode(StepRecorder(env), ...)`` then ``add(traj, step_log=env.log)`` stores
    per-step primitive actions and rewards without touching the rollout. Everything else
    is delegated.
    """

    def __init__(self, env: Any) -> None:
        self.env = env
        self.log: StepLog = []

    def reset(self, *args: Any, **kwargs: Any) -> Any:
        self.log = []
        return self.env.reset(*args, **kwargs)

    def step(self, actions: Mapping[str, Any]) -> Any:
        out = self.env.step(actions)
        self.log.append((dict(actions), dict(out[1])))
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)


__all__ = [
    "CALLS", "DEFAULT_CHUNK_STEPS", "DEFAULT_MAX_BYTES", "KINDS", "MAX_ACTION_ELEMENTS", "SCHEMAS", "STEPS",
    "TRAJECTORIES",
    "Kind", "StepLog", "StepRecorder", "TrajectoryStore",
]
