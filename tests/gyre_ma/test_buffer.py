"""TrajectoryBuffer and its Parquet TrajectoryStore: whole trajectories only, checked
against a model; the store's folders read directly by pandas, polars and duckdb."""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
import tempfile
from collections import OrderedDict
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import polars as pl
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gyre_ma.buffer import TrajectoryBuffer, agent_segments, segment_hashes
from gyre_ma.options.option import Termination
from gyre_ma.rewards.breakdown import RewardBreakdown
from gyre_ma.rollout import OptionCall, Trajectory, run_episode
from gyre_ma.store import KINDS, StepRecorder, TrajectoryStore

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


def files(root: Path, kind: str) -> list[str]:
    return sorted(p.name for p in (root / kind).iterdir())


def step_log_for(traj: Trajectory) -> list[tuple[dict, dict]]:
    """A step log with a distinct 2-vector action and reward per agent and step."""
    agents = {c.agent: c.agent_index for c in traj.calls}
    return [({a: [t, 10 * i] for a, i in agents.items()}, {a: t + i / 10 for a, i in agents.items()})
            for t in range(traj.length)]


# --------------------------------------------------------------------------- buffer and store
def test_failed_write_leaves_nothing(tmp_path):
    buf = TrajectoryBuffer.open(tmp_path / "store", fsync=False)
    traj = make_traj([(0, 1, 2, "a")])
    traj.calls[0].breakdown = object()
    with pytest.raises(TypeError, match="breakdown of call 0: expected a RewardBreakdown.*got object"):
        buf.add(traj)
    traj.calls[0].breakdown = {"outcome": 1.0, "novelty": 2.0}
    with pytest.raises(ValueError, match=r"unknown components \['novelty'\]"):
        buf.add(traj)
    assert len(buf) == 0 and len(buf.store) == 0 and buf.store.table("calls").num_rows == 0
    traj.calls[0].breakdown = RewardBreakdown(outcome=1.0, milestone=0.5, total=1.5)
    assert buf.add(traj).accepted
    buf.close()
    calls = pd.read_parquet(tmp_path / "store" / "calls")
    assert calls[["r_outcome", "r_milestone", "r_rules"]].values.tolist() == [[1.0, 0.5, 0.0]]
    assert calls["milestones"].map(list).tolist() == [["a"]] and calls["termination"].tolist() == ["done"]


def test_state_dict_writes_the_staged_trajectories_and_loads_older_checkpoints(tmp_path):
    buf = TrajectoryBuffer.open(tmp_path / "store", fsync=False)
    buf.add(make_traj([(0, 1, 2, "a")]))
    assert buf.store.ids() == [0] and buf.store.chunks == []  # staged, not yet on disk
    state = buf.state_dict()
    assert buf.store.chunks == [0] and len(pd.read_parquet(tmp_path / "store" / "trajectories")) == 1
    state["stats"] = state["stats"] | {"aborted": 3}  # written before the transaction API went
    fresh = TrajectoryBuffer()
    fresh.load_state_dict(state)
    assert fresh.fresh_ids == [0] and fresh.stats.committed == 1 and fresh.seen_milestones == {"a"}
    buf.close()


