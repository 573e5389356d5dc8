"""Milestone-anchored outcome credit: the verified outcome, credited to the calls that moved it.

The group-normalised outcome advantage (:mod:`gyre_ma.credit.outcome`) gives every call of
an episode the same number, so on a long task the one decision that sank the episode
shares its blame with hundreds that did not matter. Anchored credit spreads the same
outcome over the episode's verified milestones instead:

- The value of anchor m is V(m) = E[o | m verified], the mean outcome of the batch's
  episodes that verified m, shrunk toward the batch mean ō with ``prior`` pseudo-episodes
  (a milestone seen once does not get an extreme value). The start of an episode is
  worth ō.
- An episode's milestones, in the order it verified them, form a path ō → V(m₁) → V(m₂)
  → …; each step of the path, V(m_k) − V(m_{k−1}), is credited to the call that verified
  m_k, and the residual o − V(m_last) to the calls running when the episode ended.
- So an episode's credits sum to o − ō, its outcome advantage, but they sit on the calls
  that changed the expected outcome: verifying a trap milestone that no successful
  episode verified is worth V(trap) − V(before) < 0 at once, however far the failure is.
- A success's outcome carries a time cost, o = 1 − c with c = κ · length / horizon
  (:func:`~gyre_ma.credit.outcome.episode_outcomes`). Each call pays its own share of it:
  the anchors are taken with every success at the successes' mean cost c̄, and a success's
  cost beyond that mean, c − c̄, is charged to its calls by duration
  (:func:`spread_over_calls`). A wasteful loop pays for its own steps; the call that
  finished the task is not charged for the time the loop lost (with the cost in the
  anchors, it all fell on the residual, on whatever call ran last).

Everything is divided by the batch's outcome spread (population std), like the group
outcome advantage, and is 0 when the outcomes do not discriminate. The anchors are pooled
over the whole batch, not per task seed: a milestone's value is a property of the task
graph under the current policy, and a group of a few rollouts rarely verifies the same
milestones often enough to estimate it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gyre_ma.credit.outcome import check_outcomes


def _check_inputs(outcomes: Tensor, verified_at: Tensor) -> None:
    check_outcomes(outcomes)
    if not isinstance(verified_at, Tensor):
        raise TypeError(f"verified_at must be a torch.Tensor, got {type(verified_at).__name__}")
    if verified_at.ndim != 2 or verified_at.shape[0] != outcomes.shape[0]:
        raise ValueError(f"verified_at must have shape [E, M] with E = {outcomes.shape[0]} episodes, "
                         f"got {tuple(verified_at.shape)}")
    if verified_at.is_floating_point() or verified_at.dtype == torch.bool:
        raise ValueError(f"verified_at must be an integer tensor (steps, -1 for never), got dtype {verified_at.dtype}")
    if verified_at.numel() and verified_at.min() < -1:
        e, m = (verified_at < -1).nonzero()[0].tolist()
        raise ValueError(f"verified_at[{e}, {m}] is {verified_at[e, m].item()}; expected the step the "
                         "milestone was verified at (>= 0) or -1 for never")


def anchor_values(*, outcomes: Tensor, verified_at: Tensor, prior: float = 1.0) -> tuple[Tensor, Tensor]:
    """``(ō, V)``: the batch's mean outcome [] and each milestone's anchor value [M].

    V(m) = (Σ_{e verified m} o_e + prior · ō) / (n_m + prior), so an anchor no episode
    verified is worth ō. Shapes: ``outcomes`` [E] floating; ``verified_at`` [E, M] integer,
    the step at which episode e verified milestone m, −1 if it never did.
    """
    _check_inputs(outcomes, verified_at)
    if not prior >= 0:
        raise ValueError(f"prior must be >= 0 (pseudo-episodes at the mean outcome), got {prior!r}")
    if outcomes.numel() == 0:
        raise ValueError("outcomes is empty; anchor values need at least one episode")
    verified = (verified_at >= 0).to(outcomes.dtype)
    mean = outcomes.mean()
    counts = verified.sum(0)
    values = (outcomes @ verified + prior * mean) / (counts + prior).clamp(min=torch.finfo(outcomes.dtype).tiny)
    return mean, torch.where(counts > 0, values, mean)


def anchored_outcome_credit(
    *, outcomes: Tensor, verified_at: Tensor, prior: float, eps: float = 1e-8, success: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """``(steps, residual, time)``: each milestone's step of credit per episode [E, M], each
    episode's residual [E] and its time credit [E], all in units of the batch's outcome std σ.

    Without ``success``, the anchors are the outcomes' own: ``steps[e, m]`` = (V(m) − V(the
    anchor e verified just before m)) / (σ + eps), 0 where e did not verify m (the anchor
    before the first is the start, worth ō; milestones verified at the same step are taken
    in index order); ``residual[e]`` = (o_e − V(e's last anchor)) / (σ + eps); ``time`` is 0.

    With ``success`` [E] bool, each success's time cost c_e = 1 − o_e is priced apart: the
    anchors are taken on õ_e = o_e + (c_e − c̄) (every success at the successes' mean cost
    c̄; failures unchanged), and ``time[e]`` = −(c_e − c̄) / (σ + eps) for a success, 0 for a
    failure, to be charged to its calls by duration. Either way row e of ``steps`` plus
    ``residual[e]`` plus ``time[e]`` sums to (o_e − ō) / (σ + eps). All zeros when the
    outcomes are all equal. Shapes as :func:`anchor_values`.
    """
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps!r}")
    _check_inputs(outcomes, verified_at)
    E, M = verified_at.shape
    steps = outcomes.new_zeros(E, M)
    residual, time = outcomes.new_zeros(E), outcomes.new_zeros(E)
    anchored = outcomes
    if success is not None:
        _check_success(success, outcomes)
        if success.any():
            costs = torch.where(success, 1.0 - outcomes, 0.0)
            extra = torch.where(success, costs - costs[success].mean(), 0.0)
            anchored, time = outcomes + extra, -extra
    mean, values = anchor_values(outcomes=anchored, verified_at=verified_at, prior=prior)
    if E == 0 or not outcomes.max() > outcomes.min():
        return steps, residual, outcomes.new_zeros(E)
    scale = outcomes.std(unbiased=False) + eps
    verified = verified_at >= 0
    # order each episode's milestones by (step, index); never-verified ones go last
    big = verified_at.max() + 1
    key = torch.where(verified, verified_at, big) * M + torch.arange(M)
    order = key.argsort(dim=1)
    path = values[order]                                              # V along each episode's order
    before = torch.cat([mean.expand(E, 1), path[:, :-1]], dim=1)
    ordered_steps = torch.where(verified.gather(1, order), path - before, 0.0)
    steps.scatter_(1, order, ordered_steps)
    count = verified.sum(1)
    last = torch.where(count > 0, path.gather(1, (count - 1).clamp(min=0).unsqueeze(1)).squeeze(1), mean)
    residual = anchored - last
    return steps / scale, residual / scale, time / scale


def _check_success(success: Tensor, outcomes: Tensor) -> None:
    if not isinstance(success, Tensor) or success.dtype != torch.bool or success.shape != outcomes.shape:
        got = f"{tuple(success.shape)} {success.dtype}" if isinstance(success, Tensor) else type(success).__name__
        raise ValueError(f"success must be a bool tensor of shape {tuple(outcomes.shape)}, one per episode like "
                         f"outcomes; got {got}")
    if bool((outcomes[success] > 1.0).any()) or bool((outcomes[~success] != 0).any()):
        raise ValueError("with success, outcomes must be 0 for a failure and at most 1 for a success "
                         "(1 − its time cost, as episode_outcomes gives)")


def spread_over_calls(
    *, steps: Tensor, residual: Tensor, call_milestones: Tensor, at_end: Tensor, episode_index: Tensor,
    time: Tensor | None = None, durations: Tensor | None = None,
) -> Tensor:
    """Per-call anchored credit [R, T]: the steps of the milestones each call verified, plus
    its episode's residual on the calls running at the end, plus its episode's time credit
    shared over the row's calls by duration (a call of d of the row's D steps gets d / D).

    Shapes: ``steps`` [E, M], ``residual`` and ``time`` [E] from
    :func:`anchored_outcome_credit`; ``call_milestones`` [R, T, M] bool (call t of row r
    verified milestone m); ``at_end`` [R, T] bool; ``episode_index`` [R] integer, the episode
    of each row; ``durations`` [R, T] (primitive steps, 0 at padding), needed with ``time``.
    """
    if call_milestones.ndim != 3 or call_milestones.shape[-1] != steps.shape[-1]:
        raise ValueError(f"call_milestones must have shape [R, T, M] with M = {steps.shape[-1]} milestones, "
                         f"got {tuple(call_milestones.shape)}")
    if call_milestones.dtype != torch.bool or at_end.dtype != torch.bool:
        raise ValueError("call_milestones and at_end must be bool tensors, got dtypes "
                         f"{call_milestones.dtype} and {at_end.dtype}")
    if at_end.shape != call_milestones.shape[:2]:
        raise ValueError(f"at_end has shape {tuple(at_end.shape)}; expected {tuple(call_milestones.shape[:2])}, "
                         "the [R, T] of call_milestones")
    if episode_index.shape != call_milestones.shape[:1]:
        raise ValueError(f"episode_index has shape {tuple(episode_index.shape)}; expected "
                         f"({call_milestones.shape[0]},), one episode per row")
    per_row = steps[episode_index]                                    # [R, M]
    credit = (call_milestones.to(steps.dtype) * per_row.unsqueeze(1)).sum(-1)
    credit = credit + at_end.to(steps.dtype) * residual[episode_index].unsqueeze(1)
    if time is None:
        return credit
    if durations is None or durations.shape != at_end.shape:
        got = None if durations is None else tuple(durations.shape)
        raise ValueError(f"time credit needs durations of shape {tuple(at_end.shape)} (steps per call); got {got}")
    d = durations.to(steps.dtype).clamp(min=0)
    share = d / d.sum(-1, keepdim=True).clamp(min=1.0)
    return credit + share * time[episode_index].unsqueeze(1)
