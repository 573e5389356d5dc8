"""Rollout roles: Explorer, Executor, Evaluator — and the worker that plays them.

Every role wraps :func:`~gyre_ma.rollout.run_episode` with a manager built from the
current policy weights (a ``state_dict``) and the episode's noise:

* **Explorer** — large target noise; discovers option orderings; marks its good
  trajectories (success, or a verified-milestone score over a threshold) ``elite``.
* **Executor** — small, annealed noise; on-policy training data and validation episodes.
* **Evaluator** — greedy, noise-free validation episodes; re-checks a trajectory's
  claimed milestones on environment state by replaying its option choices
  (:meth:`Evaluator.verify`); scores trajectories (:func:`milestone_score`).

A :class:`RolloutWorker` owns one environment, its option library and a policy skeleton;
it is what a backend runs, in-process or as a Ray actor. What it is asked to do is a
:class:`RolloutTask`; what it returns is a :class:`RoleTrajectory` — a Trajectory with
the role's metadata, so everything that takes a Trajectory takes it.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol

import numpy as np
import torch

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.agents.flat import primitive_library
from gyre_ma.agents.manager import Critic, Featurizer, ManagerPolicy, StateScaler
from gyre_ma.agents.noise import NO_NOISE, Exploration, NoiseSetting, NoisyManager
from gyre_ma.envs.registry import make_env, make_library, make_oracle
from gyre_ma.options.graph import TaskGraph
from gyre_ma.options.library import OptionLibrary
from gyre_ma.rollout import Choice, Decision, Trajectory, run_episode

ROLES: tuple[str, ...] = ("explorer", "executor", "evaluator")
Weights = Mapping[str, Mapping[str, torch.Tensor]]
"""``{"policy": state_dict, "critic": state_dict}`` (``critic`` optional); None for
managers that do not learn (random, oracle)."""


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

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"task role must be one of {list(ROLES)}, got {self.role!r}")
        if not isinstance(self.noise, NoiseSetting):
            raise TypeError(f"task noise must be a NoiseSetting, got {type(self.noise).__name__}")

    @classmethod
    def coerce(cls, item: RolloutTask | Sequence[Any]) -> RolloutTask:
        """Accept a RolloutTask, or a ``(role, task_seed[, episode])`` tuple."""
        if isinstance(item, RolloutTask):
            return item
        if isinstance(item, (tuple, list)) and 2 <= len(item) <= 3:
            return cls(str(item[0]), int(item[1]), *(int(x) for x in item[2:]))
        raise TypeError(f"expected a RolloutTask or (role, task_seed[, episode]), got {item!r}")

    def manager_seed(self, version: int) -> int:
        """The episode's manager seed (perturbation and sampling), distinct per task."""
        return int(np.random.SeedSequence(
            [self.task_seed, self.episode, ROLES.index(self.role), version, int(self.greedy)]
        ).generate_state(1)[0])


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
    """Wall time the worker spent playing the episode."""


def _tag(traj: Trajectory, **meta: Any) -> RoleTrajectory:
    return RoleTrajectory(**{f.name: getattr(traj, f.name) for f in fields(Trajectory)}, **meta)


def milestone_score(traj: Trajectory, graph: TaskGraph) -> float:
    """Share of the graph's milestone reward weight the episode verified, in [0, 1];
    1.0 for a success whatever route it took."""
    if traj.success:
        return 1.0
    total = sum(graph.milestone(m).reward for m in graph.names)
    got = sum(graph.milestone(m).reward for m in traj.milestone_steps if m in graph)
    return 0.0 if total <= 0 else min(got / total, 1.0)


