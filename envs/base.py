"""What gyre-ma asks of an environment beyond PettingZoo's ParallelEnv."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np

from gyre_ma.options.errors import UserAnswerError, UserCodeError
from gyre_ma.options.graph import TaskGraph


@runtime_checkable
class GyreEnv(Protocol):
    """A PettingZoo ``ParallelEnv`` whose milestones are verified on its own state.

    ``verified_milestones()`` reads environment state only — never an agent's output —
    and is monotone within an episode (a milestone once verified stays verified).

    Optional: ``milestone_agent(milestone) -> str | None``, the agent whose action made a
    verified milestone hold, where the env can tell (who claimed the landmark). With it a
    milestone is credited to that agent's option call only; without it, to every agent's
    call running when it was verified (the team convention).
    """

    possible_agents: list[str]
    agents: list[str]

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]: ...

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]: ...

    def observation_space(self, agent: str) -> Any: ...

    def action_space(self, agent: str) -> Any: ...

    def state(self) -> Any: ...

    def task_graph(self) -> TaskGraph: ...

    def verified_milestones(self) -> frozenset[str]: ...


def unwrap(env: Any) -> Any:
    """The gyre environment under PettingZoo/Gymnasium wrappers: the outermost layer that
    verifies milestones, else the innermost one."""
    for _ in range(64):
        if hasattr(env, "verified_milestones") or not hasattr(env, "env"):
            return env
        env = env.env
    return env


def _flattenable(space: gym.Space) -> bool:
    try:
        return bool(space.is_np_flattenable)
    except NotImplementedError:
        return False


class NumericView:
    """The numeric part of an observation space, flattened to one float vector.

    Dict members with no numeric form are dropped: text (a ``Text`` space, which Gymnasium
    would flatten to one character code per position: thousands of inputs that swamp the
    numeric ones, as a session-54 user's manager found) and spaces with no flat form
    (MiniGrid's mission); any other non-flattenable space is a TypeError naming it.
    """

    def __init__(self, space: gym.Space) -> None:
        self.keys: list[str] | None = None
        if isinstance(space, gym.spaces.Dict):
            self.keys = [k for k, s in space.spaces.items()
                         if _flattenable(s) and not isinstance(s, gym.spaces.Text)]
            space = gym.spaces.Dict({k: space[k] for k in self.keys})
        elif not _flattenable(space):
            raise TypeError(f"observation space {space} has no numeric flat form")
        self.space = space
        self.flat_space = gym.spaces.flatten_space(space)
        self._array = type(space) in (gym.spaces.Box, gym.spaces.MultiBinary)
        """Flattened as an array of the space's dtype (what ``gym.spaces.flatten`` does for
        these, less its dispatch, which the manager pays at every decision)."""

    def __call__(self, observation: Any) -> np.ndarray:
        if self._array:
            return np.asarray(observation, dtype=self.space.dtype).flatten()
        if self.keys is not None:
            observation = {k: observation[k] for k in self.keys}
        return gym.spaces.flatten(self.space, observation)

    def many(self, observations: Sequence[Any]) -> np.ndarray:
        """Many observations flattened, one row each: [N, flat dimension]."""
        if not len(observations):
            return np.zeros((0, self.flat_space.shape[0]), dtype=self.flat_space.dtype)
        if self._array:  # one conversion for the whole batch, not one per row
            rows = np.asarray(observations, dtype=self.space.dtype)
            return rows.reshape(len(observations), -1)
        return np.stack([self(o) for o in observations])


def declares_goals(env: Any) -> bool:
    """Whether ``env``'s episodes may each have their own goals: it has an ``episode_goals``
    method, and where it is an adapter, the user's code behind it (``goals_source``)."""
    return callable(getattr(env, "episode_goals", None)) and getattr(env, "goals_source", True) is not None


def episode_goals(env: Any, graph: TaskGraph, seed: int) -> tuple[str, ...]:
    """The goals of the episode ``env`` was just reset to, where they change per episode:
    what ``env.episode_goals()`` returns (some of ``graph``'s goals, in the graph's order),
    checked; () where the env has no such method or it returns None (the graph's goals)."""
    ask = getattr(env, "episode_goals", None)
    if not callable(ask):
        return ()
    where = f"environment {type(getattr(env, 'unwrapped', env)).__name__}.episode_goals (task seed {seed})"
    try:
        got = ask()
    except Exception as exc:
        raise UserCodeError(where, exc) from exc
    if got is None:
        return ()
    names = [got] if isinstance(got, str) else list(got) if isinstance(got, Iterable) else None
    if not names or any(not isinstance(n, str) or n not in graph.goals for n in names):
        raise UserAnswerError(where, f"returned {got!r}; expected a non-empty list of the task graph's goals "
                              f"{list(graph.goals)} (the graph's goals are every goal an episode may have), or None "
                              "for all of them", getattr(env, "goals_source", None) or ask)
    return tuple(g for g in graph.goals if g in names)
