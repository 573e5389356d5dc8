"""The batched rollout engine: many episodes in flight per worker, one batched decision
per round.

A worker (the local process or a Ray actor) keeps up to ``rollout.num_envs`` episodes in
flight, one per *slot* (an env instance of its own). Each episode is a coroutine
(:func:`gyre_ma.rollout.play_episode`) that runs its env until one of its agents needs
a decision and yields that :class:`~gyre_ma.options.decision.Decision`. Each round, the
engine takes the pending decision of every slot, decides them all in one call of the
slot's deciders (for the learned manager one batched forward pass, each row with its
episode's own parameter noise, sampling generator and greedy memory), and sends each
episode its choice; it runs on to its next decision. A finished episode's slot takes the
next task until the worker's tasks are played.

The decisions of one env's agents stay one after another (each agent sees what the
others just chose), so a round holds at most one decision per env; the envs advance
between decisions on their own, so every round is as wide as the envs in flight, not
only those that happened to reach a decision on the same primitive step.

Semantics are those of one episode at a time: each episode's task seed, manager seed,
noise and policy version are its own, and its trajectory is what
:func:`~gyre_ma.rollout.run_episode` would return up to float round-off of the batched
forward pass; for a given (seed, ``num_envs``) the results are identical run to run.
Each slot has an env of its own, so an option must act on the env it is given
(``ctx.env``), never on one its library's factory saw: that one is slot 0's.

An episode whose agents run LLM-backed options (:mod:`gyre_ma.llm.option`) yields their
model requests instead, all agents of a step together; a round answers the requests of
every env in flight with one engine call per model and operation, beside the batched
decisions of the others.

Python's garbage collector is paused while a worker plays: the trajectories being built
are hundreds of thousands of young objects, and the full collections they set off took
8 % of a flat rollout's time, for nothing (an episode's records hold no reference
cycles; what cycles a fault's traceback makes are collected once the play ends).

A fault (an exception in an env or a user's option) costs only its own episode: with
``faults="collect"`` the engine records it (:class:`EpisodeFault`), drops that slot's
env and goes on with the others; with ``faults="raise"`` it raises at once.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from gyre_ma.options.decision import Choice, Decision
from gyre_ma.options.errors import UserCodeError

if TYPE_CHECKING:
    from gyre_ma.backends.worker import RolloutKit
    from gyre_ma.roles import Role, RoleTrajectory, RolloutTask


@dataclass
class EpisodeFault:
    """An episode that raised: the index of its task and the exception."""

    index: int
    error: BaseException


@dataclass
class _InFlight:
    index: int
    task: RolloutTask
    role: Role
    play: Generator[Decision, Choice, Any]
    decision: Decision | None
    """The decision it waits on (None before its first)."""
    started: float


def play_many(kit: RolloutKit, tasks: Sequence[RolloutTask], version: int, *, roles: dict[str, Role],
              worker: int = -1, stop: Callable[[], bool] | None = None,
              faults: Literal["raise", "collect"] = "raise") -> list[RoleTrajectory | EpisodeFault | None]:
    """Play ``tasks`` with ``kit``'s weights for ``version``, up to ``kit.num_envs`` at
    once; one result per task, in task order: its trajectory, its fault (``faults=
    "collect"``), or None for a task never started because ``stop()`` said so (it is
    asked before each new episode; episodes in flight always finish)."""
    results: list[Any] = [None] * len(tasks)
    queue = deque(enumerate(tasks))
    slots: list[_InFlight | None] = [None] * min(kit.num_envs, len(tasks))
    deciders = kit.deciders(version)

    def fault(slot: int, index: int, exc: Exception) -> None:
        if isinstance(exc, UserCodeError):
            exc.name_task_seed(tasks[index].task_seed)
        if faults == "raise":
            raise exc
        results[index] = EpisodeFault(index, exc)
        kit.discard_env(slot)  # its state is unknown now; the slot gets a fresh env

    def advance(slot: int, flight: _InFlight, choice: Choice | None) -> bool:
        """Run the slot's episode to its next decision (True); or, when it ends, record its
        trajectory or fault and free the slot (False)."""
        try:
            flight.decision = next(flight.play) if choice is None else flight.play.send(choice)
            return True
        except StopIteration as done:
            results[flight.index] = flight.role.finish(kit.tag(done.value, flight.task, worker=worker,
                                                                 seconds=time.perf_counter() - flight.started))
            if done.value.cut_by_fault:  # its env raised mid-step: its state is unknown
                kit.discard_env(slot)
        except Exception as exc:  # noqa: BLE001 - the env's or a user's fault: it costs this episode only
            fault(slot, flight.index, exc)
        slots[slot] = None
        return False

    def fill(slot: int) -> None:
        """Give an empty slot the next task (unless ``stop()``), run to its first decision;
        again while episodes end before any decision."""
        while slots[slot] is None and queue and not (stop is not None and stop()):
            index, task = queue.popleft()
            role = roles[task.role]
            played = role.prepare(task)
            slots[slot] = flight = _InFlight(index, played, role, kit.episode(slot, played, version, deciders),
                                             None, time.perf_counter())
            advance(slot, flight, None)

    collecting = gc.isenabled()
    gc.disable()  # see the module's note on the garbage collector
    try:
        for slot in range(len(slots)):
            fill(slot)
        while True:
            live = [(slot, f) for slot, f in enumerate(slots) if f is not None]
            if not live:
                break
            deciding = [(slot, f) for slot, f in live if isinstance(f.decision, Decision)]
            asking = [(slot, f) for slot, f in live if not isinstance(f.decision, Decision)]
            replies: list[Any] = []
            if deciding:
                replies += deciders.decide([slot for slot, _ in deciding], [f.decision for _, f in deciding])
            if asking:  # LLM-backed sub-policies: every env's requests in one call per model and operation
                from gyre_ma.llm.option import answer

                flat = answer([r for _, f in asking for r in f.decision.requests])
                at = 0
                for _, f in asking:
                    replies.append(flat[at:at + len(f.decision.requests)])
                    at += len(f.decision.requests)
            for (slot, flight), reply in zip(deciding + asking, replies, strict=True):
                if not advance(slot, flight, reply):
                    fill(slot)
    finally:
        if collecting:
            gc.enable()
    return results
