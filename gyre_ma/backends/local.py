"""The in-process backend (the default): one RolloutWorker, episodes played in order.

Deterministic: same config, weights and tasks → identical trajectories. ``submit`` only
queues (with a snapshot of the weights, so the learner may update in place meanwhile);
``poll`` plays queued episodes — so the async loop runs here too, just without overlap.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from gyre_ma.agents.roles import Role, RolloutTask, RolloutWorker, RoleTrajectory, Weights
from gyre_ma.backends.base import TaskLike, coerce_tasks


def snapshot(weights: Weights | None) -> dict[str, dict[str, Any]] | None:
    """Detached copies, so later in-place updates of the learner do not leak in."""
    if weights is None:
        return None
    return {part: {k: v.detach().clone() for k, v in sd.items()} for part, sd in weights.items()}


class LocalBackend:
    name = "local"

    def __init__(self, config: Any, *, roles: Mapping[str, Role] | None = None) -> None:
        self.worker = RolloutWorker(config, worker_id=0, roles=roles)
        self._queue: deque[tuple[RolloutTask, int]] = deque()
        self._weights: dict[int, Weights | None] = {}
        self._episodes = 0
        self._env_steps = 0

    def collect(self, weights: Weights | None, version: int, tasks: Sequence[TaskLike]) -> list[RoleTrajectory]:
        """Plays these tasks now; submitted ones stay queued for :meth:`poll`."""
        return [self._play(t, weights, version) for t in coerce_tasks(tasks)]

    def submit(self, weights: Weights | None, version: int, tasks: Sequence[TaskLike]) -> None:
        self._weights.setdefault(version, snapshot(weights))
        self._queue.extend((t, version) for t in coerce_tasks(tasks))

    def poll(self, timeout: float | None = 0.0) -> list[RoleTrajectory]:
        """Play queued episodes: all of them (``timeout=None``), or until ``timeout``
        seconds have passed — at least one either way, when any is queued."""
        start = time.perf_counter()
        out = []
        while self._queue:
            task, version = self._queue.popleft()
            out.append(self._play(task, self._weights[version], version))
            if timeout is not None and time.perf_counter() - start >= timeout:
                break
        live = {v for _, v in self._queue}
        self._weights = {v: w for v, w in self._weights.items() if v in live}
        return out

    @property
    def pending(self) -> int:
        return len(self._queue)

    def _play(self, task: RolloutTask, weights: Weights | None, version: int) -> RoleTrajectory:
        traj = self.worker.run(task, weights, version)
        self._episodes += 1
        self._env_steps += traj.length
        return traj

    def stats(self) -> dict[str, float]:
        return {"backend/episodes": float(self._episodes), "backend/env_steps": float(self._env_steps),
                "backend/pending": float(len(self._queue))}

    def close(self) -> None:
        self._queue.clear()
        self._weights.clear()
