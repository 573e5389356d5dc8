"""Rollout roles: Explorer, Executor, Evaluator — what each episode is for.

A worker plays every episode on its batched engine (:mod:`gyre_ma.backends.engine`); a
role says how: :meth:`Role.prepare` gives the task the episode is played as (the
evaluator's is noise-free) and :meth:`Role.finish` what is made of its trajectory (the
explorer marks its good ones elite):

* **Explorer** — large target noise; discovers option orderings; marks its good
  trajectories (success, or a verified-milestone score over a threshold) ``elite``.
* **Executor** — small, annealed noise; on-policy training data and validation episodes.
* **Evaluator** — greedy, noise-free validation episodes; re-checks a trajectory's
  claimed milestones on environment state by replaying its option choices
  (:meth:`Evaluator.verify`); scores trajectories (:func:`milestone_score`).

What a worker is asked to do is a :class:`RolloutTask`; what it returns is a
:class:`RoleTrajectory` — a Trajectory with the role's metadata, so everything that takes
a Trajectory takes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from gyre_ma.agents.noise import NO_NOISE, NoiseSetting
from gyre_ma.options.decision import Choice, Decision
from gyre_ma.options.graph import TaskGraph
from gyre_ma.rollout import Trajectory, run_episode

if TYPE_CHECKING:
    from gyre_ma.backends.worker import RolloutKit

ROLES: tuple[str, ...] = ("explorer", "executor", "evaluator")
EVALUATION = 0x65_76_61_6C  # "eval": marks the seeds of held-out evaluation's streams


# ---------------------------------------------------------------------------- task and result
@dataclass(frozen=True)
class RolloutTask:
    """One episode to play: which role, which task seed, which noise."""

    role: str
    task_seed: int
    episode: int = 0
    """Index among the episodes sharing a task seed: gives each its own manager seed."""
    noise: NoiseSetting = NO_NOISE
    greedy: bool = False
    """Take the policy's argmax and ignore the noise (validation)."""
    max_steps: int | None = None
    """Primitive step cap; None → the worker's default."""
    stream: int | None = None
    """Held-out evaluation's sampling stream. None (training): the manager seed mixes in the
    policy version, so each iteration draws afresh. An int: the seed comes from the task and
    this stream, not the version, so every policy evaluated on the same tasks and stream
    draws the same uniforms: two policies' figures differ by their choices alone (paired,
    common random numbers), and the same weights give the same figures whatever their version."""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"task role must be one of {list(ROLES)}, got {self.role!r}")
        if not isinstance(self.noise, NoiseSetting):
            raise TypeError(f"task noise must be a NoiseSetting, got {type(self.noise).__name__}")
        if self.stream is not None and (not isinstance(self.stream, int) or self.stream < 0):
            raise ValueError(f"task stream must be None or an int >= 0, got {self.stream!r}")

    @classmethod
    def coerce(cls, item: RolloutTask | Sequence[Any]) -> RolloutTask:
        """Accept a RolloutTask, or a ``(role, task_seed[, episode])`` tuple."""
        if isinstance(item, RolloutTask):
            return item
        if isinstance(item, (tuple, list)) and 2 <= len(item) <= 3:
            return cls(str(item[0]), int(item[1]), *(int(x) for x in item[2:]))
        raise TypeError(f"expected a RolloutTask or (role, task_seed[, episode]), got {item!r}")

    def manager_seed(self, version: int) -> int:
        """The episode's manager seed (perturbation and sampling), distinct per task; from the
        policy version in training, from :attr:`stream` in a held-out evaluation."""
        task = [self.task_seed, self.episode, ROLES.index(self.role)]
        entropy = (task + [version, int(self.greedy)] if self.stream is None
                   else task + [int(self.greedy), EVALUATION, self.stream])  # six words: a seed domain of its own
        return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def evaluation_tasks(seeds: Iterable[int], *, greedy: bool = False, stream: int = 0) -> list[RolloutTask]:
    """Held-out evaluation's episodes: one executor episode per task seed, without noise, on
    sampling ``stream`` (:attr:`RolloutTask.stream`: paired across policies and versions).
    The seeds must lie below 2^30 (:data:`VALIDATION_SEEDS`): from there on they are the
    runs' validation and training seeds, and a figure played on them would not be held out."""
    seeds = [int(s) for s in seeds]
    outside = [s for s in seeds if not 0 <= s < VALIDATION_SEEDS]
    if outside:
        raise ValueError(f"evaluation_tasks: held-out task seeds must lie in [0, 2^30 = {VALIDATION_SEEDS}); got "
                         f"{outside[:3]}{' …' if len(outside) > 3 else ''}: seeds from 2^30 on are the runs' "
                         "validation and training seeds (gyre-ma eval plays from 1,000,000)")
    return [RolloutTask("executor", s, greedy=greedy, stream=stream) for s in seeds]


