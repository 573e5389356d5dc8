"""Identities of the credit-assignment functions, checked with Hypothesis."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gyre_ma.credit import (
    adaptive_blend_weights,
    blend_advantages,
    episode_outcomes,
    group_outcome_advantages,
    group_outcome_stats,
    option_advantages,
    segmented_gae,
    smdp_gae,
    smdp_returns,
)

SETTINGS = settings(max_examples=100, deadline=None)
FLOATS = st.floats(-100.0, 100.0, allow_nan=False, allow_subnormal=False)
UNIT = st.floats(0.0, 1.0, allow_nan=False, allow_subnormal=False)


@dataclass(frozen=True)
class Seq:
    """One agent's option calls, possibly spanning several episodes, as Python lists."""

    rewards: list[float]
    values: list[float]
    durations: list[int]
    terminated: list[bool]
    truncated: list[bool]
    milestones: list[bool]
    next_values: list[float]
    """V(s_{t+1}): values[t+1] inside an episode, anything after a truncation, the bootstrap at the end."""
    gamma: float
    lam: float

    def tensors(self, dtype: torch.dtype = torch.float64, next_values: bool = True) -> dict:
        out = dict(
            rewards=torch.tensor(self.rewards, dtype=dtype),
            values=torch.tensor(self.values, dtype=dtype),
            durations=torch.tensor(self.durations),
            terminated=torch.tensor(self.terminated, dtype=torch.bool),
            truncated=torch.tensor(self.truncated, dtype=torch.bool),
            gamma=self.gamma,
            lam=self.lam,
        )
        if next_values:
            out["next_values"] = torch.tensor(self.next_values, dtype=dtype)
        else:
            out["bootstrap_value"] = self.next_values[-1]
        return out


@st.composite
def seqs(draw, *, min_len: int = 1, max_len: int = 12, unit_durations: bool = False,
         mid_truncation: bool = True) -> Seq:
    T = draw(st.integers(min_len, max_len))
    values = draw(st.lists(FLOATS, min_size=T, max_size=T))
    ends = draw(st.lists(st.sampled_from(["none", "none", "term", "trunc"]), min_size=T, max_size=T))
    if not mid_truncation:
        ends = [e if e != "trunc" or t == T - 1 else "none" for t, e in enumerate(ends)]
    after = draw(st.lists(FLOATS, min_size=T, max_size=T))
    next_values = [values[t + 1] if t + 1 < T and ends[t] != "trunc" else after[t] for t in range(T)]
    return Seq(
        rewards=draw(st.lists(FLOATS, min_size=T, max_size=T)),
        values=values,
        durations=[1] * T if unit_durations else draw(st.lists(st.integers(1, 20), min_size=T, max_size=T)),
        terminated=[e == "term" for e in ends],
        truncated=[e == "trunc" for e in ends],
        milestones=draw(st.lists(st.booleans(), min_size=T, max_size=T)),
        next_values=next_values,
        gamma=draw(UNIT),
        lam=draw(UNIT),
    )


def cleanrl_gae(s: Seq) -> list[float]:
    """The CleanRL loop, with terminated and truncated kept apart and γ^τ per call."""
    advantages = [0.0] * len(s.rewards)
    lastgaelam = 0.0
    for t in reversed(range(len(s.rewards))):
        discount = s.gamma ** s.durations[t]
        nextnonterminal = 1.0 - s.terminated[t]
        nextcontinues = 1.0 - (s.terminated[t] or s.truncated[t] or t == len(s.rewards) - 1)
        delta = s.rewards[t] + discount * s.next_values[t] * nextnonterminal - s.values[t]
        advantages[t] = lastgaelam = delta + discount * s.lam * nextcontinues * lastgaelam
    return advantages


def close(a: torch.Tensor, b, **kw) -> bool:
    return torch.allclose(a, torch.as_tensor(b, dtype=a.dtype), rtol=1e-9, atol=1e-6, **kw)


@SETTINGS
@given(seqs(unit_durations=True))
def test_unit_durations_reduce_to_cleanrl_gae(s: Seq) -> None:
    advantages, returns = smdp_gae(**s.tensors())
    assert close(advantages, cleanrl_gae(s))
    assert close(returns, [a + v for a, v in zip(cleanrl_gae(s), s.values)])


