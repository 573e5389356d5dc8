"""The staleness bound of asynchronous rollouts, as one pure function.

Rollouts may run ahead of the learner, but data produced by a policy more than
``max_staleness`` versions behind the current one is dropped (and counted): the PPO
ratio against its behaviour log-prob would be clipped flat, and its advantages were
scored for a policy the learner has left.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar


class Versioned(Protocol):
    policy_version: int


T = TypeVar("T", bound=Versioned)


def filter_stale(items: Iterable[T], *, current_version: int, max_staleness: int) -> tuple[list[T], int]:
    """Keep items with ``current_version − item.policy_version ≤ max_staleness``.

    Returns ``(kept, dropped)``: the kept items in their input order and how many were
    dropped. An item from a version after ``current_version`` cannot exist and is a
    ValueError, as is a negative ``max_staleness``.
    """
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    kept: list[T] = []
    dropped = 0
    for item in items:
        age = current_version - item.policy_version
        if age < 0:
            raise ValueError(f"data from policy version {item.policy_version} is newer than the "
                             f"current version {current_version}")
        if age <= max_staleness:
            kept.append(item)
        else:
            dropped += 1
    return kept, dropped


def fresh_with_metrics(items: Iterable[T], *, current_version: int,
                       max_staleness: int) -> tuple[list[T], dict[str, float]]:
    """:func:`filter_stale`, with ``staleness/dropped`` (items dropped) and ``staleness/lag``
    (mean age in policy versions of those kept) as metrics."""
    kept, dropped = filter_stale(items, current_version=current_version, max_staleness=max_staleness)
    lag = sum(current_version - item.policy_version for item in kept) / len(kept) if kept else 0.0
    return kept, {"staleness/dropped": float(dropped), "staleness/lag": float(lag)}