# --------------------------------------------------------------------------- store
def test_store_round_trips_steps_calls_and_trajectories(tmp_path):
    traj = make_traj([(0, 1, 2, "a"), (1, 2, 3, None), (0, 0, 1, "b")], seed=7, version=3, success=True)
    traj.horizon, traj.tool_calls = 50, 4
    traj.calls[1].termination, traj.calls[1].truncated = None, True
    log = step_log_for(traj)
    with TrajectoryStore(tmp_path, fsync=False) as store:
        store.append(5, traj, step_log=log)
        store.append(6, make_traj([(0, 2, 1, None)]))  # no step log: actions and rewards null
    with TrajectoryStore(tmp_path, fsync=False) as store:  # read back from disk
        assert store.ids() == [5, 6] and store.chunks == [0]
        assert store.env_steps == traj.length + 1 and store.n_steps == 6 + 1
        assert store.milestones_of(5) == {"a": 2, "b": 3}
        steps, calls, trajs = (store.to_pandas(kind) for kind in KINDS)
    mine = steps[steps.traj_id == 5]
    for i, c in enumerate(traj.calls):
        rows = mine[mine.call == i]
        assert rows.step.tolist() == list(range(c.start_step, c.start_step + c.duration))
        assert (rows.agent == c.agent).all() and (rows.option == c.option).all()
        assert rows.action.map(list).tolist() == [log[t][0][c.agent] for t in rows.step]
        assert np.allclose(rows.reward, [log[t][1][c.agent] for t in rows.step])
    other = steps[steps.traj_id == 6]
    assert other.action.isna().all() and other.reward.isna().all()
    mine = calls[calls.traj_id == 5]
    for name in ("agent", "option", "start_step", "duration", "raw_reward", "log_prob", "terminated",
                 "truncated", "policy_version"):
        assert mine[name].tolist() == [getattr(c, name) for c in traj.calls], name
    assert mine.termination.fillna("(running)").tolist() == ["done", "(running)", "done"]
    assert mine.milestones.map(list).tolist() == [["a"], [], ["b"]]
    row = trajs[trajs.traj_id == 5].iloc[0]
    assert (row.task_seed, row.policy_version, row.length, row.horizon, row.success, row.tool_calls,
            row.n_calls, row.n_steps) == (7, 3, traj.length, 50, True, 4, 3, 6)
    assert row.total_reward == traj.total_reward and row.milestone_steps == {"a": 2, "b": 3}


def test_store_folders_read_directly_with_pandas_polars_and_duckdb(tmp_path):
    with TrajectoryStore(tmp_path, fsync=False) as store:
        for i in range(3):
            traj = make_traj([(0, i, 2, "a"), (1, 0, 1 + i, None)], seed=i)
            store.append(i, traj, step_log=step_log_for(traj))
            if i != 1:
                store.flush()  # chunks: [0], [1, 2]
        expected = {kind: store.to_pandas(kind) for kind in KINDS}
    assert files(tmp_path, "steps") == ["000000.parquet", "000001.parquet"]
    for kind in KINDS:
        direct = pd.read_parquet(tmp_path / kind)
        if kind == "trajectories":  # to_pandas gives the map column as dicts
            direct["milestone_steps"] = direct.milestone_steps.map(dict)
        pd.testing.assert_frame_equal(direct, expected[kind])
    per_traj = (pl.scan_parquet(f"{tmp_path}/steps/*.parquet").group_by("traj_id").len()
                .sort("traj_id").collect())
    assert per_traj["len"].to_list() == expected["trajectories"]["n_steps"].tolist() == [3, 4, 5]
    joined = duckdb.sql(f"""
        select t.traj_id, count(*) as rows, sum(s.reward) as reward
        from '{tmp_path}/steps/*.parquet' s join '{tmp_path}/trajectories/*.parquet' t using (traj_id)
        group by t.traj_id order by t.traj_id""").fetchall()
    sums = expected["steps"].groupby("traj_id").reward.sum()
    assert [(t, n) for t, n, _ in joined] == [(0, 3), (1, 4), (2, 5)]
    assert np.allclose([r for *_, r in joined], sums.values)


CRASH = r"""
import os, pickle, sys
from gyre_ma import store as module

root, when = sys.argv[1], sys.argv[2]
traj = pickle.load(open(sys.argv[3], "rb"))
store = module.TrajectoryStore(root)
store.append(1, traj)
if when == "before_flush":
    os._exit(0)
replace = os.replace
def dying_replace(src, dst):
    if "trajectories" in str(dst):
        os._exit(0)  # killed between the chunk's renames
    replace(src, dst)
module.os.replace = dying_replace
store.flush()
"""