@SETTINGS
@given(seqs())
def test_smdp_gae_matches_reference_loop(s: Seq) -> None:
    assert close(smdp_gae(**s.tensors())[0], cleanrl_gae(s))


@SETTINGS
@given(seqs(mid_truncation=False))
def test_bootstrap_value_equals_next_values_path(s: Seq) -> None:
    a1, r1 = smdp_gae(**s.tensors(next_values=True))
    a2, r2 = smdp_gae(**s.tensors(next_values=False))
    assert close(a1, a2) and close(r1, r2)


@SETTINGS
@given(seqs())
def test_lambda_zero_is_one_step_td_error(s: Seq) -> None:
    x = s.tensors()
    x["lam"] = 0.0
    discount = s.gamma ** x["durations"].double()
    td = x["rewards"] + discount * x["next_values"] * (~x["terminated"]) - x["values"]
    assert close(smdp_gae(**x)[0], td)


@SETTINGS
@given(seqs(mid_truncation=False))
def test_lambda_one_gamma_one_without_bootstrap_is_return_minus_value(s: Seq) -> None:
    s = replace(s, gamma=1.0, lam=1.0, terminated=s.terminated[:-1] + [True],
                truncated=[False] * len(s.rewards))
    returns, acc = [0.0] * len(s.rewards), 0.0
    for t in reversed(range(len(s.rewards))):
        returns[t] = acc = s.rewards[t] + (0.0 if s.terminated[t] else acc)
    advantages, _ = smdp_gae(**s.tensors(next_values=False))
    assert close(advantages, [g - v for g, v in zip(returns, s.values)])


@SETTINGS
@given(seqs())
def test_lambda_one_returns_are_smdp_returns(s: Seq) -> None:
    x = s.tensors()
    x["lam"] = 1.0
    _, returns = smdp_gae(**x)
    del x["lam"], x["values"]
    assert torch.allclose(returns, smdp_returns(**x), rtol=1e-8, atol=1e-5)


@SETTINGS
@given(seqs(min_len=2), st.data())
def test_terminal_cuts_credit(s: Seq, data: st.DataObject) -> None:
    k = data.draw(st.integers(0, len(s.rewards) - 2))
    s = replace(s, terminated=s.terminated[:k] + [True] + s.terminated[k + 1:],
                truncated=s.truncated[:k] + [False] + s.truncated[k + 1:])
    n = len(s.rewards) - k - 1
    other = replace(
        s,
        rewards=s.rewards[:k + 1] + data.draw(st.lists(FLOATS, min_size=n, max_size=n)),
        values=s.values[:k + 1] + data.draw(st.lists(FLOATS, min_size=n, max_size=n)),
        next_values=s.next_values[:k] + data.draw(st.lists(FLOATS, min_size=n + 1, max_size=n + 1)),
    )
    assert torch.equal(smdp_gae(**s.tensors())[0][:k + 1], smdp_gae(**other.tensors())[0][:k + 1])


@SETTINGS
@given(seqs(mid_truncation=False), FLOATS)
def test_truncation_bootstraps(s: Seq, dv: float) -> None:
    k = len(s.rewards) - 1
    s = replace(s, terminated=s.terminated[:k] + [False], truncated=s.truncated[:k] + [True])
    before, _ = smdp_gae(**s.tensors(next_values=False))
    bumped = replace(s, next_values=s.next_values[:k] + [s.next_values[k] + dv])
    after, _ = smdp_gae(**bumped.tensors(next_values=False))
    assert close(after[k] - before[k], s.gamma ** s.durations[k] * dv)


@SETTINGS
@given(seqs(min_len=2), st.data(), FLOATS)
def test_mid_sequence_truncation_bootstraps_from_next_values(s: Seq, data: st.DataObject, dv: float) -> None:
    k = data.draw(st.integers(0, len(s.rewards) - 2))
    s = replace(s, terminated=s.terminated[:k] + [False] + s.terminated[k + 1:],
                truncated=s.truncated[:k] + [True] + s.truncated[k + 1:])
    bumped = replace(s, next_values=s.next_values[:k] + [s.next_values[k] + dv] + s.next_values[k + 1:])
    before, after = smdp_gae(**s.tensors())[0], smdp_gae(**bumped.tensors())[0]
    assert close(after[k] - before[k], s.gamma ** s.durations[k] * dv)
    assert torch.equal(after[k + 1:], before[k + 1:])


