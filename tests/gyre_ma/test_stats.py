"""The run statistics of `gyre-ma report` against known values and scipy's estimators."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from gyre_ma import stats


@pytest.mark.parametrize("n", range(1, 13))
def test_iqm_is_scipys_quarter_trimmed_mean(n):
    x = np.random.default_rng(n).normal(size=n)
    assert stats.iqm(x) == pytest.approx(scipy.stats.trim_mean(x, 0.25), abs=1e-12)


def test_iqm_known_values_and_runs_that_never_arrived():
    assert stats.iqm(np.arange(1, 9)) == 4.5  # middle half of 1..8: 3, 4, 5, 6
    assert stats.iqm([1, 2, 3, 100]) == 2.5  # one outlier seed does not move it
    assert stats.iqm([1, 2, 3, math.inf]) == 2.5  # an unreached run outside the middle half
    assert stats.iqm([1, 2, math.inf, math.inf]) == math.inf  # inside it: not reached
    assert stats.iqm([[0.0, 1.0], [0.0, 1.0]]) == 0.5  # pooled over tasks


def test_bootstrap_interval_matches_scipys_percentile_bootstrap():
    x = np.random.default_rng(7).normal(3.0, 2.0, size=40)
    ours = stats.stratified_bootstrap(x, stats.mean, reps=8000, seed=1)
    ref = scipy.stats.bootstrap((x,), np.mean, method="percentile", n_resamples=8000, random_state=2)
    assert ours.estimate == pytest.approx(x.mean())
    se = x.std(ddof=1) / math.sqrt(x.size)
    assert ours.low == pytest.approx(ref.confidence_interval.low, abs=0.1 * se)
    assert ours.high == pytest.approx(ref.confidence_interval.high, abs=0.1 * se)
    assert ours.high - ours.low == pytest.approx(2 * 1.96 * se, rel=0.1)  # the normal approximation
    assert stats.stratified_bootstrap(x, stats.mean, reps=500, seed=3) == \
        stats.stratified_bootstrap(x, stats.mean, reps=500, seed=3)  # deterministic


def test_the_bootstrap_resamples_runs_within_each_task():
    scores = np.array([[0.0, 1.0]] * 5)  # task 0 always 0, task 1 always 1
    got = stats.stratified_bootstrap(scores, stats.mean, reps=300)
    assert (got.estimate, got.low, got.high) == (0.5, 0.5, 0.5)  # pooled resampling would spread it
    constant = stats.stratified_bootstrap([4.0, 4.0, 4.0], stats.iqm, reps=100)
    assert (constant.low, constant.high) == (4.0, 4.0)


def test_probability_of_improvement_is_the_mann_whitney_statistic():
    rng = np.random.default_rng(0)
    x, y = rng.normal(0.5, 1, size=9), rng.normal(0, 1, size=7)
    u = scipy.stats.mannwhitneyu(x, y).statistic
    assert stats.probability_of_improvement(x, y) == pytest.approx(u / (9 * 7))
    assert stats.probability_of_improvement([1, 2, 3], [0, 0, 0]) == 1.0
    assert stats.probability_of_improvement([1, 2], [1, 2]) == 0.5  # ties count half
    assert stats.probability_of_improvement([math.inf, 5], [math.inf, math.inf]) == 0.25  # inf ties inf
    interval = stats.improvement_interval(x, y, reps=400)
    assert interval.low <= interval.estimate <= interval.high and 0 <= interval.low and interval.high <= 1


def test_steps_to_threshold_and_step_curves():
    assert stats.steps_to_threshold([10, 20, 30], [0.1, math.nan, 0.95], 0.9) == 30.0
    assert stats.steps_to_threshold([10, 20], [0.1, 0.5], 0.9) == math.inf
    # a length reached by falling to it; an unmeasured point reaches neither way
    assert stats.steps_to_threshold([10, 20, 30, 40], [150, math.nan, 95, 80], 100, at_most=True) == 30.0
    assert stats.steps_to_threshold([10, 20], [150, 120], 100, at_most=True) == math.inf
    got = stats.step_curve([10, 20, 30], [0.1, math.nan, 0.9], np.array([5, 10, 25, 40]))
    assert np.isnan(got[0]) and list(got[1:]) == [0.1, 0.1, 0.9]


def test_centred_mean_pools_measured_points_around_each():
    got = stats.centred_mean([0.0, math.nan, 1.0, 0.5, 0.0, 1.0], 3)
    # measured points 0, 1, .5, 0, 1: each the mean of itself and its measured neighbours
    assert np.isnan(got[1])
    assert list(got[[0, 2, 3, 4, 5]]) == pytest.approx([0.5, 0.5, 0.5, 0.5, 0.5])
    assert list(stats.centred_mean([1.0, 0.0, 1.0, 1.0], 5)) == pytest.approx([2 / 3, 0.75, 0.75, 2 / 3])
    assert list(stats.centred_mean([0.3, 0.9], 1)) == [0.3, 0.9]
    for bad in (0, 2, 2.0, True):
        with pytest.raises(ValueError, match="window must be an odd int >= 1"):
            stats.centred_mean([1.0], bad)


def test_a_lucky_iteration_reaches_the_raw_threshold_but_not_the_smoothed_one():
    steps = [10, 20, 30, 40, 50, 60, 70]
    values = [0.25, 1.0, 0.5, 0.75, 1.0, 1.0, 1.0]  # four held-out episodes an iteration; 1.0 at 20 by luck
    assert stats.steps_to_threshold(steps, values, 0.9) == 20
    assert stats.steps_to_threshold(steps, stats.centred_mean(values, 3), 0.9) == 50  # (.75 + 1 + 1) / 3
    assert stats.steps_to_threshold(steps, stats.centred_mean(values, 5), 0.9) == 60  # (.75 + 1 + 1 + 1) / 4


def test_bad_scores_are_refused_with_what_was_expected():
    with pytest.raises(ValueError, match="contains NaN"):
        stats.mean([1.0, math.nan])
    with pytest.raises(ValueError, match=r"expected a \[runs, tasks\] array"):
        stats.iqm(np.zeros((2, 2, 2)))
    with pytest.raises(ValueError, match="reps must be >= 1"):
        stats.stratified_bootstrap([1.0], stats.mean, reps=0)
    with pytest.raises(ValueError, match="same tasks"):
        stats.probability_of_improvement(np.zeros((2, 1)), np.zeros((2, 2)))


def test_curve_band_is_the_iqm_and_its_bootstrap_point_by_point():
    curves = np.array([[0.0, 0.5, 1.0, np.nan], [0.2, 0.6, 0.9, np.nan], [0.1, np.nan, 0.8, 1.0],
                       [0.4, 0.7, 1.0, np.nan]])
    mid, low, high = stats.curve_band(curves, reps=200)
    for j in range(3):  # the runs with a value there, point j resampled with seed j
        col = curves[:, j][~np.isnan(curves[:, j])]
        got = stats.stratified_bootstrap(col, stats.iqm, reps=200, seed=j)
        assert (mid[j], low[j], high[j]) == (got.estimate, got.low, got.high)
    assert mid[0] == stats.iqm(curves[:, 0]) == pytest.approx(0.15)  # (0.1 + 0.2) / 2
    assert np.isnan([mid[3], low[3], high[3]]).all()  # one run of four has a value there: no estimate
    with pytest.raises(ValueError, match=r"\[runs, points\]"):
        stats.curve_band(curves[0])
