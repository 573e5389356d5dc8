"""TrajectoryBuffer and TrajectoryStore: whole trajectories only, checked against a model."""

from __future__ import annotations

import shutil
import tempfile
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gyre_ma.buffer import (
    StepRecorder,
    TrajectoryBuffer,
    TrajectoryStore,
    agent_segments,
    segment_hashes,
)
from gyre_ma.options.option import Termination
from gyre_ma.rollout import OptionCall, Trajectory, run_episode

MILESTONES = ("a", "b", "c")


def make_call(agent: int, option: int, start: int, duration: int, milestone: str | None, *,
              seed: int = 0, version: int = 0) -> OptionCall:
    return OptionCall(
        agent=f"agent_{agent}", agent_index=agent, option=option, observation=np.zeros(2, np.float32),
        mask=np.ones(3, bool), achieved=frozenset(), last_option=-1, time_fraction=0.0, log_prob=-1.0,
        value=0.0, start_step=start, policy_version=version, task_seed=seed, duration=duration,
        reward=float(duration), raw_reward=float(duration),
        milestones=(milestone,) if milestone else (), termination=Termination.DONE,
    )


def make_traj(spec, *, seed: int = 0, version: int = 0, success: bool = False,
              reward: float | None = None) -> Trajectory:
    """spec: [(agent, option, duration, milestone | None)] in decision order."""
    clock: dict[int, int] = {}
    traj = Trajectory(task_seed=seed, policy_version=version)
    for agent, option, duration, milestone in spec:
        start = clock.get(agent, 0)
        clock[agent] = start + duration
        traj.calls.append(make_call(agent, option, start, duration, milestone, seed=seed, version=version))
        if milestone:
            traj.milestone_steps.setdefault(milestone, start + duration)
    traj.length = max(clock.values(), default=0)
    traj.success = success
    traj.total_reward = sum(c.raw_reward for c in traj.calls) if reward is None else reward
    return traj


# --------------------------------------------------------------------------- segments
def test_segments_cut_after_verified_milestones_and_hash_stably():
    calls = make_traj([(0, 1, 2, None), (0, 2, 1, "a"), (0, 1, 3, None)]).calls
    assert [len(s) for s in agent_segments(calls)] == [2, 1]
    t1 = make_traj([(0, 1, 2, "a"), (1, 0, 1, None)], seed=5)
    t2 = make_traj([(0, 1, 2, "a"), (1, 0, 1, None)], seed=5)
    assert segment_hashes(t1) == segment_hashes(t2) and len(segment_hashes(t1)) == 2
    assert segment_hashes(t1) != segment_hashes(make_traj([(0, 1, 3, "a"), (1, 0, 1, None)], seed=5))
    assert segment_hashes(t1) != segment_hashes(make_traj([(0, 1, 2, "a"), (1, 0, 1, None)], seed=6))


# --------------------------------------------------------------------------- buffer units
def test_dedup_rejects_a_repeat_until_the_original_leaves():
    buf = TrajectoryBuffer(capacity=4, elite_size=0, max_turning_points=0)
    first = buf.add(make_traj([(0, 1, 2, "a"), (0, 0, 1, None)]))
    assert first.accepted
    dup = buf.add(make_traj([(0, 1, 2, "a"), (0, 0, 1, None)]))
    assert not dup.accepted and buf.stats.duplicates == 1 and buf.fresh_ids == [first.id]
    assert buf.add(make_traj([(0, 1, 2, "a"), (0, 2, 1, None)])).accepted  # one new segment
    buf.evict(2)
    assert buf.add(make_traj([(0, 1, 2, "a"), (0, 0, 1, None)])).accepted


