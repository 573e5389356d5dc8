"""Credit assignment: pure functions from option calls to advantages and value targets.

Trainers choose an estimator through :func:`option_advantages`; they never
re-implement one.
"""

from gyre_ma.credit.anchors import anchor_values, anchored_outcome_credit, spread_over_calls
from gyre_ma.credit.blend import (
    AdvantageMode,
    OutcomeCredit,
    adaptive_blend_weights,
    blend_advantages,
    option_advantages,
)
from gyre_ma.credit.gae import smdp_gae, smdp_returns
from gyre_ma.credit.gigpo import gigpo_advantages
from gyre_ma.credit.outcome import GroupStats, episode_outcomes, group_outcome_advantages, group_outcome_stats
from gyre_ma.credit.segmented import segmented_gae

__all__ = [
    "AdvantageMode",
    "GroupStats",
    "OutcomeCredit",
    "adaptive_blend_weights",
    "anchor_values",
    "anchored_outcome_credit",
    "blend_advantages",
    "episode_outcomes",
    "gigpo_advantages",
    "group_outcome_advantages",
    "group_outcome_stats",
    "option_advantages",
    "segmented_gae",
    "smdp_gae",
    "smdp_returns",
    "spread_over_calls",
]
