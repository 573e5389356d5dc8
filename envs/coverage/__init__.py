"""coverage: N agents must cover N landmarks on an open grid, an assignment task (``coverage_v0``)."""

from gyre_ma.envs.coverage.coverage import (
    CoverageConfig,
    CoverageEnv,
    env,
    parallel_env,
    raw_env,
    task_graph,
)
from gyre_ma.envs.coverage.options import make_library
from gyre_ma.envs.coverage.oracle import FixedAssignment, NearestFirst, OracleManager

__all__ = [
    "CoverageConfig", "CoverageEnv", "FixedAssignment", "NearestFirst", "OracleManager", "env", "make_library",
    "parallel_env", "raw_env", "task_graph",
]