def test_capacity_counts_option_calls_and_random_eviction_spares_the_newest():
    buf = TrajectoryBuffer(capacity=6, eviction="random_oldest", eviction_window=2, dedup=False,
                           elite_size=0, max_turning_points=0, seed=3)
    ids = [buf.add(make_traj([(0, i % 3, 1, None), (1, 0, 1, None)], seed=i)).id for i in range(3)]
    assert buf.calls == 6 and buf.fresh_ids == ids
    for i in range(3, 20):
        result = buf.add(make_traj([(0, 0, 1, None), (1, 0, 1, None)], seed=i))
        assert result.id in buf.fresh_ids and buf.calls <= 6
        assert len(result.evicted) == 1
    with pytest.raises(ValueError, match=r"7 option calls, more than the buffer `capacity` \(6\)"):
        buf.add(make_traj([(0, 0, 1, None)] * 7))
    with pytest.raises(ValueError, match=r"`eviction` \('lifo'\)"):
        TrajectoryBuffer(eviction="lifo")


def test_stale_trajectories_are_dropped_and_counted_elite_and_turning_points_kept():
    buf = TrajectoryBuffer(capacity=100, dedup=False, elite_size=1, max_turning_points=1,
                           elite_ratio=0.5, max_staleness=1)
    good = buf.add(make_traj([(0, 1, 3, "a")], version=0, success=True)).id
    for v in range(4):
        buf.add(make_traj([(0, 0, 1, None)], version=v))
    sample = buf.sample(4, version=3)
    assert sample.stale_dropped == 3  # versions 0 (plain), 0 and 1 — not the elite one
    assert good in buf.elite_ids and good not in buf.fresh_ids
    assert good in sample.ids and sample.elite[sample.ids.index(good)]
    assert all(buf.get(i).policy_version >= 2 for i, e in zip(sample.ids, sample.elite) if not e)
    assert sum(sample.elite) == 1 and buf.stats.stale_dropped == 3


def test_elite_pool_mix_ratio_and_turning_points():
    buf = TrajectoryBuffer(capacity=4, dedup=False, elite_size=2, max_turning_points=2, elite_ratio=0.25,
                           max_staleness=None)
    results = [buf.add(make_traj([(0, 0, 1, None)], seed=i, reward=float(i))) for i in range(6)]
    assert buf.elite_ids == [results[4].id, results[5].id]  # top-2 by return
    tp = buf.add(make_traj([(0, 1, 1, "b")], seed=9, reward=-5.0))
    assert tp.turning_point and not tp.elite and tp.id in buf.turning_point_ids
    again = buf.add(make_traj([(0, 1, 1, "b")], seed=10, reward=-5.0))
    assert not again.turning_point
    for i in range(4):  # push the turning point out of the fresh pool
        buf.add(make_traj([(0, 0, 1, None)], seed=20 + i))
    assert tp.id not in buf.fresh_ids and tp.id in buf.elite_ids
    winner = buf.add(make_traj([(0, 2, 1, None)], seed=30, success=True, reward=0.0))
    assert winner.elite and winner.id in buf.elite_ids  # verified outcome beats any return
    sample = buf.sample(8, version=0, newest=True)
    elite = [i for i, e in zip(sample.ids, sample.elite) if e]
    assert len(elite) == 2 and set(elite) <= set(buf.elite_ids)  # round(8 · 0.25) of the 3 elites
    assert sample.ids[:-2] == [i for i in buf.fresh_ids if i not in elite]  # the rest: all fresh left
    held = len(buf)
    assert buf.purge(min_version=0) == held and len(buf) == 0
    assert buf.sample(4, version=0).ids == []


