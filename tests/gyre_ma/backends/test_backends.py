from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre_ma.agents.noise import NoiseSetting, PolicyActor
from gyre_ma.backends import Backend, make_backend
from gyre_ma.backends.faults import arm_faults, tokens_left
from gyre_ma.backends.local import LocalBackend
from gyre_ma.backends.ray import _Job
from gyre_ma.backends.worker import policy_weights
from gyre_ma.config import parse_config
from gyre_ma.roles import RoleTrajectory, RolloutTask, iteration_tasks
from gyre_ma.rollout import Trajectory
from gyre_ma.staleness import filter_stale

SAMPLE_TIMEOUT = 4.0


def fingerprint(t: Trajectory) -> tuple:
    calls = tuple((c.agent, c.option, c.log_prob, c.value, c.duration, c.reward, c.milestones, c.termination,
                   c.policy_version) for c in t.calls)
    return (t.task_seed, t.policy_version, t.length, tuple(sorted(t.milestone_steps.items())), t.success,
            t.total_reward, calls)


def faulty_config(fault_dir, at_step=5):
    return parse_config({
        "seed": 0,
        "env": {"id": "gyre_ma.backends.faults:faulty_env",
                "kwargs": {"fault_dir": str(fault_dir), "at_step": at_step}},
        "library": "gyre_ma.envs.workflow.options:make_library",
        "manager": {"hidden": 16},
    })


def noisy_tasks(seeds, version_salt=0):
    noise = {"explorer": NoiseSetting("param", 0.5), "executor": NoiseSetting("epsilon", 0.1)}
    return iteration_tasks(seeds=[s + version_salt for s in seeds], explorers=1, executors=1, noise=noise)


@pytest.fixture(scope="module")
def fault_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def local(fault_dir):
    backend = LocalBackend(faulty_config(fault_dir))
    torch.manual_seed(0)
    kit = backend.worker.kit
    with torch.no_grad():
        for p in kit.policy.parameters():
            p.normal_(0, 0.3)
    yield backend, policy_weights(kit.policy, kit.critic)
    backend.close()


# ------------------------------------------------------------------------ staleness
@dataclass
class _Item:
    policy_version: int


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50)), st.integers(0, 50), st.integers(0, 60))
def test_staleness_filter_keeps_exactly_the_fresh_and_counts_the_rest(versions, max_staleness, ahead):
    current = max(versions, default=0) + ahead
    items = [_Item(v) for v in versions]
    kept, dropped = filter_stale(items, current_version=current, max_staleness=max_staleness)
    assert all(current - i.policy_version <= max_staleness for i in kept)
    assert kept == [i for i in items if current - i.policy_version <= max_staleness]  # order kept
    assert dropped == len(items) - len(kept)


def test_staleness_filter_rejects_data_from_the_future_and_negative_bounds():
    with pytest.raises(ValueError, match="version 3 is newer than the current version 2"):
        filter_stale([_Item(3)], current_version=2, max_staleness=1)
    with pytest.raises(ValueError, match="max_staleness must be >= 0, got -1"):
        filter_stale([], current_version=0, max_staleness=-1)


