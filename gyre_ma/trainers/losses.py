"""Losses as small typed functions; trainers combine them."""

from __future__ import annotations

import torch
from torch import Tensor


def clipped_surrogate(*, log_prob: Tensor, old_log_prob: Tensor, advantage: Tensor, clip: float,
                      weight: Tensor | None = None) -> Tensor:
    """PPO's clipped objective, negated for minimisation. All inputs [N]; returns a scalar.
    ``weight`` [N] scales each row's term (decoupled PPO's behaviour correction)."""
    ratio = (log_prob - old_log_prob).exp()
    unclipped = ratio * advantage
    clipped = ratio.clamp(1.0 - clip, 1.0 + clip) * advantage
    objective = torch.minimum(unclipped, clipped)
    return -(objective if weight is None else weight * objective).mean()


def approx_kl(*, log_prob: Tensor, old_log_prob: Tensor) -> Tensor:
    """KL(old ‖ new) by the non-negative k3 estimator: (r − 1) − log r, r = π_new/π_old."""
    log_ratio = log_prob - old_log_prob
    return (log_ratio.exp() - 1.0 - log_ratio).mean()


def value_loss(*, value: Tensor, target: Tensor) -> Tensor:
    """Half mean squared error of values [N] against targets [N]."""
    return 0.5 * (value - target).pow(2).mean()