@dataclass
class RoleTrajectory(Trajectory):
    """A Trajectory plus who produced it, how, and what the evaluator made of it."""

    role: str = "executor"
    episode: int = 0
    worker: int = -1
    noise: NoiseSetting = NO_NOISE
    greedy: bool = False
    step_cap: int = 0
    """The primitive step cap the episode ran under (the replay needs it)."""
    score: float = 0.0
    """Verified-milestone score in [0, 1] (:func:`milestone_score`)."""
    elite: bool = False
    """Marked for the elite pool (by an explorer; cleared if verification fails)."""
    verified: bool | None = None
    """None until an evaluator re-checked it; then whether its claims held."""
    seconds: float = 0.0
    """Wall time from the episode's start to its end (in a batched worker, shared with the
    episodes in flight beside it)."""


def tag(traj: Trajectory, **meta: Any) -> RoleTrajectory:
    return RoleTrajectory(**{f.name: getattr(traj, f.name) for f in fields(Trajectory)}, **meta)


def milestone_score(traj: Trajectory, graph: TaskGraph) -> float:
    """Share of the graph's milestone reward weight the episode verified, in [0, 1];
    1.0 for a success whatever route it took."""
    if traj.success:
        return 1.0
    total = sum(graph.milestone(m).reward for m in graph.names)
    got = sum(graph.milestone(m).reward for m in traj.milestone_steps if m in graph)
    return 0.0 if total <= 0 else min(got / total, 1.0)


# ---------------------------------------------------------------------------- roles
class Role(Protocol):
    name: str

    def prepare(self, task: RolloutTask) -> RolloutTask:
        """The task the episode is played as."""
        ...

    def finish(self, traj: RoleTrajectory) -> RoleTrajectory:
        """The trajectory as the role returns it."""
        ...


@dataclass(frozen=True)
class Explorer:
    """Large target noise; its good trajectories are marked for the elite pool."""

    elite_min_score: float | None = None
    """Also mark unsuccessful episodes whose milestone score reaches this (None: successes only)."""
    name: str = "explorer"

    def prepare(self, task: RolloutTask) -> RolloutTask:
        return task

    def finish(self, traj: RoleTrajectory) -> RoleTrajectory:
        traj.elite = traj.success or (self.elite_min_score is not None and traj.score >= self.elite_min_score)
        return traj


@dataclass(frozen=True)
class Executor:
    """Small, annealed noise: on-policy training data; greedy tasks are validation episodes."""

    name: str = "executor"

    def prepare(self, task: RolloutTask) -> RolloutTask:
        return task

    def finish(self, traj: RoleTrajectory) -> RoleTrajectory:
        return traj


@dataclass(frozen=True)
class Verification:
    """What replaying a trajectory's option choices found on environment state."""

    ok: bool
    claimed: frozenset[str]
    verified: frozenset[str]
    problem: str | None = None


class _Diverged(Exception):
    pass


class _Replay:
    """A manager that re-issues a trajectory's recorded choices, in decision order."""

    def __init__(self, traj: Trajectory) -> None:
        self._calls = iter(traj.calls)

    def decide(self, decisions: Sequence[Decision]) -> list[Choice]:
        out = []
        for d in decisions:
            call = next(self._calls, None)
            if call is None:
                raise _Diverged(f"the replay asked agent {d.agent!r} for an option after the recorded calls ran out")
            if call.agent != d.agent or not d.mask[call.option]:
                raise _Diverged(f"the replay reached agent {d.agent!r} where the record has option "
                                f"{call.option} for agent {call.agent!r}")
            out.append(Choice(call.option, call.log_prob, call.value))
        return out