@pytest.mark.parametrize("when", ["before_flush", "between_renames"])
def test_a_killed_writer_leaves_whole_trajectories_only(tmp_path, when):
    root = tmp_path / "store"
    with TrajectoryStore(root) as store:
        store.append(0, make_traj([(0, 1, 2, "a")]))
    (tmp_path / "traj.pkl").write_bytes(pickle.dumps(make_traj([(0, 2, 3, "b"), (1, 0, 1, None)], seed=1)))
    subprocess.run([sys.executable, "-c", CRASH, str(root), when, str(tmp_path / "traj.pkl")], check=True,
                   timeout=120)
    left = {kind: files(root, kind) for kind in KINDS}
    if when == "between_renames":  # steps and calls of chunk 1 renamed, its trajectories file not
        assert left == {"steps": ["000000.parquet", "000001.parquet"],
                        "calls": ["000000.parquet", "000001.parquet"],
                        "trajectories": [".000001.parquet.tmp", "000000.parquet"]}
    assert pd.read_parquet(root / "trajectories").traj_id.tolist() == [0]  # the temp file is ignored
    with TrajectoryStore(root) as store:
        assert store.ids() == [0] and store.chunks == [0] and store.milestones_of(0) == {"a": 2}
        assert store.table("steps").column("traj_id").to_pylist() == [0, 0]
    assert {kind: files(root, kind) for kind in KINDS} == {kind: ["000000.parquet"] for kind in KINDS}
    assert pd.read_parquet(root / "steps").traj_id.tolist() == [0, 0]


def test_a_failed_flush_leaves_no_files_and_keeps_the_trajectories_staged(tmp_path, monkeypatch):
    from gyre_ma import store as module

    replace = module.os.replace

    def full_disk(src, dst):
        if "calls" in str(dst):
            raise OSError(28, "No space left on device")
        replace(src, dst)

    with TrajectoryStore(tmp_path, fsync=False) as store:
        store.append(0, make_traj([(0, 1, 2, "a")]))
        monkeypatch.setattr(module.os, "replace", full_disk)
        with pytest.raises(OSError, match="No space left"):
            store.flush()
        assert {kind: files(tmp_path, kind) for kind in KINDS} == {kind: [] for kind in KINDS}
        assert store.ids() == [0] and store.chunks == []
        monkeypatch.setattr(module.os, "replace", replace)
        assert store.flush() > 0 and store.chunks == [0]
    assert pd.read_parquet(tmp_path / "calls").traj_id.tolist() == [0]


def test_store_evicts_the_oldest_chunks_past_max_bytes(tmp_path):
    def chunk(store: TrajectoryStore, tid: int) -> None:
        store.append(tid, make_traj([(0, tid % 3, 1 + tid, "a")], seed=tid))
        store.flush()

    with TrajectoryStore(tmp_path, max_bytes=None, fsync=False) as store:
        chunk(store, 0)
        size = store.nbytes
    bound = int(2.5 * size)
    with TrajectoryStore(tmp_path, max_bytes=bound, fsync=False) as store:
        for tid in range(1, 6):
            chunk(store, tid)
            assert store.nbytes <= bound
        assert store.chunks == [4, 5] and store.ids() == [4, 5]
        with pytest.raises(KeyError, match="trajectory 0 is not in store"):
            store.milestones_of(0)
    assert files(tmp_path, "calls") == ["000004.parquet", "000005.parquet"]
    assert pd.read_parquet(tmp_path / "steps").traj_id.unique().tolist() == [4, 5]
    with TrajectoryStore(tmp_path, max_bytes=1, fsync=False) as store:  # a smaller bound applies on open
        assert store.chunks == [5] and store.nbytes > 1  # the newest chunk always stays
        chunk(store, 6)
        assert store.chunks == [6] and TrajectoryBuffer(store=store)._next_id == 7


def test_discard_from_drops_later_chunks_and_staged_trajectories_and_refuses_to_split_a_chunk(tmp_path):
    with TrajectoryStore(tmp_path, max_bytes=None, fsync=False) as store:
        for tid in range(4):
            store.append(tid, make_traj([(0, 1, 2, "a")], seed=tid))
            if tid in (1, 2):
                store.flush()  # chunks [0, 1] and [2]; 3 stays staged
        assert store.discard_from(2) == [2, 3]
        assert store.ids() == [0, 1] and store.chunks == [0]
        assert files(tmp_path, "trajectories") == ["000000.parquet"]
        with pytest.raises(ValueError, match=r"chunk 0 holds trajectories 0–1, on both sides of 1"):
            store.discard_from(1)
        assert store.ids() == [0, 1]
    with TrajectoryStore(tmp_path, fsync=False) as store:
        assert store.ids() == [0, 1]


