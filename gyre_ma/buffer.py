"""TrajectoryBuffer: whole trajectories only, with dedup, an elite pool and freshness.

Trajectories enter through a transaction (:meth:`TrajectoryBuffer.begin` → ``append`` →
``commit`` / ``abort``) or :meth:`TrajectoryBuffer.add`; until the commit, nothing of
them is visible to :meth:`TrajectoryBuffer.sample`. Two pools feed samples:

- *fresh*: committed trajectories in commit order, at most ``capacity`` option calls,
  evicted FIFO or at random among the oldest ``eviction_window``;
- *elite*: the top ``elite_size`` trajectories by verified outcome, then return, plus
  *turning points* (the first trajectory to verify a milestone never seen before). They
  are mixed into samples at ``elite_ratio`` and outlive their eviction from *fresh*.

A trajectory whose every segment (an agent's run of option calls up to a verified
milestone) is already held is a duplicate and is not admitted. Samples skip trajectories
more than ``max_staleness`` policy versions old, and count them.

With a :class:`TrajectoryStore`, each committed trajectory is also appended to a compact
on-disk log of per-primitive-step records (no observations); a crash leaves only whole
trajectories there. The log is for analysis (``to_pandas``) and for restoring the
buffer's memory of seen milestones after a restart; training batches come from the
in-memory pools, which hold the observations the learner needs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from gyre_ma.options.option import Termination
from gyre_ma.rollout import OptionCall, Trajectory, trajectory_from_state, trajectory_to_state

if TYPE_CHECKING:
    import pandas as pd

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX
    fcntl = None  # type: ignore[assignment]

Eviction = Literal["fifo", "random_oldest"]
StepLog = list[tuple[Mapping[str, Any], Mapping[str, float]]]
"""One ``(actions, rewards)`` pair of dicts per env step, as ``env.step`` saw them."""


# --------------------------------------------------------------------------- segments
def agent_segments(calls: Sequence[OptionCall]) -> list[list[OptionCall]]:
    """Cut one agent's calls (decision order) after each call that verified a milestone."""
    out: list[list[OptionCall]] = []
    current: list[OptionCall] = []
    for c in calls:
        current.append(c)
        if c.milestones:
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out


def segment_hashes(traj: Trajectory) -> tuple[int, ...]:
    """Stable 64-bit hashes of every segment of every agent.

    A segment is keyed by the task seed, the agent, the step it starts at and its
    ``(option, milestones, duration)`` sequence: on a deterministic env the same key
    means the same experience (observations excepted, which are not hashed).
    """
    by_agent: dict[str, list[OptionCall]] = {}
    for c in traj.calls:
        by_agent.setdefault(c.agent, []).append(c)
    out = []
    for calls in by_agent.values():
        for seg in agent_segments(calls):
            key = f"{traj.task_seed}|{seg[0].agent_index}|{seg[0].start_step}|" + ";".join(
                f"{c.option},{'+'.join(c.milestones)},{c.duration}" for c in seg
            )
            digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
            out.append(int.from_bytes(digest, "little"))
    return tuple(out)


def split_steps(traj: Trajectory, step_log: StepLog) -> list[list[tuple[Any, float]]]:
    """Per option call, the ``(action, reward)`` of each primitive step it ran.

    ``step_log[t]`` holds the actions and rewards of env step ``t`` (as recorded by
    :class:`StepRecorder`, or by ``run_episode(step_log=...)``).
    """
    if len(step_log) < traj.length:
        raise ValueError(f"step_log has {len(step_log)} steps; the trajectory has {traj.length}")
    out = []
    for c in traj.calls:
        rows = []
        for t in range(c.start_step, c.start_step + c.duration):
            actions, rewards = step_log[t]
            rows.append((actions[c.agent], float(rewards.get(c.agent, 0.0))))
        out.append(rows)
    return out


