"""RewardBreakdown: where each option call's reward came from.

Every reward the learner sees is the ``total`` of one breakdown, and the breakdown keeps
its parts after arbitration, so ``total == outcome + milestone + rules + env + prm + penalty``
holds exactly (``env``, the environment's own reward, is a part too: off unless
``rewards.env_reward`` weights it) and each part names its sources (``sources``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

COMPONENTS: tuple[str, ...] = ("outcome", "milestone", "rules", "env", "prm", "penalty")
"""The additive parts of a breakdown, in arbitration order (highest precedence first)."""


@dataclass(frozen=True)
class RewardBreakdown:
    """One option call's reward, by source, after arbitration (see :mod:`.arbiter`)."""

    outcome: float = 0.0
    """Verified goal reward (paid on the calls running when a successful episode ended)."""
    milestone: float = 0.0
    """Task-graph reward weights of milestones first verified during this call."""
    rules: float = 0.0
    """Weights of process rules that passed and paid on this call."""
    env: float = 0.0
    """The environment's own reward over the call's steps × ``rewards.env_reward`` (its
    health or score signal; unverified, so it ranks with milestones and rules)."""
    prm: float = 0.0
    """Process-reward-model score, centred and capped."""
    penalty: float = 0.0
    """Guard penalty (≤ 0) charged to this call for a guard violation."""
    guard: bool = False
    """The episode violated a guard rule: its positive reward was vetoed."""
    removed: float = 0.0
    """Positive reward taken away by the guard veto or the failed-episode cap (≥ 0)."""
    total: float = 0.0
    """The option reward the learner uses: the sum of the six parts above."""
    sources: tuple[str, ...] = ()
    """What paid or cut: ``milestone:<name>``, ``rule:<name>``, ``guard:<name>``,
    ``outcome``, ``env``, ``prm``, ``veto``, ``cap``."""

    def __post_init__(self) -> None:
        parts = sum(getattr(self, k) for k in COMPONENTS)
        if not math.isclose(self.total, parts, rel_tol=1e-9, abs_tol=1e-9):
            raise ValueError(
                f"RewardBreakdown: total ({self.total}) must equal the sum of its parts "
                f"{dict((k, getattr(self, k)) for k in COMPONENTS)} = {parts}"
            )

    @classmethod
    def of(cls, *, outcome: float = 0.0, milestone: float = 0.0, rules: float = 0.0, env: float = 0.0,
           prm: float = 0.0, penalty: float = 0.0, guard: bool = False, removed: float = 0.0,
           sources: Iterable[str] = ()) -> RewardBreakdown:
        """Build with ``total`` computed from the parts."""
        total = outcome + milestone + rules + env + prm + penalty
        return cls(outcome=float(outcome), milestone=float(milestone), rules=float(rules), env=float(env),
                   prm=float(prm), penalty=float(penalty), guard=bool(guard), removed=float(removed),
                   total=float(total), sources=tuple(sources))

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def summarize(breakdowns: Sequence[Sequence[RewardBreakdown]],
              success: Sequence[bool] | None = None) -> dict[str, float]:
    """Per-episode means of each part, the total, and the vetoed fraction of episodes.

    ``breakdowns`` is one list per episode (aligned with its calls). Keys are
    ``reward/<part>``, ``reward/total``, ``reward/removed`` and ``reward/vetoed_episodes``.
    With ``success`` (one verified-completion flag per episode) also
    ``reward/total_failed``: the mean total of the episodes that did not complete, NaN when
    every episode completed (what the reward-hacking alarm watches: a hack pays failures),
    and ``reward/vetoed_successes``: the share of episodes that verified every goal and that
    a guard vetoed (the learner counts them failures: a shortcut the guards caught).
    """
    if success is not None and len(success) != len(breakdowns):
        raise ValueError(f"summarize: {len(success)} success flags for {len(breakdowns)} episodes")
    n = max(len(breakdowns), 1)
    out = {f"reward/{k}": 0.0 for k in (*COMPONENTS, "total", "removed")}
    vetoed = 0
    for episode in breakdowns:
        for b in episode:
            for k in (*COMPONENTS, "total", "removed"):
                out[f"reward/{k}"] += getattr(b, k)
        vetoed += any(b.guard for b in episode)
    out = {k: v / n for k, v in out.items()}
    out["reward/vetoed_episodes"] = vetoed / n
    if success is not None:
        failed = [sum(b.total for b in episode) for episode, ok in zip(breakdowns, success, strict=True) if not ok]
        out["reward/total_failed"] = sum(failed) / len(failed) if failed else math.nan
        out["reward/vetoed_successes"] = sum(ok and any(b.guard for b in episode)
                                             for episode, ok in zip(breakdowns, success, strict=True)) / n
    return out
