"""Global outcome advantage, normalised within groups of episodes (GRPO style).

Episodes of the same task seed form a group; an episode's advantage is how much better
its outcome was than its group's, in units of the group's spread. The outcome is verified
success (0/1); with a length weight κ > 0 a success is worth less the longer it took
(:func:`episode_outcomes`), so a group in which every episode succeeded still prefers its
faster ones. A group whose outcomes are all equal — every rollout failed, or succeeded in
the same time, or a lone rollout — says nothing about which behaviour was better, so its
advantage is 0.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


def episode_outcomes(*, success: Tensor, length: Tensor, horizon: Tensor, length_weight: float = 0.0) -> Tensor:
    """o_e = success_e · (1 − κ · length_e / horizon_e), with κ = ``length_weight``.

    A failure is 0 however long it lasted, and a success lies in [1 − κ, 1], so any
    verified success outranks any failure when κ < 1. κ = 0 is success alone.
    Shapes: ``success`` [E] bool, ``length`` and ``horizon`` [E] integer (steps; each
    horizon ≥ 1 and ≥ its length) → [E] float32.
    """
    if not 0.0 <= length_weight <= 1.0:
        raise ValueError(f"length_weight must be in [0, 1], got {length_weight!r}")
    for name, x in (("success", success), ("length", length), ("horizon", horizon)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.ndim != 1 or x.shape != success.shape:
            raise ValueError(f"{name} must have shape [E], one per episode, like success "
                             f"{tuple(success.shape)}; got {tuple(x.shape)}")
    if success.dtype != torch.bool:
        raise ValueError(f"success must be a bool tensor, got dtype {success.dtype}")
    outcomes = success.float()
    if length_weight == 0.0:
        return outcomes
    bad = (horizon < 1) | (length < 0) | (length > horizon)
    if bad.any():
        i = bad.nonzero()[0].item()
        raise ValueError(f"episode {i}: length {length[i].item()} and horizon {horizon[i].item()}; expected "
                         "0 <= length <= horizon and horizon >= 1 (the step cap the episode ran under)")
    return outcomes * (1.0 - length_weight * length.float() / horizon.float())


class GroupStats(NamedTuple):
    """Per-episode statistics of the episode's group, each [E]."""

    mean: Tensor
    std: Tensor
    """Population standard deviation (divides by the group size)."""
    size: Tensor
    discriminates: Tensor
    """The group's outcomes are not all equal (exact; a group of one never discriminates)."""
    high: Tensor
    """The group's highest outcome."""


def check_outcomes(outcomes: Tensor) -> None:
    """Episode outcomes must be a finite floating [E] tensor; else one error naming what is wrong."""
    if not isinstance(outcomes, Tensor):
        raise TypeError(f"outcomes must be a torch.Tensor, got {type(outcomes).__name__}")
    if outcomes.ndim != 1:
        raise ValueError(f"outcomes must have shape [E], one per episode, got {tuple(outcomes.shape)}")
    if not outcomes.is_floating_point():
        raise ValueError(f"outcomes must be a floating tensor, got dtype {outcomes.dtype}")
    if not torch.isfinite(outcomes).all():
        i = (~torch.isfinite(outcomes)).nonzero()[0].item()
        raise ValueError(f"outcomes must be finite, got {outcomes[i].item()} at [{i}]")


def group_outcome_stats(*, outcomes: Tensor, groups: Tensor) -> GroupStats:
    """Mean, std, size, discrimination and highest outcome of each episode's group.

    Shapes: ``outcomes`` [E] floating, finite; ``groups`` [E] integer (the task seed).
    """
    check_outcomes(outcomes)
    if not isinstance(groups, Tensor):
        raise TypeError(f"groups must be a torch.Tensor, got {type(groups).__name__}")
    if groups.shape != outcomes.shape:
        raise ValueError(f"groups has shape {tuple(groups.shape)}; expected {tuple(outcomes.shape)}, "
                         "the shape of outcomes")
    if groups.is_floating_point() or groups.is_complex():
        raise ValueError(f"groups must be an integer tensor (task seeds), got dtype {groups.dtype}")
    _, inverse, counts = torch.unique(groups, return_inverse=True, return_counts=True)
    zeros = outcomes.new_zeros(counts.shape)
    mean = zeros.index_add(0, inverse, outcomes) / counts
    centered = outcomes - mean[inverse]
    std = (zeros.index_add(0, inverse, centered * centered) / counts).sqrt()
    high = zeros.scatter_reduce(0, inverse, outcomes, "amax", include_self=False)
    low = zeros.scatter_reduce(0, inverse, outcomes, "amin", include_self=False)
    return GroupStats(mean=mean[inverse], std=std[inverse], size=counts[inverse],
                      discriminates=(high > low)[inverse], high=high[inverse])


def group_outcome_advantages(*, outcomes: Tensor, groups: Tensor, eps: float = 1e-8) -> Tensor:
    """A_i = (o_i − mean_g) / (std_g + eps), and 0 where the group does not discriminate.

    Shapes: ``outcomes`` [E] floating, ``groups`` [E] integer → [E], dtype of ``outcomes``.
    The std is the population one, so a group {0, 1} gives exactly ±1 (up to eps).
    """
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps!r}")
    stats = group_outcome_stats(outcomes=outcomes, groups=groups)
    advantages = (outcomes - stats.mean) / (stats.std + eps)
    return torch.where(stats.discriminates, advantages, 0.0)
