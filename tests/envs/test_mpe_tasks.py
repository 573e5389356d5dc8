"""PettingZoo MPE simple_spread as a gyre env: PettingZoo's tests pass through the adapter,
the oracle covers every landmark on almost every seed, faster than a fixed assignment or a
random order, ``go_to_k`` parks its agent on the landmark, one agent at a time heads for a
landmark, and a landmark another agent holds ends the call as a failure."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch

pytest.importorskip("mpe2", reason="PettingZoo MPE (pip install --no-deps mpe2) is not installed")

from gyre_ma.agents.baselines import RandomManager  # noqa: E402
from gyre_ma.checks import check_setup  # noqa: E402
from gyre_ma.envs.checks import check_env  # noqa: E402
from gyre_ma.envs.mpe_tasks import (  # noqa: E402
    FixedAssignment,
    LandmarkFeatures,
    SpreadOracle,
    covered,
    make_spread,
    push_toward,
    spread,
    spread_library,
)
from gyre_ma.options.decision import Choice, Decision  # noqa: E402
from gyre_ma.options.option import Termination  # noqa: E402
from gyre_ma.rollout import run_episode  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


def test_pettingzoo_tests_pass_and_milestones_are_read_from_the_world() -> None:
    report = check_env(make_spread, n_steps=100)
    assert {"parallel_api_test", "parallel_seed_test"} <= set(report.pettingzoo_tests)
    assert check_setup(make_spread, spread_library(), n_steps=200).milestones >= {"covered_0", "covered_1"}
    env = make_spread()
    env.reset(seed=0)
    world = env.unwrapped.world
    assert not spread(env.unwrapped)
    for agent, landmark in zip(world.agents, world.landmarks):
        agent.state.p_pos = landmark.state.p_pos.copy()
    assert spread(env.unwrapped) and all(covered(env.unwrapped, k) for k in range(3))


def test_oracle_beats_the_fixed_assignment_and_random_order() -> None:
    env, library = make_spread(), spread_library()
    rates = {}
    for name, build in (("oracle", lambda s: SpreadOracle(library=library)),
                        ("fixed", lambda s: FixedAssignment(library=library)), ("random", RandomManager)):
        runs = [run_episode(env, library, build(s), seed=s) for s in range(60)]
        assert not any(t.dead_ends for t in runs)
        rates[name] = np.mean([t.success for t in runs]), np.mean([t.length for t in runs])
    assert rates["oracle"][0] >= 0.95 and rates["oracle"][1] < 14
    assert rates["fixed"][0] < rates["oracle"][0] and rates["fixed"][1] > rates["oracle"][1] + 2
    assert rates["random"][1] > rates["oracle"][1] + 3  # go_to is exclusive: random orders cover, but slowly


def test_push_toward_brings_the_agent_to_rest_on_its_target() -> None:
    env = make_spread()
    env.reset(seed=3)
    agent = env.unwrapped.world.agents[0]
    target = np.array([0.5, -0.5])
    for _ in range(40):
        env.step({a: (push_toward(agent, target) if a == "agent_0" else 0) for a in env.agents})
        if not env.agents:
            break
    assert np.linalg.norm(agent.state.p_pos - target) < agent.size and np.linalg.norm(agent.state.p_vel) < 0.3


class _Everyone:
    """Every agent heads for landmark 0 if it may, else stays."""

    def __init__(self, library) -> None:
        self.library = library

    def decide(self, decisions: Sequence[Decision]) -> list[Choice]:
        go = self.library.index("go_to_0")
        return [Choice(go if d.mask[go] else self.library.index("stay")) for d in decisions]


def test_one_agent_at_a_time_heads_for_a_landmark() -> None:
    env, library = make_spread(), spread_library()
    go = library.index("go_to_0")
    traj = run_episode(env, library, _Everyone(library), seed=1)
    assert not traj.success
    runs = [c for c in traj.calls if c.option == go]
    assert [c.agent for c in runs] == ["agent_0"] and runs[0].termination is Termination.DONE
    assert all(not c.mask[go] for c in traj.calls if c.agent != "agent_0")  # running, then held by agent_0


def test_a_landmark_held_by_another_agent_fails_the_call_and_closes_the_option() -> None:
    from gyre_ma.options.option import OptionContext

    env, library = make_spread(), spread_library()
    observations, _ = env.reset(seed=1)
    world = env.unwrapped.world
    go = library["go_to_0"]

    def ctx(agent: str) -> OptionContext:
        return OptionContext(agent, env, observations[agent], frozenset(), rng=np.random.default_rng(0))

    assert go.initiation(ctx("agent_0")) and not go.failure(ctx("agent_0"))
    holder = world.agents[1]  # agent_1 comes to rest on landmark 0
    holder.state.p_pos, holder.state.p_vel = world.landmarks[0].state.p_pos.copy(), np.zeros(2)
    assert go.failure(ctx("agent_0")) and not go.initiation(ctx("agent_0"))  # taken: agent_0's call fails
    assert not go.failure(ctx("agent_1")) and go.done(ctx("agent_1"))  # the holder's own call is done


def test_a_landmark_is_credited_to_the_agent_touching_it() -> None:
    from gyre_ma.envs.mpe_tasks import toucher

    env = make_spread()
    env.reset(seed=2)
    raw = env.unwrapped
    world = raw.world
    mark = world.landmarks[0].state.p_pos
    far = np.array([5.0, 5.0])
    for agent in world.agents:
        agent.state.p_pos = far.copy()
    assert toucher(raw, "covered_0") is None and toucher(raw, "spread") is None
    world.agents[1].state.p_pos = mark + np.array([0.05, 0.0])
    assert toucher(raw, "covered_0") == "agent_1"
    world.agents[2].state.p_pos = mark + np.array([0.01, 0.0])  # two touch it: the nearer
    assert toucher(raw, "covered_0") == "agent_2"
    library = spread_library(hold=True)
    traj = run_episode(env, library, SpreadOracle(library=library), seed=0)
    assert traj.success and set(traj.milestone_agents) == {"covered_0", "covered_1", "covered_2"}
    assert set(traj.milestone_agents.values()) <= set(env.possible_agents)


def test_with_hold_a_parked_agent_keeps_its_landmark_to_the_end() -> None:
    env, library, parking = make_spread(), spread_library(hold=True), spread_library()
    runs = [run_episode(env, library, SpreadOracle(library=library), seed=s) for s in range(30)]
    asked = [run_episode(env, parking, SpreadOracle(library=parking), seed=s) for s in range(30)]
    assert np.mean([t.success for t in runs]) >= 0.95
    stay = library.index("stay")
    for t in runs:
        if t.success:  # every agent's last go_to call is still running when the task is done
            last = {c.agent: c for c in t.calls}
            assert all(c.termination is Termination.EPISODE for c in last.values() if c.option != stay)
    # without hold a parked agent is asked again every step (and must choose stay each time)
    assert np.mean([len(t.calls) for t in runs]) + 4 < np.mean([len(t.calls) for t in asked])


@pytest.mark.parametrize("hold,features", [(False, False), (True, False), (True, True)])
def test_the_library_dumps_and_loads_back(tmp_path, hold: bool, features: bool) -> None:
    from gyre_ma.options.library import OptionLibrary

    library = spread_library(hold=hold, features=features)
    library.dump(tmp_path / "spread.yaml")
    loaded = OptionLibrary.load(tmp_path / "spread.yaml")
    assert loaded.to_spec() == library.to_spec()
    assert all((a.policy, a.initiation, a.done, a.failure, a.features) ==
               (b.policy, b.initiation, b.done, b.failure, b.features)
               for a, b in zip(loaded, library))  # the module's own objects, resolved by name
    assert ("features" in library.to_spec()["options"][0]) == features


@pytest.mark.parametrize("n", [2, 3, 4])
def test_landmark_features_are_the_distance_table_seen_from_each_landmark(n: int) -> None:
    env = make_spread(n=n)
    observations, _ = env.reset(seed=3)
    world = env.unwrapped.world
    marks = [landmark.state.p_pos for landmark in world.landmarks]
    for i, agent in enumerate(env.possible_agents):
        me = world.agents[i].state.p_pos
        others = [a.state.p_pos for j, a in enumerate(world.agents) if j != i]
        for k in range(n):
            got = LandmarkFeatures(k)(observations[agent])
            assert got.shape == (3 + (n - 1) + (n - 1) ** 2 + (n - 1),)
            np.testing.assert_allclose(got[:2], marks[k] - me, atol=1e-5)
            np.testing.assert_allclose(got[2], np.linalg.norm(marks[k] - me), atol=1e-5)
            nearest_first = sorted(others, key=lambda o: np.linalg.norm(o - marks[k]))
            rest = sorted((j for j in range(n) if j != k), key=lambda j: np.linalg.norm(marks[j] - me))
            np.testing.assert_allclose(got[3:n + 2], [np.linalg.norm(o - marks[k]) for o in nearest_first], atol=1e-5)
            table = [[np.linalg.norm(o - marks[j]) for j in rest] for o in nearest_first]
            np.testing.assert_allclose(got[n + 2:n + 2 + (n - 1) ** 2], np.ravel(table), atol=1e-5)
            np.testing.assert_allclose(got[n + 2 + (n - 1) ** 2:], [np.linalg.norm(marks[j] - me) for j in rest],
                                       atol=1e-5)


def test_a_library_with_features_trains_and_resumes_from_its_checkpoint(tmp_path) -> None:
    """The manager scores the go_to options from their features; a run writes the scorer into
    its checkpoint and a resumed run goes on from it bit for bit."""
    from gyre_ma.config import parse_config
    from gyre_ma.loop import Gyre

    raw = {"seed": 0, "env": {"id": "gyre_ma.envs.mpe_tasks:make_spread"},
           "library": "gyre_ma.envs.mpe_tasks:spread_library", "library_kwargs": {"hold": True, "features": True},
           "manager": {"hidden": 16}, "train": {"iterations": 4}}
    whole = Gyre(parse_config(raw))
    assert whole.featurizer.option_features == 11 and whole.policy.option_features == 11  # n = 3
    before = whole.policy.option_head.weight.clone()
    history = [whole.iteration(i) for i in range(4)]
    assert not torch.equal(before, whole.policy.option_head.weight)  # the scorer learns
    first = Gyre(parse_config(raw))
    for i in range(2):
        first.iteration(i)
    state = first.state_dict()
    assert any(k.startswith("option_body.") for k in state["policy"])
    resumed = Gyre(parse_config(raw))
    resumed.load_state_dict(state)
    rest = [resumed.iteration(i) for i in range(2, 4)]
    assert [m["success_rate"] for m in rest] == [m["success_rate"] for m in history[2:]]
    for p, q in zip(whole.policy.parameters(), resumed.policy.parameters(), strict=True):
        assert torch.equal(p, q)