@SETTINGS
@given(seqs())
def test_segmented_without_milestones_is_plain(s: Seq) -> None:
    x = s.tensors()
    plain = smdp_gae(**x)
    segmented = segmented_gae(milestones=torch.zeros(len(s.rewards), dtype=torch.bool), **x)
    assert all(torch.equal(p, q) for p, q in zip(plain, segmented))


@SETTINGS
@given(seqs())
def test_milestone_boundary_is_a_bootstrapped_cut(s: Seq) -> None:
    """Segmented GAE is plain GAE where every milestone call were truncated (δ bootstraps, A is cut)."""
    x = s.tensors()
    milestones = torch.tensor(s.milestones)
    segmented = segmented_gae(milestones=milestones, **x)
    as_truncated = smdp_gae(**{**x, "truncated": x["truncated"] | (milestones & ~x["terminated"])})
    assert all(torch.equal(p, q) for p, q in zip(segmented, as_truncated))


@SETTINGS
@given(seqs(min_len=3), st.data())
def test_segment_boundary_cuts_the_recursion(s: Seq, data: st.DataObject) -> None:
    k = data.draw(st.integers(0, len(s.rewards) - 3))
    s = replace(s, milestones=s.milestones[:k] + [True] + s.milestones[k + 1:])
    n = len(s.rewards) - k - 1
    other = replace(
        s,
        rewards=s.rewards[:k + 1] + data.draw(st.lists(FLOATS, min_size=n, max_size=n)),
        values=s.values[:k + 2] + data.draw(st.lists(FLOATS, min_size=n - 1, max_size=n - 1)),
        next_values=s.next_values[:k + 1] + data.draw(st.lists(FLOATS, min_size=n, max_size=n)),
        durations=s.durations[:k + 1] + data.draw(st.lists(st.integers(1, 20), min_size=n, max_size=n)),
    )
    a = segmented_gae(milestones=torch.tensor(s.milestones), **s.tensors())[0]
    b = segmented_gae(milestones=torch.tensor(other.milestones), **other.tensors())[0]
    assert torch.equal(a[:k + 1], b[:k + 1])


@SETTINGS
@given(seqs(), st.sampled_from([torch.float32, torch.float64]))
def test_finite_inputs_give_finite_outputs_of_the_same_dtype(s: Seq, dtype: torch.dtype) -> None:
    x = s.tensors(dtype)
    outs = [*smdp_gae(**x), *segmented_gae(milestones=torch.tensor(s.milestones), **x)]
    del x["lam"], x["values"]
    outs.append(smdp_returns(**x))
    assert all(o.dtype == dtype and torch.isfinite(o).all() for o in outs)


@settings(max_examples=60, deadline=None)
@given(st.lists(seqs(mid_truncation=False), min_size=1, max_size=4), UNIT, UNIT)
def test_padded_batch_equals_each_row(rows: list[Seq], gamma: float, lam: float) -> None:
    T = max(len(r.rewards) for r in rows)

    def pad(xs: list, fill) -> list:
        return xs + [fill] * (T - len(xs))

    batch = dict(
        rewards=torch.tensor([pad(r.rewards, 7.0) for r in rows], dtype=torch.float64),
        values=torch.tensor([pad(r.values, -3.0) for r in rows], dtype=torch.float64),
        durations=torch.tensor([pad(r.durations, 0) for r in rows]),
        terminated=torch.tensor([pad(r.terminated, True) for r in rows]),
        truncated=torch.tensor([pad(r.truncated, True) for r in rows]),
        mask=torch.tensor([pad([True] * len(r.rewards), False) for r in rows]),
        bootstrap_value=torch.tensor([r.next_values[-1] for r in rows], dtype=torch.float64),
        gamma=gamma,
        lam=lam,
    )
    advantages, returns = smdp_gae(**batch)
    for b, r in enumerate(rows):
        n = len(r.rewards)
        a, g = smdp_gae(**replace(r, gamma=gamma, lam=lam).tensors(next_values=False))
        assert close(advantages[b, :n], a) and close(returns[b, :n], g)
        assert not advantages[b, n:].any() and not returns[b, n:].any()


groups_and_outcomes = st.integers(1, 20).flatmap(lambda n: st.tuples(
    st.lists(st.integers(0, 3), min_size=n, max_size=n),
    st.lists(st.one_of(st.sampled_from([0.0, 1.0]), FLOATS), min_size=n, max_size=n),
))


