"""MiniGrid ObstructedMaze-1Dlhb and LockedRoom as gyre envs: their oracles succeed,
check_setup passes, milestones fire in graph order, and the key put down comes back."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.checks import check_setup
from gyre_ma.envs.minigrid_tasks import (
    LockedRoomOracle,
    ObstructedMazeOracle,
    has_key,
    key_room_open,
    locked_room_library,
    make_locked_room,
    make_obstructed_maze,
    obstructed_maze_library,
)
from gyre_ma.envs.registry import make_oracle
from gyre_ma.options.decision import Choice, Decision
from gyre_ma.options.library import OptionLibrary
from gyre_ma.rollout import Trajectory, run_episode

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TASKS = {
    "obstructed_maze": (make_obstructed_maze, obstructed_maze_library, ObstructedMazeOracle),
    "locked_room": (make_locked_room, locked_room_library, LockedRoomOracle),
}
ORACLE_CALLS = {
    "obstructed_maze": ["move_ball", "open_box", "get_key", "open_door", "get_target"],
    "locked_room": ["open_key_room", "get_key", "open_door", "go_to_goal"],
}


class Scripted:
    """Runs the named options in turn (``turn`` when the next one is masked)."""

    def __init__(self, library: OptionLibrary, names: Sequence[str]) -> None:
        self.library, self.names = library, list(names)
        self.masks: list[dict[str, bool]] = []

    def decide(self, decisions: Sequence[Decision]) -> list[Choice]:
        d = decisions[0]
        self.masks.append({n: bool(d.mask[self.library.index(n)]) for n in self.library.names})
        if self.names and d.mask[self.library.index(self.names[0])]:
            return [Choice(self.library.index(self.names.pop(0)))]
        return [Choice(self.library.index("turn"))]


def _in_graph_order(traj: Trajectory, library: OptionLibrary) -> None:
    for m in library.graph.milestones:
        for r in m.requires:
            assert traj.milestone_steps[r] <= traj.milestone_steps[m.name], (m.name, r, traj.milestone_steps)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_oracle_succeeds_on_almost_every_seed(task: str) -> None:
    make_env, make_library, oracle = TASKS[task]
    env, library = make_env(), make_library()
    runs = [run_episode(env, library, oracle(library=library), seed=s) for s in range(40)]
    assert np.mean([t.success for t in runs]) >= 0.95
    assert not any(t.dead_ends for t in runs)
    assert max(t.length for t in runs) < env.max_cycles
    for t in runs:
        _in_graph_order(t, library)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_milestones_fire_in_graph_order_on_an_oracle_episode(task: str) -> None:
    make_env, make_library, oracle = TASKS[task]
    env, library = make_env(), make_library()
    traj = run_episode(env, library, oracle(library=library), seed=7)
    assert traj.success and traj.calls[-1].terminated
    assert [library[c.option].name for c in traj.calls] == ORACLE_CALLS[task]
    assert [c.milestones for c in traj.calls] == [(library[c.option].milestone,) for c in traj.calls]
    assert set(traj.milestone_steps) == set(library.graph.names) and min(traj.milestone_steps.values()) > 0
    _in_graph_order(traj, library)
    assert traj.total_reward > 0  # MiniGrid's own success reward passes through


@pytest.mark.parametrize("task", sorted(TASKS))
def test_check_setup_passes_driven_by_the_library(task: str) -> None:
    make_env, make_library, _ = TASKS[task]
    report = check_setup(make_env, make_library(), n_steps=300)
    assert report.milestones == set(make_library().graph.names)
    assert {"parallel_api_test", "parallel_seed_test"} <= set(report.pettingzoo_tests)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_random_order_never_dead_ends(task: str) -> None:
    make_env, make_library, _ = TASKS[task]
    env, library = make_env(), make_library()
    for seed in range(5):
        traj = run_episode(env, library, RandomManager(seed), seed=seed)
        assert not traj.dead_ends
        _in_graph_order(traj, library)


def test_key_taken_too_early_is_put_down_for_the_ball_and_fetched_again() -> None:
    env, library = make_obstructed_maze(), obstructed_maze_library()
    manager = Scripted(library, ["open_box", "get_key", "move_ball", "get_key", "open_door", "get_target"])
    traj = run_episode(env, library, manager, seed=3)
    assert traj.success
    assert [library[c.option].name for c in traj.calls] == [
        "open_box", "get_key", "move_ball", "get_key", "open_door", "get_target"]
    after_move = manager.masks[3]  # the key lies on the floor, has_key stays verified
    assert "has_key" in traj.calls[3].achieved
    assert after_move["get_key"] and not after_move["open_door"] and not after_move["move_ball"]
    assert after_move["turn"]


def test_oracle_builds_from_a_reference_and_rejects_a_foreign_library() -> None:
    env, library = make_locked_room(), locked_room_library()
    oracle = make_oracle("MiniGrid-LockedRoom-v0", env, library,
                         source="gyre_ma.envs.minigrid_tasks:LockedRoomOracle")
    assert isinstance(oracle, LockedRoomOracle)
    with pytest.raises(ValueError, match="lacks option"):
        ObstructedMazeOracle(library=library)


def test_locked_room_detectors_read_the_mission() -> None:
    env = make_locked_room()
    env.reset(seed=0)
    raw = env.unwrapped
    assert not key_room_open(raw) and not has_key(raw)
    raw.mission = "go somewhere"
    with pytest.raises(ValueError, match="LockedRoom mission"):
        key_room_open(raw)


@pytest.mark.parametrize(("kwargs", "at_reset"), [({"blocked": False}, {"door_unblocked"}),
                                                  ({"key_in_box": False}, {"key_revealed"})])
def test_obstructed_maze_variants_verify_the_missing_obstacle_at_reset(kwargs: dict[str, bool],
                                                                       at_reset: set[str]) -> None:
    env, library = make_obstructed_maze(**kwargs), obstructed_maze_library()
    env.reset(seed=0)
    assert env.verified_milestones() == at_reset
    assert run_episode(env, library, ObstructedMazeOracle(library=library), seed=0).success
