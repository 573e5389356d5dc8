"""The rollout backend interface: where episodes are played, behind one Protocol.

A backend plays :class:`~gyre_ma.roles.RolloutTask` s with given policy weights
and returns whole :class:`~gyre_ma.roles.RoleTrajectory` s, each carrying the
policy version that produced it. Synchronous use is :meth:`Backend.collect`; the async
loop :meth:`~Backend.submit` s work and :meth:`~Backend.poll` s finished episodes while
the learner updates — tasks are bound to the weights they were submitted with, and
:func:`gyre_ma.staleness.filter_stale` bounds how old accepted data may be.

A failed or hung episode is never returned in part: it is re-issued whole, or the
backend raises after ``max_attempts``.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from gyre_ma.backends.worker import Weights
from gyre_ma.roles import RoleTrajectory, RolloutTask

TaskLike = RolloutTask | tuple[str, int] | tuple[str, int, int]

BACKENDS: dict[str, str] = {
    "local": "gyre_ma.backends.local:LocalBackend",
    "ray": "gyre_ma.backends.ray:RayBackend",
}
"""Backend name → ``module:class``; the module is imported only when chosen (ray stays
unimported unless the Ray backend is)."""


@runtime_checkable
class Backend(Protocol):
    name: str

    def collect(self, weights: Weights | None, version: int, tasks: Sequence[TaskLike]) -> list[RoleTrajectory]:
        """Play every task with these weights; return their trajectories in task order.
        Work submitted earlier is not returned here; it stays for :meth:`poll`."""
        ...

    def submit(self, weights: Weights | None, version: int, tasks: Sequence[TaskLike]) -> None:
        """Queue tasks bound to these weights; return at once."""
        ...

    def poll(self, timeout: float | None = 0.0) -> list[RoleTrajectory]:
        """Finished trajectories so far. Waits up to ``timeout`` seconds for at least one
        (``None``: until everything submitted is done; ``0``: no waiting)."""
        ...

    @property
    def pending(self) -> int:
        """Tasks submitted and not yet returned."""
        ...

    def stats(self) -> dict[str, float]:
        """Counters for logging (episodes, restarts, timeouts, re-issued episodes)."""
        ...

    def close(self) -> None: ...


def make_backend(name: str, config: Any, **options: Any) -> Backend:
    """Build the backend called ``name`` for an ExperimentConfig; ``options`` go to its
    constructor (e.g. ``workers=2, sample_timeout_s=300`` for ``ray``)."""
    if name not in BACKENDS:
        raise ValueError(f"backend: unknown backend {name!r}; expected one of {sorted(BACKENDS)}")
    module, cls = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)(config, **options)


def coerce_tasks(tasks: Sequence[TaskLike]) -> list[RolloutTask]:
    return [RolloutTask.coerce(t) for t in tasks]