@SETTINGS
@given(groups_and_outcomes)
@example(([0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1], [0.0, 0.0, 100.0] + [0.0] * 8 + [99.99999999999999]))
def test_group_outcome_advantage_is_zero_mean_per_group(data: tuple[list[int], list[float]]) -> None:
    groups, outcomes = torch.tensor(data[0]), torch.tensor(data[1], dtype=torch.float64)
    advantages = group_outcome_advantages(outcomes=outcomes, groups=groups)
    assert torch.isfinite(advantages).all()
    for g in groups.unique():
        a, o = advantages[groups == g], outcomes[groups == g]
        spread = o.std(unbiased=False).item()
        # the group mean is rounded to float64: each centred outcome is off by up to an ulp of the
        # outcomes, which the division by (spread + eps) magnifies where the spread is that small
        # (100 and 99.99999999999999 differ by one ulp: a mean of -7e-7, not 0)
        rounding = len(o) * math.ulp(o.abs().max().item()) / (spread + 1e-8)
        assert abs(a.mean().item()) < 1e-9 + rounding
        if len(o) == 1 or (o == o[0]).all():
            assert not a.any()
        else:
            assert abs(a.std(unbiased=False).item() - spread / (spread + 1e-8)) < 1e-6


def test_group_outcome_advantage_small_example() -> None:
    outcomes = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.3])
    groups = torch.tensor([7, 7, 8, 8, 9, 10])
    assert close(group_outcome_advantages(outcomes=outcomes, groups=groups), [1, -1, 0, 0, 0, 0])


@SETTINGS
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5000), st.integers(1, 5000)), min_size=1, max_size=12),
       st.floats(0.0, 0.99, allow_subnormal=False))
def test_episode_outcome_ranks_any_success_above_any_failure_and_faster_above_slower(
    episodes: list[tuple[bool, int, int]], kappa: float
) -> None:
    success = torch.tensor([s for s, _, _ in episodes])
    horizon = torch.tensor([h for _, _, h in episodes])
    length = torch.minimum(torch.tensor([n for _, n, _ in episodes]), horizon)
    o = episode_outcomes(success=success, length=length, horizon=horizon, length_weight=kappa)
    assert torch.equal(o[~success], torch.zeros(int((~success).sum())))
    assert (o[success] >= 1.0 - kappa - 1e-6).all() and (o[success] <= 1.0).all()
    if success.any() and (~success).any() and kappa < 1.0:
        assert o[success].min() > o[~success].max()
    slower = episode_outcomes(success=success, length=torch.minimum(length + 1, horizon), horizon=horizon,
                              length_weight=kappa)
    assert (slower <= o).all()
    assert torch.equal(episode_outcomes(success=success, length=length, horizon=horizon), success.float())


def test_length_weight_makes_an_all_success_group_discriminate() -> None:
    success = torch.tensor([True, True, True, True])
    length, horizon = torch.tensor([1000, 1400, 1000, 1400]), torch.full((4,), 3000)
    groups = torch.tensor([3, 3, 5, 5])
    plain = episode_outcomes(success=success, length=length, horizon=horizon)
    assert not group_outcome_advantages(outcomes=plain, groups=groups).any()
    faster = episode_outcomes(success=success, length=length, horizon=horizon, length_weight=0.5)
    advantages = group_outcome_advantages(outcomes=faster, groups=groups)
    assert torch.allclose(advantages, torch.tensor([1.0, -1.0, 1.0, -1.0]), atol=1e-5)
    weights = adaptive_blend_weights(outcomes=faster, groups=groups, w_max=0.5, std_ref=0.5)
    assert torch.allclose(weights, torch.full((4,), 0.5 * (0.5 * 200 / 3000) / 0.5))  # small spread, small weight


def test_episode_outcomes_reject_lengths_past_the_horizon() -> None:
    with pytest.raises(ValueError, match=r"episode 1: length 9 and horizon 8; expected 0 <= length <= horizon"):
        episode_outcomes(success=torch.tensor([True, True]), length=torch.tensor([3, 9]),
                         horizon=torch.tensor([8, 8]), length_weight=0.1)
    with pytest.raises(ValueError, match=r"horizon must have shape \[E\]"):
        episode_outcomes(success=torch.tensor([True]), length=torch.tensor([3]), horizon=torch.tensor([8, 8]))
    with pytest.raises(ValueError, match="success must be a bool tensor"):
        episode_outcomes(success=torch.tensor([1.0]), length=torch.tensor([3]), horizon=torch.tensor([8]))


