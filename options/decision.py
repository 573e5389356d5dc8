"""The manager's interface: a :class:`Decision` (one agent needing a new option) in, a
:class:`Choice` out. Learned managers, baselines and oracles all speak it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


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


@dataclass(frozen=True)
class Choice:
    option: int
    log_prob: float = 0.0
    value: float = 0.0


class Manager(Protocol):
    """Chooses options for a batch of simultaneous decisions (one per agent)."""

    def decide(self, decisions: Sequence[Decision]) -> list[Choice]: ...