def test_store_rejects_bad_input_and_a_second_writer(tmp_path):
    with pytest.raises(ValueError, match=r"`max_bytes` \(0\) must be >= 1 or None"):
        TrajectoryStore(tmp_path, max_bytes=0)
    with TrajectoryStore(tmp_path, fsync=False) as store:
        store.append(0, make_traj([(0, 1, 2, None)]))
        with pytest.raises(ValueError, match="trajectory id 0 is already in store"):
            store.append(0, make_traj([(0, 1, 2, None)]))
        with pytest.raises(ValueError, match="step_log has 1 steps; the trajectory's calls run to step 2"):
            store.append(1, make_traj([(0, 1, 2, None)]), step_log=[({}, {})])
        with pytest.raises(ValueError, match=r"kind: expected one of \['steps', 'calls', 'trajectories'\], "
                                             r"got 'episodes'"):
            store.table("episodes")
        with pytest.raises(ValueError, match="open in another process"):
            TrajectoryStore(tmp_path)
        assert store.ids() == [0]


def test_real_workflow_episodes_round_trip_through_the_store(tmp_path):
    from gyre_ma.envs import workflow_v0
    from gyre_ma.envs.workflow.options import make_library
    from gyre_ma.envs.workflow.oracle import OracleManager

    env = StepRecorder(workflow_v0.parallel_env())
    library, oracle = make_library(), OracleManager()
    buf = TrajectoryBuffer.open(tmp_path / "store", fsync=False)
    trajs = []
    for seed in range(2):
        traj = run_episode(env, library, oracle, seed=seed)
        assert buf.add(traj, step_log=env.log).accepted
        trajs.append(traj)
    buf.close()
    steps = pd.read_parquet(tmp_path / "store" / "steps")
    calls = pd.read_parquet(tmp_path / "store" / "calls")
    assert len(steps) == sum(t.length for t in trajs) * len(env.possible_agents)
    assert len(calls) == sum(len(t.calls) for t in trajs)
    for tid, traj in enumerate(trajs):
        mine = steps[steps.traj_id == tid]
        assert np.allclose(mine.groupby("call").reward.sum().values, [c.raw_reward for c in traj.calls])
        assert mine.groupby("call").size().tolist() == [c.duration for c in traj.calls]
    first = steps[(steps.traj_id == 1) & (steps.step == 0)].sort_values("agent")
    assert first.action.map(list).tolist() == [list(env.log[0][0][a]) for a in sorted(env.possible_agents)]
    buf = TrajectoryBuffer.open(tmp_path / "store", fsync=False)  # a restart: pools empty, memory kept
    assert len(buf) == 0 and buf.store.ids() == [0, 1] and "submission_verified" in buf.seen_milestones
    assert buf.add(trajs[0]).id == 2
    buf.close()


# --------------------------------------------------------------------------- state machine
CAP = 6
MAX_BYTES = 20_000
CALL_SPECS = st.lists(st.tuples(st.integers(0, 1), st.integers(0, 2), st.integers(1, 2),
                                st.sampled_from((None, None, *MILESTONES))), max_size=CAP)


