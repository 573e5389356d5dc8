"""workflow_v0 under its versioned PettingZoo id: ``from gyre_ma.envs import workflow_v0``."""

from gyre_ma.envs.workflow.workflow import WorkflowEnv, env, parallel_env, raw_env

__all__ = ["WorkflowEnv", "env", "parallel_env", "raw_env"]
