"""techtree_v0 — PettingZoo entry points (``env``, ``parallel_env``, ``raw_env``)."""

from gyre_ma.envs.techtree.techtree import TechTreeEnv, env, parallel_env, raw_env

__all__ = ["TechTreeEnv", "env", "parallel_env", "raw_env"]
