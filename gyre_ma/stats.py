"""Aggregate statistics over training runs: the protocol of Agarwal et al. (2021).

"Deep RL at the Edge of the Statistical Precipice" (NeurIPS 2021) asks for few-run
results to be reported as interval estimates, not point estimates: the mean and the
interquartile mean (IQM: the mean of the middle 50 % of runs, robust to one outlier
seed, less noisy than the median), each with a stratified-bootstrap confidence interval,
and the probability that one algorithm improves on another. The ``rliable`` package
implements it on ``arch``, which does not import beside pandas 3; these are the same
estimators on numpy.

Scores are ``[runs, tasks]`` arrays: one row per run (seed), one column per task (an
experiment on one environment has one). The stratified bootstrap resamples runs with
replacement *within each task* (every task keeps its number of runs), recomputes the
statistic, and reports the percentile interval. A run that never reached a threshold has
``inf`` steps-to-threshold; statistics over it are ``inf`` where it falls inside the
estimator's window (the IQM of four runs of which two never arrived is ``inf``): "not
reached", never a number it did not earn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Statistic = Callable[[np.ndarray], float]


def _as_scores(scores: np.ndarray | list, name: str = "scores") -> np.ndarray:
    x = np.asarray(scores, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"{name}: expected a [runs, tasks] array with at least one run, got shape {x.shape}")
    if np.isnan(x).any():
        raise ValueError(f"{name}: contains NaN; a run without a value must be left out or given inf")
    return x


def mean(scores: np.ndarray) -> float:
    """Mean over every run and task of ``scores`` [runs, tasks]."""
    return float(np.mean(_as_scores(scores)))


def iqm(scores: np.ndarray) -> float:
    """Interquartile mean of ``scores`` [runs, tasks], pooled over runs and tasks: the mean
    left after cutting ``floor(n / 4)`` values from each end of the sorted ``n`` scores —
    ``scipy.stats.trim_mean(x, 0.25)``, which is rliable's ``aggregate_iqm``."""
    x = np.sort(_as_scores(scores).ravel())
    cut = int(0.25 * x.size)
    return float(np.mean(x[cut:x.size - cut]))


def median(scores: np.ndarray) -> float:
    return float(np.median(_as_scores(scores)))


@dataclass(frozen=True)
class Interval:
    """A point estimate and its percentile bootstrap interval."""

    estimate: float
    low: float
    high: float

    def as_dict(self) -> dict[str, float | None]:
        """JSON-ready: ``inf`` (not reached) becomes None."""
        return {k: (v if np.isfinite(v) else None) for k, v in
                (("estimate", self.estimate), ("low", self.low), ("high", self.high))}


def stratified_bootstrap(scores: np.ndarray, statistic: Statistic, *, reps: int = 2000,
                         confidence: float = 0.95, seed: int = 0) -> Interval:
    """``statistic`` of ``scores`` [runs, tasks] and its stratified-bootstrap percentile
    interval at ``confidence``: ``reps`` resamples, each drawing every task's runs with
    replacement from that task's own runs. Deterministic for a given ``seed``."""
    x = _as_scores(scores)
    _check(reps, confidence)
    rng = np.random.default_rng(seed)
    runs, tasks = x.shape
    picks = rng.integers(0, runs, size=(reps, runs, tasks))
    resampled = x[picks, np.arange(tasks)]  # [reps, runs, tasks]: each task's runs drawn from its own
    values = np.array([statistic(r) for r in resampled])
    low, high = _percentiles(values, confidence)
    return Interval(statistic(x), low, high)


def mean_interval(values: np.ndarray | list, *, confidence: float = 0.95) -> Interval:
    """The mean of ``values`` (a run's episodes, or per-seed differences) with its percentile
    bootstrap interval: 2,000 resamples, seed 0 (eval's and compare's intervals of a mean)."""
    return stratified_bootstrap(np.asarray(values, dtype=float)[:, None], mean, reps=2000, confidence=confidence,
                                seed=0)


