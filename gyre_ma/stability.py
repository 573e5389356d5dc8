"""The learner's stability policy beside its :class:`~gyre_ma.checkpoints.CheckpointManager`:
what validation judges, when an update is skipped, when the learner rolls back.

The checkpoint manager keeps the slots and decides improved / kept / rollback from a
score; this module decides which score it sees (held-out validation episodes, or
without them the training episodes, pooled over a window of iterations, since one
iteration's are too few to roll back on) and guards updates against non-finite inputs (:class:`NanGuard`: skip, and
roll back after ``nan_max_consecutive`` in a row).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gyre_ma.checkpoints import CheckpointManager, GuardDecision, NanGuard, ValidationDecision
from gyre_ma.config import MIN_VALIDATION_EPISODES
from gyre_ma.metrics import wilson_interval

if TYPE_CHECKING:
    from gyre_ma.config import CheckpointConfig


def significant_drop(*, best: float, best_episodes: int | None, score: float, episodes: int,
                     confidence: float, candidates: int = 1) -> bool:
    """Whether success rate ``score`` over ``episodes`` is below ``best`` over
    ``best_episodes`` beyond chance: the upper Wilson bound of ``score`` (one-sided at
    ``confidence``) lies below the lower bound of ``best``. Stricter than a plain
    two-proportion test on purpose: ``best`` is the highest of ``candidates`` noisy
    validations, so it sits above the policy's true rate, and a test that takes it at face
    value finds a window at the true rate "significantly" below it — the more often, the
    longer the run. So the best's bound is taken at the family-wise level (Bonferroni):
    one-sided at ``1 - (1 - confidence) / candidates``. A best of unknown sample size is
    taken as measured on as many episodes as ``score``."""
    n1, n2 = (best_episodes or episodes), episodes
    if n1 < 1 or n2 < 1:
        raise ValueError(f"episodes must be >= 1, got best_episodes={best_episodes}, episodes={episodes}")
    if candidates < 1:
        raise ValueError(f"candidates must be >= 1, got {candidates}")
    two_sided = 2 * confidence - 1  # each bound one-sided at ``confidence``
    if two_sided <= 0:  # confidence 0.5: the bounds are the rates themselves
        return score < best
    best_low, _ = wilson_interval(round(best * n1), n1, confidence=1 - 2 * (1 - confidence) / candidates)
    _, score_high = wilson_interval(round(score * n2), n2, confidence=two_sided)
    return score_high < best_low


class Stability:
    """Validation scores, the NaN guard and the rollback decisions of one learner."""

    def __init__(self, config: CheckpointConfig, checkpoints: CheckpointManager | None, *,
                 min_episodes: int | None = None) -> None:
        self.config, self.checkpoints = config, checkpoints
        if min_episodes is None:  # no run config to derive it from: the section's own, or the default
            min_episodes = config.min_validation_episodes or MIN_VALIDATION_EPISODES
        self.min_episodes = min_episodes
        """Episodes a window must hold to be judged (:attr:`ExperimentConfig.min_validation_episodes`)."""
        self.nan_guard = NanGuard(config.nan_max_consecutive)
        self.recent: deque[tuple[float, int, float]] = deque(maxlen=config.validation_window)
        """(success rate, episodes, mean episode length) of the last iterations' validation
        episodes, judged together (the length, NaN where not given, breaks ties in success)."""
        self.drops = 0
        """Validations in a row significantly below the best."""
        self.judged = 0
        """Validations judged so far: the candidates the best is the highest of."""

    @classmethod
    def from_config(cls, config: CheckpointConfig, run_dir: Path | None, *,
                    min_episodes: int | None = None) -> Stability:
        """With ``run_dir``, the checkpoint slots live in ``<run_dir>/checkpoints``; without it
        (or with checkpoints disabled) nothing is kept and nothing rolls back. ``min_episodes``:
        the run's :attr:`~gyre_ma.config.ExperimentConfig.min_validation_episodes`."""
        checkpoints = None
        if config.enabled and run_dir is not None:
            checkpoints = CheckpointManager(Path(run_dir) / "checkpoints", rollback_threshold=config.rollback_threshold,
                                            lr_cut=config.lr_cut, min_lr_scale=config.min_lr_scale,
                                            large_update_kl=config.large_update_kl)
        return cls(config, checkpoints, min_episodes=min_episodes)

    @property
    def rollbacks_stopped(self) -> bool:
        """``max_rollbacks`` reached: drops are recorded, no longer rolled back."""
        return self.checkpoints is not None and len(self.checkpoints.rollbacks) >= self.config.max_rollbacks

    def score(self, success_rate: float, *, episodes: int, length: float = math.nan) -> tuple[float, int]:
        """The score validation judges and the episodes behind it: the success pooled over
        the recent window of iterations (and ``length``, their mean episode length, pooled
        as :attr:`length`)."""
        self.recent.append((success_rate, episodes, float(length)))
        total = sum(n for _, n, _ in self.recent)
        return float(sum(r * n for r, n, _ in self.recent) / max(total, 1)), total

    @property
    def length(self) -> float:
        """The mean episode length pooled over the recent window (NaN where one is unknown)."""
        if not self.recent:
            return math.nan
        total = sum(n for _, n, _ in self.recent)
        return float(sum(x * n for _, n, x in self.recent) / max(total, 1))

    def validate(self, score: float, episodes: int, state: Mapping[str, Any] | None, *,
                 step: int) -> ValidationDecision:
        """Keep the judged state as best, or roll back (see :meth:`CheckpointManager.validate`;
        ``state`` None: the judged state is the one in ``latest``). A score over fewer than
        ``min_validation_episodes`` is not judged; a drop rolls back only when it is
        significant (:func:`significant_drop`, the best taken as the highest of every
        validation judged so far) on ``validation_window + 1`` validations in a row — so on two
        windows that share no episode — and ``max_rollbacks`` is not reached.

        Why persistence: the best is the highest of many noisy windows, so it sits above the
        policy's true rate, and one window's significant drop below it happens by chance
        again and again (an unchanged policy at 60 % with 8 episodes an iteration rolled back
        3 times in 50 iterations). A collapse persists; chance does not. Why the family-wise
        bound: over 1,200 iterations an unchanged policy at 50-70 % still rolled back up to 3
        times a run against the best of hundreds of windows, each rollback halving the LR."""
        ck = self.checkpoints
        if episodes < self.min_episodes:
            return ValidationDecision("kept", float(score), ck.best_score, ck.lr_scale)
        self.judged += 1
        best = ck.best_score
        finite = math.isfinite(score)
        drop = best is not None and finite and significant_drop(
            best=best, best_episodes=ck.best_episodes, score=score, episodes=episodes,
            confidence=self.config.rollback_confidence, candidates=self.judged)
        self.drops = self.drops + 1 if drop else 0
        allow = not self.rollbacks_stopped and (
            best is None or not finite or self.drops > self.config.validation_window)
        decision = ck.validate(score, state, step=step, episodes=episodes, length=self.length, allow_rollback=allow)
        if decision.rolled_back:
            self.recent.clear()  # a new policy: its own scores from here on
            self.drops = 0
        return decision

    def guard(self, *, step: int, **values: Any) -> tuple[GuardDecision, ValidationDecision | None]:
        """Whether to skip this update (non-finite ``values``), and the rollback when the
        guard asks for one and there are checkpoints to roll back to."""
        guard = self.nan_guard.check(**values)
        if not (guard.rollback and self.checkpoints is not None):
            return guard, None
        decision = self.checkpoints.rollback(reason=guard.reason, step=step)
        self.recent.clear()
        self.drops = 0
        return guard, decision

    def state_dict(self) -> dict[str, Any]:
        return {"nan_guard": self.nan_guard.state_dict(), "recent_scores": [list(r) for r in self.recent],
                "validation_drops": self.drops, "validations_judged": self.judged}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("nan_guard") is not None:
            self.nan_guard.load_state_dict(state["nan_guard"])
        self.drops = int(state.get("validation_drops", 0))
        self.judged = int(state.get("validations_judged", 0))
        self.recent.clear()  # older checkpoints kept bare rates (an unknown count is one episode each), then
        self.recent.extend(_recent(r) for r in state.get("recent_scores", []))  # (rate, count) without a length


def _recent(stored: Any) -> tuple[float, int, float]:
    """A stored validation window entry as (rate, episodes, length): a bare rate, a
    (rate, episodes) pair or the whole triple."""
    if not isinstance(stored, (list, tuple)):
        return float(stored), 1, math.nan
    return float(stored[0]), int(stored[1]), float(stored[2]) if len(stored) > 2 else math.nan
