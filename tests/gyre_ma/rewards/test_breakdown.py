from __future__ import annotations

import math

import pytest

from gyre_ma.rewards.breakdown import COMPONENTS, RewardBreakdown, summarize


def test_total_is_the_sum_of_the_parts():
    b = RewardBreakdown.of(outcome=5.0, milestone=1.5, rules=0.5, prm=-0.05, penalty=-1.0, sources=["outcome"])
    assert b.total == pytest.approx(5.95)
    assert b.total == pytest.approx(sum(getattr(b, k) for k in COMPONENTS))
    assert b.as_dict()["sources"] == ("outcome",)


def test_an_inconsistent_total_is_rejected():
    with pytest.raises(ValueError, match="total .* must equal the sum of its parts"):
        RewardBreakdown(outcome=1.0, total=2.0)


def test_summarize_gives_per_episode_means_and_vetoed_share():
    ep1 = [RewardBreakdown.of(milestone=1.0), RewardBreakdown.of(outcome=5.0)]
    ep2 = [RewardBreakdown.of(penalty=-1.0, guard=True, removed=0.5)]
    m = summarize([ep1, ep2])
    assert m["reward/total"] == pytest.approx((6.0 - 1.0) / 2)
    assert m["reward/outcome"] == pytest.approx(2.5)
    assert m["reward/removed"] == pytest.approx(0.25)
    assert m["reward/vetoed_episodes"] == 0.5
    assert summarize([])["reward/total"] == 0.0
    assert "reward/total_failed" not in m


def test_summarize_gives_the_reward_of_the_episodes_that_did_not_complete():
    won = [RewardBreakdown.of(outcome=10.0)]
    lost = [[RewardBreakdown.of(rules=2.0), RewardBreakdown.of(milestone=1.0)], [RewardBreakdown.of(penalty=-1.0)]]
    m = summarize([won, *lost], success=[True, False, False])
    assert m["reward/total_failed"] == pytest.approx((3.0 - 1.0) / 2)
    assert m["reward/total"] == pytest.approx(12.0 / 3)
    assert math.isnan(summarize([won], success=[True])["reward/total_failed"])
    with pytest.raises(ValueError, match="2 success flags for 3 episodes"):
        summarize([won, *lost], success=[True, False])
