"""scienceworld_v0 — PettingZoo entry points (``env``, ``parallel_env``, ``raw_env``) of the
ScienceWorld env (:mod:`gyre_ma.envs.scienceworld_env`): the gyre env the registry builds,
which truncates at ``max_cycles`` and verifies milestones, and its AEC form."""

from __future__ import annotations

from typing import Any

from pettingzoo import AECEnv
from pettingzoo.utils import parallel_to_aec, wrappers

from gyre_ma.envs.adapters import GyreAdapter
from gyre_ma.envs.scienceworld_env import ScienceWorldParallel, make_env


def parallel_env(**kwargs: Any) -> GyreAdapter:
    """The one-agent ParallelEnv (``family``, ``max_cycles``)."""
    return make_env(**kwargs)


def raw_env(**kwargs: Any) -> AECEnv:
    """The AEC version, converted from the parallel env."""
    return parallel_to_aec(make_env(**kwargs))


def env(**kwargs: Any) -> AECEnv:
    """The AEC version with PettingZoo's order-enforcing wrapper (actions are text: no bounds to assert)."""
    return wrappers.OrderEnforcingWrapper(raw_env(**kwargs))


__all__ = ["ScienceWorldParallel", "env", "parallel_env", "raw_env"]
