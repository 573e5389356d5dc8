"""Option-level (SMDP) returns and generalised advantage estimation.

An option call that runs τ primitive steps is one SMDP transition: its reward is the
in-option discounted sum ``sum_k γ^k r_k`` (see :class:`gyre_ma.rollout.OptionCall`) and
the backup to the next decision is discounted by γ^τ. With τ = 1 everywhere this is
ordinary GAE (Schulman et al. 2016), the CleanRL loop.

Three flags stay apart. ``terminated``: the environment ended the episode, the next
state has value 0 — no bootstrap, recursion cut. ``truncated``: a time limit stopped the
episode, the next state still has a value — bootstrap with it, recursion cut. Option
termination is what delimits the calls themselves, so it is no cut at this level.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor


class _Prepared(NamedTuple):
    """Validated inputs as [B, T] tensors of one floating dtype."""

    rewards: Tensor
    values: Tensor
    discount: Tensor
    """γ^τ_t."""
    next_values: Tensor
    """V(s_{t+1}); zero where terminated or padded."""
    ends: Tensor
    """The recursion stops after t: terminated, truncated or the last valid entry."""
    mask: Tensor
    squeeze: bool
    """The input was [T]; outputs are squeezed back."""


def _check_shape(name: str, x: object, shape: torch.Size, ref: str = "rewards") -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.shape != shape:
        raise ValueError(f"{name} has shape {tuple(x.shape)}; expected {tuple(shape)}, the shape of {ref}")


def _check_bool(name: str, x: Tensor) -> None:
    if x.dtype != torch.bool:
        raise ValueError(f"{name} must be a bool tensor, got dtype {x.dtype}; pass {name}.bool()")


def _check_unit(name: str, x: float) -> None:
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {x!r}")


def _where(bad: Tensor, squeeze: bool) -> str:
    """The first index where ``bad`` is true, as the caller's own index."""
    b, t = bad.nonzero()[0].tolist()
    return f"[{t}]" if squeeze else f"[{b}, {t}]"


def _prepare(
    *,
    rewards: Tensor,
    durations: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    gamma: float,
    values: Tensor | None = None,
    next_values: Tensor | None = None,
    bootstrap_value: Tensor | float | None = None,
    mask: Tensor | None = None,
) -> _Prepared:
    if not isinstance(rewards, Tensor):
        raise TypeError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    if rewards.ndim not in (1, 2):
        raise ValueError(f"rewards must have shape [T] or [B, T], got {tuple(rewards.shape)}")
    shape, dtype = rewards.shape, rewards.dtype
    for name, x in (("values", values), ("next_values", next_values), ("durations", durations),
                    ("terminated", terminated), ("truncated", truncated), ("mask", mask)):
        if x is not None:
            _check_shape(name, x, shape)
        if x is not None and name in ("terminated", "truncated", "mask"):
            _check_bool(name, x)
    for name, x in (("rewards", rewards), ("values", values), ("next_values", next_values)):
        if x is not None and not x.is_floating_point():
            raise ValueError(f"{name} must be a floating tensor, got dtype {x.dtype}")
        dtype = dtype if x is None else torch.promote_types(dtype, x.dtype)
    if durations.is_floating_point() or durations.dtype == torch.bool:
        raise ValueError(f"durations must be an integer tensor (primitive steps), "
                         f"got dtype {durations.dtype}")
    _check_unit("gamma", gamma)
    if next_values is not None and bootstrap_value is not None:
        raise ValueError("got both next_values and bootstrap_value; pass one "
                         "(next_values[..., -1] already is the value after the last call)")

    squeeze = rewards.ndim == 1

    def batch(x: Tensor) -> Tensor:
        return x.unsqueeze(0) if squeeze else x

    r, dur, term, trunc = batch(rewards), batch(durations), batch(terminated), batch(truncated)
    B, T = r.shape
    valid = torch.ones_like(term) if mask is None else batch(mask)
    reopened = torch.cat([torch.zeros_like(valid[:, :1]), valid[:, 1:] & ~valid[:, :-1]], dim=1)
    if reopened.any():
        raise ValueError("mask must be right-padded (True for real entries, then False only); "
                         f"a True follows a False at {_where(reopened, squeeze)}")
    bad = valid & (dur < 1)
    if bad.any():
        raise ValueError(f"durations must be >= 1, got {dur[bad][0].item()} at {_where(bad, squeeze)}")
    next_valid = torch.cat([valid[:, 1:], torch.zeros_like(valid[:, :1])], dim=1)
    term, trunc = term & valid, trunc & valid

    if next_values is None:
        if (trunc & ~term & next_valid).any():
            raise ValueError(
                f"truncated is True at {_where(trunc & ~term & next_valid, squeeze)} before the end of the "
                "sequence, so the next entry belongs to another episode; pass next_values "
                "(V of the state after each call) to bootstrap the truncated call")
        open_end = valid & ~next_valid & ~term
        if bootstrap_value is None and open_end.any():
            raise ValueError(
                f"the sequence ends at {_where(open_end, squeeze)} without terminated=True; pass "
                "bootstrap_value (V of the state after the last call) or next_values, or mark the "
                "call terminated if the environment ended the episode")
        boot = torch.as_tensor(0.0 if bootstrap_value is None else bootstrap_value, dtype=dtype,
                               device=r.device)
        lead = shape[:-1]
        if boot.shape not in (torch.Size(), lead):
            raise ValueError(f"bootstrap_value has shape {tuple(boot.shape)}; expected () or "
                             f"{tuple(lead)}, one value per sequence of rewards {tuple(shape)}")
        boot = boot.expand(B).unsqueeze(1)
        shifted = torch.zeros_like(r, dtype=dtype) if values is None else \
            torch.cat([batch(values)[:, 1:].to(dtype), boot], dim=1)
        nv = torch.where(next_valid, shifted, boot)
    else:
        nv = batch(next_values).to(dtype)
    zero = torch.zeros((), dtype=dtype, device=r.device)
    return _Prepared(
        rewards=torch.where(valid, r.to(dtype), zero),
        values=zero.expand(B, T) if values is None else torch.where(valid, batch(values).to(dtype), zero),
        discount=gamma ** dur.to(dtype),
        next_values=torch.where(term | ~valid, zero, nv),
        ends=term | trunc | ~next_valid,
        mask=valid,
        squeeze=squeeze,
    )


