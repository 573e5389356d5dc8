"""Milestone-anchored segmented GAE.

A long episode is cut into segments that end at the option calls which verified a
milestone. Credit is estimated locally inside each segment: the GAE recursion stops at
a segment's last call, whose TD error still bootstraps with the value of the state
after the milestone. A critic error far downstream then cannot leak into the credit of
calls that already earned their milestone. A milestone bonus, if any, is already in
the rewards.
"""

from __future__ import annotations

from torch import Tensor

from gyre_ma.credit.gae import _check_bool, _check_shape, _smdp_gae


def segmented_gae(
    *,
    rewards: Tensor,
    values: Tensor,
    durations: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    milestones: Tensor,
    gamma: float,
    lam: float,
    bootstrap_value: Tensor | float | None = None,
    next_values: Tensor | None = None,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Option-level GAE local to milestone segments: ``(advantages, returns)``.

    δ_t is that of :func:`~gyre_ma.credit.gae.smdp_gae`; the recursion is
    A_t = δ_t + γ^τ_t · λ · (1 − done_t) · (1 − milestone_t) · A_{t+1}.

    Shapes: as :func:`~gyre_ma.credit.gae.smdp_gae`, plus ``milestones`` — bool, the
    shape of ``rewards`` ([T] or [B, T]); ``milestones[t]`` means call t verified a
    milestone (``bool(OptionCall.milestones)``). With no milestone this is plain GAE.
    """
    if not isinstance(rewards, Tensor):
        raise TypeError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    _check_shape("milestones", milestones, rewards.shape)
    _check_bool("milestones", milestones)
    return _smdp_gae(rewards=rewards, values=values, durations=durations, terminated=terminated,
                     truncated=truncated, gamma=gamma, lam=lam, bootstrap_value=bootstrap_value,
                     next_values=next_values, mask=mask, cut=milestones)
