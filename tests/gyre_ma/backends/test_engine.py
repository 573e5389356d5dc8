"""The batched rollout engine (issue #19): many episodes in flight per worker, one batched
decision per round, and the same episodes as one at a time."""

from __future__ import annotations

import pytest
import torch

from gyre_ma.agents.noise import NoiseSetting, PolicyActor
from gyre_ma.backends.engine import EpisodeFault
from gyre_ma.backends.faults import WORKER_ID_ENV, arm_faults, tokens_left
from gyre_ma.backends.local import LocalBackend
from gyre_ma.backends.worker import RolloutWorker, policy_weights
from gyre_ma.config import parse_config
from gyre_ma.options.errors import UserCodeError
from gyre_ma.roles import RolloutTask, iteration_tasks, validation_tasks
from gyre_ma.rollout import Trajectory


def fingerprint(t: Trajectory) -> tuple:
    calls = tuple((c.agent, c.option, c.log_prob, c.value, c.start_step, c.duration, c.milestones, c.termination,
                   c.policy_version) for c in t.calls)
    return (t.task_seed, t.policy_version, t.length, tuple(sorted(t.milestone_steps.items())), t.success, calls)


def config(num_envs: int, **extra) -> object:
    return parse_config({"seed": 0, "env": {"id": "workflow_v0"}, "manager": {"hidden": 16},
                         "rollout": {"num_envs": num_envs}} | extra)


def mixed_tasks() -> list[RolloutTask]:
    """Explorers with parameter noise, executors with ε, greedy and sampled evaluators: 14 episodes."""
    noise = {"explorer": NoiseSetting("param", 0.5), "executor": NoiseSetting("epsilon", 0.1)}
    return (iteration_tasks(seeds=[1, 2, 3, 4, 5], explorers=1, executors=1, noise=noise)
            + validation_tasks([7, 8], modes=(False, True)))


@pytest.fixture(scope="module")
def weights():
    worker = RolloutWorker(config(1))
    torch.manual_seed(0)
    with torch.no_grad():
        for p in worker.kit.policy.parameters():
            p.normal_(0, 0.3)
    return policy_weights(worker.kit.policy, worker.kit.critic)


def test_many_in_flight_play_the_episodes_one_at_a_time_plays(weights):
    tasks = mixed_tasks()
    alone = [fingerprint(t) for t in LocalBackend(config(1)).collect(weights, 3, tasks)]
    batched_backend = LocalBackend(config(5))
    batched = batched_backend.collect(weights, 3, tasks)
    assert [fingerprint(t) for t in batched] == alone  # same episodes, in task order
    assert [(t.role, t.task_seed, t.episode, t.greedy) for t in batched] == [
        (t.role, t.task_seed, t.episode, t.greedy) for t in tasks]
    assert all(t.policy_version == 3 and all(c.policy_version == 3 for c in t.calls) for t in batched)
    assert len(batched_backend.worker.kit._envs) == 5  # one env per slot, reused as episodes end


def test_a_round_decides_every_episode_in_flight_in_one_batched_call(weights, monkeypatch):
    rounds = []
    real = PolicyActor.decide

    def spy(self, slots, decisions):
        rounds.append(len(decisions))
        assert len(set(slots)) == len(slots)  # at most one decision per episode per round
        return real(self, slots, decisions)

    monkeypatch.setattr(PolicyActor, "decide", spy)
    trajectories = LocalBackend(config(4)).collect(weights, 0, mixed_tasks())
    assert max(rounds) == 4 and sum(rounds) == sum(len(t.calls) for t in trajectories)
    assert sum(r == 4 for r in rounds) > len(rounds) / 2  # mostly full rounds


def test_same_seed_and_num_envs_same_trajectories(weights):
    tasks = mixed_tasks()
    first = LocalBackend(config(4)).collect(weights, 0, tasks)
    second = LocalBackend(config(4)).collect(weights, 0, tasks)
    assert [fingerprint(t) for t in first] == [fingerprint(t) for t in second]


def test_each_episode_has_its_own_perturbation(weights):
    """Two explorers of one task seed (episodes 0 and 1) in one batch: different manager
    seeds, so different perturbed weights and choices; each the same as when played alone."""
    tasks = [RolloutTask("explorer", 9, e, NoiseSetting("param", 2.0)) for e in range(2)]
    together = LocalBackend(config(2)).collect(weights, 0, tasks)
    assert [c.option for c in together[0].calls] != [c.option for c in together[1].calls]
    alone = [LocalBackend(config(1)).collect(weights, 0, [t])[0] for t in tasks]
    assert [fingerprint(t) for t in together] == [fingerprint(t) for t in alone]