class StepRecorder:
    """Env proxy that logs each ``step``'s actions and rewards into ``self.log``.

    ``run_episode(StepRecorder(env), ...)`` then :func:`split_steps` gives per-call
    primitive actions without touching the rollout. Everything else is delegated.
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


# --------------------------------------------------------------------------- on-disk store
_HEADER = struct.Struct("<4sQIII")  # magic, traj_id, n_steps, n_calls, body_len
_TRAILER = struct.Struct("<4sI")  # commit marker, crc32 of header + body
_MAGIC, _COMMIT = b"GYRT", b"GYRC"
TERMINATIONS: tuple[Termination | None, ...] = (None, *Termination)
"""Code of ``termination`` in the calls table: index into this tuple (0 = still running)."""
_MAX_ACTION_ELEMENTS = 16

STEP_FIELDS: tuple[tuple[str, str], ...] = (
    ("step", "<u4"), ("agent", "<u2"), ("call", "<u4"), ("option", "<u2"), ("reward", "<f4"),
)
"""Per primitive step and agent; then ``action`` (scalar) or ``action_0..`` (vector)."""
CALL_FIELDS: tuple[tuple[str, str], ...] = (
    ("agent", "<u2"), ("option", "<u2"), ("start_step", "<u4"), ("duration", "<u4"),
    ("reward", "<f4"), ("raw_reward", "<f4"), ("log_prob", "<f4"), ("value", "<f4"),
    ("milestones", "<u8"), ("termination", "<u1"), ("terminated", "?"), ("truncated", "?"),
    ("policy_version", "<u4"),
)
"""Per option call; ``milestones`` is a bitmask over the store's milestone table; then one
``r_<component>`` column per reward-breakdown component."""


@dataclass(frozen=True)
class StoredTrajectory:
    """One trajectory as the store keeps it: metadata, per-step and per-call records."""

    id: int
    task_seed: int
    policy_version: int
    length: int
    success: bool
    total_reward: float
    milestone_steps: dict[str, int]
    steps: np.ndarray
    calls: np.ndarray


@dataclass
class _Chunk:
    id: int
    offset: int
    size: int
    n_steps: int
    n_calls: int
    meta: dict[str, Any]


def _breakdown(obj: Any) -> dict[str, float]:
    """A reward breakdown (mapping, dataclass or ``as_dict()``) → its float components."""
    if obj is None:
        return {}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = dataclasses.asdict(obj)
    elif not isinstance(obj, Mapping):
        for name in ("as_dict", "to_dict"):
            if callable(getattr(obj, name, None)):
                obj = getattr(obj, name)()
                break
        else:
            raise TypeError(f"reward breakdown: expected a mapping or dataclass, got {type(obj).__name__}")
    return {str(k): float(v) for k, v in obj.items()
            if isinstance(v, (int, float, np.number)) and not isinstance(v, bool)}


def _action_spec(actions: Sequence[Sequence[Any]] | None) -> tuple[str, tuple[int, ...]] | None:
    """(dtype, shape) of the store's action columns, from the first recorded action."""
    for seq in actions or ():
        if seq is None or not len(seq):
            continue
        try:
            a = np.asarray(seq[0])
        except (ValueError, TypeError):
            return None
        if a.size > _MAX_ACTION_ELEMENTS or a.dtype.kind not in "biuf":
            return None  # images, text: not compact, not stored
        return ("<f4" if a.dtype.kind == "f" else "<i4", tuple(int(s) for s in a.shape))
    return None


def _action_fields(spec: tuple[str, tuple[int, ...]] | None) -> list[tuple[str, str]]:
    if spec is None:
        return []
    dtype, shape = spec
    n = int(np.prod(shape)) if shape else 0
    return [("action", dtype)] if n == 0 else [(f"action_{i}", dtype) for i in range(n)]