def _backward(x: Tensor, carry: Tensor) -> Tensor:
    """y_t = x_t + carry_t · y_{t+1} over the last axis of [B, T], with y_T = 0."""
    out = torch.zeros_like(x)
    last = torch.zeros_like(x[:, 0])
    for t in reversed(range(x.shape[1])):
        out[:, t] = last = x[:, t] + carry[:, t] * last
    return out


def _smdp_gae(
    *, cut: Tensor | None = None, lam: float, values: Tensor, **inputs: Any
) -> tuple[Tensor, Tensor]:
    """GAE whose recursion is also cut after every entry where ``cut`` (bool, validated) is true."""
    _check_unit("lam", lam)
    p = _prepare(values=values, **inputs)
    deltas = p.rewards + p.discount * p.next_values - p.values
    stop = p.ends if cut is None else p.ends | cut.reshape(p.ends.shape)
    advantages = _backward(deltas, torch.where(stop, 0.0, p.discount * lam))
    advantages = torch.where(p.mask, advantages, 0.0)
    returns = torch.where(p.mask, advantages + p.values, 0.0)
    if p.squeeze:
        return advantages.squeeze(0), returns.squeeze(0)
    return advantages, returns


def smdp_gae(
    *,
    rewards: Tensor,
    values: Tensor,
    durations: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    gamma: float,
    lam: float,
    bootstrap_value: Tensor | float | None = None,
    next_values: Tensor | None = None,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Option-level GAE: ``(advantages, returns)`` with ``returns = advantages + values``.

    δ_t = r_t + γ^τ_t · (1 − terminated_t) · V_{t+1} − V_t
    A_t = δ_t + γ^τ_t · λ · (1 − terminated_t) · (1 − truncated_t) · A_{t+1}

    Shapes: ``rewards``, ``values``, ``durations`` (int, ≥ 1), ``terminated``,
    ``truncated`` (bool) and the optional ``next_values`` and ``mask`` (bool, True for
    real entries, right-padded) are all [T] — one agent's calls in decision order — or
    [B, T]. ``bootstrap_value`` is [] or [B]. Outputs have the shape of ``rewards``, the
    promoted floating dtype of the inputs, and are 0 at padding.

    V_{t+1} is ``next_values[t]`` when given (needed when a truncation is followed by
    another episode in the same row), else ``values[t+1]``, and ``bootstrap_value``
    after the last real entry. A row that ends neither terminated nor truncated is
    bootstrapped too, so it needs one of the two; terminated wins over truncated.
    """
    return _smdp_gae(rewards=rewards, values=values, durations=durations, terminated=terminated,
                     truncated=truncated, gamma=gamma, lam=lam, bootstrap_value=bootstrap_value,
                     next_values=next_values, mask=mask)


def smdp_returns(
    *,
    rewards: Tensor,
    durations: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    gamma: float,
    bootstrap_value: Tensor | float | None = None,
    next_values: Tensor | None = None,
    mask: Tensor | None = None,
) -> Tensor:
    """Discounted SMDP returns: G_t = r_t + γ^τ_t · (1 − terminated_t) · G_{t+1}.

    At a truncation, and after the last real entry, G_{t+1} is replaced by the value of
    the next state (``next_values[t]`` or ``bootstrap_value``). Shapes as in
    :func:`smdp_gae`; equals ``smdp_gae(lam=1).returns`` for any values.
    """
    p = _prepare(rewards=rewards, durations=durations, terminated=terminated, truncated=truncated,
                 gamma=gamma, next_values=next_values, bootstrap_value=bootstrap_value, mask=mask)
    x = p.rewards + torch.where(p.ends, p.discount * p.next_values, 0.0)
    returns = torch.where(p.mask, _backward(x, torch.where(p.ends, 0.0, p.discount)), 0.0)
    return returns.squeeze(0) if p.squeeze else returns