# ------------------------------------------------------------------------ local backend
def test_importing_gyre_ma_does_not_import_ray():
    code = ("import sys, gyre_ma, gyre_ma.backends, gyre_ma.backends.local, gyre_ma.roles, gyre_ma.loop; "
            "sys.exit('ray' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_unknown_backend_is_named_with_the_choices(fault_dir):
    with pytest.raises(ValueError, match=r"unknown backend 'dask'; expected one of \['local', 'ray'\]"):
        make_backend("dask", faulty_config(fault_dir))


def test_local_backend_same_seed_same_trajectories(local, fault_dir):
    backend, weights = local
    assert isinstance(backend, Backend)
    tasks = noisy_tasks([1, 2, 3])
    first = backend.collect(weights, 0, tasks)
    other = LocalBackend(faulty_config(fault_dir))
    second = other.collect(weights, 0, tasks)
    assert [fingerprint(t) for t in first] == [fingerprint(t) for t in second]
    assert [(t.role, t.task_seed, t.episode) for t in first] == [(t.role, t.task_seed, t.episode) for t in tasks]
    assert backend.stats()["backend/episodes"] >= len(tasks)


def test_local_rollouts_run_single_threaded_and_restore_the_learners_threads(local):
    backend, weights = local
    before = torch.get_num_threads()
    seen = []
    real_decide = PolicyActor.decide

    def spy(self, slots, decisions):
        seen.append(torch.get_num_threads())
        return real_decide(self, slots, decisions)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(PolicyActor, "decide", spy)
        backend.collect(weights, 0, noisy_tasks([6]))
    assert set(seen) == {1} and torch.get_num_threads() == before


def test_local_submit_binds_a_snapshot_of_the_weights(local):
    backend, weights = local
    tasks = noisy_tasks([4, 5])
    expected = [fingerprint(t) for t in backend.collect(weights, 0, tasks)]  # batched; the polls play 1, then 3
    mutable = {part: {k: v.clone() for k, v in sd.items()} for part, sd in weights.items()}
    backend.submit(mutable, 0, tasks)
    for v in mutable["policy"].values():  # the learner updates in place after submitting
        v.add_(1.0)
    backend.submit(mutable, 1, tasks[:1])
    assert backend.pending == len(tasks) + 1
    got = backend.poll(timeout=0.0)
    assert len(got) == 1 and backend.pending == len(tasks)
    got += backend.poll(timeout=None)
    assert [fingerprint(t) for t in got[: len(tasks)]] == expected
    assert got[-1].policy_version == 1 and backend.pending == 0


# ------------------------------------------------------------------------ ray backend
@pytest.fixture(scope="module")
def ray_backend(fault_dir):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    backend = make_backend("ray", faulty_config(fault_dir), workers=2, max_restarts=4, max_attempts=3,
                           sample_timeout_s=SAMPLE_TIMEOUT, startup_timeout_s=120.0, cpus_per_worker=1.0)
    try:
        yield backend
    finally:
        backend.close()
        ray.shutdown()


def test_ray_matches_local_and_weights_go_out_once_per_version(ray_backend, local, monkeypatch):
    import ray

    backend, weights = local
    puts = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda value: puts.append(value) or real_put(value))
    tasks = noisy_tasks([10, 11, 12])
    got = ray_backend.collect(weights, 3, tasks)
    ray_backend.collect(weights, 3, tasks[:2])
    assert len(puts) == 1
    ray_backend.collect(weights, 4, tasks[:1])
    assert len(puts) == 2
    assert set(ray_backend._weights) == {4}  # version 3 has no episode left: its weights are released
    assert [fingerprint(t) for t in got] == [fingerprint(t) for t in backend.collect(weights, 3, tasks)]
    assert all(isinstance(t, RoleTrajectory) and t.policy_version == 3 for t in got)
    assert {a["worker_id"] for a in ray_backend.actor_info()} == {0, 1}
    # calls play on the actor's main thread, where the watchdog's signal can interrupt a stuck
    # option (a concurrency group moved them off it, and a stuck option then ran to the sample timeout)
    assert all(a["main_thread"] for a in ray_backend.actor_info())
    assert ray_backend.stats()["backend/restarts"] == 0


@pytest.mark.parametrize("mode", ["raise", "exit"])
def test_failed_workers_restart_once_per_fault_and_no_partial_episode_escapes(ray_backend, local, fault_dir, mode,
                                                                           monkeypatch):
    backend, weights = local
    tasks = noisy_tasks([20, 21, 22, 23])
    expected = [fingerprint(t) for t in backend.collect(weights, 4, tasks)]
    ray_backend.wait_ready()  # both actors up (a previous test restarted them): two episodes each
    before = ray_backend.stats()
    pids = [a["pid"] for a in ray_backend.actor_info()]
    monkeypatch.setattr(ray_backend, "episodes_per_call", 2)  # two calls per actor: one plays, one queued
    arm_faults(fault_dir, 1, mode=mode, worker=0)
    arm_faults(fault_dir, 1, mode=mode, worker=1)
    got = ray_backend.collect(weights, 4, tasks)
    after = ray_backend.stats()
    assert tokens_left(fault_dir) == 0
    assert after["backend/restarts"] - before["backend/restarts"] == 2
    # 8 episodes, 2 actors x 2 calls of two: each actor plays a chunk of two, a call of
    # two queued behind it, and faults in its chunk's first episode. Raised: that episode
    # alone is re-issued; its chunk-mate, in flight beside it, plays on, and the queued
    # call is requeued (it did not fault). Died: the whole chunk is re-issued (which one
    # was playing is unknown), the call requeued.
    reissued, requeued = (2, 4) if mode == "raise" else (4, 4)
    assert after["backend/reissued"] - before["backend/reissued"] == reissued
    assert after["backend/requeued"] - before["backend/requeued"] == requeued
    assert after["backend/episodes"] - before["backend/episodes"] == len(tasks)  # nothing extra, nothing partial
    assert [fingerprint(t) for t in got] == expected
    assert all(new != old for new, old in zip((a["pid"] for a in ray_backend.actor_info()), pids, strict=True))