def test_a_fault_costs_only_its_episode_and_its_slot_gets_a_fresh_env(weights, tmp_path, monkeypatch):
    cfg = parse_config({"seed": 0, "env": {"id": "gyre_ma.backends.faults:faulty_env",
                                           "kwargs": {"fault_dir": str(tmp_path), "at_step": 5}},
                        "library": "gyre_ma.envs.workflow.options:make_library", "manager": {"hidden": 16},
                        "rollout": {"num_envs": 3}})
    tasks = mixed_tasks()[:6]
    clean = [fingerprint(t) for t in RolloutWorker(cfg).run_many(tasks, weights, 0)]
    worker = RolloutWorker(cfg)
    made, make = [], worker.kit.make_env
    worker.kit.make_env = lambda: made.append(1) or make()
    monkeypatch.setenv(WORKER_ID_ENV, "0")  # faults fire in rollout workers only
    arm_faults(tmp_path, 1, seed=tasks[2].task_seed)
    results = worker.run_many(tasks, weights, 0, faults="collect")
    assert tokens_left(tmp_path) == 0
    faults = [r for r in results if isinstance(r, EpisodeFault)]
    assert len(faults) == 1 and "injected fault" in str(faults[0].error)
    assert tasks[faults[0].index].task_seed == tasks[2].task_seed
    assert [fingerprint(r) for i, r in enumerate(results) if i != faults[0].index] == [
        f for i, f in enumerate(clean) if i != faults[0].index]  # the others played on, unchanged
    assert len(made) == 3  # slots 1 and 2, then a fresh env for the slot whose episode faulted
    arm_faults(tmp_path, 1, seed=tasks[0].task_seed)
    with pytest.raises(UserCodeError, match="InjectedFault: injected fault"):
        worker.run_many(tasks, weights, 0)  # faults="raise", the local backend's way


def test_stop_keeps_new_episodes_from_starting_and_lets_those_in_flight_finish(weights):
    worker = RolloutWorker(config(3))
    started = []

    def stop() -> bool:
        started.append(1)
        return len(started) > 4

    results = worker.run_many(mixed_tasks(), weights, 0, stop=stop)
    played = [r for r in results if r is not None]
    assert len(played) == 4 and results[:4] == played and all(r is None for r in results[4:])


def test_managers_that_do_not_learn_get_one_instance_per_slot():
    tasks = [RolloutTask("executor", s) for s in range(6)]
    for kind in ("random", "oracle"):
        one = [fingerprint(t) for t in RolloutWorker(config(1, manager={"kind": kind})).run_many(tasks, None, 0)]
        many = [fingerprint(t) for t in RolloutWorker(config(4, manager={"kind": kind})).run_many(tasks, None, 0)]
        assert one == many, kind


def test_async_polls_play_a_policy_version_at_a_time(weights):
    backend = LocalBackend(config(4))
    tasks = mixed_tasks()[:4]
    backend.submit(weights, 0, tasks[:2])
    backend.submit(weights, 1, tasks[2:])
    got = backend.poll(timeout=None)
    assert [t.policy_version for t in got] == [0, 0, 1, 1]
    assert [fingerprint(t) for t in got] == [fingerprint(t) for t in
                                            backend.collect(weights, 0, tasks[:2])
                                            + backend.collect(weights, 1, tasks[2:])]


@pytest.mark.parametrize("env, library, kwargs", [
    ("coverage_v0", None, {}),
    ("gyre_ma.envs.minigrid_doorkey:make_env", "gyre_ma.envs.minigrid_doorkey:make_library", {}),
    ("gyre_ma.envs.minigrid_tasks:make_locked_room", "gyre_ma.envs.minigrid_tasks:locked_room_library", {}),
    ("gyre_ma.envs.overcooked_kitchen:make_env", "gyre_ma.envs.overcooked_kitchen:make_library",
     {"layout": "cramped_room"}),
    ("techtree_v0", None, {"max_cycles": 300}),
])
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_every_shipped_library_plays_the_same_episodes_at_any_num_envs(env, library, kwargs):
    """Options act on their own slot's env (ctx.env), never on an env their factory saw."""
    def worker(num_envs: int) -> RolloutWorker:
        data = {"seed": 0, "env": {"id": env, "kwargs": kwargs}, "manager": {"hidden": 16},
                "rollout": {"num_envs": num_envs}}
        return RolloutWorker(parse_config(data | ({"library": library} if library else {})))

    one, many = worker(1), worker(3)
    weights = policy_weights(one.kit.policy, one.kit.critic)
    tasks = [RolloutTask("explorer", s, 0, NoiseSetting("param", 0.3)) for s in range(5)]
    assert [fingerprint(t) for t in one.run_many(tasks, weights, 0)] == [
        fingerprint(t) for t in many.run_many(tasks, weights, 0)]


def test_the_garbage_collector_pauses_while_a_worker_plays_and_is_restored_after(weights, tmp_path, monkeypatch):
    """Paused during the play (its full collections cost a flat rollout ~8 %), on again after
    it, also when an episode's fault ends the play; left off if it was off before."""
    import gc

    seen = []
    worker = RolloutWorker(config(2))
    deciders = worker.kit.deciders(0)
    decide = type(deciders).decide
    monkeypatch.setattr(type(deciders), "decide", lambda self, s, d: seen.append(gc.isenabled()) or decide(self, s, d))
    assert gc.isenabled()
    worker.run_many(mixed_tasks()[:2], weights, 0)
    assert seen and not any(seen) and gc.isenabled()

    cfg = parse_config({"seed": 0, "env": {"id": "gyre_ma.backends.faults:faulty_env",
                                           "kwargs": {"fault_dir": str(tmp_path), "at_step": 5}},
                        "library": "gyre_ma.envs.workflow.options:make_library", "manager": {"hidden": 16}})
    monkeypatch.setenv(WORKER_ID_ENV, "0")
    arm_faults(tmp_path, 1, seed=mixed_tasks()[0].task_seed)
    with pytest.raises(UserCodeError):
        RolloutWorker(cfg).run_many(mixed_tasks()[:1], weights, 0)
    assert gc.isenabled()
    gc.disable()
    try:
        worker.run_many(mixed_tasks()[:1], weights, 0)
        assert not gc.isenabled()
    finally:
        gc.enable()
