"""Verified rewards: every option call's reward comes from verified sources, in a fixed
order (guard veto > verified outcome > milestones and rules > PRM), and stays traceable in
its :class:`RewardBreakdown`.

- :mod:`.breakdown` — RewardBreakdown, the per-call record;
- :mod:`.milestones` — first-verified milestone rewards from task-graph weights;
- :mod:`.rules` — the rule engine (process rules and guards over env state);
- :mod:`.prm` — the learned process reward model (its Lightning trainer: :mod:`gyre_ma.trainers.prm`);
- :mod:`.arbiter` — RewardConfig (with PRMConfig, so a config loads without torch) and the arbitration;
- :mod:`.drift` — PRM/outcome agreement and the weight cut;
- :mod:`.alarms` — reward-hacking alarms;
- :mod:`.scorer` — RewardScorer, which runs all of it once per iteration.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name → the submodule defining it; imported on first use (PEP 562), so loading a
# config (which needs RewardConfig) does not import torch and Lightning with the PRM
_SOURCES = {
    "alarms": ("Alarm", "AlarmConfig", "HackingMonitor", "calls_without_completion", "reward_without_completion",
               "rules_without_success"),
    "arbiter": ("PRMConfig", "RewardConfig", "outcome_reward", "score_trajectory"),
    "breakdown": ("RewardBreakdown", "summarize"),
    "drift": ("DriftConfig", "DriftMonitor", "DriftStatus", "agreement", "auc", "spearman"),
    "milestones": ("first_verified", "milestone_rewards"),
    "prm": ("ProcessRewardModel", "prm_labels", "prm_rewards"),
    "rules": ("Rule", "RuleContext", "RuleEngine", "RuleResults", "RuleSpec",
              "default_snapshot", "extended_snapshot", "load_rules", "rule_metrics", "state_check"),
    "scorer": ("RewardScorer", "Scored", "apply_breakdowns"),
}
_MODULE_OF = {name: module for module, names in _SOURCES.items() for name in names}

__all__ = [
    "Alarm", "AlarmConfig", "DriftConfig", "DriftMonitor", "DriftStatus",
    "HackingMonitor", "PRMConfig", "ProcessRewardModel",
    "RewardBreakdown", "RewardConfig", "RewardScorer", "Rule", "RuleContext", "RuleEngine",
    "RuleResults", "RuleSpec", "Scored", "agreement", "apply_breakdowns", "auc",
    "calls_without_completion", "default_snapshot", "extended_snapshot", "first_verified", "load_rules",
    "milestone_rewards", "outcome_reward", "prm_labels", "prm_rewards", "reward_without_completion",
    "rule_metrics", "rules_without_success", "score_trajectory", "spearman", "state_check",
    "summarize",
]


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
