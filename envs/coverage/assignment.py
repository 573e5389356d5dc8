"""Assigning agents to landmarks: the bottleneck (min makespan) and min total cost.

``cost[a, k]`` is the number of steps agent ``a`` needs to reach landmark ``k``; ``inf``
marks a pair that may not be assigned. The layout generator asks :func:`bottleneck` (is
this layout solvable in time?), the oracle asks :func:`assign`. The min-total step uses
SciPy's Hungarian solver (``linear_sum_assignment``) when SciPy is installed, else brute
force over permutations (up to ``BRUTE_FORCE_LIMIT`` pairs).
"""

from __future__ import annotations

import itertools

import numpy as np

try:
    from scipy.optimize import linear_sum_assignment
except ImportError:  # SciPy is optional: small problems are solved by brute force
    linear_sum_assignment = None

OBJECTIVES = ("makespan", "total")
"""``makespan``: minimise the largest cost, then the total; ``total``: minimise the total."""
BRUTE_FORCE_LIMIT = 6
"""The most pairs solved by enumerating permutations when SciPy is missing."""


def matching_size(allowed: np.ndarray) -> int:
    """Size of a maximum matching of rows to columns over the ``allowed`` pairs (Kuhn)."""
    n_rows, n_cols = allowed.shape
    match_of_col = [-1] * n_cols
    options = [np.flatnonzero(allowed[r]).tolist() for r in range(n_rows)]

    def augment(r: int, seen: list[bool]) -> bool:
        for c in options[r]:
            if not seen[c]:
                seen[c] = True
                if match_of_col[c] < 0 or augment(match_of_col[c], seen):
                    match_of_col[c] = r
                    return True
        return False

    return sum(augment(r, [False] * n_cols) for r in range(n_rows))


def bottleneck(cost: np.ndarray) -> float:
    """The smallest ``t`` such that pairs with ``cost <= t`` match as many rows as all the
    finite pairs do: the optimal makespan of a maximum assignment (0 when no pair is
    finite). Whether that assignment is complete is :func:`matching_size`'s to say."""
    cost = np.asarray(cost, dtype=float)
    if cost.ndim != 2:
        raise ValueError(f"bottleneck: cost must be a 2-d matrix, got shape {cost.shape}")
    finite = np.isfinite(cost)
    if not finite.any():
        return 0.0
    best = matching_size(finite)
    values = np.unique(cost[finite])
    lo, hi = 0, len(values) - 1
    while lo < hi:  # the matching size only grows with the threshold: binary search
        mid = (lo + hi) // 2
        if matching_size(cost <= values[mid]) == best:
            hi = mid
        else:
            lo = mid + 1
    return float(values[lo])


def assign(cost: np.ndarray, *, objective: str = "makespan", floor: float = 0.0) -> list[tuple[int, int]]:
    """Row → column pairs of a maximum-cardinality assignment over the finite pairs, sorted
    by row, minimising ``objective``. ``floor`` is a makespan already committed elsewhere
    (agents mid-route): with ``makespan``, pairs up to ``max(floor, bottleneck)`` are all
    equally good and the total decides among them."""
    if objective not in OBJECTIVES:
        raise ValueError(f"assign: objective must be one of {list(OBJECTIVES)}, got {objective!r}")
    cost = np.asarray(cost, dtype=float)
    if cost.ndim != 2:
        raise ValueError(f"assign: cost must be a 2-d matrix, got shape {cost.shape}")
    allowed = np.isfinite(cost)
    if not allowed.any():
        return []
    if objective == "makespan":
        allowed &= cost <= max(float(floor), bottleneck(cost))
    return _min_total(cost, allowed)


def _min_total(cost: np.ndarray, allowed: np.ndarray) -> list[tuple[int, int]]:
    """A maximum-cardinality matching over ``allowed`` pairs with the least total cost."""
    big = float(cost[allowed].sum()) + 1.0  # one forbidden pair costs more than all allowed ones
    masked = np.where(allowed, cost, big)
    if linear_sum_assignment is not None:
        rows, cols = linear_sum_assignment(masked)
        return [(int(r), int(c)) for r, c in zip(rows, cols, strict=True) if allowed[r, c]]
    n_rows, n_cols = cost.shape
    if min(n_rows, n_cols) > BRUTE_FORCE_LIMIT:
        raise RuntimeError(
            f"assign: a {n_rows}x{n_cols} assignment needs SciPy (pip install scipy); without it "
            f"brute force handles at most {BRUTE_FORCE_LIMIT} pairs"
        )
    transpose = n_rows > n_cols
    m = masked.T if transpose else masked
    best, best_total = None, float("inf")
    for cols in itertools.permutations(range(m.shape[1]), m.shape[0]):
        total = float(m[range(m.shape[0]), cols].sum())
        if total < best_total:
            best, best_total = cols, total
    pairs = [(c, r) if transpose else (r, c) for r, c in enumerate(best)]
    return sorted((r, c) for r, c in pairs if allowed[r, c])