@SETTINGS
@given(groups_and_outcomes, UNIT, st.one_of(st.none(), st.floats(0.01, 10.0)))
def test_blend_weight_is_zero_exactly_when_outcomes_do_not_discriminate(
    data: tuple[list[int], list[float]], w_max: float, std_ref: float | None
) -> None:
    groups, outcomes = torch.tensor(data[0]), torch.tensor(data[1], dtype=torch.float64)
    weights = adaptive_blend_weights(outcomes=outcomes, groups=groups, w_max=w_max, std_ref=std_ref)
    stats = group_outcome_stats(outcomes=outcomes, groups=groups)
    assert not weights[~stats.discriminates].any()
    assert ((weights >= 0) & (weights <= w_max)).all()
    if std_ref is None:
        assert (weights[stats.discriminates] == w_max).all()
    local = torch.randn(len(data[0]), 5, dtype=torch.float64)
    blended = blend_advantages(local=local, outcome_advantages=group_outcome_advantages(
        outcomes=outcomes, groups=groups), weights=weights)
    assert torch.equal(blended[~stats.discriminates], local[~stats.discriminates])


def test_blend_mixes_local_and_global_per_episode() -> None:
    local = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [5.0, 5.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, True], [True, True, False]])
    out = blend_advantages(local=local, outcome_advantages=torch.tensor([1.0, -1.0]),
                           weights=torch.tensor([0.5, 0.25]), episode_index=torch.tensor([0, 1, 0]),
                           mask=mask)
    assert close(out, [[1.0, 1.5, 2.0], [-0.25, -0.25, -0.25], [3.0, 3.0, 0.0]])


def test_option_advantages_modes() -> None:
    x = dict(
        rewards=torch.tensor([[0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]]),
        values=torch.tensor([[0.5, 0.6, 0.2, 0.9], [0.5, 0.4, 0.3, 0.1]]),
        durations=torch.tensor([[3, 1, 4, 2], [2, 2, 2, 2]]),
        terminated=torch.tensor([[False, False, False, True], [False, False, False, False]]),
        truncated=torch.tensor([[False, False, False, False], [False, False, False, True]]),
        bootstrap_value=torch.tensor([0.0, 0.2]),
        gamma=0.99,
        lam=0.95,
    )
    milestones = torch.tensor([[False, True, False, True], [False, False, False, False]])
    blend_args = dict(outcomes=torch.tensor([1.0, 0.0]), groups=torch.tensor([4, 4]), w_max=0.5,
                      outcome_credit="episode")
    plain = option_advantages(mode="plain", milestones=milestones, **x)
    assert all(torch.equal(p, q) for p, q in zip(plain, smdp_gae(**x)))
    segmented = option_advantages(mode="segmented", milestones=milestones, **x)
    assert all(torch.equal(p, q) for p, q in zip(segmented, segmented_gae(milestones=milestones, **x)))
    blended, returns = option_advantages(mode="blend", milestones=milestones, **blend_args, **x)
    assert torch.equal(returns, segmented[1])
    assert close(blended, 0.5 * segmented[0] + 0.5 * torch.tensor([[1.0], [-1.0]]))
    with pytest.raises(ValueError, match="mode must be one of"):
        option_advantages(mode="gae", **x)
    with pytest.raises(ValueError, match="needs milestones"):
        option_advantages(mode="segmented", **x)
    with pytest.raises(ValueError, match=r"missing \['outcomes', 'groups'\]"):
        option_advantages(mode="blend", milestones=milestones, **x)
    with pytest.raises(ValueError, match=r"outcome_credit must be one of \['anchored', 'episode'\], got None"):
        option_advantages(mode="blend", milestones=milestones, **(blend_args | {"outcome_credit": None}), **x)
    with pytest.raises(ValueError, match=r"needs \['w_max'\] \(the config's credit settings\)"):
        option_advantages(mode="blend", milestones=milestones, **(blend_args | {"w_max": None}), **x)
    # GRPO: every call gets its episode's group-normalised outcome advantage; the critic
    # still learns the segmented λ-returns
    grpo, grpo_returns = option_advantages(mode="grpo", milestones=milestones, **blend_args, **x)
    assert torch.equal(grpo_returns, segmented[1])
    expected = group_outcome_advantages(outcomes=blend_args["outcomes"], groups=blend_args["groups"])
    assert torch.equal(grpo, expected.unsqueeze(-1).expand(2, 4))
    with pytest.raises(ValueError, match=r"mode 'grpo' needs outcomes and groups .* missing \['outcomes', 'groups'\]"):
        option_advantages(mode="grpo", milestones=milestones, **x)