# ---------------------------------------------------------------------------- the worker's kit
@dataclass
class RolloutKit:
    """One env, its library, and the manager pieces a role builds a manager from."""

    env: Any
    library: OptionLibrary
    manager_kind: str
    gamma: float
    max_steps: int | None
    featurizer: Featurizer | None = None
    policy: ManagerPolicy | None = None
    critic: Critic | None = None
    state_scaler: StateScaler | None = None
    """Set when the critic is centralised (values the global state)."""
    fixed: Any = None
    """The non-learning manager (oracle) when ``manager_kind`` is ``oracle``."""
    version: int | None = None
    """Policy version whose weights are loaded."""
    scratch: ManagerPolicy | None = None
    """Reused for each episode's perturbed weights (one episode at a time per kit)."""
    rules: Any = None
    """A RewardScorer whose rule engine checks env state at option and episode ends
    (None when the config has no rules)."""

    @classmethod
    def from_config(cls, config: Any) -> RolloutKit:
        """Build from an :class:`~gyre_ma.config.ExperimentConfig` exactly as the learner does."""
        env = make_env(config.env.id, **config.env.kwargs)
        agents = env.possible_agents
        m = config.manager
        if m.kind == "flat":
            library = primitive_library(env.task_graph(), env.action_space(agents[0]))
        else:
            library = make_library(config.env.id, env, config.library)
        kit = cls(env, library, m.kind, config.credit.gamma, config.train.max_steps)
        rewards = getattr(config, "rewards", None)
        if rewards is not None and (rewards.rules or rewards.rules_file):
            from gyre_ma.rewards.scorer import RewardScorer

            kit.rules = RewardScorer(rewards, library.graph, option_names=library.names)
        if m.kind in ("learned", "flat"):
            with torch.random.fork_rng():  # initial weights are overwritten; leave the caller's RNG alone
                kit._build_modules(config, agents)
        elif m.kind == "oracle":
            kit.fixed = make_oracle(config.env.id, env, library)
        return kit

    def _build_modules(self, config: Any, agents: list[str]) -> None:
        """Featurizer, policy, critic (and scratch copy) shaped as the learner's."""
        m = config.manager
        self.featurizer = Featurizer(self.env.observation_space(agents[0]), self.library)
        self.policy = ManagerPolicy(self.featurizer.dim, len(self.library), len(agents), hidden=m.hidden,
                                    layers=m.layers, agent_embedding=m.agent_embedding)
        self.scratch = copy.deepcopy(self.policy)
        if getattr(m, "centralised_critic", False):
            self.state_scaler = StateScaler(self.env.state_space)
        inputs = self.state_scaler.dim if self.state_scaler else self.featurizer.dim
        self.critic = Critic(inputs, len(agents), hidden=m.hidden, layers=m.layers,
                             agent_embedding=m.agent_embedding)

    @property
    def learns(self) -> bool:
        return self.policy is not None

    def load(self, weights: Weights | None, version: int) -> None:
        """Load the learner's weights for ``version`` (once per version)."""
        if version == self.version:
            return
        if self.learns:
            if weights is None or "policy" not in weights:
                got = None if weights is None else sorted(weights)
                raise ValueError(f"manager kind {self.manager_kind!r} needs weights with a 'policy' "
                                 f"state_dict for version {version}, got {got}")
            self.policy.load_state_dict(weights["policy"])
            if "critic" in weights and self.critic is not None:
                self.critic.load_state_dict(weights["critic"])
        self.version = version

    def manager(self, task: RolloutTask, version: int) -> Any:
        seed = task.manager_seed(version)
        if self.learns:
            return NoisyManager(self.policy, self.featurizer, task.noise, critic=self.critic, seed=seed,
                                greedy=task.greedy, state_scaler=self.state_scaler, scratch=self.scratch)
        if self.manager_kind == "random":
            return RandomManager(seed=seed)
        return self.fixed

    def cap(self, task: RolloutTask) -> int:
        cap = task.max_steps if task.max_steps is not None else self.max_steps
        return int(cap if cap is not None else getattr(self.env, "max_cycles", 10_000))

    def play(self, task: RolloutTask, version: int, *, worker: int = -1) -> RoleTrajectory:
        cap = self.cap(task)
        start = time.perf_counter()
        hook = self.rules.on_option_end if self.rules is not None else None
        traj = run_episode(self.env, self.library, self.manager(task, version), seed=task.task_seed,
                           gamma=self.gamma, policy_version=version, max_steps=cap,
                           record_state=self.state_scaler is not None, on_option_end=hook)
        if self.rules is not None:
            traj.rule_results = self.rules.end_episode(traj, self.env)
        return _tag(traj, role=task.role, episode=task.episode, worker=worker, noise=task.noise,
                    greedy=task.greedy, step_cap=cap, score=milestone_score(traj, self.library.graph),
                    seconds=time.perf_counter() - start)


def policy_weights(policy: ManagerPolicy, critic: Critic | None = None) -> dict[str, dict[str, torch.Tensor]]:
    """A detached CPU snapshot of the learner's weights, safe to hand to a backend."""
    out = {"policy": {k: v.detach().cpu().clone() for k, v in policy.state_dict().items()}}
    if critic is not None:
        out["critic"] = {k: v.detach().cpu().clone() for k, v in critic.state_dict().items()}
    return out


# ---------------------------------------------------------------------------- roles
class Role(Protocol):
    name: str

    def play(self, kit: RolloutKit, task: RolloutTask, version: int, *, worker: int = -1) -> RoleTrajectory: ...