def test_transaction_is_invisible_until_commit_and_abort_leaves_nothing(tmp_path):
    buf = TrajectoryBuffer.open(tmp_path / "log", fsync=False)
    tx = buf.begin(task_seed=1, policy_version=0)
    tx.append(make_call(0, 1, 0, 2, "a", seed=1), actions=[3, 4], rewards=[0.0, 1.0])
    assert buf.sample(5, version=0).ids == [] and len(buf.store) == 0
    with pytest.raises(ValueError, match="policy_version=7; expected 1, 0"):
        tx.append(make_call(0, 1, 2, 1, None, seed=1, version=7))
    with pytest.raises(ValueError, match="actions has 1 entries; the call lasted 2"):
        tx.append(make_call(0, 1, 2, 2, None, seed=1), actions=[1])
    result = tx.commit(success=True)
    assert result.accepted and buf.sample(5, version=0).ids == [result.id]
    with pytest.raises(ValueError, match="no longer open"):
        tx.append(make_call(0, 1, 2, 1, None, seed=1))
    with buf.begin(task_seed=2, policy_version=0) as tx2:
        tx2.append(make_call(0, 1, 0, 1, None, seed=2))
    assert buf.stats.aborted == 1 and len(buf.store) == 1 and len(buf) == 1
    steps = buf.store.to_pandas()
    assert steps["action"].tolist() == [3, 4] and steps["reward"].tolist() == [0.0, 1.0]


def test_failed_write_leaves_nothing(tmp_path):
    buf = TrajectoryBuffer.open(tmp_path / "log", fsync=False)
    traj = make_traj([(0, 1, 2, "a")])
    with pytest.raises(TypeError, match="reward breakdown"):
        buf.add(traj, breakdowns=[object()])
    assert len(buf) == 0 and len(buf.store) == 0 and buf.store.nbytes == 0
    assert buf.add(traj, breakdowns=[{"outcome": 1.0, "milestone": 0.5}]).accepted
    calls = buf.store.to_pandas("calls")
    assert calls[["r_milestone", "r_outcome"]].values.tolist() == [[0.5, 1.0]]
    assert calls["milestone_names"].tolist() == [("a",)] and calls["termination"].tolist() == ["done"]


# --------------------------------------------------------------------------- on-disk store
def test_store_truncates_a_torn_tail_at_every_byte(tmp_path):
    path = tmp_path / "log"
    with TrajectoryStore(path, fsync=False) as store:
        for i in range(3):
            store.append(i, make_traj([(0, i, 2, "a"), (1, 0, 1, None)], seed=i))
        sizes = [c.size for c in store._chunks]
    full = path.read_bytes()
    whole = sum(sizes[:2])
    for cut in range(whole, len(full), 3):
        path.write_bytes(full[:cut])
        with TrajectoryStore(path, fsync=False) as store:
            assert store.ids() == [0, 1] and store.truncated_bytes == cut - whole
        assert path.stat().st_size == whole
    flipped = bytearray(full)
    flipped[sizes[0] + 40] ^= 0xFF  # damage in the second chunk drops it and all after it
    path.write_bytes(bytes(flipped))
    with TrajectoryStore(path, fsync=False) as store:
        assert store.ids() == [0] and store.milestones == ["a"]


def test_store_is_single_writer(tmp_path):
    with TrajectoryStore(tmp_path / "log"):
        with pytest.raises(ValueError, match="open in another process"):
            TrajectoryStore(tmp_path / "log")


def test_real_workflow_episodes_round_trip_through_the_store(tmp_path):
    from gyre_ma.envs import workflow_v0
    from gyre_ma.envs.workflow.options import make_library
    from gyre_ma.envs.workflow.oracle import OracleManager

    env = StepRecorder(workflow_v0.parallel_env())
    library, oracle = make_library(), OracleManager()
    buf = TrajectoryBuffer.open(tmp_path / "log", fsync=False)
    trajs = []
    for seed in range(2):
        traj = run_episode(env, library, oracle, seed=seed)
        assert buf.add(traj, step_log=env.log).accepted
        trajs.append(traj)
    steps = buf.store.to_pandas("steps")
    calls = buf.store.to_pandas("calls")
    assert len(steps) == sum(t.length for t in trajs) * len(env.possible_agents)
    assert len(calls) == sum(len(t.calls) for t in trajs)
    for tid, traj in zip(buf.store.ids(), trajs, strict=True):
        stored = buf.store.read(tid)
        assert stored.milestone_steps == traj.milestone_steps and stored.success == traj.success
        df = pd.DataFrame(stored.steps)  # plain numpy structured array → pandas
        per_call = df.groupby("call")["reward"].sum()
        assert np.allclose(per_call.values, [c.raw_reward for c in traj.calls])
        assert (df.groupby("call").size().values == [c.duration for c in traj.calls]).all()
    first = steps[(steps.traj_id == 1) & (steps.step == 0)][["action_0", "action_1"]].values
    assert first.tolist() == [list(env.log[0][0][a]) for a in env.possible_agents]  # log: last episode
    buf.reopen()
    assert len(buf) == 0 and buf.store.ids() == [0, 1] and "submission_verified" in buf.seen_milestones


