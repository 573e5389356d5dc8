"""Self-imitation: replay the decisions whose episodes did better than the critic expected.

Oh et al. 2018 (arXiv 1806.05635). A learner on a sparse outcome sees a rare success on a
hard task seed once, in one minibatch, as one advantage among many; the policy gradient
moves it a little and the next groups, sampled from the barely changed policy, mostly fail
again. Self-imitation keeps every decision with its Monte-Carlo return ``R`` (the critic's
target) and, at each update, imitates the stored decisions that beat the *current* critic:

    L = −coef · E_rows[ (R − V(s))⁺ · log π(a | s) ]

A decision its critic already expects to return ``R`` weighs nothing (so on a learned task
the term fades by itself); a success on a seed where the critic predicts failure weighs
most, and is replayed at every update until the critic has
learned that the policy now wins there. Rows are drawn with probability ∝ (R − V)⁺ and the
loss scaled by the mean weight, an unbiased estimate of the expectation above.
"""

from __future__ import annotations

import torch

from gyre_ma import batch as B

KEYS = (B.FEATURES, B.STATE, B.AGENT, B.MASK, B.OPTION, B.RETURN)
"""What a stored decision keeps (a :class:`~gyre_ma.trainers.replay.RowReplay` of these):
the policy's and the critic's inputs, the choice, its return."""


def imitation_sample(rows: B.Batch, values: torch.Tensor, *, size: int,
                     generator: torch.Generator) -> tuple[B.Batch, float] | None:
    """``size`` rows drawn with probability ∝ (R − V)⁺, and the mean of (R − V)⁺ over all
    rows (the loss's scale); None where no row beat its value."""
    weight = (rows[B.RETURN].float() - values.float()).clamp(min=0.0)
    total = float(weight.sum())
    if not total > 0.0:
        return None
    picked = torch.multinomial(weight / total, size, replacement=True, generator=generator)
    return {k: v[picked] for k, v in rows.items() if k != B.RETURN}, total / len(weight)
