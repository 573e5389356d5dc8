"""Gymnasium's Taxi-v4 as a gyre env: its Discrete observation passes PettingZoo's tests,
the oracle delivers on every seed in the fewest steps, a passenger set down at the wrong
stand is picked up again, and the milestones are read from Taxi's own state."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.checks import check_setup
from gyre_ma.envs.checks import check_env
from gyre_ma.envs.taxi_tasks import TaxiOracle, delivered, make_taxi, picked_up, taxi_library
from gyre_ma.options.decision import Choice, Decision
from gyre_ma.options.library import OptionLibrary
from gyre_ma.rollout import run_episode

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


class Scripted:
    """Runs the named options in turn, then hands over to the oracle."""

    def __init__(self, library: OptionLibrary, names: Sequence[str]) -> None:
        self.library, self.names, self.oracle = library, list(names), TaxiOracle(library=library)

    def decide(self, decisions: Sequence[Decision]) -> list[Choice]:
        if self.names:
            return [Choice(self.library.index(self.names.pop(0)))]
        return self.oracle.decide(decisions)


def test_a_discrete_observation_is_a_numpy_integer_and_passes_pettingzoo_tests() -> None:
    env = make_taxi()
    observations, _ = env.reset(seed=0)
    obs = observations["agent_0"]
    assert isinstance(obs, np.int64) and env.observation_space("agent_0").contains(obs)
    report = check_env(make_taxi, n_steps=200)
    assert {"parallel_api_test", "api_test"} <= set(report.pettingzoo_tests)
    observations, *_ = env.step({"agent_0": 1})
    assert isinstance(observations["agent_0"], np.int64)


def _fewest_steps(taxi) -> int:
    """Fewest steps from Taxi's current state to a delivery: breadth-first search over Taxi's
    own transition table (``P[state][action]``: probability, next state, reward, terminated)."""
    frontier, seen, steps = [taxi.s], {taxi.s}, 0
    while frontier:
        steps, following = steps + 1, []
        for state in frontier:
            for action in range(taxi.action_space.n):
                for _, after, _, terminated in taxi.P[state][action]:
                    if terminated:
                        return steps
                    if after not in seen:
                        seen.add(after)
                        following.append(after)
        frontier = following
    raise AssertionError("no delivery is reachable")


def test_oracle_delivers_on_every_seed_by_the_shortest_route() -> None:
    env, library = make_taxi(), taxi_library()
    runs = [run_episode(env, library, TaxiOracle(library=library), seed=s) for s in range(60)]
    fewest = []
    for s in range(60):
        env.reset(seed=s)
        fewest.append(_fewest_steps(env.unwrapped))
    assert [t.length for t in runs] == fewest  # every episode as short as any can be
    assert all(t.success for t in runs) and not any(t.dead_ends for t in runs)
    for t in runs:
        names = [library[c.option].name for c in t.calls]
        assert names[-1] == "dropoff" and names.count("pickup") == 1 and len(names) <= 4
        assert t.length == sum(c.duration for c in t.calls)
        assert t.milestone_steps["picked_up"] < t.milestone_steps["delivered"] == t.length
    # Taxi's shortest tours average about 13 steps from its random starts
    assert 11 < np.mean([t.length for t in runs]) < 15


def test_a_passenger_set_down_at_the_wrong_stand_is_picked_up_again() -> None:
    env, library = make_taxi(), taxi_library()
    env.reset(seed=5)
    row, col, passenger, destination = env.unwrapped.decode(env.unwrapped.s)
    stands = "RGYB"
    wrong = next(k for k in range(4) if k not in (passenger, destination))
    plan = [f"go_to_{stands[passenger]}", "pickup", f"go_to_{stands[wrong]}", "dropoff"]
    if tuple(env.unwrapped.locs[passenger]) == (row, col):
        plan = plan[1:]
    traj = run_episode(env, library, Scripted(library, plan), seed=5)
    names = [library[c.option].name for c in traj.calls]
    assert traj.success and not traj.dead_ends
    assert names.count("pickup") == 2 and names.count("dropoff") == 2
    failed_dropoff = traj.calls[names.index("dropoff")]
    assert failed_dropoff.milestones == () and not failed_dropoff.terminated


def test_milestones_read_taxis_state_and_random_order_never_dead_ends() -> None:
    env, library = make_taxi(), taxi_library()
    env.reset(seed=1)
    assert not picked_up(env.unwrapped) and not delivered(env.unwrapped)
    report = check_setup(make_taxi, library, n_steps=300)
    assert report.milestones == {"picked_up", "delivered"}
    for seed in range(5):
        traj = run_episode(env, library, RandomManager(seed), seed=seed)
        assert not traj.dead_ends
        if traj.success:
            assert traj.milestone_steps["picked_up"] < traj.milestone_steps["delivered"]


def test_oracle_rejects_a_foreign_library() -> None:
    from gyre_ma.options.examples import breakfast

    with pytest.raises(ValueError, match="lacks option"):
        TaxiOracle(library=breakfast())


def test_the_decoded_observation_is_taxis_four_parts_and_plays_the_same_episode() -> None:
    state, decoded, library = make_taxi(), make_taxi(observation="decoded"), taxi_library()
    observations, _ = decoded.reset(seed=4)
    assert observations["agent_0"].tolist() == list(decoded.unwrapped.decode(decoded.unwrapped.s))
    assert decoded.observation_space("agent_0").contains(observations["agent_0"])
    a = run_episode(state, library, TaxiOracle(library=library), seed=4)
    b = run_episode(decoded, library, TaxiOracle(library=library), seed=4)
    assert (a.length, [c.option for c in a.calls]) == (b.length, [c.option for c in b.calls])
    assert b.calls[0].observation.tolist() == observations["agent_0"].tolist()
    with pytest.raises(ValueError, match="observation must be"):
        make_taxi(observation="pixels")


def test_a_go_to_option_at_its_stand_cannot_proceed_and_is_not_eligible() -> None:
    from gyre_ma.options.option import CANNOT_PROCEED, OptionContext

    env, library = make_taxi(), taxi_library()
    observations, _ = env.reset(seed=2)
    raw = env.unwrapped
    row, col, *_ = raw.decode(raw.s)
    here = next((k for k, stand in enumerate(raw.locs) if tuple(stand) == (row, col)), None)
    if here is None:  # drive to stand R first
        run = library["go_to_R"]
        ctx = OptionContext("agent_0", env, observations["agent_0"], frozenset())
        while not run.done(ctx):
            env.step({"agent_0": run.policy(ctx)})
        here = 0
    option = library[f"go_to_{'RGYB'[here]}"]
    ctx = OptionContext("agent_0", env, None, frozenset())
    assert option.policy(ctx) is CANNOT_PROCEED and not option.can_start(ctx)
    assert library.mask(frozenset(), ctx)[library.index(option.name)] == False  # noqa: E712


def test_the_library_dumps_and_loads_back(tmp_path) -> None:
    from gyre_ma.options.library import reference

    library = taxi_library()
    library.dump(tmp_path / "taxi.yaml")
    loaded = OptionLibrary.load(tmp_path / "taxi.yaml")
    assert loaded.to_spec() == library.to_spec()
    assert [reference(o.policy) for o in loaded] == [reference(o.policy) for o in library]
    assert all(a.policy is b.policy and a.done is b.done and a.features is b.features
               for a, b in zip(loaded, library))  # the module's own objects
    assert all("features" in o for o in library.to_spec()["options"])
    assert not any("features" in o for o in taxi_library(features=False).to_spec()["options"])


def test_each_option_describes_the_place_it_acts_on() -> None:
    """``go_to_<stand>``'s features: the steps its option takes to the stand, whether the
    passenger waits there, whether it is the destination, whether the passenger rides;
    ``pickup``/``dropoff``'s: the same of the taxi's own cell. The index and the decoded
    observation give the same numbers."""
    from gyre_ma.options.option import OptionContext

    library, decoded_env = taxi_library(), make_taxi(observation="decoded")
    for seed in range(6):
        env = make_taxi()
        observations, _ = env.reset(seed=seed)
        decoded, _ = decoded_env.reset(seed=seed)
        raw = env.unwrapped
        row, col, passenger, destination = (int(v) for v in raw.decode(raw.s))
        for k, stand in enumerate(raw.locs):
            option = library[f"go_to_{'RGYB'[k]}"]
            got = option.features(observations["agent_0"])
            np.testing.assert_array_equal(got, option.features(decoded["agent_0"]))
            assert got[1:].tolist() == [passenger == k, destination == k, passenger == 4]
            probe = make_taxi()
            probe.reset(seed=seed)
            ctx, steps = OptionContext("agent_0", probe, None, frozenset()), 0
            while not option.done(ctx):
                probe.step({"agent_0": option.policy(ctx)})
                steps += 1
            assert got[0] == pytest.approx(steps / 8), (seed, k)  # 8: the map's longest shortest path
        here = [tuple(s) == (row, col) for s in raw.locs]
        for name in ("pickup", "dropoff"):
            got = library[name].features(observations["agent_0"])
            waits = passenger < 4 and here[passenger]
            assert got.tolist() == [0.0, waits, here[destination], passenger == 4]
    with pytest.raises(ValueError, match=r"Taxi's state index \(an integer in \[0, 500\)\)"):
        library["pickup"].features(np.int64(500))
