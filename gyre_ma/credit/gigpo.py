"""GiGPO: group-in-group advantages (Feng et al. 2025, arXiv 2505.10978).

GRPO compares whole episodes of the same task seed: every call of an episode gets its
episode's group-normalised outcome. GiGPO adds a step-level comparison inside that
group: rollouts of one task seed pass through the same states again and again (all of
them through the first one; with scripted options, through every state reached by the
same option prefix), and the decisions taken from one such *anchor state* form a step
group. Each decision's step advantage is its discounted return, normalised within its
step group; its advantage is the episode term plus ω times the step term:

    A(a_t^i) = A^E(τ_i) + ω · (R_t^i − mean_{G(s_t)} R) / (std_{G(s_t)} R + ε)

A step group of one decision, or whose returns are all equal, says nothing and gets 0,
like an episode group in :func:`~gyre_ma.credit.outcome.group_outcome_advantages`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gyre_ma.credit.gae import _check_bool, _check_shape
from gyre_ma.credit.outcome import group_outcome_advantages


def gigpo_advantages(*, episode_advantages: Tensor, step_returns: Tensor, anchors: Tensor, episode_index: Tensor,
                     mask: Tensor, step_weight: float, eps: float = 1e-8) -> Tensor:
    """Group-in-group advantages of every decision.

    Shapes: ``episode_advantages`` [E] (the episode-level group advantage, GRPO's);
    ``step_returns`` [B, T] floating (each decision's discounted return to the end of
    its episode); ``anchors`` [B, T] integer (the anchor-state group of each decision:
    equal ids are the same state of the same task seed); ``episode_index`` [B] integer;
    ``mask`` [B, T] bool (real decisions). ``step_weight`` is ω ≥ 0. Output [B, T], 0 at
    padding.
    """
    if not step_weight >= 0:
        raise ValueError(f"step_weight must be >= 0, got {step_weight!r}")
    if not isinstance(step_returns, Tensor) or step_returns.ndim != 2 or not step_returns.is_floating_point():
        raise ValueError("step_returns must be a floating [B, T] tensor, got "
                         f"{getattr(step_returns, 'shape', type(step_returns).__name__)}")
    _check_shape("anchors", anchors, step_returns.shape, ref="step_returns")
    _check_shape("mask", mask, step_returns.shape, ref="step_returns")
    _check_bool("mask", mask)
    _check_shape("episode_index", episode_index, step_returns.shape[:1], ref="the rows of step_returns")
    if anchors.is_floating_point() or episode_index.is_floating_point():
        raise ValueError("anchors and episode_index must be integer tensors")
    step = torch.zeros_like(step_returns)
    if mask.any():
        step[mask] = group_outcome_advantages(outcomes=step_returns[mask], groups=anchors[mask], eps=eps)
    episode = episode_advantages[episode_index].unsqueeze(-1).to(step_returns.dtype)
    return torch.where(mask, episode + step_weight * step, 0.0)