@dataclass(frozen=True)
class Evaluator:
    """Held-out validation (sampled and greedy, noise-free); milestone verification by
    replay on environment state; scoring."""

    name: str = "evaluator"

    def prepare(self, task: RolloutTask) -> RolloutTask:
        """A noise-free episode: the policy's argmax (``task.greedy``) or a sample from it."""
        return RolloutTask(task.role, task.task_seed, task.episode, NO_NOISE, task.greedy, task.max_steps)

    def finish(self, traj: RoleTrajectory) -> RoleTrajectory:
        return traj

    @staticmethod
    def score(traj: Trajectory, graph: TaskGraph) -> float:
        return milestone_score(traj, graph)

    @staticmethod
    def verify(kit: RolloutKit, traj: Trajectory) -> Verification:
        """Replay ``traj``'s option choices from its task seed on ``kit.env`` and compare
        every claimed milestone (and the step it was first verified at, the success flag
        and each call's milestones) with what ``env.verified_milestones()`` reports."""
        claimed = frozenset(traj.milestone_steps)
        cap = traj.step_cap if isinstance(traj, RoleTrajectory) and traj.step_cap else kit.cap(
            RolloutTask("evaluator", traj.task_seed))
        try:
            replay = run_episode(kit.env, kit.library, _Replay(traj), seed=traj.task_seed,
                                 policy_version=traj.policy_version, max_steps=cap,
                                 on_fault=getattr(kit, "on_fault", "stop"))  # a fault the play went on through, too
        except _Diverged as exc:
            return Verification(False, claimed, frozenset(kit.env.verified_milestones()), str(exc))
        verified = frozenset(replay.milestone_steps)
        problem = None
        if verified != claimed:
            problem = (f"claimed milestones {sorted(claimed - verified)} were not verified on environment state"
                       if claimed - verified else f"milestones {sorted(verified - claimed)} verified but not claimed")
        elif replay.milestone_steps != traj.milestone_steps:
            moved = sorted(m for m in claimed if replay.milestone_steps[m] != traj.milestone_steps[m])
            problem = "milestones verified at other steps than claimed: " + ", ".join(
                f"{m} (claimed {traj.milestone_steps[m]}, verified {replay.milestone_steps[m]})" for m in moved)
        elif replay.success != traj.success:
            problem = f"claimed success={traj.success}, verified success={replay.success}"
        elif len(replay.calls) != len(traj.calls) or any(
                a.milestones != b.milestones for a, b in zip(replay.calls, traj.calls, strict=False)):
            problem = "per-call milestones differ from the replay"
        return Verification(problem is None, claimed, verified, problem)

    def check(self, kit: RolloutKit, trajectories: Iterable[RoleTrajectory], *,
              only_elite: bool = True) -> dict[str, float]:
        """Verify trajectories (by default only elite candidates, the expensive ones to get
        wrong); set ``verified``, clear ``elite`` where the claims fail; return counts."""
        checked = failed = 0
        for t in trajectories:
            if only_elite and not t.elite:
                continue
            v = self.verify(kit, t)
            t.verified = v.ok
            t.elite = t.elite and v.ok
            checked += 1
            failed += not v.ok
        return {"evaluator/verified": float(checked), "evaluator/rejected": float(failed)}


def default_roles(*, elite_min_score: float | None = None) -> dict[str, Role]:
    return {"explorer": Explorer(elite_min_score), "executor": Executor(), "evaluator": Evaluator()}


# ---------------------------------------------------------------------------- task plans
TRAINING_SEEDS = 1 << 31
"""Training task seeds lie in [2^31, 2^32)."""
VALIDATION_SEEDS = 1 << 30
"""Held-out validation seeds lie in [2^30, 2^31); ``gyre-ma eval`` and the benchmarks use
seeds below 2^30. The ranges never meet, so no reported success is measured on a task the
learner trained on."""


def check_held_out_seeds(first: int, episodes: int, key: str) -> None:
    """Held-out evaluation seeds ``first`` .. ``first + episodes - 1`` must lie below 2^30:
    from there on they are validation's and training's (:data:`VALIDATION_SEEDS`,
    :data:`TRAINING_SEEDS`). Errors name ``key``."""
    if first < 0 or first + episodes > VALIDATION_SEEDS:
        raise ValueError(f"{key}: held-out task seeds {first}..{first + episodes - 1} must lie in [0, 2^30 = "
                         f"{VALIDATION_SEEDS}); seeds from 2^30 on are the runs' validation and training seeds")


def task_seed(seed: int, iteration: int, group: int) -> int:
    """Distinct, reproducible training task seeds per (run seed, iteration, group)."""
    return TRAINING_SEEDS | int(np.random.SeedSequence([seed, iteration, group]).generate_state(1)[0] >> 1)


def validation_seed(seed: int, iteration: int, k: int) -> int:
    """The ``k``-th held-out validation seed of ``iteration`` (never a training seed)."""
    return VALIDATION_SEEDS | int(np.random.SeedSequence([seed, iteration, k, 1]).generate_state(1)[0] >> 2)


def iteration_tasks(*, seeds: Sequence[int], explorers: int, executors: int,
                    noise: Mapping[str, NoiseSetting], max_steps: int | None = None) -> list[RolloutTask]:
    """Per task seed, ``executors`` executor episodes then ``explorers`` explorer episodes
    (one group of ``explorers + executors`` episodes per seed, for the outcome advantage)."""
    if explorers < 0 or executors < 0 or explorers + executors < 1:
        raise ValueError(f"need explorers, executors >= 0 and at least one episode per seed, got "
                         f"explorers={explorers}, executors={executors}")
    tasks = []
    for seed in seeds:
        for e in range(executors):
            tasks.append(RolloutTask("executor", int(seed), e, noise.get("executor", NO_NOISE), max_steps=max_steps))
        for e in range(explorers):
            tasks.append(RolloutTask("explorer", int(seed), executors + e, noise.get("explorer", NO_NOISE),
                                     max_steps=max_steps))
    return tasks


def validation_tasks(seeds: Sequence[int], *, max_steps: int | None = None,
                     modes: Sequence[bool] = (True,)) -> list[RolloutTask]:
    """Noise-free evaluator episodes, one per seed and mode (``True`` greedy, ``False``
    sampled from the policy)."""
    return [RolloutTask("evaluator", int(s), k, NO_NOISE, greedy, max_steps)
            for s in seeds for k, greedy in enumerate(modes)]

