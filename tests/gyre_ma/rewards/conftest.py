"""Shared builders: a small task graph and hand-made trajectories."""

from __future__ import annotations

import numpy as np
import pytest

from gyre_ma.options.graph import TaskGraph
from gyre_ma.rollout import OptionCall, Trajectory


def call(agent: str, start: int, duration: int, option: int = 0, agent_index: int | None = None) -> OptionCall:
    return OptionCall(
        agent=agent, agent_index=int(agent[-1]) if agent_index is None else agent_index, option=option,
        observation=np.zeros(3, dtype=np.float32), mask=np.ones(4, dtype=bool), achieved=frozenset(),
        last_option=-1, time_fraction=0.0, log_prob=0.0, value=0.0, start_step=start,
        policy_version=0, task_seed=0, duration=duration,
    )


def trajectory(calls: list[OptionCall], milestone_steps: dict[str, int], success: bool = False) -> Trajectory:
    t = Trajectory(task_seed=0, policy_version=0, calls=calls, milestone_steps=dict(milestone_steps),
                   success=success)
    t.length = max((c.start_step + c.duration for c in calls), default=0)
    return t


@pytest.fixture
def graph() -> TaskGraph:
    """a (0.5) → b (1.0) → goal (5.0)."""
    return TaskGraph.from_spec({
        "goals": ["goal"],
        "milestones": {
            "a": {"reward": 0.5},
            "b": {"reward": 1.0, "requires": ["a"]},
            "goal": {"reward": 5.0, "requires": ["b"]},
        },
    })


@pytest.fixture
def two_agent_episode():
    """agent_0: calls [0,10) [10,30); agent_1: [0,25) [25,30). a at 5, b at 20, goal at 30."""
    def make(success: bool = True, steps: dict[str, int] | None = None) -> Trajectory:
        calls = [call("agent_0", 0, 10), call("agent_1", 0, 25), call("agent_0", 10, 20), call("agent_1", 25, 5)]
        ms = {"a": 5, "b": 20, "goal": 30} if steps is None else steps
        return trajectory(calls, ms, success)

    return make


@pytest.fixture
def make_call():
    return call


@pytest.fixture
def make_traj():
    return trajectory
