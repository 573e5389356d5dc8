"""Flat RL in the same framework: every primitive action as a one-step option.

With this library the manager *is* a flat PPO policy over primitive actions (same
network, same trainer, same loop), which makes it the fair baseline: only the action
abstraction differs.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym

from gyre_ma.options.graph import TaskGraph
from gyre_ma.options.library import OptionLibrary
from gyre_ma.options.option import Option, OptionContext


@dataclass(frozen=True)
class PrimitiveAction:
    """Sub-policy that always emits one fixed primitive action."""

    action: int

    def __call__(self, ctx: OptionContext) -> int:
        return self.action


def after_one_step(ctx: OptionContext) -> bool:
    return ctx.steps >= 1


def primitive_library(graph: TaskGraph, action_space: gym.Space) -> OptionLibrary:
    """One option per primitive action, always eligible, ending after one step."""
    if not isinstance(action_space, gym.spaces.Discrete):
        raise TypeError(f"flat baseline needs a Discrete action space, got {action_space}")
    library = OptionLibrary("primitive", graph)
    for a in range(int(action_space.n)):
        library.add(Option(f"action_{a}", PrimitiveAction(int(action_space.start) + a),
                           done=after_one_step, max_steps=1))
    return library