class TrajectoryStore:
    """Append-only log of committed trajectories, one framed, checksummed chunk each.

    A chunk is ``header | zlib(meta, step columns, call columns) | commit marker + crc``;
    on open, the log is truncated after the last whole chunk, so a crash mid-append
    leaves only whole trajectories. One writer at a time (an exclusive ``flock``).
    """

    def __init__(self, path: str | Path, *, fsync: bool = True) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a+b")  # noqa: SIM115 - kept open for appends
        if fcntl is not None:
            try:
                fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                self._file.close()
                raise ValueError(f"trajectory store {str(self.path)!r} is open in another process") from None
        self._chunks: list[_Chunk] = []
        self._by_id: dict[int, int] = {}
        self.milestones: list[str] = []
        """Milestone table: bit ``i`` of a ``milestones`` bitmask is ``milestones[i]``."""
        self.truncated_bytes = self._recover()
        """Bytes of a half-written tail dropped when the log was opened."""

    @classmethod
    def open(cls, path: str | Path, *, fsync: bool = True) -> TrajectoryStore:
        return cls(path, fsync=fsync)

    # ----------------------------------------------------------- recovery
    def _recover(self) -> int:
        f = self._file
        f.seek(0, os.SEEK_END)
        end = f.tell()
        f.seek(0)
        data = f.read()
        pos = 0
        while pos + _HEADER.size + _TRAILER.size <= end:
            magic, tid, n_steps, n_calls, body_len = _HEADER.unpack_from(data, pos)
            stop = pos + _HEADER.size + body_len + _TRAILER.size
            if magic != _MAGIC or stop > end:
                break
            marker, crc = _TRAILER.unpack_from(data, stop - _TRAILER.size)
            frame = data[pos:stop - _TRAILER.size]
            if marker != _COMMIT or zlib.crc32(frame) != crc or tid in self._by_id:
                break
            try:
                meta = self._meta(zlib.decompress(frame[_HEADER.size:]))
            except (zlib.error, ValueError):
                break
            self._index(_Chunk(tid, pos, stop - pos, n_steps, n_calls, meta))
            pos = stop
        if pos < end:
            f.truncate(pos)
            f.flush()
            os.fsync(f.fileno())
        f.seek(0, os.SEEK_END)
        return end - pos

    @staticmethod
    def _meta(raw: bytes) -> dict[str, Any]:
        (n,) = struct.unpack_from("<I", raw, 0)
        return json.loads(raw[4:4 + n])

    def _index(self, chunk: _Chunk) -> None:
        self._by_id[chunk.id] = len(self._chunks)
        self._chunks.append(chunk)
        self.milestones.extend(chunk.meta.get("new_milestones", []))

    # ----------------------------------------------------------- writing
    def append(
        self,
        traj_id: int,
        traj: Trajectory,
        *,
        actions: Sequence[Sequence[Any] | None] | None = None,
        rewards: Sequence[Sequence[float] | None] | None = None,
        breakdowns: Sequence[Any] | None = None,
    ) -> int:
        """Append one whole trajectory durably; return the bytes written.

        ``actions[i]`` / ``rewards[i]`` are the primitive actions / rewards of call ``i``
        (``duration`` of them) or None (stored as -1 / NaN); ``breakdowns[i]`` its reward
        breakdown (default: the call's ``breakdown`` attribute, if it has one).
        """
        if traj_id in self._by_id:
            raise ValueError(f"trajectory id {traj_id} is already in store {str(self.path)!r}")
        n = len(traj.calls)
        for name, seq in (("actions", actions), ("rewards", rewards), ("breakdowns", breakdowns)):
            if seq is not None and len(seq) != n:
                raise ValueError(f"{name}: expected one entry per option call ({n}), got {len(seq)}")
        table = {m: i for i, m in enumerate(self.milestones)}
        new = []
        for m in [*traj.milestone_steps, *(m for c in traj.calls for m in c.milestones)]:
            if m not in table:
                table[m] = len(table)
                new.append(m)
        if len(table) > 64:
            raise ValueError(f"trajectory store holds at most 64 milestones, got {len(table)}")
        bd = [_breakdown(b) for b in (breakdowns or [getattr(c, "breakdown", None) for c in traj.calls])]
        components = sorted({k for b in bd for k in b})
        spec = _action_spec(actions)
        calls = self._call_table(traj, table, bd, components)
        steps = self._step_table(traj, spec, actions, rewards)
        meta = {
            "task_seed": int(traj.task_seed), "policy_version": int(traj.policy_version),
            "length": int(traj.length), "success": bool(traj.success),
            "total_reward": float(traj.total_reward),
            "milestone_steps": [[table[m], int(s)] for m, s in traj.milestone_steps.items()],
            "new_milestones": new, "components": components,
            "action": None if spec is None else [spec[0], list(spec[1])],
        }
        meta_raw = json.dumps(meta, separators=(",", ":")).encode()
        parts = [struct.pack("<I", len(meta_raw)), meta_raw]
        for table_ in (steps, calls):
            parts += [np.ascontiguousarray(table_[name]).tobytes() for name in table_.dtype.names]
        body = zlib.compress(b"".join(parts), 6)
        frame = _HEADER.pack(_MAGIC, traj_id, len(steps), n, len(body)) + body
        blob = frame + _TRAILER.pack(_COMMIT, zlib.crc32(frame))
        f = self._file
        start = f.seek(0, os.SEEK_END)
        try:
            f.write(blob)
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        except BaseException:
            f.truncate(start)  # never leave a torn chunk in front of later ones
            f.flush()
            raise
        self._index(_Chunk(traj_id, start, len(blob), len(steps), n, meta))
        return len(blob)

    @staticmethod
    def _call_table(traj: Trajectory, table: dict[str, int], bd: list[dict[str, float]],
                    components: list[str]) -> np.ndarray:
        dtype = np.dtype([*CALL_FIELDS, *((f"r_{k}", "<f4") for k in components)])
        out = np.zeros(len(traj.calls), dtype=dtype)
        code = {t: i for i, t in enumerate(TERMINATIONS)}
        for i, c in enumerate(traj.calls):
            mask = 0
            for m in c.milestones:
                mask |= 1 << table[m]
            out[i] = (c.agent_index, c.option, c.start_step, c.duration, c.reward, c.raw_reward,
                      c.log_prob, c.value, mask, code[c.termination], c.terminated, c.truncated,
                      c.policy_version, *(bd[i].get(k, np.nan) for k in components))
        return out

    @staticmethod
    def _step_table(traj: Trajectory, spec: tuple[str, tuple[int, ...]] | None,
                    actions: Sequence[Sequence[Any] | None] | None,
                    rewards: Sequence[Sequence[float] | None] | None) -> np.ndarray:
        afields = _action_fields(spec)
        dtype = np.dtype([*STEP_FIELDS, *afields])
        durations = np.array([c.duration for c in traj.calls], dtype=np.int64)
        total = int(durations.sum())
        out = np.zeros(total, dtype=dtype)
        if total == 0:
            return out
        call_idx = np.repeat(np.arange(len(traj.calls)), durations)
        offsets = np.arange(total) - np.repeat(np.cumsum(durations) - durations, durations)
        out["step"] = np.repeat([c.start_step for c in traj.calls], durations) + offsets
        out["agent"] = np.repeat([c.agent_index for c in traj.calls], durations)
        out["call"] = call_idx
        out["option"] = np.repeat([c.option for c in traj.calls], durations)
        out["reward"] = np.nan
        width = len(afields)
        act = np.full((total, width), -1 if spec and spec[0] == "<i4" else np.nan,
                      dtype=spec[0] if spec else "<f4") if width else None
        pos = 0
        for i, c in enumerate(traj.calls):
            d = c.duration
            if rewards is not None and rewards[i] is not None:
                r = np.asarray(rewards[i], dtype=np.float32)
                if r.shape != (d,):
                    raise ValueError(f"rewards of call {i}: expected {d} values, got shape {r.shape}")
                out["reward"][pos:pos + d] = r
            if act is not None and actions is not None and actions[i] is not None:
                a = np.asarray(actions[i])
                if len(a) != d:
                    raise ValueError(f"actions of call {i}: expected {d} actions, got {len(a)}")
                act[pos:pos + d] = a.reshape(d, width)
            pos += d
        if act is not None:
            for j, (name, _) in enumerate(afields):
                out[name] = act[:, j]
        return out[np.lexsort((out["agent"], out["step"]))]

    # ----------------------------------------------------------- reading
    def __len__(self) -> int:
        return len(self._chunks)

    def __contains__(self, traj_id: object) -> bool:
        return traj_id in self._by_id

    def ids(self) -> list[int]:
        return [c.id for c in self._chunks]

    @property
    def nbytes(self) -> int:
        return sum(c.size for c in self._chunks)

    @property
    def n_steps(self) -> int:
        """Per-agent primitive-step records held."""
        return sum(c.n_steps for c in self._chunks)

    @property
    def env_steps(self) -> int:
        """Primitive (team) env steps held."""
        return sum(int(c.meta["length"]) for c in self._chunks)

    def milestones_of(self, traj_id: int) -> dict[str, int]:
        """First verification step of each milestone in a stored trajectory."""
        meta = self._chunks[self._by_id[traj_id]].meta
        return {self.milestones[i]: s for i, s in meta["milestone_steps"]}

    def read(self, traj_id: int) -> StoredTrajectory:
        if traj_id not in self._by_id:
            raise KeyError(f"trajectory {traj_id} is not in store {str(self.path)!r}")
        self._file.flush()
        with open(self.path, "rb") as f:
            return self._decode(self._chunks[self._by_id[traj_id]], f)

    def __iter__(self) -> Iterator[StoredTrajectory]:
        self._file.flush()
        with open(self.path, "rb") as f:
            for chunk in list(self._chunks):
                yield self._decode(chunk, f)

    def _decode(self, chunk: _Chunk, f: Any) -> StoredTrajectory:
        f.seek(chunk.offset + _HEADER.size)
        raw = zlib.decompress(f.read(chunk.size - _HEADER.size - _TRAILER.size))
        meta = chunk.meta
        pos = 4 + struct.unpack_from("<I", raw, 0)[0]
        spec = None if meta["action"] is None else (meta["action"][0], tuple(meta["action"][1]))
        tables = []
        for fields, n in (((*STEP_FIELDS, *_action_fields(spec)), chunk.n_steps),
                          ((*CALL_FIELDS, *((f"r_{k}", "<f4") for k in meta["components"])), chunk.n_calls)):
            arr = np.zeros(n, dtype=np.dtype(list(fields)))
            for name, dt in fields:
                arr[name] = np.frombuffer(raw, dtype=dt, count=n, offset=pos)
                pos += np.dtype(dt).itemsize * n
            tables.append(arr)
        return StoredTrajectory(
            id=chunk.id, task_seed=meta["task_seed"], policy_version=meta["policy_version"],
            length=meta["length"], success=meta["success"], total_reward=meta["total_reward"],
            milestone_steps=self.milestones_of(chunk.id), steps=tables[0], calls=tables[1],
        )

    def to_pandas(self, kind: Literal["steps", "calls", "trajectories"] = "steps") -> pd.DataFrame:
        """One table over all stored trajectories, with a ``traj_id`` column.

        ``steps``: one row per agent per primitive step; ``calls``: one row per option
        call (``termination`` and ``milestones`` decoded to names); ``trajectories``: one
        row per trajectory.
        """
        import pandas as pd

        if kind == "trajectories":
            rows = [{"traj_id": c.id, "task_seed": c.meta["task_seed"],
                     "policy_version": c.meta["policy_version"], "length": c.meta["length"],
                     "success": c.meta["success"], "total_reward": c.meta["total_reward"],
                     "n_calls": c.n_calls, "n_steps": c.n_steps, "bytes": c.size} for c in self._chunks]
            return pd.DataFrame(rows, columns=["traj_id", "task_seed", "policy_version", "length", "success",
                                               "total_reward", "n_calls", "n_steps", "bytes"])
        if kind not in ("steps", "calls"):
            raise ValueError(f"kind: expected 'steps', 'calls' or 'trajectories', got {kind!r}")
        frames = []
        for t in self:
            df = pd.DataFrame(t.steps if kind == "steps" else t.calls)
            if kind == "calls":
                df.insert(0, "call", np.arange(len(df)))
                df["termination"] = [None if t_ is None else t_.value
                                     for t_ in (TERMINATIONS[i] for i in df["termination"])]
                df["milestone_names"] = [self._names(int(m)) for m in df["milestones"]]
            df.insert(0, "traj_id", t.id)
            frames.append(df)
        if not frames:
            names = [n for n, _ in (STEP_FIELDS if kind == "steps" else CALL_FIELDS)]
            return pd.DataFrame(columns=["traj_id", *names])
        return pd.concat(frames, ignore_index=True)

    def _names(self, mask: int) -> tuple[str, ...]:
        return tuple(m for i, m in enumerate(self.milestones) if mask >> i & 1)

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()  # also releases the flock

    def __enter__(self) -> TrajectoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- buffer
