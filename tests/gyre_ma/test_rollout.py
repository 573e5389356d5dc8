"""run_episode: a dead end of the library cuts the episode as a truncation, counted."""

from __future__ import annotations

import pytest

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.envs.minigrid_doorkey import make_env
from gyre_ma.metrics import episode_metrics
from gyre_ma.options.library import OptionLibrary
from gyre_ma.options.option import Option
from gyre_ma.rollout import run_episode, trajectory_from_state, trajectory_to_state

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_a_library_dead_end_cuts_the_episode_instead_of_raising():
    """No always-eligible fallback: the one option open at the start may be taken once, the
    others need milestones it never verifies. Before, the rollout raised and ended training."""
    env = make_env(max_cycles=100)
    library = OptionLibrary("no_fallback", env.task_graph())
    calls = {"n": 0}

    def once(ctx):
        calls["n"] += 1
        return calls["n"] <= 1

    library.add(Option("stall", lambda ctx: 0, milestone="has_key", max_steps=3, initiation=once))
    library.add(Option("open_door", lambda ctx: 5, milestone="door_open", max_steps=3))
    library.add(Option("go_to_goal", lambda ctx: 2, milestone="reached_goal", max_steps=3))
    traj = run_episode(env, library, RandomManager(seed=0), seed=0)
    agent = env.possible_agents[0]
    assert traj.dead_ends == [agent] and not traj.success
    assert traj.length == 3 and len(traj.calls) == 1 and not traj.calls[-1].terminated  # cut, so bootstrapped
    assert episode_metrics([traj], ())["dead_ends"] == 1.0
    assert trajectory_from_state(trajectory_to_state(traj)).dead_ends == [agent]
