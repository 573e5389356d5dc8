"""The in-process backend (the default): one RolloutWorker, ``rollout.num_envs`` episodes
in flight on its batched engine.

Deterministic: same config, weights and tasks → identical trajectories. ``submit`` only
queues (with a snapshot of the weights, so the learner may update in place meanwhile);
``poll`` plays queued episodes, a policy version at a time — so the async loop runs here
too, just without overlap.

Episodes run with ``torch`` limited to ``rollout_threads`` intra-op threads (restored
afterwards): the manager's per-decision forward passes are tiny, and a thread pool
sized for training makes them several times slower on a busy machine (as in the Ray
actors, which run with one thread).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from gyre_ma.backends.base import TaskLike, coerce_tasks
from gyre_ma.backends.worker import RolloutWorker, Weights
from gyre_ma.roles import Role, RoleTrajectory, RolloutTask


def snapshot(weights: Weights | None) -> dict[str, dict[str, Any]] | None:
    """Detached copies, so later in-place updates of the learner do not leak in."""
    if weights is None:
        return None
    return {part: {k: v.detach().clone() for k, v in sd.items()} for part, sd in weights.items()}


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run a block with ``n`` torch intra-op threads (None: leave as is)."""
    before = torch.get_num_threads()
    if n is not None and n != before:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


class LocalBackend:
    name = "local"

    def __init__(self, config: Any, *, roles: Mapping[str, Role] | None = None,
                 rollout_threads: int | None = 1) -> None:
        if rollout_threads is not None and rollout_threads < 1:
            raise ValueError(f"rollout_threads must be >= 1 or None, got {rollout_threads}")
        self.worker = RolloutWorker(config, worker_id=0, roles=roles)
        self.rollout_threads = rollout_threads
        self._queue: deque[tuple[RolloutTask, int]] = deque()
        self._weights: dict[int, Weights | None] = {}
        self._episodes = 0
        self._env_steps = 0

    def collect(self, weights: Weights | None, version: int, tasks: Sequence[TaskLike]) -> list[RoleTrajectory]:
        """Plays these tasks now; submitted ones stay queued for :meth:`poll`."""
        with torch_threads(self.rollout_threads):
            return self._play(coerce_tasks(tasks), weights, version)

    def submit(self, weights: Weights | None, version: int, tasks: Sequence[TaskLike]) -> None:
        self._weights.setdefault(version, snapshot(weights))
        self._queue.extend((t, version) for t in coerce_tasks(tasks))

    def poll(self, timeout: float | None = 0.0) -> list[RoleTrajectory]:
        """Play queued episodes: all of them (``timeout=None``), or until ``timeout``
        seconds have passed — at least one either way, when any is queued."""
        start, started = time.perf_counter(), 0
        out: list[RoleTrajectory] = []

        def late() -> bool:
            return timeout is not None and time.perf_counter() - start >= timeout

        def stop() -> bool:
            """Asked before each new episode: once late, no more start (but the first always does)."""
            nonlocal started
            if started and late():
                return True
            started += 1
            return False

        with torch_threads(self.rollout_threads):
            while self._queue and not (started and late()):
                version = self._queue[0][1]
                tasks = []
                while self._queue and self._queue[0][1] == version:
                    tasks.append(self._queue.popleft()[0])
                results = self._play(tasks, self._weights[version], version, stop=stop)
                self._queue.extendleft(reversed([(t, version) for t, r in zip(tasks, results, strict=True)
                                                 if r is None]))
                out += [r for r in results if r is not None]
        live = {v for _, v in self._queue}
        self._weights = {v: w for v, w in self._weights.items() if v in live}
        return out

    @property
    def pending(self) -> int:
        return len(self._queue)

    def _play(self, tasks: list[RolloutTask], weights: Weights | None, version: int, *,
              stop: Callable[[], bool] | None = None) -> list[RoleTrajectory | None]:
        """Each task's trajectory, or None where ``stop`` kept it from starting."""
        results = self.worker.run_many(tasks, weights, version, stop=stop)
        for traj in results:
            if traj is not None:
                self._episodes += 1
                self._env_steps += traj.length
        return results

    def stats(self) -> dict[str, float]:
        return {"backend/episodes": float(self._episodes), "backend/env_steps": float(self._env_steps),
                "backend/pending": float(len(self._queue))}

    def close(self) -> None:
        self._queue.clear()
        self._weights.clear()