@dataclass(frozen=True)
class Entry:
    """A committed trajectory as the buffer holds it."""

    id: int
    trajectory: Trajectory
    hashes: tuple[int, ...]

    @property
    def n_calls(self) -> int:
        return len(self.trajectory.calls)

    @property
    def policy_version(self) -> int:
        return self.trajectory.policy_version

    @property
    def rank(self) -> tuple[float, float, int]:
        """Elite order: verified outcome, then return, then the newer one."""
        return (float(self.trajectory.success), float(self.trajectory.total_reward), self.id)


@dataclass(frozen=True)
class CommitResult:
    id: int
    accepted: bool
    """False for a duplicate (every segment already held): nothing was stored."""
    elite: bool = False
    """Entered the top-k elite pool."""
    turning_point: bool = False
    """First trajectory to verify one of its milestones."""
    evicted: tuple[int, ...] = ()
    """Ids evicted from the fresh pool to make room."""


@dataclass(frozen=True)
class Sample:
    trajectories: list[Trajectory]
    ids: list[int]
    elite: list[bool]
    """Whether each was drawn from the elite pool."""
    stale_dropped: int
    """Trajectories dropped as stale by this call."""


@dataclass
class BufferStats:
    committed: int = 0
    aborted: int = 0
    duplicates: int = 0
    evicted: int = 0
    stale_dropped: int = 0
    purged: int = 0
    turning_points: int = 0


