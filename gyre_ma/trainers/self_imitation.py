"""Self-imitation: replay the learner's own decisions that did well, and imitate them.

Each update also raises the log-probability of replayed decisions (a ring of the newest
``train.self_imitation_capacity``; ``train.self_imitation_window`` can also bound their age:
an old winner pulls the policy back toward the policy that played it),
``train.self_imitation_rows`` deciding which:

- ``group_best`` (the default): the decisions of each task seed's best episode. The
  episodes of a group play the same task seed, so where their verified outcomes differ
  the best of them is judged against what the same policy did on the same layout, not
  against a critic's guess of it. An assignment whose worth depends on the layout (which
  agent takes which landmark) is worth a few steps of outcome, less than the spread
  between layouts; a policy gradient alone, even on exact rewards, learned none of it in
  the 1,200 task seeds a run sees (``benchmarks/assignment_bandit.py``), and the group's
  winner, kept and replayed, is what taught it (``benchmarks/results/README.md``, session
  42). The term is ``L = −coef · E[τ · log π(a | s)]`` over the winners' decisions, with
  the trust ``τ = min(1, π_now(a | s) / π_then(a | s))`` (``train.self_imitation_trust``;
  1 everywhere when off): rows are drawn ∝ τ and the loss scaled by its mean. Where a
  group's best is partly luck (Pursuit's evaders walk at random), the winners are samples
  of the policy that played them, so imitating them pulls the policy back toward what it
  was when they were played, and the replay holds tens of updates of them: there the
  policy gradient has since moved away from many of those choices, τ falls, and the pull
  with it. Where the winners are right (an assignment read from the layout) the policy
  has not moved away from them and τ stays near 1 (session 43).
- ``beat_critic``: Oh et al. 2018 (arXiv 1806.05635). A learner on a sparse outcome sees
  a rare success on a hard task seed once, in one minibatch, as one advantage among many;
  the policy gradient moves it a little and the next groups, sampled from the barely
  changed policy, mostly fail again. Every decision is kept with its Monte-Carlo return
  ``R`` (the critic's target) and each update imitates the stored decisions that beat the
  *current* critic::

      L = −coef · E_rows[ (R − V(s))⁺ · log π(a | s) ]

  A decision its critic already expects to return ``R`` weighs nothing (so on a learned task
  the term fades by itself); a success on a seed where the critic predicts failure weighs
  most, and is replayed at every update until the critic has learned that the policy now
  wins there. Rows are drawn with probability ∝ (R − V)⁺ and the loss scaled by the mean
  weight, an unbiased estimate of the expectation above.
"""

from __future__ import annotations

import torch

from gyre_ma import batch as B
from gyre_ma.credit import group_outcome_stats

KEYS = (B.FEATURES, B.STATE, B.AGENT, B.MASK, B.OPTION, B.LOG_PROB, B.RETURN, B.GROUP_BEST)
"""What a stored decision keeps (a :class:`~gyre_ma.trainers.replay.RowReplay` of these):
the policy's and the critic's inputs, the choice and the log-probability it was made with,
its return, whether its episode was its group's best (where the batch says)."""


def group_best(outcomes: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Per episode, 1.0 where it is its group's best: its outcome is the group's highest
    (ties all count) and the group's outcomes differ; else 0.0. ``outcomes`` [E] float,
    ``groups`` [E] (the task seed of each episode)."""
    stats = group_outcome_stats(outcomes=outcomes, groups=groups)
    return (stats.discriminates & (outcomes == stats.high)).float()


def group_best_sample(rows: B.Batch, *, size: int, generator: torch.Generator,
                      trust: torch.Tensor | None = None) -> tuple[B.Batch, float] | None:
    """``size`` rows drawn (with replacement) among those of a group's best episode, with
    probability ∝ ``trust`` (uniformly where None), and the mean trust over those rows (the
    loss's scale); None where there are none, or none is trusted."""
    best = rows[B.GROUP_BEST].float()
    weight = best if trust is None else best * trust.float()
    total = float(weight.sum())
    if not total > 0.0:
        return None
    return _draw(rows, weight / total, size, generator), total / float(best.sum())


def imitation_sample(rows: B.Batch, values: torch.Tensor, *, size: int,
                     generator: torch.Generator) -> tuple[B.Batch, float] | None:
    """``size`` rows drawn with probability ∝ (R − V)⁺, and the mean of (R − V)⁺ over all
    rows (the loss's scale); None where no row beat its value."""
    weight = (rows[B.RETURN].float() - values.float()).clamp(min=0.0)
    total = float(weight.sum())
    if not total > 0.0:
        return None
    return _draw(rows, weight / total, size, generator), total / len(weight)


def _draw(rows: B.Batch, probs: torch.Tensor, size: int, generator: torch.Generator) -> B.Batch:
    """``size`` rows drawn with probabilities ``probs`` (with replacement), with what an
    imitation step reads of them (the policy's inputs and the choice; not the return, the
    group flag or the old log-probability, which only chose them)."""
    picked = torch.multinomial(probs, size, replacement=True, generator=generator)
    return {k: v[picked] for k, v in rows.items() if k not in (B.RETURN, B.GROUP_BEST, B.LOG_PROB)}