@dataclass(frozen=True)
class Explorer:
    """Large target noise; its good trajectories are marked for the elite pool."""

    elite_min_score: float | None = None
    """Also mark unsuccessful episodes whose milestone score reaches this (None: successes only)."""
    name: str = "explorer"

    def play(self, kit: RolloutKit, task: RolloutTask, version: int, *, worker: int = -1) -> RoleTrajectory:
        traj = kit.play(task, version, worker=worker)
        traj.elite = traj.success or (self.elite_min_score is not None and traj.score >= self.elite_min_score)
        return traj


@dataclass(frozen=True)
class Executor:
    """Small, annealed noise: on-policy training data; greedy tasks are validation episodes."""

    name: str = "executor"

    def play(self, kit: RolloutKit, task: RolloutTask, version: int, *, worker: int = -1) -> RoleTrajectory:
        return kit.play(task, version, worker=worker)


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
    """Greedy validation; milestone verification by replay on environment state; scoring."""

    name: str = "evaluator"

    def play(self, kit: RolloutKit, task: RolloutTask, version: int, *, worker: int = -1) -> RoleTrajectory:
        greedy = RolloutTask(task.role, task.task_seed, task.episode, NO_NOISE, True, task.max_steps)
        return kit.play(greedy, version, worker=worker)

    @staticmethod
    def score(traj: Trajectory, graph: TaskGraph) -> float:
        return milestone_score(traj, graph)

    @staticmethod
    def verify(kit: RolloutKit, traj: Trajectory, *, gamma: float | None = None) -> Verification:
        """Replay ``traj``'s option choices from its task seed on ``kit.env`` and compare
        every claimed milestone (and the step it was first verified at, the success flag
        and each call's milestones) with what ``env.verified_milestones()`` reports."""
        claimed = frozenset(traj.milestone_steps)
        cap = traj.step_cap if isinstance(traj, RoleTrajectory) and traj.step_cap else kit.cap(
            RolloutTask("evaluator", traj.task_seed))
        try:
            replay = run_episode(kit.env, kit.library, _Replay(traj), seed=traj.task_seed,
                                 gamma=kit.gamma if gamma is None else gamma,
                                 policy_version=traj.policy_version, max_steps=cap)
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


# ---------------------------------------------------------------------------- the worker
class RolloutWorker:
    """Plays :class:`RolloutTask` s; one per process (in-process backend, or a Ray actor)."""

    def __init__(self, config: Any, *, worker_id: int = 0, roles: Mapping[str, Role] | None = None) -> None:
        self.kit = RolloutKit.from_config(config)
        self.worker_id = worker_id
        self.roles = dict(roles) if roles is not None else default_roles()
        missing = [r for r in ROLES if r not in self.roles]
        if missing:
            raise ValueError(f"roles: missing {missing}; give one object per role in {list(ROLES)}")

    def run(self, task: RolloutTask, weights: Weights | None, version: int) -> RoleTrajectory:
        self.kit.load(weights, version)
        return self.roles[task.role].play(self.kit, task, version, worker=self.worker_id)


# ---------------------------------------------------------------------------- learner side
class RoleNoise:
    """The learner's exploration per role (e.g. a large, slowly annealed δ for explorers
    and a small one for executors): settings for the next tasks, one update per iteration."""

    def __init__(self, noises: Mapping[str, Exploration]) -> None:
        unknown = [r for r in noises if r not in ROLES]
        if unknown:
            raise ValueError(f"noise for unknown roles {unknown}; roles are {list(ROLES)}")
        self.noises = dict(noises)

    def settings(self) -> dict[str, NoiseSetting]:
        return {role: noise.setting() for role, noise in self.noises.items()}

    def observe(self, features: torch.Tensor, agent: torch.Tensor, mask: torch.Tensor) -> None:
        """Recent decision states (a batch's FEATURES, AGENT, MASK) the distances are measured on."""
        for noise in self.noises.values():
            noise.observe(features, agent, mask)

    def update(self, policy: ManagerPolicy) -> dict[str, float]:
        """Adapt and anneal every role's noise; metrics as ``noise/<role>/<name>``."""
        out: dict[str, float] = {}
        for role, noise in self.noises.items():
            noise.update(policy)
            out |= noise.metrics(f"noise/{role}")
        return out

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for role, noise in self.noises.items():
            out |= noise.metrics(f"noise/{role}")
        return out

    def state_dict(self) -> dict[str, Any]:
        return {role: noise.state_dict() for role, noise in self.noises.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for role, noise in self.noises.items():
            if role in state:
                noise.load_state_dict(state[role])


# ---------------------------------------------------------------------------- task plans
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


def validation_tasks(seeds: Sequence[int], *, max_steps: int | None = None) -> list[RolloutTask]:
    """Greedy, noise-free evaluator episodes, one per seed."""
    return [RolloutTask("evaluator", int(s), 0, NO_NOISE, True, max_steps) for s in seeds]