# --------------------------------------------------------------------------- state machine
CAP = 6


class BufferMachine(RuleBasedStateMachine):
    """The buffer against a model: FIFO pool, top-k elite, turning points, store contents."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp())
        self.buf = TrajectoryBuffer.open(
            self.dir / "log", fsync=False, capacity=CAP, eviction="fifo", dedup=True, elite_size=2,
            max_turning_points=2, elite_ratio=0.5, max_staleness=1, elite_max_staleness=None,
        )
        self.version = 0
        self.open: list[tuple] = []  # (pending, per-agent clock)
        self.fresh: OrderedDict[int, tuple[int, int, tuple[int, ...]]] = OrderedDict()
        self.top: dict[int, tuple] = {}
        self.turning: OrderedDict[int, None] = OrderedDict()
        self.hashes: dict[int, tuple[int, ...]] = {}
        self.seen: set[str] = set()
        self.stored: list[int] = []
        self.stored_milestones: set[str] = set()
        self.last_commit: int | None = None

    def teardown(self) -> None:
        self.buf.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def held(self) -> set[int]:
        return set(self.fresh) | set(self.top) | set(self.turning)

    @precondition(lambda self: len(self.open) < 3)
    @rule(seed=st.integers(0, 2))
    def begin(self, seed):
        self.open.append((self.buf.begin(task_seed=seed, policy_version=self.version), {}))

    @precondition(lambda self: self.open)
    @rule(i=st.integers(0, 2), agent=st.integers(0, 1), option=st.integers(0, 2),
          duration=st.integers(1, 2), milestone=st.sampled_from((None, None, *MILESTONES)))
    def append(self, i, agent, option, duration, milestone):
        tx, clock = self.open[i % len(self.open)]
        if len(tx.trajectory.calls) >= CAP:
            return
        start = clock.get(agent, 0)
        clock[agent] = start + duration
        t = tx.trajectory
        tx.append(make_call(agent, option, start, duration, milestone, seed=t.task_seed,
                            version=t.policy_version), actions=list(range(duration)))

    @precondition(lambda self: self.open)
    @rule(i=st.integers(0, 2), success=st.booleans(), reward=st.integers(-2, 2))
    def commit(self, i, success, reward):
        tx, _ = self.open.pop(i % len(self.open))
        hashes = segment_hashes(tx.trajectory)
        held_hashes = {h for tid in self.held() for h in self.hashes[tid]}
        duplicate = bool(hashes) and all(h in held_hashes for h in hashes)
        result = tx.commit(success=success, total_reward=float(reward))
        assert result.accepted == (not duplicate)
        if duplicate:
            return
        tid, traj = result.id, tx.trajectory
        self.hashes[tid] = hashes
        self.stored.append(tid)
        self.last_commit = tid
        self.fresh[tid] = (len(traj.calls), traj.policy_version, hashes)
        rank = (float(success), float(reward), tid)
        if len(self.top) < 2:
            self.top[tid] = rank
        else:
            worst = min(self.top, key=self.top.__getitem__)
            if rank > self.top[worst]:
                del self.top[worst]
                self.top[tid] = rank
        new = set(traj.milestone_steps) - self.seen
        self.stored_milestones |= set(traj.milestone_steps)
        assert result.turning_point == bool(new)
        if new:
            self.seen |= new
            self.turning[tid] = None
            while len(self.turning) > 2:
                self.turning.popitem(last=False)
        evicted = []
        while sum(n for n, _, _ in self.fresh.values()) > CAP:
            victim = next(k for k in self.fresh if k != tid)
            del self.fresh[victim]
            evicted.append(victim)
        assert list(result.evicted) == evicted

    @precondition(lambda self: self.open)
    @rule(i=st.integers(0, 2))
    def abort(self, i):
        tx, _ = self.open.pop(i % len(self.open))
        tx.abort()

    @rule(count=st.integers(1, 2))
    def evict(self, count):
        expected = list(self.fresh)[:count]
        assert self.buf.evict(count) == expected
        for tid in expected:
            del self.fresh[tid]

    @rule()
    def bump_version(self):
        self.version += 1

    @precondition(lambda self: self.last_commit is not None)
    @rule()
    def purge_last_batch(self):
        tid = self.last_commit
        assert self.buf.purge([tid]) == int(tid in self.held())
        self.fresh.pop(tid, None)
        self.top.pop(tid, None)
        self.turning.pop(tid, None)

    @rule(n=st.integers(0, 6), newest=st.booleans())
    def sample(self, n, newest):
        stale = [t for t, (_, v, _) in self.fresh.items() if v < self.version - 1]
        for t in stale:
            del self.fresh[t]
        s = self.buf.sample(n, version=self.version, newest=newest)
        assert s.stale_dropped == len(stale)
        elite_pool = set(self.top) | set(self.turning)
        k_elite = min(round(n * 0.5), len(elite_pool))
        chosen_elite = [i for i, e in zip(s.ids, s.elite) if e]
        chosen_fresh = [i for i, e in zip(s.ids, s.elite) if not e]
        assert len(chosen_elite) == k_elite and set(chosen_elite) <= elite_pool
        candidates = [t for t in self.fresh if t not in chosen_elite]
        assert len(chosen_fresh) == min(n - k_elite, len(candidates))
        assert set(chosen_fresh) <= set(candidates) and len(set(s.ids)) == len(s.ids)
        if newest:
            assert chosen_fresh == candidates[len(candidates) - len(chosen_fresh):]
        assert all(t.policy_version >= self.version - 1 for t, e in zip(s.trajectories, s.elite) if not e)

    @rule(torn=st.integers(0, 400))
    def crash_and_reopen(self, torn):
        path = self.buf.store.path
        if torn and self.buf.store._chunks:  # a half-written chunk at the tail
            last = self.buf.store._chunks[-1]
            data = path.read_bytes()[last.offset:last.offset + last.size]
            with open(path, "ab") as f:
                f.write(data[: torn % last.size])
        stale_tx = self.open[0][0] if self.open else None
        self.buf.reopen()
        self.open.clear()
        self.fresh.clear()
        self.top.clear()
        self.turning.clear()
        self.seen = set(self.stored_milestones)
        assert self.buf.seen_milestones == self.seen
        assert self.buf.store.to_pandas("trajectories")["traj_id"].tolist() == self.stored
        if stale_tx is not None:
            with pytest.raises(ValueError, match="no longer open|reopened"):
                stale_tx.commit()

    @invariant()
    def agrees_with_model(self):
        assert self.buf.fresh_ids == list(self.fresh)
        assert self.buf.calls == sum(n for n, _, _ in self.fresh.values()) <= CAP
        assert self.buf.elite_ids == sorted(set(self.top) | set(self.turning))
        assert self.buf.store.ids() == self.stored
        assert len(self.buf) == len(self.held())
        assert not {tx.id for tx, _ in self.open} & self.held()


TestBufferMachine = BufferMachine.TestCase
TestBufferMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