def test_a_call_ready_before_the_one_its_actor_was_playing_waits_for_it(ray_backend, monkeypatch):
    """An actor's death fails every call queued on it, and the failures reach the driver
    one by one: the one queued behind can come first. It is processed after the head
    (the head's failure is the fault), or, if the head does not report, not at all yet."""
    import types

    import ray

    import gyre_ma.backends.ray as ray_module

    @ray.remote(num_cpus=0)  # the rollout actors hold the CPUs
    def later(seconds):
        time.sleep(seconds)
        return seconds

    head, behind, ping = later.remote(0.5), ray.put(0), ray.put(1)
    slot = types.SimpleNamespace(queued=[head, behind])
    fake = types.SimpleNamespace(_slots=[slot], _inflight={head: None, behind: None})
    # the wait is generous here: on a loaded machine Ray took over 5 s to start the task's worker
    monkeypatch.setattr(ray_module, "_IN_ORDER_WAIT_S", 120.0)
    assert ray_module.RayBackend._in_actor_order(fake, [behind, ping]) == [ping, head, behind]
    monkeypatch.setattr(ray_module, "_IN_ORDER_WAIT_S", 0.1)
    stuck = later.remote(30.0)
    slot.queued, fake._inflight = [stuck, behind], {stuck: None, behind: None}
    assert ray_module.RayBackend._in_actor_order(fake, [behind]) == []  # stays in flight
    ray.cancel(stuck, force=True)


def test_a_hanging_worker_is_replaced_within_the_sample_timeout(ray_backend, local, fault_dir):
    backend, weights = local
    tasks = noisy_tasks([30, 31])
    expected = [fingerprint(t) for t in backend.collect(weights, 5, tasks)]
    ray_backend.wait_ready()
    ray_backend.collect(weights, 5, tasks[:2])  # actors warm, version 5 fetched
    before = ray_backend.stats()
    arm_faults(fault_dir, 1, mode="hang", worker=1)
    start = time.monotonic()
    got = ray_backend.collect(weights, 5, tasks)
    elapsed = time.monotonic() - start
    after = ray_backend.stats()
    # the timeout, plus a fresh actor's start and one short episode
    assert elapsed < SAMPLE_TIMEOUT + 15.0
    assert after["backend/timeouts"] - before["backend/timeouts"] == 1
    assert after["backend/replaced"] - before["backend/replaced"] == 1
    assert [fingerprint(t) for t in got] == expected


def test_async_submit_and_poll_carry_versions_for_the_staleness_filter(ray_backend, local):
    backend, weights = local
    ray_backend.submit(weights, 6, noisy_tasks([40, 41]))
    ray_backend.submit(weights, 7, noisy_tasks([42]))
    validation = ray_backend.collect(weights, 7, [("evaluator", 43)])  # meanwhile: only its own episode
    assert [(t.role, t.task_seed, t.policy_version) for t in validation] == [("evaluator", 43, 7)]
    got: list[RoleTrajectory] = []
    deadline = time.monotonic() + 60
    while ray_backend.pending and time.monotonic() < deadline:
        got += ray_backend.poll(timeout=1.0)
    assert len(got) == 6 and ray_backend.pending == 0
    assert sorted(t.policy_version for t in got) == [6, 6, 6, 6, 7, 7]
    expected = backend.collect(weights, 6, noisy_tasks([40, 41])) + backend.collect(weights, 7, noisy_tasks([42]))
    key = lambda t: (t.policy_version, t.task_seed, t.episode)  # noqa: E731
    assert [fingerprint(t) for t in sorted(got, key=key)] == [fingerprint(t) for t in sorted(expected, key=key)]
    kept, dropped = filter_stale(got, current_version=8, max_staleness=1)
    assert dropped == 4 and {t.policy_version for t in kept} == {7}


