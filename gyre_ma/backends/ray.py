"""The Ray backend: rollout workers as Ray actors, restarted on failure.

* Weights go out through the object store: one ``ray.put`` per policy version; each
  actor fetches a version once and caches it.
* One call to an actor plays a *chunk* of up to ``episodes_per_call`` episodes (fewer
  as the queue runs low, so no actor is left with a long tail); up to
  ``pipeline_depth`` calls are queued on it, so the next starts the moment one ends
  instead of after a round trip to the driver. Chunks divide the driver's per-call cost
  (submission, ``ray.wait``, result bookkeeping) over their episodes.
* An actor plays a chunk on its batched engine, ``rollout.num_envs`` episodes in flight.
  When an episode raises inside the actor (an env or option fault), the others play on;
  the actor returns the chunk's finished episodes and the faults; the actor is restarted
  (``ray.kill(..., no_restart=False)``; Ray re-runs its constructor, within
  ``max_restarts``) and the faulty episode re-issued whole, up to ``max_attempts`` times.
  When the actor process dies, Ray restarts it by itself; which episode of a chunk was
  playing is unknown, so the chunk's episodes go back one per call (the next death
  names its episode). Calls queued behind a fault are requeued as they were (they did
  not fault; ``backend/requeued``).
* A hanging call is bounded by ``sample_timeout_s`` (``ray.wait(..., timeout=...)``),
  counted from when it could start (its predecessor on the actor ended): its actor is
  killed and replaced by a fresh one, its episodes re-issued as for a death.
* Calls use ``max_task_retries=0``: the backend, not Ray, decides what is re-issued, so
  no episode is ever returned in part or twice.

``ray`` is imported here only, and ``ray.init`` runs only when this backend is built
(and only if Ray is not initialised already; then :meth:`RayBackend.close` shuts it down),
through :func:`~gyre_ma.backends.ray_start.start_ray`: a private Ray instance unless
``backend.ray_init.address`` (or ``RAY_ADDRESS``) names a cluster.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
import warnings
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
import torch

from gyre_ma.backends.base import TaskLike, coerce_tasks
from gyre_ma.backends.engine import EpisodeFault
from gyre_ma.backends.ray_start import start_ray
from gyre_ma.backends.worker import RolloutWorker, Weights
from gyre_ma.options.errors import UserCodeError
from gyre_ma.roles import ROLES, Role, RoleTrajectory, RolloutTask

_IN_ORDER_WAIT_S = 5.0
"""How long a ready call waits for its actor's earlier calls to report (see ``_in_actor_order``)."""

WORKER_ID_ENV = "GYRE_MA_WORKER_ID"
"""Set in each actor's process to its worker index (fault injection and logs read it)."""


class RolloutActor:
    """A :class:`RolloutWorker` in its own process. Its calls run on the process's main
    thread, one at a time: the watchdog (:mod:`gyre_ma.watchdog`) interrupts a stuck
    sub-policy with a signal, which only the main thread receives. Giving the actor a
    concurrency group (or ``max_concurrency``) moves every call off that thread and
    leaves a stuck option running until the sample timeout; :meth:`info` reports where
    calls run (``main_thread``)."""

    def __init__(self, config: Any, worker_id: int, roles: Mapping[str, Role] | None) -> None:
        os.environ[WORKER_ID_ENV] = str(worker_id)
        torch.set_num_threads(1)
        self.incarnation = uuid.uuid4().hex
        """New on every (re)start: tells a restarted actor from the one that was killed."""
        self.worker = RolloutWorker(config, worker_id=worker_id, roles=roles)

    def run(self, box: list[Any], version: int,
            tasks: list[RolloutTask]) -> tuple[list[tuple[int, RoleTrajectory]], list[tuple[int, str, bool]]]:
        """Play ``tasks`` on the batched engine: the trajectories that finished and the
        faults of those that raised, each with its index in ``tasks`` (a fault costs only
        its own episode; the others play on) and, for a fault, whether the user's code
        raised it (:class:`UserCodeError`: its one line names the callable and file:line).
        ``box`` holds the weights' ObjectRef (boxed so Ray does not fetch it per call)."""
        ref = box[0]
        weights = None if ref is None or version == self.worker.kit.version else ray.get(ref)
        done, faults = [], []
        for i, result in enumerate(self.worker.run_many(tasks, weights, version, faults="collect")):
            if isinstance(result, EpisodeFault):
                user = isinstance(result.error, UserCodeError)
                text = str(result.error) if user else f"{type(result.error).__name__}: {_last_line(result.error)}"
                faults.append((i, text, user))
            else:
                done.append((i, result))
        return done, faults

    def info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "worker_id": self.worker.worker_id, "incarnation": self.incarnation,
                "main_thread": threading.current_thread() is threading.main_thread()}


