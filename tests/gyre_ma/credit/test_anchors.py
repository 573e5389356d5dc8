"""Milestone-anchored outcome credit: telescoping, signs, spreading over calls, bad input."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre_ma.credit import anchor_values, anchored_outcome_credit, option_advantages, segmented_gae, spread_over_calls

SETTINGS = settings(max_examples=100, deadline=None)


def close(a: torch.Tensor, b: object, tol: float = 1e-6) -> bool:
    return torch.allclose(a.double(), torch.as_tensor(b, dtype=torch.float64), atol=tol)


episodes = st.integers(1, 8).flatmap(lambda E: st.integers(1, 6).flatmap(lambda M: st.tuples(
    st.lists(st.floats(0.0, 1.0, allow_subnormal=False), min_size=E, max_size=E),
    st.lists(st.lists(st.integers(-1, 50), min_size=M, max_size=M), min_size=E, max_size=E),
    st.floats(0.0, 5.0, allow_subnormal=False),
)))


@SETTINGS
@given(episodes)
def test_each_episode_credit_telescopes_to_its_outcome_advantage(data: tuple) -> None:
    """Steps along an episode's milestones plus its residual and time credit sum to (o − ō) / σ,
    with or without a time cost inside the outcomes (a success o > 0 costs 1 − o)."""
    outcomes = torch.tensor(data[0], dtype=torch.float64)
    verified_at = torch.tensor(data[1])
    for success in (None, outcomes > 0):
        steps, residual, time = anchored_outcome_credit(outcomes=outcomes, verified_at=verified_at, prior=data[2],
                                                        success=success)
        assert torch.isfinite(steps).all() and torch.isfinite(residual).all() and torch.isfinite(time).all()
        assert not steps[verified_at < 0].any()                          # only verified milestones are credited
        assert not time[outcomes == 0].any()                             # failures pay no time cost
        if outcomes.max() > outcomes.min():
            expected = (outcomes - outcomes.mean()) / (outcomes.std(unbiased=False) + 1e-8)
            assert close(steps.sum(1) + residual + time, expected, tol=1e-6)
        else:
            assert not steps.any() and not residual.any() and not time.any()


def test_anchor_values_are_shrunk_conditional_means() -> None:
    outcomes = torch.tensor([1.0, 0.0, 0.0, 1.0])
    verified_at = torch.tensor([[3, -1, 7], [2, 5, -1], [4, 9, -1], [1, -1, -1]])
    mean, values = anchor_values(outcomes=outcomes, verified_at=verified_at, prior=0.0)
    assert close(mean, 0.5) and close(values, [0.5, 0.0, 1.0])
    _, shrunk = anchor_values(outcomes=outcomes, verified_at=verified_at, prior=2.0)
    assert close(shrunk, [(2.0 + 1.0) / 6.0, (0.0 + 1.0) / 4.0, (1.0 + 1.0) / 3.0])
    _, unseen = anchor_values(outcomes=outcomes, verified_at=torch.full((4, 2), -1), prior=0.0)
    assert close(unseen, [0.5, 0.5])                                     # nobody verified it: worth the mean


def test_a_trap_milestone_is_blamed_where_it_was_verified() -> None:
    """Milestones 0 → 1 is the good path, 0 → 2 the trap; the trap call takes the blame and the
    calls before it none, although the failure shows only at the end."""
    outcomes = torch.tensor([1.0, 1.0, 0.0, 0.0])
    verified_at = torch.tensor([[10, 40, -1], [12, 35, -1], [11, -1, 30], [9, -1, 50]])
    steps, residual, _ = anchored_outcome_credit(outcomes=outcomes, verified_at=verified_at, prior=0.0)
    assert close(steps[:, 0], [0.0, 0.0, 0.0, 0.0])                      # everybody verified it: no information
    assert close(steps[:2, 1], [1.0, 1.0]) and close(steps[2:, 2], [-1.0, -1.0])
    assert close(residual, [0.0, 0.0, 0.0, 0.0])                         # the milestones explain every outcome


def test_milestones_verified_at_the_same_step_go_in_index_order() -> None:
    outcomes = torch.tensor([1.0, 0.0])
    verified_at = torch.tensor([[5, 5], [5, -1]])
    mean, values = anchor_values(outcomes=outcomes, verified_at=verified_at, prior=0.0)
    steps, _, _ = anchored_outcome_credit(outcomes=outcomes, verified_at=verified_at, prior=0.0)
    sigma = outcomes.std(unbiased=False)
    assert close(steps[0], [(values[0] - mean) / sigma, (values[1] - values[0]) / sigma], tol=1e-5)


def test_spread_puts_steps_on_verifying_calls_and_the_residual_at_the_end() -> None:
    steps = torch.tensor([[0.5, -1.0], [0.25, 0.0]])
    residual = torch.tensor([0.1, -0.2])
    call_milestones = torch.zeros(3, 3, 2, dtype=torch.bool)
    call_milestones[0, 0, 0] = call_milestones[0, 2, 1] = True            # episode 0, agent a: both milestones
    call_milestones[2, 1, 0] = True                                       # episode 1
    at_end = torch.tensor([[False, False, True], [False, True, False], [False, True, False]])
    out = spread_over_calls(steps=steps, residual=residual, call_milestones=call_milestones, at_end=at_end,
                            episode_index=torch.tensor([0, 0, 1]))
    assert close(out, [[0.5, 0.0, -0.9], [0.0, 0.1, 0.0], [0.0, 0.05, 0.0]])
    durations = torch.tensor([[2, 6, 2], [5, 5, 0], [1, 3, 0]])
    timed = spread_over_calls(steps=steps, residual=residual, call_milestones=call_milestones, at_end=at_end,
                              episode_index=torch.tensor([0, 0, 1]), time=torch.tensor([-1.0, 0.4]),
                              durations=durations)
    assert close(timed - out, [[-0.2, -0.6, -0.2], [-0.5, -0.5, 0.0], [0.1, 0.3, 0.0]])  # by duration
    with pytest.raises(ValueError, match=r"time credit needs durations of shape \(3, 3\)"):
        spread_over_calls(steps=steps, residual=residual, call_milestones=call_milestones, at_end=at_end,
                          episode_index=torch.tensor([0, 0, 1]), time=torch.tensor([-1.0, 0.4]))


def test_a_wasteful_loop_pays_for_its_own_steps_not_the_call_that_finishes() -> None:
    """Two successes of one agent, key → goal: the short one takes 10 + 10 steps; the long one
    drops the key and picks it up again (a 20-step loop verifying nothing new) before the same
    final call. The loop is charged the extra length; the final call is not."""
    horizon, kappa = 100, 0.5
    lengths = torch.tensor([20, 40])
    outcomes = 1.0 - kappa * lengths.double() / horizon                  # 0.9 and 0.8
    x = dict(rewards=torch.zeros(2, 3, dtype=torch.float64), values=torch.zeros(2, 3, dtype=torch.float64),
             durations=torch.tensor([[10, 10, 1], [10, 20, 10]]),
             terminated=torch.tensor([[False, True, False], [False, False, True]]),
             truncated=torch.zeros(2, 3, dtype=torch.bool), gamma=1.0, lam=1.0,
             milestones=torch.tensor([[True, True, False], [True, False, True]]),
             mask=torch.tensor([[True, True, False], [True, True, True]]))
    call_milestones = torch.zeros(2, 3, 2, dtype=torch.bool)
    call_milestones[0, 0, 0] = call_milestones[1, 0, 0] = True          # get the key
    call_milestones[0, 1, 1] = call_milestones[1, 2, 1] = True          # reach the goal
    anchored = dict(verified_at=torch.tensor([[10, 20], [10, 40]]), call_milestones=call_milestones,
                    at_end=torch.tensor([[False, True, False], [False, False, True]]), outcome_credit="anchored",
                    anchor_prior=0.0, groups=torch.tensor([0, 0]), w_max=1.0, w_length=1.0,
                    success=torch.tensor([True, True]))
    credit, _ = option_advantages(mode="blend", outcomes=outcomes, **anchored, **x)
    key, loop, goal = credit[1].tolist()
    assert loop < 0 and loop < key and abs(goal) < abs(loop)              # the loop takes the blame
    assert close(credit[1].sum(), -1.0) and close(credit[0, :2].sum(), 1.0)  # (o − ō) / σ per episode
    assert close(torch.tensor([key, loop, goal]), [-0.25, -0.5, -0.25])  # by duration: 10, 20, 10 of 40 steps


def test_upkeep_that_keeps_an_agent_alive_is_credited_by_what_follows_not_zeroed() -> None:
    """Measurement 7: two episodes, one dies of thirst. A drink call verifies no milestone;
    with the anchored credit at full weight it got exactly 0 whenever outcomes differed. It
    now keeps its local credit: the survivor's drink led to a valuable state (V = 1), the
    other episode's wander led to death (terminated, nothing after)."""
    x = dict(rewards=torch.tensor([[0.0, 1.0], [0.0, 0.0]]), values=torch.tensor([[0.5, 1.0], [0.5, 0.0]]),
             durations=torch.ones(2, 2, dtype=torch.long), terminated=torch.tensor([[False, True], [True, False]]),
             truncated=torch.zeros(2, 2, dtype=torch.bool), gamma=1.0, lam=1.0,
             milestones=torch.tensor([[False, True], [False, False]]),
             mask=torch.tensor([[True, True], [True, False]]))
    call_milestones = torch.zeros(2, 2, 1, dtype=torch.bool)
    call_milestones[0, 1, 0] = True                                      # the survivor reaches the goal
    credit, _ = option_advantages(
        mode="blend", outcomes=torch.tensor([1.0, 0.0]), verified_at=torch.tensor([[1], [-1]]),
        call_milestones=call_milestones, at_end=torch.tensor([[False, True], [True, False]]),
        outcome_credit="anchored", anchor_prior=0.0, groups=torch.tensor([0, 0]), w_max=1.0, w_length=1.0,
        success=torch.tensor([True, False]), **x)
    drink = credit[0, 0].item()
    assert drink == pytest.approx(0.5)                                   # V(after) − V(before): 1 − 0.5, not 0
    assert credit[0, 1].item() == pytest.approx(1.0)                     # the goal's anchored step, (1 − 0.5) / 0.5
    assert credit[1, 0].item() < 0                                       # dying is blamed where it happened