def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y): the chance that a run of X scores higher than a run of Y on a task,
    ties counting half (the Mann-Whitney U statistic / (n·m)), averaged over tasks.
    ``x`` [n, tasks], ``y`` [m, tasks]."""
    a, b = _as_scores(x, "x"), _as_scores(y, "y")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"x and y need the same tasks, got {a.shape[1]} and {b.shape[1]} columns")
    out = []
    for t in range(a.shape[1]):
        above = a[:, t][:, None] > b[:, t][None, :]  # compared, not subtracted: inf ties inf
        same = a[:, t][:, None] == b[:, t][None, :]
        out.append(float(np.mean(above + 0.5 * same)))
    return float(np.mean(out))


def improvement_interval(x: np.ndarray, y: np.ndarray, *, reps: int = 2000, confidence: float = 0.95,
                         seed: int = 0) -> Interval:
    """:func:`probability_of_improvement` of X over Y with a stratified-bootstrap interval
    (X's and Y's runs resampled independently, task by task)."""
    a, b = _as_scores(x, "x"), _as_scores(y, "y")
    _check(reps, confidence)
    rng = np.random.default_rng(seed)
    values = np.empty(reps)
    for r in range(reps):
        ra = np.take_along_axis(a, rng.integers(0, a.shape[0], size=a.shape), axis=0)
        rb = np.take_along_axis(b, rng.integers(0, b.shape[0], size=b.shape), axis=0)
        values[r] = probability_of_improvement(ra, rb)
    low, high = _percentiles(values, confidence)
    return Interval(probability_of_improvement(a, b), low, high)


def steps_to_threshold(steps: np.ndarray, values: np.ndarray, threshold: float, *, at_most: bool = False) -> float:
    """The first of ``steps`` at which ``values`` reached ``threshold`` — rose to it, or with
    ``at_most`` fell to it (NaN values — not measured at that point — skipped); ``inf`` if
    they never did."""
    s, v = np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)
    if s.shape != v.shape or s.ndim != 1:
        raise ValueError(f"steps and values must be 1-d and the same length, got {s.shape} and {v.shape}")
    hit = np.flatnonzero(np.nan_to_num(v, nan=np.inf) <= threshold if at_most
                         else np.nan_to_num(v, nan=-np.inf) >= threshold)
    return float(s[hit[0]]) if hit.size else float("inf")


def centred_mean(values: np.ndarray, window: int) -> np.ndarray:
    """``values`` smoothed by a centred moving average over ``window`` (odd) measured
    points: each measured point becomes the mean of the measured points up to
    ``window // 2`` before and after it (fewer at either end); NaN (not measured) stays NaN
    and is skipped, so the window counts measurements, not rows. ``window`` 1 returns the
    values unchanged.

    Why: a per-iteration estimate from a few held-out episodes crosses a level by luck long
    before the policy does (four episodes all succeed one time in four at 70 % success),
    and the first crossing is what steps-to-threshold reads; the centred mean pools
    ``window`` iterations' episodes without the lag of a trailing window."""
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1 or window % 2 == 0:
        raise ValueError(f"window must be an odd int >= 1, got {window!r}")
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1:
        raise ValueError(f"values must be 1-d, got shape {v.shape}")
    out = v.copy()
    measured = np.flatnonzero(~np.isnan(v))
    seen, half = v[measured], window // 2
    if half and seen.size:
        sums = np.concatenate([[0.0], np.cumsum(seen)])
        i = np.arange(seen.size)
        lo, hi = np.maximum(i - half, 0), np.minimum(i + half + 1, seen.size)
        out[measured] = (sums[hi] - sums[lo]) / (hi - lo)
    return out


def step_curve(steps: np.ndarray, values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """A run's curve read at ``grid``: the last measured value at or before each point
    (NaN before its first measurement)."""
    s, v = np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)
    keep = ~np.isnan(v)
    s, v = s[keep], v[keep]
    at = np.searchsorted(s, grid, side="right") - 1
    return np.where(at >= 0, v[np.clip(at, 0, None)] if v.size else np.nan, np.nan)


def curve_band(curves: np.ndarray, *, reps: int = 300) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The IQM over runs of ``curves`` [runs, points] (each run read at the same points, NaN
    where it has no value) and its 95 % stratified-bootstrap interval, point by point: NaN
    wherever fewer than half of the runs have a value. Point ``j`` resamples with seed ``j``."""
    m = np.asarray(curves, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"curves: expected a [runs, points] array, got shape {m.shape}")
    mid, low, high = (np.full(m.shape[1], np.nan) for _ in range(3))
    for j in range(m.shape[1]):
        col = m[:, j][~np.isnan(m[:, j])]
        if col.size and col.size * 2 >= m.shape[0]:
            got = stratified_bootstrap(col, iqm, reps=reps, seed=j)
            mid[j], low[j], high[j] = got.estimate, got.low, got.high
    return mid, low, high


def _check(reps: int, confidence: float) -> None:
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")


def _percentiles(values: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = 100 * (1 - confidence) / 2
    method = "linear" if np.isfinite(values).all() else "nearest"  # interpolating to inf gives nan
    low, high = np.percentile(values, [tail, 100 - tail], method=method)
    return float(low), float(high)
