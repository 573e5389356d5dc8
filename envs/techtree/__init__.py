"""techtree: a multi-agent, Crafter-inspired survival-and-crafting world (``techtree_v0``)."""

from gyre_ma.envs.techtree.options import make_library
from gyre_ma.envs.techtree.oracle import OracleManager
from gyre_ma.envs.techtree.techtree import (
    TechTreeConfig,
    TechTreeEnv,
    env,
    parallel_env,
    raw_env,
    task_graph,
)

__all__ = [
    "OracleManager", "TechTreeConfig", "TechTreeEnv", "env", "make_library", "parallel_env",
    "raw_env", "task_graph",
]