def _rows() -> dict:
    return dict(
        rewards=torch.tensor([[0.0, 0.1, 0.0], [0.0, 0.1, 0.0]]), values=torch.zeros(2, 3),
        durations=torch.ones(2, 3, dtype=torch.long), terminated=torch.tensor([[False, False, True]] * 2),
        truncated=torch.zeros(2, 3, dtype=torch.bool), gamma=0.99, lam=0.95,
        milestones=torch.tensor([[False, True, False], [False, True, False]]),
    )


def test_option_advantages_adds_anchored_credit_only_when_the_batch_discriminates() -> None:
    x = _rows()
    call_milestones = torch.zeros(2, 3, 2, dtype=torch.bool)
    call_milestones[0, 1, 0] = call_milestones[1, 1, 1] = True
    anchored = dict(verified_at=torch.tensor([[1, -1], [-1, 1]]), call_milestones=call_milestones,
                    at_end=torch.tensor([[False, False, True]] * 2), outcome_credit="anchored", anchor_prior=0.0,
                    groups=torch.tensor([0, 1]), w_max=0.5, w_length=0.5)
    local, _ = segmented_gae(**x)
    credit = torch.tensor([[0.0, 1.0, 0.0], [0.0, -1.0, 0.0]])          # each milestone's anchored step

    blended, _ = option_advantages(mode="blend", outcomes=torch.tensor([1.0, 0.0]), **anchored, **x)
    assert close(blended, local + 0.5 * credit)                          # added to every call's local credit
    same, _ = option_advantages(mode="blend", outcomes=torch.tensor([1.0, 1.0]), **anchored, **x)
    assert torch.equal(same, local)                                      # nothing to tell apart: local credit
    # the weight follows what separates the episodes: verified success (w_max), length alone
    # when every episode succeeded (w_length), nothing (0)
    mixed, _ = option_advantages(mode="blend", outcomes=torch.tensor([0.9, 0.0]), **(anchored | {"w_length": 0.25}),
                                 **x, success=torch.tensor([True, False]))
    assert close(mixed, local + 0.5 * credit)
    faster, _ = option_advantages(mode="blend", outcomes=torch.tensor([0.9, 0.6]), **(anchored | {"w_length": 0.25}),
                                  **x, success=torch.tensor([True, True]))
    by_duration = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]]) / 3  # only time separates them
    assert close(faster, local + 0.25 * by_duration)
    full, _ = option_advantages(mode="blend", outcomes=torch.tensor([0.9, 0.0]), **(anchored | {"w_max": 1.0}),
                                **x, success=torch.tensor([True, False]))
    assert close(full, local + credit)                                   # w = 1: the whole anchored credit, on top
    with pytest.raises(ValueError, match=r"success has shape \(3,\); expected \(2,\), the shape of outcomes"):
        option_advantages(mode="blend", outcomes=torch.tensor([0.9, 0.0]), **anchored, **x,
                          success=torch.tensor([True, True, False]))
    with pytest.raises(ValueError, match="w_length"):
        option_advantages(mode="blend", outcomes=torch.tensor([0.9, 0.0]), **(anchored | {"w_length": 1.5}), **x)
    with pytest.raises(ValueError, match=r"needs verified_at .* missing \['call_milestones', 'at_end'\]"):
        option_advantages(mode="blend", outcomes=torch.tensor([1.0, 0.0]), groups=torch.tensor([0, 1]),
                          outcome_credit="anchored", verified_at=anchored["verified_at"], w_max=0.5, w_length=0.5,
                          anchor_prior=1.0, **x)
    with pytest.raises(ValueError, match="outcome_credit must be one of"):
        option_advantages(mode="blend", outcomes=torch.tensor([1.0, 0.0]), groups=torch.tensor([0, 1]),
                          outcome_credit="calls", **x)


