"""PettingZoo's SISL Pursuit as a two-agent gyre env: check_setup passes, the catches are
side-effect milestones read from the game, a strategy call ends at a catch, and hunting as
a pair (the oracle) beats chasing apart."""

from __future__ import annotations

import numpy as np
import pytest

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.checks import check_setup
from gyre_ma.envs.pursuit_tasks import (
    IndependentChase,
    MutualFollow,
    PursuitOracle,
    _distances,
    _game,
    make_pursuit,
    pursuit_library,
)
from gyre_ma.envs.registry import make_oracle
from gyre_ma.options.decision import Decision
from gyre_ma.options.library import OptionLibrary
from gyre_ma.options.option import Termination
from gyre_ma.rollout import run_episode

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_check_setup_passes_driven_by_the_library() -> None:
    report = check_setup(make_pursuit, pursuit_library(), n_steps=300)
    assert {"parallel_api_test", "parallel_seed_test"} <= set(report.pettingzoo_tests)
    assert report.milestones  # at least one catch in 300 steps of a random order, verified twice


def test_the_catches_are_side_effects_the_library_does_not_aim_at() -> None:
    library = pursuit_library()
    assert [m.side_effect for m in library.graph.milestones] == [True, True, True]
    assert all(opt.milestone is None for opt in library)
    assert library.graph.goals == ("caught_3",)


def test_pairs_catch_every_evader_and_split_pursuers_do_worse() -> None:
    seeds = range(20)
    for cap, pair_wins, apart_wins in ((30, 0.9, 0.5), (100, 1.0, 0.8)):
        env, library = make_pursuit(max_cycles=cap), pursuit_library()
        pair = [run_episode(env, library, PursuitOracle(library=library), seed=s) for s in seeds]
        apart = [run_episode(env, library, IndependentChase(library=library), seed=s) for s in seeds]
        mutual = [run_episode(env, library, MutualFollow(library=library), seed=s) for s in seeds]
        assert np.mean([t.success for t in pair]) >= pair_wins
        assert np.mean([t.success for t in mutual]) >= pair_wins
        assert np.mean([t.success for t in apart]) <= apart_wins
        assert np.mean([t.length for t in pair]) < np.mean([t.length for t in apart])
        for t in pair:  # a catch count, verified on the game, in order
            caught = [t.milestone_steps[m] for m in ("caught_1", "caught_2", "caught_3") if m in t.milestone_steps]
            assert set(t.milestone_steps) == {f"caught_{k + 1}" for k in range(len(caught))}  # a prefix of the chain
            assert caught == sorted(caught) and all(0 < s <= t.length <= cap for s in caught)
            assert t.success == (len(caught) == 3) and (not t.success or caught[-1] == t.length)


def test_a_strategy_call_ends_when_an_evader_is_caught() -> None:
    env, library = make_pursuit(), pursuit_library()
    traj = run_episode(env, library, PursuitOracle(library=library), seed=4)
    ended = [c for c in traj.calls if c.termination is Termination.DONE]
    assert ended and all(c.milestones for c in ended)  # done exactly where a catch was verified
    for c in traj.calls:
        assert c.termination in (Termination.DONE, Termination.MAX_STEPS, Termination.EPISODE)
        assert c.duration <= library[c.option].max_steps


def test_random_order_never_dead_ends_and_the_oracle_builds_from_a_reference() -> None:
    env, library = make_pursuit(), pursuit_library()
    for seed in range(3):
        assert not run_episode(env, library, RandomManager(seed), seed=seed).dead_ends
    oracle = make_oracle("gyre_ma.envs.pursuit_tasks:make_pursuit", env, library,
                         source="gyre_ma.envs.pursuit_tasks:PursuitOracle")
    assert isinstance(oracle, PursuitOracle)


def test_paths_go_around_the_building() -> None:
    env = make_pursuit()
    env.reset(seed=0)
    walls = _game(env.unwrapped).map_matrix
    assert (walls == -1).any()
    dist = _distances(walls, (0, 4))
    # straight across the building is 7 cells; the path goes round it
    assert dist[7, 4] > 7 and dist[7, 4] < walls.size
    assert dist[0, 4] == 0 and dist[1, 4] == 1


def test_a_reference_manager_names_the_strategy_it_cannot_run() -> None:
    library = pursuit_library()
    mask = np.ones(len(library), dtype=bool)
    mask[library.index("chase_nearest")] = False
    decision = Decision("pursuer_0", 0, None, mask, frozenset(), -1, 0.0, None)
    with pytest.raises(ValueError, match="'chase_nearest' is not eligible for 'pursuer_0'"):
        PursuitOracle(library=library).decide([decision])
    with pytest.raises(ValueError, match=r"lacks option\(s\) \['follow_partner'\]"):
        MutualFollow(library=_chase_only(library))


def _chase_only(library: OptionLibrary) -> OptionLibrary:
    only = OptionLibrary("chase_only", library.graph)
    only.add(library[library.index("chase_nearest")])
    return only
