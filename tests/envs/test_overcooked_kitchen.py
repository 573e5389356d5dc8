"""The Overcooked kitchen: the oracle serves a soup, the env passes the gyre checks, and a
seed fixes the episode."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("overcooked", reason="the overcooked extra is not installed")

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.checks import check_setup
from gyre_ma.envs.checks import check_env
from gyre_ma.envs.overcooked_kitchen import (
    LAYOUTS,
    OracleManager,
    make_env,
    make_library,
    task_graph,
)
from gyre_ma.rollout import run_episode

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_oracle_serves_a_soup_on_almost_every_seed(layout: str) -> None:
    env, library = make_env(layout), make_library()
    manager = OracleManager(library=library)
    runs = [run_episode(env, library, manager, seed=s) for s in range(20)]
    assert np.mean([t.success for t in runs]) >= 0.95
    assert not any(t.dead_ends for t in runs)
    assert max(t.length for t in runs) < env.max_cycles


@pytest.mark.parametrize("layout", LAYOUTS)
def test_check_setup_passes(layout: str) -> None:
    report = check_setup(make_env(layout), make_library())
    assert report.milestones == set(task_graph().names)


def test_milestones_stay_in_graph_order_under_random_primitive_actions() -> None:
    # random play starts pots cooking with one or two onions; no milestone may follow from that
    check_env(lambda: make_env("cramped_room"), seeds=(0, 1), n_steps=200, pettingzoo_tests=False)


def test_a_seed_fixes_the_start_and_the_trajectory() -> None:
    env, library = make_env("cramped_room"), make_library()
    first = run_episode(env, library, RandomManager(7), seed=7)
    again = run_episode(env, library, RandomManager(7), seed=7)
    assert first.length == again.length
    assert [(c.agent, c.option, c.duration) for c in first.calls] == [
        (c.agent, c.option, c.duration) for c in again.calls]
    starts = set()
    for seed in range(10):
        env.reset(seed=seed)
        starts.add(tuple(p.pos_and_or for p in env.unwrapped.game.players))
    assert len(starts) > 1, "reset(seed=...) should draw the cooks' start tiles and facings"


def test_asymmetric_halves_stay_apart_at_reset() -> None:
    env = make_env("asymmetric_advantages")
    for seed in range(10):
        env.reset(seed=seed)
        left, right = (p.position[0] for p in env.unwrapped.game.players)
        assert right < 4 < left, "each cook starts in the half its layout start lies in"


def test_auto_cook_graph_declares_cooking_a_side_effect() -> None:
    graph = task_graph()
    assert graph.milestone("soup_ready").side_effect and not graph.milestone("cooking_started").side_effect
    env = make_env("cramped_room", auto_cook=True)
    library = make_library(env)
    assert env.task_graph().milestone("cooking_started").side_effect
    assert "start_cooking" not in library.names
    runs = [run_episode(env, library, OracleManager(library=library), seed=s) for s in range(5)]
    assert all(t.success for t in runs)


def test_unscripted_layout_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="forced_coordination.*cramped_room"):
        make_env("forced_coordination")