class Pending:
    """An open trajectory: calls appended here are invisible until :meth:`commit`.

    As a context manager it aborts on an exception or when left uncommitted.
    """

    def __init__(self, buffer: TrajectoryBuffer, traj_id: int, task_seed: int, policy_version: int,
                 epoch: int) -> None:
        self.buffer = buffer
        self.id = traj_id
        self.trajectory = Trajectory(task_seed=task_seed, policy_version=policy_version)
        self.actions: list[Sequence[Any] | None] = []
        self.rewards: list[Sequence[float] | None] = []
        self.breakdowns: list[Any] = []
        self.open = True
        self._epoch = epoch

    def _check_open(self) -> None:
        if not self.open:
            raise ValueError(f"trajectory {self.id} is no longer open (committed, aborted, or the buffer reopened)")
        if self._epoch != self.buffer._epoch:
            self.open = False
            raise ValueError(f"trajectory {self.id} was begun before the buffer reopened; begin it again")

    def append(self, call: OptionCall, *, actions: Sequence[Any] | None = None,
               rewards: Sequence[float] | None = None, breakdown: Any = None) -> None:
        """Add one option call, optionally with its ``duration`` primitive actions/rewards."""
        self._check_open()
        t = self.trajectory
        if call.task_seed != t.task_seed or call.policy_version != t.policy_version:
            raise ValueError(
                f"trajectory {self.id}: call has task_seed={call.task_seed}, policy_version="
                f"{call.policy_version}; expected {t.task_seed}, {t.policy_version}"
            )
        for name, seq in (("actions", actions), ("rewards", rewards)):
            if seq is not None and len(seq) != call.duration:
                raise ValueError(f"trajectory {self.id}: {name} has {len(seq)} entries; "
                                 f"the call lasted {call.duration} steps")
        t.calls.append(call)
        self.actions.append(actions)
        self.rewards.append(rewards)
        self.breakdowns.append(breakdown if breakdown is not None else getattr(call, "breakdown", None))

    def commit(self, *, length: int | None = None, success: bool = False,
               total_reward: float | None = None, milestone_steps: Mapping[str, int] | None = None,
               final: Mapping[str, Any] | None = None) -> CommitResult:
        """Make the trajectory visible (or reject it as a duplicate); closes it either way.

        Unset fields are derived from the calls: ``length`` from the last call's end,
        ``total_reward`` from the raw rewards, ``milestone_steps`` from call milestones.
        """
        self._check_open()
        t = self.trajectory
        t.length = length if length is not None else max((c.start_step + c.duration for c in t.calls), default=0)
        t.success = success
        t.total_reward = total_reward if total_reward is not None else sum(c.raw_reward for c in t.calls)
        if milestone_steps is None:
            milestone_steps = {}
            for c in t.calls:
                for m in c.milestones:
                    milestone_steps.setdefault(m, c.start_step + c.duration)
        t.milestone_steps = dict(milestone_steps)
        t.final = dict(final or {})
        try:
            return self.buffer._commit(self.id, t, self.actions, self.rewards, self.breakdowns)
        finally:
            self.open = False

    def abort(self) -> None:
        """Discard everything appended; idempotent."""
        if self.open:
            self.open = False
            self.buffer.stats.aborted += 1

    def __enter__(self) -> Pending:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()