def _seq_args(T: int = 4) -> dict:
    return dict(
        rewards=torch.zeros(T), values=torch.zeros(T), durations=torch.ones(T, dtype=torch.long),
        terminated=torch.zeros(T, dtype=torch.bool).index_fill(0, torch.tensor([T - 1]), True),
        truncated=torch.zeros(T, dtype=torch.bool), gamma=0.9, lam=0.9,
    )


BAD_SHAPES = {
    "values": torch.zeros(3),
    "durations": torch.ones(3, dtype=torch.long),
    "terminated": torch.zeros(3, dtype=torch.bool),
    "truncated": torch.zeros(2, 4, dtype=torch.bool),
    "next_values": torch.zeros(5),
    "mask": torch.ones(5, dtype=torch.bool),
}


@pytest.mark.parametrize("name", list(BAD_SHAPES))
def test_bad_shapes_name_the_argument_and_shapes(name: str) -> None:
    bad = BAD_SHAPES[name]
    expected = rf"{name} has shape {re.escape(str(tuple(bad.shape)))}; expected \(4,\)"
    with pytest.raises(ValueError, match=expected):
        smdp_gae(**{**_seq_args(), name: bad})


def test_other_bad_inputs_raise_value_errors() -> None:
    x = _seq_args()
    with pytest.raises(ValueError, match=r"rewards must have shape \[T\] or \[B, T\], got \(1, 1, 4\)"):
        smdp_gae(**{**x, "rewards": torch.zeros(1, 1, 4)})
    with pytest.raises(ValueError, match=r"milestones has shape \(2,\); expected \(4,\)"):
        segmented_gae(milestones=torch.zeros(2, dtype=torch.bool), **x)
    with pytest.raises(ValueError, match=r"bootstrap_value has shape \(3,\); expected \(\) or \(2,\)"):
        smdp_gae(**{k: v.expand(2, 4) if isinstance(v, torch.Tensor) else v for k, v in x.items()},
                 bootstrap_value=torch.zeros(3))
    with pytest.raises(ValueError, match=r"durations must be >= 1, got 0 at \[2\]"):
        smdp_gae(**{**x, "durations": torch.tensor([1, 1, 0, 1])})
    with pytest.raises(ValueError, match="terminated must be a bool tensor"):
        smdp_gae(**{**x, "terminated": x["terminated"].float()})
    with pytest.raises(ValueError, match="gamma must be in"):
        smdp_gae(**{**x, "gamma": 1.5})
    with pytest.raises(ValueError, match=r"truncated is True at \[1\] before the end"):
        smdp_gae(**{**x, "truncated": torch.tensor([False, True, False, False])})
    with pytest.raises(ValueError, match=r"ends at \[3\] without terminated=True; pass bootstrap_value"):
        smdp_gae(**{**x, "terminated": torch.zeros(4, dtype=torch.bool)})
    with pytest.raises(ValueError, match="right-padded"):
        smdp_gae(**{**x, "mask": torch.tensor([True, False, True, False])})
    with pytest.raises(ValueError, match=r"groups has shape \(2,\); expected \(3,\)"):
        group_outcome_advantages(outcomes=torch.zeros(3), groups=torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"outcomes must be finite, got nan at \[1\]"):
        group_outcome_advantages(outcomes=torch.tensor([0.0, float("nan")]),
                                 groups=torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"weights has shape \(3,\); expected \(2,\)"):
        blend_advantages(local=torch.zeros(2, 4), outcome_advantages=torch.zeros(2), weights=torch.zeros(3))
    with pytest.raises(ValueError, match="episode_index is required"):
        blend_advantages(local=torch.zeros(3, 4), outcome_advantages=torch.zeros(2), weights=torch.zeros(2))
