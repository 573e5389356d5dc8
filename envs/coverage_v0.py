"""coverage_v0 — PettingZoo entry points (``env``, ``parallel_env``, ``raw_env``)."""

from gyre_ma.envs.coverage.coverage import CoverageEnv, env, parallel_env, raw_env

__all__ = ["CoverageEnv", "env", "parallel_env", "raw_env"]