class TrajectoryBuffer:
    """Fresh pool + elite pool of whole trajectories; see the module docstring."""

    def __init__(
        self,
        capacity: int = 4096,
        *,
        eviction: Eviction = "fifo",
        eviction_window: int = 16,
        dedup: bool = True,
        elite_size: int = 8,
        max_turning_points: int = 8,
        elite_ratio: float = 0.0,
        max_staleness: int | None = 1,
        elite_max_staleness: int | None = None,
        seed: int = 0,
        store: TrajectoryStore | str | Path | None = None,
    ) -> None:
        checks = [
            ("capacity", capacity, capacity >= 1, ">= 1"),
            ("eviction", eviction, eviction in ("fifo", "random_oldest"), "'fifo' or 'random_oldest'"),
            ("eviction_window", eviction_window, eviction_window >= 1, ">= 1"),
            ("elite_size", elite_size, elite_size >= 0, ">= 0"),
            ("max_turning_points", max_turning_points, max_turning_points >= 0, ">= 0"),
            ("elite_ratio", elite_ratio, 0.0 <= elite_ratio <= 1.0, "in [0, 1]"),
            ("max_staleness", max_staleness, max_staleness is None or max_staleness >= 0, "None or >= 0"),
            ("elite_max_staleness", elite_max_staleness,
             elite_max_staleness is None or elite_max_staleness >= 0, "None or >= 0"),
        ]
        for name, value, ok, expected in checks:
            if not ok:
                raise ValueError(f"`{name}` ({value!r}) must be {expected}")
        self.capacity = capacity
        self.eviction = eviction
        self.eviction_window = eviction_window
        self.dedup = dedup
        self.elite_size = elite_size
        self.max_turning_points = max_turning_points
        self.elite_ratio = elite_ratio
        self.max_staleness = max_staleness
        self.elite_max_staleness = elite_max_staleness
        self.rng = np.random.default_rng(seed)
        self.stats = BufferStats()
        self.store = TrajectoryStore(store) if isinstance(store, (str, Path)) else store
        self._lock = threading.RLock()
        self._epoch = 0
        self._reset_memory()

    def _reset_memory(self) -> None:
        self._fresh: OrderedDict[int, Entry] = OrderedDict()
        self._top: dict[int, Entry] = {}
        self._turning: OrderedDict[int, Entry] = OrderedDict()
        self._hash_refs: dict[int, int] = {}
        self._refs: dict[int, int] = {}  # pools holding each entry
        self._entries: dict[int, Entry] = {}
        self._fresh_calls = 0
        self.seen_milestones: set[str] = set()
        self._next_id = 0
        if self.store is not None:
            for tid in self.store.ids():
                self.seen_milestones |= {m for m, s in self.store.milestones_of(tid).items() if s > 0}
            self._next_id = max(self.store.ids(), default=-1) + 1

    # ----------------------------------------------------------- opening
    @classmethod
    def open(cls, path: str | Path, *, fsync: bool = True, **settings: Any) -> TrajectoryBuffer:
        """A buffer over the store at ``path`` (created if missing, recovered if torn).

        Pools start empty (observations are not stored); the memory of seen milestones
        (turning points) and the id sequence continue from the store.
        """
        return cls(store=TrajectoryStore(path, fsync=fsync), **settings)

    def reopen(self) -> None:
        """Close and reopen the store as a restarted process would: open trajectories and
        the in-memory pools are gone; the store keeps exactly the committed trajectories."""
        with self._lock:
            self._epoch += 1
            if self.store is not None:
                path, fsync = self.store.path, self.store.fsync
                self.store.close()
                self.store = TrajectoryStore(path, fsync=fsync)
            self._reset_memory()

    def close(self) -> None:
        if self.store is not None:
            self.store.close()

    # ----------------------------------------------------------- writing
    def begin(self, task_seed: int, policy_version: int) -> Pending:
        """Open a trajectory; append calls to it, then commit or abort."""
        with self._lock:
            tid = self._next_id
            self._next_id += 1
            return Pending(self, tid, task_seed, policy_version, self._epoch)

    def add(self, traj: Trajectory, *, steps: Sequence[Sequence[tuple[Any, float]]] | None = None,
            step_log: StepLog | None = None, breakdowns: Sequence[Any] | None = None) -> CommitResult:
        """Commit a finished trajectory at once (the same object is kept, not a copy).

        ``steps[i]`` lists call ``i``'s ``(action, reward)`` per primitive step; or pass
        the episode's ``step_log`` (see :class:`StepRecorder`) and it is split per call.
        """
        if steps is None and step_log is not None:
            steps = split_steps(traj, step_log)
        n = len(traj.calls)
        for name, seq in (("steps", steps), ("breakdowns", breakdowns)):
            if seq is not None and len(seq) != n:
                raise ValueError(f"{name}: expected one entry per option call ({n}), got {len(seq)}")
        for c in traj.calls:
            if c.policy_version != traj.policy_version:
                raise ValueError(f"call of agent {c.agent!r} at step {c.start_step} has policy_version "
                                 f"{c.policy_version}; the trajectory has {traj.policy_version}")
        actions = rewards = None
        if steps is not None:
            actions = [[a for a, _ in s] for s in steps]
            rewards = [[r for _, r in s] for s in steps]
        with self._lock:
            tid = self._next_id
            self._next_id += 1
            return self._commit(tid, traj, actions, rewards, breakdowns)

    def _commit(self, tid: int, traj: Trajectory, actions: Sequence[Any] | None,
                rewards: Sequence[Any] | None, breakdowns: Sequence[Any] | None) -> CommitResult:
        with self._lock:
            n = len(traj.calls)
            if n > self.capacity:
                raise ValueError(f"trajectory has {n} option calls, more than the buffer `capacity` "
                                 f"({self.capacity}); raise the capacity")
            entry = Entry(tid, traj, segment_hashes(traj))
            if self.dedup and entry.hashes and all(h in self._hash_refs for h in entry.hashes):
                self.stats.duplicates += 1
                return CommitResult(tid, accepted=False)
            if self.store is not None:
                if breakdowns is not None and all(b is None for b in breakdowns):
                    breakdowns = None
                self.store.append(tid, traj, actions=actions, rewards=rewards, breakdowns=breakdowns)
            self.stats.committed += 1
            self._hold(entry)
            self._fresh[tid] = entry
            self._fresh_calls += n
            elite = self._admit_elite(entry)
            new = {m for m, s in traj.milestone_steps.items() if s > 0} - self.seen_milestones
            if new:
                self.seen_milestones |= new
                self.stats.turning_points += 1
                if self.max_turning_points:
                    self._hold(entry)
                    self._turning[tid] = entry
                    while len(self._turning) > self.max_turning_points:
                        old, _ = self._turning.popitem(last=False)
                        self._release(old)
            evicted = []
            while self._fresh_calls > self.capacity:
                evicted.append(self._evict_one(protect=tid))
            return CommitResult(tid, True, elite=elite, turning_point=bool(new), evicted=tuple(evicted))

    # reference counting: an entry's hashes count while it sits in at least one pool
    def _hold(self, entry: Entry) -> None:
        count = self._refs.get(entry.id, 0)
        if count == 0:
            for h in entry.hashes:
                self._hash_refs[h] = self._hash_refs.get(h, 0) + 1
        self._refs[entry.id] = count + 1
        self._entries[entry.id] = entry

    def _release(self, tid: int) -> None:
        count = self._refs[tid] - 1
        if count:
            self._refs[tid] = count
            return
        del self._refs[tid]
        entry = self._entries.pop(tid)
        for h in entry.hashes:
            left = self._hash_refs[h] - 1
            if left:
                self._hash_refs[h] = left
            else:
                del self._hash_refs[h]

    def _admit_elite(self, entry: Entry) -> bool:
        if not self.elite_size:
            return False
        if len(self._top) >= self.elite_size:
            worst = min(self._top.values(), key=lambda e: e.rank)
            if entry.rank <= worst.rank:
                return False
            del self._top[worst.id]
            self._release(worst.id)
        self._hold(entry)
        self._top[entry.id] = entry
        return True

    def _evict_one(self, protect: int | None = None) -> int:
        ids = [i for i in self._fresh if i != protect]
        if not ids:
            raise ValueError("nothing to evict")
        if self.eviction == "fifo":
            victim = ids[0]
        else:
            victim = ids[int(self.rng.integers(min(self.eviction_window, len(ids))))]
        self._drop_fresh(victim)
        self.stats.evicted += 1
        return victim

    def _drop_fresh(self, tid: int) -> None:
        entry = self._fresh.pop(tid)
        self._fresh_calls -= entry.n_calls
        self._release(tid)

    def evict(self, count: int = 1) -> list[int]:
        """Evict up to ``count`` trajectories from the fresh pool by the eviction rule."""
        with self._lock:
            return [self._evict_one() for _ in range(min(count, len(self._fresh)))]

    def purge(self, ids: Sequence[int] | None = None, *, min_version: int | None = None) -> int:
        """Remove trajectories from every pool (e.g. the batch before a rollback): the
        given ``ids`` and/or all with ``policy_version >= min_version``. Returns how many."""
        with self._lock:
            doomed = set(ids or ())
            if min_version is not None:
                doomed |= {i for i, e in list(self._entries.items()) if e.policy_version >= min_version}
            removed = 0
            for tid in doomed:
                hit = False
                if tid in self._fresh:
                    self._drop_fresh(tid)
                    hit = True
                for pool in (self._top, self._turning):
                    if tid in pool:
                        del pool[tid]
                        self._release(tid)
                        hit = True
                removed += hit
            self.stats.purged += removed
            return removed

    # ----------------------------------------------------------- reading
    def _drop_stale(self, version: int) -> int:
        dropped: set[int] = set()
        if self.max_staleness is not None:
            floor = version - self.max_staleness
            for tid in [i for i, e in self._fresh.items() if e.policy_version < floor]:
                self._drop_fresh(tid)
                dropped.add(tid)
        if self.elite_max_staleness is not None:
            floor = version - self.elite_max_staleness
            for pool in (self._top, self._turning):
                for tid in [i for i, e in pool.items() if e.policy_version < floor]:
                    del pool[tid]
                    self._release(tid)
                    dropped.add(tid)
        self.stats.stale_dropped += len(dropped)
        return len(dropped)

    def sample(self, n: int, *, version: int, rng: np.random.Generator | None = None,
               newest: bool = False) -> Sample:
        """Up to ``n`` distinct trajectories: ``round(n · elite_ratio)`` from the elite pool
        (fewer if it is smaller), the rest from the fresh pool — at random, or the most
        recently committed with ``newest=True``. Stale ones are dropped first and counted."""
        if n < 0:
            raise ValueError(f"n ({n}) must be >= 0")
        rng = rng if rng is not None else self.rng
        with self._lock:
            dropped = self._drop_stale(version)
            elite_pool = sorted(self._top.keys() | self._turning.keys())
            k_elite = min(round(n * self.elite_ratio), len(elite_pool))
            chosen = [elite_pool[i] for i in rng.choice(len(elite_pool), k_elite, replace=False)] if k_elite else []
            taken = set(chosen)
            fresh = [i for i in self._fresh if i not in taken]
            k_fresh = min(n - k_elite, len(fresh))
            if newest:
                picked = fresh[len(fresh) - k_fresh:]
            else:
                picked = [fresh[i] for i in rng.choice(len(fresh), k_fresh, replace=False)] if k_fresh else []
            ids = picked + chosen
            return Sample(trajectories=[self._entries[i].trajectory for i in ids], ids=ids,
                          elite=[False] * len(picked) + [True] * len(chosen), stale_dropped=dropped)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def calls(self) -> int:
        """Option calls held in the fresh pool (what ``capacity`` bounds)."""
        return self._fresh_calls

    @property
    def fresh_ids(self) -> list[int]:
        return list(self._fresh)

    @property
    def elite_ids(self) -> list[int]:
        return sorted(self._top.keys() | self._turning.keys())

    @property
    def turning_point_ids(self) -> list[int]:
        return list(self._turning)

    def get(self, traj_id: int) -> Trajectory:
        return self._entries[traj_id].trajectory

    def metrics(self) -> dict[str, float]:
        """Counters for the monitor, under ``buffer/``."""
        out = {f"buffer/{k}": float(v) for k, v in dataclasses.asdict(self.stats).items()}
        out |= {"buffer/trajectories": float(len(self)), "buffer/fresh_calls": float(self.calls),
                "buffer/elite": float(len(self.elite_ids))}
        return out

    def state_dict(self) -> dict[str, Any]:
        """Counters, seen milestones, id sequence, RNG state and the pools themselves (their
        trajectories as plain data), so a resumed run samples what the killed one would."""
        with self._lock:
            return {
                "next_id": self._next_id, "seen_milestones": sorted(self.seen_milestones),
                "stats": dataclasses.asdict(self.stats), "rng": self.rng.bit_generator.state,
                "pools": {"fresh": list(self._fresh), "top": list(self._top), "turning": list(self._turning),
                          "trajectories": {tid: trajectory_to_state(e.trajectory)
                                           for tid, e in self._entries.items()}},
            }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        with self._lock:
            self._next_id = max(int(state["next_id"]), self._next_id)
            self.seen_milestones |= set(state["seen_milestones"])
            self.stats = BufferStats(**state["stats"])
            self.rng.bit_generator.state = state["rng"]
            pools = state.get("pools")
            if pools is None:
                return
            entries = {int(tid): Entry(int(tid), traj := trajectory_from_state(s), segment_hashes(traj))
                       for tid, s in pools["trajectories"].items()}
            for name, pool in (("fresh", self._fresh), ("top", self._top), ("turning", self._turning)):
                for tid in pools[name]:
                    self._hold(entries[int(tid)])
                    pool[int(tid)] = entries[int(tid)]
            self._fresh_calls = sum(e.n_calls for e in self._fresh.values())


__all__ = [
    "BufferStats", "CommitResult", "Entry", "Pending", "Sample", "StepLog", "StepRecorder",
    "StoredTrajectory", "TERMINATIONS", "TrajectoryBuffer", "TrajectoryStore", "agent_segments",
    "segment_hashes", "split_steps",
]
