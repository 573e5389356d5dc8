"""The manager's interface: a :class:`Decision` (one agent needing a new option) in, a
:class:`Choice` out. Learned managers, baselines and oracles all speak it.

The rollout asks for one agent's decision at a time, in ``env.agents`` order, so that each
decision can see what the other agents are running, including the options chosen for
them a moment earlier in the same step (``Decision.others``): a shared manager can break
the symmetry of agents that start alike ("you take the left landmark, I the right").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from gyre_ma.options.option import Termination


@dataclass(frozen=True)
class Decision:
    """One agent needing a new option. ``env`` is the env being stepped (planners read it;
    adapters expose the wrapped env's internals as ``env.unwrapped``)."""

    agent: str
    agent_index: int
    observation: Any
    mask: np.ndarray
    achieved: frozenset[str]
    last_option: int
    time_fraction: float
    env: Any
    others: tuple[int, ...] = ()
    """Options the other live agents are running now, in ``env.agents`` order (those
    decided earlier in this step included; agents between options left out)."""
    last_termination: Termination | None = None
    """How this agent's previous call ended (None before its first)."""
    goals: tuple[str, ...] = ()
    """This episode's goals, where the env sets them per episode (``env.episode_goals()``);
    (): the task graph's."""
    last_duration: int = 0
    """Primitive steps of this agent's previous call (0 before its first)."""


@dataclass(frozen=True)
class Choice:
    option: int
    log_prob: float = 0.0
    value: float = 0.0


class Manager(Protocol):
    """Chooses one option per decision: ``decide`` returns a :class:`Choice` per
    :class:`Decision`, in order, each option allowed by its decision's mask.

    Two optional hooks, called by :func:`gyre_ma.rollout.run_episode` where a manager
    defines them (a planner resets its bookkeeping in the first, tracks progress in the
    second):

    - ``episode_start(env, seed)``: after ``env.reset(seed=seed)``, before any decision;
    - ``option_end(call, env)``: as each option call ends (an
      :class:`~gyre_ma.rollout.OptionCall` with its duration, termination and the
      milestones verified during it), while ``env`` holds the state it ended in.
    """

    def decide(self, decisions: Sequence[Decision]) -> list[Choice]: ...
