from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre_ma.rewards.drift import DriftConfig, DriftMonitor, agreement, auc, spearman

SCORES = st.lists(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.7, 1.0]), min_size=2, max_size=40)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_auc_is_the_probability_a_positive_outranks_a_negative(data):
    scores = data.draw(SCORES)
    labels = data.draw(st.lists(st.booleans(), min_size=len(scores), max_size=len(scores)))
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    got = auc(scores=np.array(scores), labels=np.array(labels, dtype=float))
    if not pos or not neg:
        assert math.isnan(got)
        return
    pairs = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))
    assert got == pytest.approx(pairs)


@settings(max_examples=100, deadline=None)
@given(SCORES, st.randoms(use_true_random=False))
def test_spearman_is_pearson_on_average_ranks(xs, rnd):
    ys = [rnd.random() for _ in xs]
    got = spearman(np.array(xs), np.array(ys))
    if len(set(xs)) == 1 or len(set(ys)) == 1:
        assert math.isnan(got)
        return

    def ranks(v):
        return [sum(u < w for u in v) + (sum(u == w for u in v) + 1) / 2 for w in v]

    assert got == pytest.approx(float(np.corrcoef(ranks(xs), ranks(ys))[0, 1]), abs=1e-9)


def test_rank_measures_on_simple_cases():
    x = np.arange(10.0)
    assert auc(scores=x, labels=x >= 5) == 1.0 and auc(scores=-x, labels=x >= 5) == 0.0
    assert auc(scores=np.ones(10), labels=x >= 5) == 0.5
    assert spearman(x, x ** 3) == pytest.approx(1.0) and spearman(x, -x) == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="same shape"):
        auc(scores=x, labels=x[:3])


def test_agreement_averages_the_measurable_heads():
    p = torch.tensor([[0.9, 0.2], [0.1, 0.4], [0.8, 0.6], [0.2, 0.1]])
    y = torch.tensor([[1.0, 1.0], [0.0, 1.0], [1.0, 1.0], [0.0, 1.0]])  # success all equal: skipped
    assert agreement(probabilities=p, labels=y) == 1.0
    assert math.isnan(agreement(probabilities=p, labels=torch.ones(4, 2)))
    assert agreement(probabilities=p, labels=y, metric="spearman") == pytest.approx(
        spearman(p[:, 0].numpy(), y[:, 0].numpy()))
    with pytest.raises(ValueError, match=r"must both be \[N, H\]"):
        agreement(probabilities=p, labels=y[:, 0])


def test_weight_is_cut_below_threshold_and_restored_on_recovery(caplog):
    mon = DriftMonitor(DriftConfig(threshold=0.6, recover=0.7, cut=0.25, min_samples=10))
    assert not mon.trusted and mon.scale == 0.25  # untrusted until agreement is shown
    assert mon.update(0.65, samples=50).event is None and mon.scale == 0.25
    s = mon.update(0.8, samples=50, iteration=3)
    assert s.event == "restore" and mon.scale == 1.0
    assert mon.update(0.65, samples=50).event is None and mon.trusted  # hysteresis band
    assert mon.update(0.1, samples=5).event is None and mon.trusted  # too few samples
    assert mon.update(math.nan, samples=50).event is None and mon.trusted  # unmeasurable
    with caplog.at_level(logging.WARNING, logger="gyre_ma.rewards"):
        s = mon.update(0.55, samples=50, iteration=7)
    assert s.event == "cut" and s.scale == 0.25 and "iteration 7" in s.message
    assert "PRM drift at iteration 7" in caplog.text
    assert [e.event for e in mon.events] == ["restore", "cut"]
    other = DriftMonitor(mon.config)
    other.load_state_dict(mon.state_dict())
    assert other.trusted == mon.trusted and other.events == mon.events


def test_check_measures_agreement_on_held_out_calls():
    mon = DriftMonitor(DriftConfig(min_samples=4))
    p = torch.tensor([[0.9, 0.9], [0.1, 0.1], [0.8, 0.7], [0.2, 0.3]])
    good = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    assert mon.check(probabilities=p, labels=good).event == "restore"
    assert mon.check(probabilities=p, labels=1 - good).event == "cut"


def test_config_needs_hysteresis():
    with pytest.raises(ValueError, match=r"`recover` \(0.5\) must be >= `threshold` \(0.6\)"):
        DriftConfig(threshold=0.6, recover=0.5)