def test_bad_inputs_name_what_was_expected() -> None:
    outcomes = torch.tensor([1.0, 0.0])
    with pytest.raises(ValueError, match=r"verified_at must have shape \[E, M\] with E = 2"):
        anchor_values(outcomes=outcomes, verified_at=torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="verified_at must be an integer tensor"):
        anchor_values(outcomes=outcomes, verified_at=torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"verified_at\[1, 0\] is -3"):
        anchor_values(outcomes=outcomes, verified_at=torch.tensor([[0, 1], [-3, 1]]))
    with pytest.raises(ValueError, match=r"outcomes must be finite, got nan at \[0\]"):
        anchor_values(outcomes=torch.tensor([float("nan"), 0.0]), verified_at=torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="prior must be >= 0"):
        anchor_values(outcomes=outcomes, verified_at=torch.zeros(2, 1, dtype=torch.long), prior=-1.0)
    with pytest.raises(ValueError, match=r"call_milestones must have shape \[R, T, M\] with M = 2"):
        spread_over_calls(steps=torch.zeros(2, 2), residual=torch.zeros(2),
                          call_milestones=torch.zeros(1, 3, 5, dtype=torch.bool),
                          at_end=torch.zeros(1, 3, dtype=torch.bool), episode_index=torch.tensor([0]))
