"""workflow_v0: a team runs a data-analysis tool chain (acquire → validate → fit →
report → compliance → submit) with tool timeouts, hidden data problems and a
surface-only shortcut. See :mod:`gyre_ma.envs.workflow.workflow`."""

from gyre_ma.envs.workflow.workflow import (
    GRAPH_SPEC,
    MILESTONES,
    WorkflowConfig,
    WorkflowEnv,
    env,
    parallel_env,
    raw_env,
    task_graph,
)

__all__ = [
    "GRAPH_SPEC", "MILESTONES", "WorkflowConfig", "WorkflowEnv", "env", "parallel_env",
    "raw_env", "task_graph",
]
