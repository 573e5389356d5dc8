"""TrajectoryBuffer: whole trajectories only, with dedup, an elite pool and freshness.

:meth:`TrajectoryBuffer.add` admits a finished trajectory whole, or not at all; samples
come from two pools:

- *fresh*: admitted trajectories in commit order, at most ``capacity`` option calls,
  evicted FIFO or at random among the oldest ``eviction_window``;
- *elite*: the top ``elite_size`` trajectories by verified outcome, then return, plus
  *turning points* (the first trajectory to verify a milestone never seen before). They
  are mixed into samples at ``elite_ratio`` and outlive their eviction from *fresh*.

A trajectory whose every segment (an agent's run of option calls up to a verified
milestone) is already held is a duplicate and is not admitted. Samples skip trajectories
more than ``max_staleness`` policy versions old, and count them.

With a :class:`~gyre_ma.store.TrajectoryStore`, each admitted trajectory is also written
to Parquet tables on disk (per-step and per-call records, no observations), for analysis
and for restoring the buffer's memory of seen milestones after a restart; training
batches come from the in-memory pools, which hold the observations the learner needs.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from gyre_ma.rollout import OptionCall, Trajectory, trajectory_from_state, trajectory_to_state
from gyre_ma.store import DEFAULT_MAX_BYTES, StepLog, TrajectoryStore

if TYPE_CHECKING:
    from gyre_ma.config import BufferConfig

Eviction = Literal["fifo", "random_oldest"]


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
        """Elite order: verified outcome (a guard's veto making it a failure), then return,
        then the newer one."""
        return (float(self.trajectory.counted_success), float(self.trajectory.total_reward), self.id)


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
    duplicates: int = 0
    evicted: int = 0
    stale_dropped: int = 0
    purged: int = 0
    turning_points: int = 0


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

    @classmethod
    def from_config(cls, config: BufferConfig, *, store_dir: Path | None, seed: int) -> TrajectoryBuffer:
        """The buffer ``config`` describes; with ``store_dir`` (and ``config.store``) its
        committed trajectories also go to the Parquet store there."""
        store = None
        if config.store and store_dir is not None:
            store = TrajectoryStore(store_dir, max_bytes=config.store_max_bytes)
        return cls(config.capacity, eviction=config.eviction, eviction_window=config.eviction_window,
                   dedup=config.dedup, elite_size=config.elite_size, max_turning_points=config.max_turning_points,
                   elite_ratio=config.elite_ratio, max_staleness=config.max_staleness, seed=seed, store=store)

    @classmethod
    def open(cls, path: str | Path, *, max_bytes: int | None = DEFAULT_MAX_BYTES, fsync: bool = True,
             **settings: Any) -> TrajectoryBuffer:
        """A buffer over the store at ``path`` (created if missing, cleaned after a crash).

        Pools start empty (observations are not stored); the memory of seen milestones
        (turning points) and the id sequence continue from the trajectories the store holds.
        """
        return cls(store=TrajectoryStore(path, max_bytes=max_bytes, fsync=fsync), **settings)

    def close(self) -> None:
        """Write the store's staged trajectories and let go of it."""
        if self.store is not None:
            self.store.close()

    # ----------------------------------------------------------- writing
    def add(self, traj: Trajectory, *, step_log: StepLog | None = None) -> CommitResult:
        """Admit a finished trajectory whole, or reject it as a duplicate (the same object
        is kept, not a copy). With a store, ``step_log`` (see
        :class:`~gyre_ma.store.StepRecorder`) adds each step's primitive actions and rewards."""
        n = len(traj.calls)
        if n > self.capacity:
            raise ValueError(f"trajectory has {n} option calls, more than the buffer `capacity` "
                             f"({self.capacity}); raise the capacity")
        for c in traj.calls:
            if c.policy_version != traj.policy_version:
                raise ValueError(f"call of agent {c.agent!r} at step {c.start_step} has policy_version "
                                 f"{c.policy_version}; the trajectory has {traj.policy_version}")
        tid = self._next_id
        self._next_id += 1
        entry = Entry(tid, traj, segment_hashes(traj))
        if self.dedup and entry.hashes and all(h in self._hash_refs for h in entry.hashes):
            self.stats.duplicates += 1
            return CommitResult(tid, accepted=False)
        if self.store is not None:
            self.store.append(tid, traj, step_log=step_log)
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
        return [self._evict_one() for _ in range(min(count, len(self._fresh)))]

    def purge(self, ids: Sequence[int] | None = None, *, min_version: int | None = None) -> int:
        """Remove trajectories from every pool (e.g. the batch before a rollback): the
        given ``ids`` and/or all with ``policy_version >= min_version``. Returns how many."""
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

    def training_sample(self, n: int, *, version: int) -> tuple[list[Trajectory], dict[str, float]]:
        """A training batch of up to ``n``: the newest fresh, deduplicated trajectories plus
        the configured share of elites, with the buffer's metrics (stale ones dropped now
        are counted as ``buffer/stale_dropped_now``)."""
        sample = self.sample(n, version=version, newest=True)
        return sample.trajectories, self.metrics() | {"buffer/stale_dropped_now": float(sample.stale_dropped)}

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
        trajectories as plain data), so a resumed run samples what the killed one would.

        The store writes its staged trajectories first: resumed from this state, a run's
        store holds every trajectory admitted before it."""
        if self.store is not None:
            self.store.flush()
        return {
            "next_id": self._next_id, "seen_milestones": sorted(self.seen_milestones),
            "stats": dataclasses.asdict(self.stats), "rng": self.rng.bit_generator.state,
            "pools": {"fresh": list(self._fresh), "top": list(self._top), "turning": list(self._turning),
                      "trajectories": {tid: trajectory_to_state(e.trajectory)
                                       for tid, e in self._entries.items()}},
        }

    def rewind_to(self, state: Mapping[str, Any]) -> None:
        """After :meth:`load_state_dict` of the checkpoint a killed run resumes from: what
        the run wrote to the store after that checkpoint is dropped (the resumed run plays
        it again), and the id sequence and seen milestones are the checkpoint's, as if the
        run had never gone past it."""
        if self.store is not None:
            self.store.discard_from(int(state["next_id"]))
        self._next_id = int(state["next_id"])
        self.seen_milestones = set(state["seen_milestones"])

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load a checkpoint's state (a rollback within a run: ids and seen milestones
        move on from both; see :meth:`rewind_to` for a run restarted from disk)."""
        self._next_id = max(int(state["next_id"]), self._next_id)
        self.seen_milestones |= set(state["seen_milestones"])
        stats = {k: v for k, v in state["stats"].items() if k != "aborted"}  # older checkpoints
        self.stats = BufferStats(**stats)
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


__all__ = ["BufferStats", "CommitResult", "Entry", "Sample", "TrajectoryBuffer", "agent_segments", "segment_hashes"]
