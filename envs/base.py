"""What gyre-ma asks of an environment beyond PettingZoo's ParallelEnv."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from gyre_ma.options.graph import TaskGraph


@runtime_checkable
class GyreEnv(Protocol):
    """A PettingZoo ``ParallelEnv`` whose milestones are verified on its own state.

    ``verified_milestones()`` reads environment state only — never an agent's output —
    and is monotone within an episode (a milestone once verified stays verified).
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
