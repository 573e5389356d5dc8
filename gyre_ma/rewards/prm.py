"""Process reward model: a small learned scorer of option calls, trained online on labels
taken from verified outcomes only.

For a call (the manager's features at the decision [N, F] and the chosen option [N]) it
predicts two probabilities: ``progress`` — a milestone is first verified during the call
(its segment reaches a milestone) — and ``success`` — the episode verifies its goal. Its
score is their mean. The arbiter pays it last and least (see :mod:`.arbiter`): centred
on the batch so it only ranks calls and never adds net reward, and weighted by at most
``prm_weight_cap``, cut further by the drift monitor (:mod:`.drift`). Its trainer,
:class:`~gyre_ma.trainers.prm.PRMModule`, lives with the other Lightning modules, so that a run
without a PRM (the default) can score and play without importing Lightning.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gyre_ma.rewards.arbiter import PRMConfig  # noqa: F401 (re-export: defined there so a config loads without torch)
from gyre_ma.rewards.milestones import first_verified
from gyre_ma.rollout import Trajectory


class ProcessRewardModel(nn.Module):
    """(features [N, F], option [N] long) → logits [N, 2] for (progress, success)."""

    HEADS = ("progress", "success")

    def __init__(self, features: int, n_options: int, *, hidden: int = 64) -> None:
        super().__init__()
        if features < 1 or n_options < 1:
            raise ValueError(f"ProcessRewardModel: features ({features}) and n_options ({n_options}) must be >= 1")
        self.n_options = n_options
        self.net = nn.Sequential(
            nn.Linear(features + n_options, hidden), nn.LayerNorm(hidden), nn.Tanh(),
            nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, len(self.HEADS)),
        )

    def forward(self, features: Tensor, option: Tensor) -> Tensor:
        if features.ndim != 2 or option.shape != features.shape[:1]:
            raise ValueError(
                f"ProcessRewardModel: expected features [N, F] and option [N], got "
                f"{tuple(features.shape)} and {tuple(option.shape)}"
            )
        onehot = F.one_hot(option.long(), self.n_options).to(features.dtype)
        return self.net(torch.cat([features, onehot], dim=-1))

    @torch.no_grad()
    def score(self, features: Tensor, option: Tensor) -> Tensor:
        """Mean of the two predicted probabilities, [N] in (0, 1)."""
        return self.probabilities(features, option).mean(-1)

    @torch.no_grad()
    def probabilities(self, features: Tensor, option: Tensor) -> Tensor:
        """[N, 2] predicted (progress, success) probabilities, float32 on the CPU whatever the
        model's device and precision (the learner's Fabric may have moved it)."""
        weight = next(self.parameters())
        return self(features.to(weight.device, weight.dtype), option.to(weight.device)).sigmoid().float().cpu()


def prm_labels(trajectory: Trajectory) -> tuple[Tensor, Tensor]:
    """(progress [n], success [n]) float labels for the trajectory's calls, from verified
    milestones and the verified outcome only."""
    progress = torch.tensor([float(bool(m)) for m in first_verified(trajectory)], dtype=torch.float32)
    success = torch.full((len(trajectory.calls),), float(trajectory.success), dtype=torch.float32)
    return progress, success


def prm_rewards(scores: Tensor, *, weight: float) -> Tensor:
    """``weight · (score − mean score)`` over the batch [N]: the PRM ranks calls but adds no
    net reward, so making more calls cannot farm it. |reward| ≤ weight."""
    if scores.ndim != 1:
        raise ValueError(f"prm_rewards: scores must have shape [N], got {tuple(scores.shape)}")
    if scores.numel() == 0 or weight == 0.0:
        return torch.zeros_like(scores)
    return weight * (scores - scores.mean())