@pytest.mark.parametrize("mode", ["raise", "exit"])
def test_a_fault_inside_a_chunk_costs_only_its_episode(ray_backend, local, fault_dir, mode):
    """One actor, one call of four episodes, in flight together; one faults. Raised: the
    other three play on and are kept, the faulty one alone is re-issued. Died: which
    episode was playing is unknown, so all four go back one per call, no attempt spent."""
    backend, weights = local
    tasks = noisy_tasks([50, 51])  # four episodes: two seeds, explorer and executor each
    expected = [fingerprint(t) for t in backend.collect(weights, 8, tasks)]
    chunked = make_backend("ray", ray_backend.config, workers=1, pipeline_depth=1, episodes_per_call=4,
                           max_restarts=4, max_attempts=2, sample_timeout_s=60.0,
                           cpus_per_worker=0.0)  # the module's two actors hold both CPUs
    try:
        chunked.collect(weights, 8, tasks[:1])  # started, weights fetched
        arm_faults(fault_dir, 1, mode=mode, worker=0, seed=51)
        got = chunked.collect(weights, 8, tasks)
        stats = chunked.stats()
    finally:
        chunked.close()
    assert tokens_left(fault_dir) == 0
    assert [fingerprint(t) for t in got] == expected
    assert stats["backend/restarts"] == 1 and stats["backend/episodes"] == 1 + len(tasks)
    if mode == "raise":
        assert (stats["backend/reissued"], stats["backend/requeued"]) == (1, 0)
    else:
        assert (stats["backend/reissued"], stats["backend/requeued"]) == (len(tasks), 0)


def test_a_batch_is_split_evenly_among_the_actors_taking_it(ray_backend):
    """Calls as _dispatch makes them (each to the shallowest ready actor): a batch of twelve
    on two idle actors is two calls of six, so each call refills its actor's slots; a batch
    past the cap of 32 a call shares what is left over the next level of the pipeline; an
    actor still starting keeps its share waiting (the first ready one took a whole batch,
    and a fault armed for the other never fired)."""
    backend = ray_backend
    backend.wait_ready()  # an actor still starting takes no call
    assert backend.episodes_per_call == 32 and backend.pipeline_depth == 2 and len(backend._slots) == 2

    class Recorder:  # stands in for an actor handle: records each call _dispatch sends it
        def __init__(self, index: int, made: list[tuple[int, int]]) -> None:
            self.index, self.made = index, made
            self.run = self

        def remote(self, weights: list, version: int, tasks: list) -> object:
            self.made.append((self.index, len(tasks)))
            return object()

    def calls(n: int) -> list[tuple[int, int]]:
        made: list[tuple[int, int]] = []
        actors, weights, inflight = [slot.actor for slot in backend._slots], backend._weights, dict(backend._inflight)
        backend._queue.extend(_Job(RolloutTask("executor", s), 0, s) for s in range(n))
        try:
            for slot in backend._slots:
                slot.actor = Recorder(slot.index, made)
            backend._weights = {0: "the weights of version 0"}
            backend._dispatch()
        finally:
            backend._queue.clear()
            backend._inflight, backend._weights = inflight, weights
            for slot, actor in zip(backend._slots, actors, strict=True):
                slot.actor = actor
                slot.queued.clear()
        return made

    assert calls(12) == [(0, 6), (1, 6)]
    assert calls(100) == [(0, 32), (1, 32), (0, 18), (1, 18)]
    assert calls(200)[:4] == [(0, 32), (1, 32), (0, 32), (1, 32)]  # the rest waits for a call to end
    backend._slots[1].starting = "its readiness ping"  # a slow start: the ready actor takes its share, not all
    try:
        assert calls(12) == [(0, 6), (0, 3)]  # the other three wait for the actor starting
    finally:
        backend._slots[1].starting = None


def test_ray_workers_per_role_are_validated(ray_backend, local):
    with pytest.raises(ValueError, match="unknown roles"):
        make_backend("ray", ray_backend.config, workers={"critic": 1})


def test_more_workers_than_the_cluster_can_run_are_warned_about(ray_backend):
    """workers=8 on 2 CPUs ran 2 actors and said nothing (the others never started)."""
    with pytest.warns(RuntimeWarning, match=r"backend.workers=3 × backend.cpus_per_worker=1 needs 3 CPUs and the "
                                            r"Ray cluster has 2: 2 worker\(s\) can run at once"):
        ray_backend._warn_short_of_cpus(3)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ray_backend._warn_short_of_cpus(2)  # what it was built with: no warning