@dataclass
class _Job:
    task: RolloutTask
    version: int
    order: int
    attempts: int = 0
    errors: list[str] = field(default_factory=list)
    solo: bool = False
    """Play in a chunk of its own (after a chunk it was in died or hung, so the next
    failure names its episode)."""


@dataclass
class _Slot:
    index: int
    role: str | None
    """The role this actor plays; None: any role."""
    actor: Any
    restarts: int = 0
    """Restarts of the current actor (Ray's ``max_restarts`` budget)."""
    starting: Any = None
    """While the actor (re)starts: the ObjectRef of its readiness ping; no episode goes
    to it until that resolves (calls to a restarting actor would fail)."""
    since: float = 0.0
    """When the current start began (for ``startup_timeout_s``)."""
    incarnation: str | None = None
    """The running actor instance's id, from its readiness ping."""
    killed: str | None = None
    """The incarnation we asked Ray to restart: a ping answered by it (``ray.kill`` is
    asynchronous) does not count as the restarted actor being ready."""
    queued: deque[Any] = field(default_factory=deque)
    """ObjectRefs of the calls sent to this actor, oldest (the one playing) first."""
    head_since: float = 0.0
    """When the oldest queued call could start: the sample timeout counts from here."""


class RayBackend:
    name = "ray"

    def __init__(self, config: Any, *, workers: int | Mapping[str, int] = 2, max_restarts: int = 3,
                 max_attempts: int = 3, sample_timeout_s: float = 600.0, startup_timeout_s: float = 120.0,
                 cpus_per_worker: float = 1.0, roles: Mapping[str, Role] | None = None,
                 init: Mapping[str, Any] | None = None, pipeline_depth: int = 2,
                 episodes_per_call: int = 32) -> None:
        """``workers``: a number of actors that play any role, or actors per role
        (``{"explorer": 1, "executor": 2}``). ``init``: keyword arguments for ``ray.init``.
        ``pipeline_depth``: calls queued on one actor at a time (1: none waits).
        ``episodes_per_call``: the most episodes one call plays (a chunk)."""
        counts = {None: workers} if isinstance(workers, int) else dict(workers)
        unknown = [r for r in counts if r is not None and r not in ROLES]
        if unknown:
            raise ValueError(f"workers: unknown roles {unknown}; expected some of {list(ROLES)}")
        if any(n < 0 for n in counts.values()) or sum(counts.values()) < 1:
            raise ValueError(f"workers: need at least one actor and no negative counts, got {workers!r}")
        if (max_restarts < 0 or max_attempts < 1 or sample_timeout_s <= 0 or startup_timeout_s < 0
                or pipeline_depth < 1 or episodes_per_call < 1):
            raise ValueError(f"need max_restarts >= 0, max_attempts >= 1, sample_timeout_s > 0, "
                             f"startup_timeout_s >= 0, pipeline_depth >= 1 and episodes_per_call >= 1; got "
                             f"{max_restarts}, {max_attempts}, {sample_timeout_s}, {startup_timeout_s}, "
                             f"{pipeline_depth}, {episodes_per_call}")
        self.pipeline_depth, self.episodes_per_call = pipeline_depth, episodes_per_call
        self.config, self.roles = config, roles
        self.max_restarts, self.max_attempts = max_restarts, max_attempts
        self.sample_timeout_s, self.startup_timeout_s = sample_timeout_s, startup_timeout_s
        self.cpus_per_worker = cpus_per_worker
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            start_ray(init, include_dashboard=False)
        self._warn_short_of_cpus(sum(counts.values()))
        self._actor_class = ray.remote(RolloutActor)
        self._slots: list[_Slot] = []
        for role, n in counts.items():
            for _ in range(n):
                index = len(self._slots)
                slot = _Slot(index, role, self._spawn(index))
                self._await_start(slot)
                self._slots.append(slot)
        self._queue: deque[_Job] = deque()
        self._inflight: dict[Any, tuple[list[_Job], _Slot]] = {}
        self._weights: dict[int, Any] = {}
        self._order = 0
        self._stash: list[RoleTrajectory] = []
        self._counts = dict.fromkeys(("episodes", "env_steps", "restarts", "timeouts", "reissued", "requeued",
                                      "replaced"), 0)

    # ---------------------------------------------------------------- public
    def collect(self, weights: Weights | None, version: int, tasks: Sequence[TaskLike]) -> list[RoleTrajectory]:
        """Blocks until these tasks are done; earlier submitted work keeps running, and what
        of it finishes meanwhile is kept for the next :meth:`poll`."""
        first = self._order
        self.submit(weights, version, tasks)
        mine: dict[int, RoleTrajectory] = {}
        while len(mine) < self._order - first:
            if not self._queue and not self._inflight:
                raise RuntimeError(f"collect: {self._order - first - len(mine)} episodes were lost")
            for order, traj in self._poll(self.sample_timeout_s):
                if order >= first:
                    mine[order] = traj
                else:
                    self._stash.append(traj)
        return [mine[o] for o in sorted(mine)]

    def submit(self, weights: Weights | None, version: int, tasks: Sequence[TaskLike]) -> None:
        jobs = coerce_tasks(tasks)
        for job in jobs:
            if not any(s.role in (None, job.role) for s in self._slots):
                raise ValueError(f"no Ray worker plays role {job.role!r}; workers per role: "
                                 f"{self._roles_summary()}")
        if version not in self._weights:
            self._weights[version] = None if weights is None else ray.put(weights)
        for task in jobs:
            self._queue.append(_Job(task, version, self._order))
            self._order += 1
        self._dispatch()

    def wait_ready(self) -> None:
        """Block until every actor has answered its readiness ping (after a start or a
        restart); bounded by ``startup_timeout_s``. Work already submitted keeps running."""
        while True:
            starting = {s.starting: s for s in self._slots if s.starting is not None}
            if not starting:
                return
            ready, _ = ray.wait(list(starting), num_returns=len(starting), timeout=1.0)
            for ref in ready:
                self._started(starting[ref], ref)
            self._expire()

    def poll(self, timeout: float | None = 0.0) -> list[RoleTrajectory]:
        stash, self._stash = self._stash, []
        return stash + [t for _, t in self._poll(0.0 if stash and timeout is not None else timeout)]

    @property
    def pending(self) -> int:
        return len(self._queue) + len(self._inflight) + len(self._stash)

    def stats(self) -> dict[str, float]:
        return {f"backend/{k}": float(v) for k, v in self._counts.items()} | {"backend/pending": float(self.pending)}

    def actor_info(self) -> list[dict[str, Any]]:
        """Each actor's pid and worker index (for tests and logs)."""
        return ray.get([s.actor.info.options(max_task_retries=-1).remote() for s in self._slots])

    def close(self) -> None:
        for slot in self._slots:
            ray.kill(slot.actor, no_restart=True)
        self._slots.clear()
        self._queue.clear()
        self._inflight.clear()
        self._stash.clear()
        self._weights.clear()
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()

    def __enter__(self) -> RayBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- machinery
    def _warn_short_of_cpus(self, workers: int) -> None:
        """Say so where the cluster cannot run every worker at once: the others wait to
        start, and a run long enough stops at ``startup_timeout_s``."""
        cpus = ray.cluster_resources().get("CPU", 0)
        need = workers * self.cpus_per_worker
        if need > cpus:
            warnings.warn(f"backend.workers={workers} × backend.cpus_per_worker={self.cpus_per_worker:g} needs "
                          f"{need:g} CPUs and the Ray cluster has {cpus:g}: {int(cpus // self.cpus_per_worker)} "
                          f"worker(s) can run at once, the others wait to start (past backend.startup_timeout_s="
                          f"{self.startup_timeout_s:g} s the run stops); lower backend.workers", RuntimeWarning,
                          stacklevel=3)

    def _spawn(self, index: int) -> Any:
        options = {"max_restarts": self.max_restarts, "max_task_retries": 0, "num_cpus": self.cpus_per_worker}
        return self._actor_class.options(**options).remote(self.config, index, self.roles)

    def _roles_summary(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self._slots:
            out[s.role or "any"] = out.get(s.role or "any", 0) + 1
        return out

    def _await_start(self, slot: _Slot) -> None:
        """Ping the actor, retried through its restart; it takes work once the ping returns."""
        slot.starting = slot.actor.info.options(max_task_retries=-1).remote()
        slot.since = time.monotonic()

    def _dispatch(self) -> None:
        """Fill every ready actor up to ``pipeline_depth`` calls, shallowest first (so work
        spreads over the actors before any queues a second call)."""
        waiting: deque[_Job] = deque()
        while self._queue:
            room = [s for s in self._slots if s.starting is None and len(s.queued) < self.pipeline_depth]
            if not room:
                break
            job = self._queue.popleft()
            fits = [s for s in room if s.role in (None, job.task.role)]
            if not fits:
                waiting.append(job)
                continue
            slot = min(fits, key=lambda s: (len(s.queued), s.role is None, s.index))
            jobs = [job] + self._chunk_after(job, slot)
            ref = slot.actor.run.remote([self._weights[job.version]], job.version, [j.task for j in jobs])
            if not slot.queued:
                slot.head_since = time.monotonic()
            slot.queued.append(ref)
            self._inflight[ref] = (jobs, slot)
        self._queue.extendleft(reversed(waiting))
        live = {job.version for job in self._queue} | {j.version for jobs, _ in self._inflight.values() for j in jobs}
        latest = max(self._weights, default=None)
        self._weights = {v: r for v, r in self._weights.items() if v in live or v == latest}

    def _chunk_after(self, job: _Job, slot: _Slot) -> list[_Job]:
        """Jobs from the head of the queue to play in one call after ``job``: same policy
        version, a role the actor plays, none marked solo; at most ``episodes_per_call``
        in all, and no more than an even share of the queue among the actors taking a call
        at ``slot``'s depth (the idle ones, at the start of a batch) or still starting, so
        that the actors finish together. A batch of 64 on two idle actors is two calls of
        32, not four of 16: a call's episodes refill its actor's ``rollout.num_envs`` slots,
        where calls of 16 each ran down to a tail of a few episodes in flight (a narrow
        batch). An actor still starting keeps its share in the queue, so the first ready
        actor does not take the whole first batch."""
        depth = len(slot.queued)
        takers = sum(1 for s in self._slots if s.role in (None, job.task.role)
                     and (s.starting is not None or len(s.queued) <= depth))
        share = -(-(len(self._queue) + 1) // max(takers, 1))
        n = min(self.episodes_per_call, share) - 1
        more: list[_Job] = []
        while not job.solo and len(more) < n and self._queue:
            nxt = self._queue[0]
            if nxt.solo or nxt.version != job.version or slot.role not in (None, nxt.task.role):
                break
            more.append(self._queue.popleft())
        return more

    def _poll(self, timeout: float | None) -> list[tuple[int, RoleTrajectory]]:
        end = None if timeout is None else time.monotonic() + timeout
        out: list[tuple[int, RoleTrajectory]] = []
        while True:
            self._dispatch()
            starting = {s.starting: s for s in self._slots if s.starting is not None}
            if not self._inflight and not (self._queue and starting):
                break
            now = time.monotonic()
            deadlines = [s.head_since + self.sample_timeout_s for s in self._slots if s.queued]
            deadlines += [s.since + self.startup_timeout_s for s in starting.values()]
            wait = max(0.0, min(deadlines) - now)
            if end is not None:
                wait = min(wait, max(0.0, end - now))
            refs = [*self._inflight, *starting]
            ready, _ = ray.wait(refs, num_returns=1, timeout=wait)
            if ready:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            ready = self._in_actor_order(ready)
            for ref in ready:
                if ref in starting:
                    self._started(starting[ref], ref)
                else:
                    self._finish(ref, out)
            self._expire()
            if end is not None and (out or time.monotonic() >= end):
                break
        self._dispatch()
        return out

    def _in_actor_order(self, ready: list[Any]) -> list[Any]:
        """The ready refs, each actor's calls in the order it plays them, and only those
        whose predecessors on the actor are ready too. When an actor dies, every call
        queued on it fails, and the failure belongs to the one it was playing (the head);
        the failures reach the driver one by one, so a call queued behind the head can be
        ready first. A healthy actor ends its calls in order, so a ready call's
        predecessors are ready or about to be: they are waited for (briefly), and a call
        whose head is still not ready stays in flight for the next round."""
        ready_set = set(ready)
        out = [ref for ref in ready if ref not in self._inflight]  # actor start pings
        for slot in self._slots:
            queued = list(slot.queued)
            last = max((i for i, r in enumerate(queued) if r in ready_set), default=-1)
            missing = [r for r in queued[:last] if r not in ready_set]
            if missing:
                done, _ = ray.wait(missing, num_returns=len(missing), timeout=_IN_ORDER_WAIT_S)
                ready_set.update(done)
            for ref in queued:
                if ref not in ready_set:
                    break
                out.append(ref)
        return out

    def _finish(self, ref: Any, out: list[tuple[int, RoleTrajectory]]) -> None:
        if ref not in self._inflight:  # requeued when its actor faulted earlier in this batch
            return
        jobs, slot = self._inflight.pop(ref)
        slot.queued.remove(ref)
        slot.head_since = time.monotonic()
        try:
            done, faults = ray.get(ref)
        except ray.exceptions.RayError as exc:
            # the process died (Ray restarts it within max_restarts), or the call itself failed
            self._fault(slot, kill=not isinstance(exc, ray.exceptions.RayActorError))
            self._reissue_unknown(jobs, f"{type(exc).__name__}: {_last_line(exc)}")
            return
        for i, traj in done:
            self._counts["episodes"] += 1
            self._counts["env_steps"] += traj.length
            out.append((jobs[i].order, traj))
        if faults:  # episodes raised inside the actor; the others of the chunk played on
            self._fault(slot, kill=True)
            for i, error, user in reversed(faults):
                self._reissue(jobs[i], error, user=user)

    def _fault(self, slot: _Slot, *, kill: bool) -> None:
        """Restart (or, past ``max_restarts``, replace) a faulty actor; requeue what was queued on it."""
        self._requeue_behind(slot)
        self._counts["restarts"] += 1
        slot.restarts += 1
        if slot.restarts > self.max_restarts:
            self._replace(slot)
        else:
            if kill:
                slot.killed = slot.incarnation
                ray.kill(slot.actor, no_restart=False)
            self._await_start(slot)

    def _started(self, slot: _Slot, ref: Any) -> None:
        try:
            info = ray.get(ref)
        except ray.exceptions.RayError as exc:
            raise RuntimeError(f"Ray rollout worker {slot.index} failed to start: {exc}") from None
        if info["incarnation"] == slot.killed:  # the old instance answered before the kill landed
            slot.starting = slot.actor.info.options(max_task_retries=-1).remote()
            return
        slot.starting, slot.incarnation, slot.killed = None, info["incarnation"], None

    def _expire(self) -> None:
        now = time.monotonic()
        for slot in self._slots:
            if slot.starting is not None and now >= slot.since + self.startup_timeout_s:
                cpus = ray.cluster_resources().get("CPU", 0)
                raise RuntimeError(
                    f"Ray rollout worker {slot.index} did not start within backend.startup_timeout_s="
                    f"{self.startup_timeout_s:g} s; does the cluster have {self.cpus_per_worker:g} CPU(s) "
                    f"free per worker ({len(self._slots)} workers, cluster: {cpus:g} CPUs), or does loading its "
                    "model take longer (raise backend.startup_timeout_s)?"
                )
        for slot in self._slots:
            if slot.queued and now >= slot.head_since + self.sample_timeout_s:
                jobs, _ = self._inflight.pop(slot.queued.popleft())
                self._requeue_behind(slot)
                self._counts["timeouts"] += 1
                self._replace(slot)
                self._reissue_unknown(jobs, f"no result within the sample timeout of {self.sample_timeout_s:g} s")

    def _requeue_behind(self, slot: _Slot) -> None:
        """The episodes still queued on an actor that is going away go back to the queue
        unchanged (no attempt spent): they did not fault, and are never returned in part."""
        jobs = [job for ref in slot.queued for job in self._inflight.pop(ref)[0]]
        slot.queued.clear()
        self._counts["requeued"] += len(jobs)
        self._queue.extendleft(sorted(jobs, key=lambda j: j.order, reverse=True))

    def _replace(self, slot: _Slot) -> None:
        """Kill the actor for good (its partial episode is lost with it) and start a fresh one."""
        ray.kill(slot.actor, no_restart=True)
        slot.actor = self._spawn(slot.index)
        slot.restarts, slot.incarnation, slot.killed = 0, None, None
        self._await_start(slot)
        self._counts["replaced"] += 1

    def _reissue_unknown(self, jobs: list[_Job], error: str) -> None:
        """A call died or hung without saying which of its episodes was playing: a lone
        episode is re-issued (one attempt spent); a chunk's episodes go back one per call,
        no attempt spent, so that a repeat failure names its episode (the error is kept
        on each, for the report should one fail for good)."""
        if len(jobs) == 1:
            self._reissue(jobs[0], error)
            return
        for job in jobs:
            job.solo = True
            job.errors.append(f"{error} (in a call of {len(jobs)} episodes)")
        self._counts["reissued"] += len(jobs)
        self._queue.extendleft(reversed(jobs))

    def _reissue(self, job: _Job, error: str, *, user: bool = False) -> None:
        """Re-issue a faulty episode, or raise once it failed ``max_attempts`` times: a
        ValueError with the user's error line when their code raised it last (a user error,
        exit 2 on the CLI), else a RuntimeError with every attempt's error."""
        job.attempts += 1
        job.errors.append(error)
        if job.attempts >= self.max_attempts:
            if user:
                raise ValueError(f"{error} (episode {job.task} on a Ray worker, {job.attempts} attempts)")
            raise RuntimeError(
                f"episode {job.task} failed {job.attempts} times (max_attempts={self.max_attempts}); "
                f"errors: {job.errors}"
            )
        self._counts["reissued"] += 1
        self._queue.appendleft(job)


def _last_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[-1] if text else ""