class BufferMachine(RuleBasedStateMachine):
    """The buffer against a model: FIFO pool, top-k elite, turning points; its store holds
    whole trajectories, oldest chunks evicted first, across restarts with crash debris."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp())
        self.buf = self.open()
        self.version = 0
        self.fresh: OrderedDict[int, tuple[int, int, tuple[int, ...]]] = OrderedDict()
        self.top: dict[int, tuple] = {}
        self.turning: OrderedDict[int, None] = OrderedDict()
        self.hashes: dict[int, tuple[int, ...]] = {}
        self.seen: set[str] = set()
        self.milestones: dict[int, set[str]] = {}
        self.chunks: list[list[int]] = []  # on disk, oldest first
        self.staged: list[int] = []
        self.last_commit: int | None = None

    def open(self) -> TrajectoryBuffer:
        return TrajectoryBuffer.open(
            self.dir / "store", max_bytes=MAX_BYTES, fsync=False, capacity=CAP, eviction="fifo", dedup=True,
            elite_size=2, max_turning_points=2, elite_ratio=0.5, max_staleness=1, elite_max_staleness=None,
        )

    def teardown(self) -> None:
        self.buf.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def held(self) -> set[int]:
        return set(self.fresh) | set(self.top) | set(self.turning)

    def sync_evicted_chunks(self) -> None:
        """Drop from the model the chunks the store evicted: always the oldest."""
        on_disk = [tid for c in self.chunks for tid in c]
        kept = self.buf.store.ids()[:len(self.buf.store.ids()) - len(self.staged)]
        assert on_disk[len(on_disk) - len(kept):] == kept
        while sum(map(len, self.chunks)) > len(kept):
            self.chunks.pop(0)
        assert [tid for c in self.chunks for tid in c] == kept

    @rule(spec=CALL_SPECS, seed=st.integers(0, 2), success=st.booleans(), reward=st.integers(-2, 2))
    def add(self, spec, seed, success, reward):
        traj = make_traj(spec, seed=seed, version=self.version, success=success, reward=float(reward))
        hashes = segment_hashes(traj)
        held_hashes = {h for tid in self.held() for h in self.hashes[tid]}
        duplicate = bool(hashes) and all(h in held_hashes for h in hashes)
        result = self.buf.add(traj)
        assert result.accepted == (not duplicate)
        if duplicate:
            return
        tid = result.id
        self.hashes[tid] = hashes
        self.milestones[tid] = set(traj.milestone_steps)
        self.staged.append(tid)
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

    @rule()
    def flush(self):
        self.buf.store.flush()
        if self.staged:
            self.chunks.append(self.staged)
            self.staged = []
        self.sync_evicted_chunks()

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

    @rule(debris=st.booleans())
    def restart(self, debris):
        """Close (the staged chunk is written) and open again, after a crash's debris:
        a temporary file and a chunk whose trajectories file never arrived."""
        self.buf.close()
        if self.staged:
            self.chunks.append(self.staged)
            self.staged = []
        root = self.dir / "store"
        if debris and self.buf.store.chunks:
            newest = self.buf.store.chunks[-1]
            for kind in ("steps", "calls"):
                shutil.copy(root / kind / f"{newest:06d}.parquet", root / kind / f"{newest + 1:06d}.parquet")
            shutil.copy(root / "trajectories" / f"{newest:06d}.parquet",
                        root / "trajectories" / f".{newest + 1:06d}.parquet.tmp")
        self.buf = self.open()
        self.sync_evicted_chunks()
        self.fresh.clear()
        self.top.clear()
        self.turning.clear()
        self.seen = set().union(*(self.milestones[tid] for c in self.chunks for tid in c))
        assert self.buf.seen_milestones == self.seen
        assert all(not p.name.startswith(".") for kind in KINDS for p in (root / kind).iterdir())
        if self.chunks:  # (an empty folder reads as a frame without columns)
            on_disk = pd.read_parquet(root / "trajectories").traj_id.tolist()
            assert on_disk == [tid for c in self.chunks for tid in c]

    @invariant()
    def agrees_with_model(self):
        assert self.buf.fresh_ids == list(self.fresh)
        assert self.buf.calls == sum(n for n, _, _ in self.fresh.values()) <= CAP
        assert self.buf.elite_ids == sorted(set(self.top) | set(self.turning))
        assert len(self.buf) == len(self.held())
        store = self.buf.store
        assert store.ids() == [tid for c in self.chunks for tid in c] + self.staged
        assert store.nbytes <= MAX_BYTES or len(store.chunks) == 1


TestBufferMachine = BufferMachine.TestCase
TestBufferMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
