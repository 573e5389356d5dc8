"""Verified rewards: every option call's reward comes from verified sources, in a fixed
order (guard veto > verified outcome > milestones and rules > PRM), and stays traceable in
its :class:`RewardBreakdown`.

- :mod:`.breakdown` — RewardBreakdown, the per-call record;
- :mod:`.milestones` — first-verified milestone rewards from task-graph weights;
- :mod:`.rules` — the rule engine (process rules and guards over env state);
- :mod:`.prm` — the learned process reward model and its Lightning trainer;
- :mod:`.arbiter` — RewardConfig and the arbitration;
- :mod:`.drift` — PRM/outcome agreement and the weight cut;
- :mod:`.alarms` — reward-hacking alarms;
- :mod:`.scorer` — RewardScorer, which runs all of it once per iteration.
"""

from gyre_ma.rewards.alarms import (
    Alarm,
    AlarmConfig,
    HackingMonitor,
    calls_without_completion,
    reward_without_completion,
    rules_without_success,
)
from gyre_ma.rewards.arbiter import RewardConfig, outcome_reward, score_trajectory
from gyre_ma.rewards.breakdown import RewardBreakdown, summarize
from gyre_ma.rewards.drift import DriftConfig, DriftMonitor, DriftStatus, agreement, auc, spearman
from gyre_ma.rewards.milestones import first_verified, milestone_rewards
from gyre_ma.rewards.prm import PRMConfig, PRMModule, ProcessRewardModel, prm_labels, prm_rewards
from gyre_ma.rewards.rules import (
    BrokenRuleWarning,
    OptionEndProbe,
    Rule,
    RuleContext,
    RuleEngine,
    RuleResults,
    RuleSpec,
    default_snapshot,
    extended_snapshot,
    load_rules,
    rule_metrics,
    state_check,
)
from gyre_ma.rewards.scorer import RewardScorer, Scored, apply_breakdowns

__all__ = [
    "Alarm", "AlarmConfig", "BrokenRuleWarning", "DriftConfig", "DriftMonitor", "DriftStatus",
    "HackingMonitor", "OptionEndProbe", "PRMConfig", "PRMModule", "ProcessRewardModel",
    "RewardBreakdown", "RewardConfig", "RewardScorer", "Rule", "RuleContext", "RuleEngine",
    "RuleResults", "RuleSpec", "Scored", "agreement", "apply_breakdowns", "auc",
    "calls_without_completion", "default_snapshot", "extended_snapshot", "first_verified", "load_rules",
    "milestone_rewards", "outcome_reward", "prm_labels", "prm_rewards", "reward_without_completion",
    "rule_metrics", "rules_without_success", "score_trajectory", "spearman", "state_check",
    "summarize",
]
