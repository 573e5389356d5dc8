"""The learner's stability policy beside its :class:`~gyre_ma.checkpoints.CheckpointManager`:
what validation judges, when an update is skipped, when the learner rolls back.

The checkpoint manager keeps the slots and decides improved / kept / rollback from a
score; this module decides which score it sees (greedy evaluator episodes as they are;
sampled training episodes averaged over a window, since one iteration's are too noisy to
roll back on) and guards updates against non-finite inputs (:class:`NanGuard`: skip, and
roll back after ``nan_max_consecutive`` in a row).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gyre_ma.checkpoints import CheckpointManager, GuardDecision, NanGuard, ValidationDecision

if TYPE_CHECKING:
    from gyre_ma.config import CheckpointConfig


class Stability:
    """Validation scores, the NaN guard and the rollback decisions of one learner."""

    def __init__(self, config: CheckpointConfig, checkpoints: CheckpointManager | None) -> None:
        self.checkpoints = checkpoints
        self.nan_guard = NanGuard(config.nan_max_consecutive)
        self.recent: deque[float] = deque(maxlen=config.validation_window)
        """Success rates of the last iterations' sampled episodes (judged by their mean)."""

    @classmethod
    def from_config(cls, config: CheckpointConfig, run_dir: Path | None) -> Stability:
        """With ``run_dir``, the checkpoint slots live in ``<run_dir>/checkpoints``; without it
        (or with checkpoints disabled) nothing is kept and nothing rolls back."""
        checkpoints = None
        if config.enabled and run_dir is not None:
            checkpoints = CheckpointManager(Path(run_dir) / "checkpoints", rollback_threshold=config.rollback_threshold,
                                            lr_cut=config.lr_cut, min_lr_scale=config.min_lr_scale,
                                            large_update_kl=config.large_update_kl)
        return cls(config, checkpoints)

    def score(self, success_rate: float, *, sampled: bool) -> float:
        """The score validation judges: a greedy evaluation's success as it is, sampled
        episodes' as the mean over the recent window."""
        if not sampled:
            return success_rate
        self.recent.append(success_rate)
        return float(np.mean(self.recent))

    def validate(self, score: float, state: Mapping[str, Any] | None, *, step: int) -> ValidationDecision:
        """Keep the judged state as best, or roll back (see :meth:`CheckpointManager.validate`;
        ``state`` None: the judged state is the one in ``latest``)."""
        decision = self.checkpoints.validate(score, state, step=step)
        if decision.rolled_back:
            self.recent.clear()  # a new policy: its own scores from here on
        return decision

    def guard(self, *, step: int, **values: Any) -> tuple[GuardDecision, ValidationDecision | None]:
        """Whether to skip this update (non-finite ``values``), and the rollback when the
        guard asks for one and there are checkpoints to roll back to."""
        guard = self.nan_guard.check(**values)
        if not (guard.rollback and self.checkpoints is not None):
            return guard, None
        decision = self.checkpoints.rollback(reason=guard.reason, step=step)
        self.recent.clear()
        return guard, decision

    def state_dict(self) -> dict[str, Any]:
        return {"nan_guard": self.nan_guard.state_dict(), "recent_scores": list(self.recent)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("nan_guard") is not None:
            self.nan_guard.load_state_dict(state["nan_guard"])
        self.recent.clear()
        self.recent.extend(state.get("recent_scores", []))
