"""The rollout worker: env instances, their option library and a policy skeleton, playing
:class:`~gyre_ma.roles.RolloutTask` s many at a time on the batched engine
(:mod:`gyre_ma.backends.engine`). It is what a backend runs, in-process or as a Ray actor."""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.agents.flat import primitive_library
from gyre_ma.agents.manager import Critic, Featurizer, ManagerPolicy, StateScaler
from gyre_ma.agents.noise import PolicyActor
from gyre_ma.backends.engine import EpisodeFault, play_many
from gyre_ma.envs.base import declares_goals, unwrap
from gyre_ma.envs.registry import make_env, make_library, make_oracle
from gyre_ma.options.decision import Choice, Decision, Manager
from gyre_ma.options.errors import UserCodeError
from gyre_ma.options.library import OptionLibrary
from gyre_ma.roles import ROLES, Role, RoleTrajectory, RolloutTask, default_roles, milestone_score, tag
from gyre_ma.rollout import Trajectory, ask, is_users, play_episode
from gyre_ma.watchdog import TimeBound

Weights = Mapping[str, Mapping[str, torch.Tensor]]
"""``{"policy": state_dict, "critic": state_dict}`` (``critic`` optional); None for
managers that do not learn (random, oracle)."""


# ---------------------------------------------------------------------------- deciders
class Deciders(Protocol):
    """Who decides for the episodes in a worker's slots."""

    def begin(self, slot: int, task: RolloutTask, version: int, env: Any) -> tuple[list[Callable], Callable | None]:
        """Set up ``slot`` for ``task``'s episode; its option-end hooks and episode-start hook."""
        ...

    def decide(self, slots: Sequence[int], decisions: Sequence[Decision]) -> list[Choice]:
        """One choice per decision; ``slots[i]`` is the slot ``decisions[i]`` comes from."""
        ...


class PolicyDeciders:
    """The learned manager: every round one batched forward pass (:class:`PolicyActor`)."""

    def __init__(self, actor: PolicyActor) -> None:
        self.actor = actor

    def begin(self, slot: int, task: RolloutTask, version: int, env: Any) -> tuple[list[Callable], Callable | None]:
        self.actor.begin(slot, task.noise, task.manager_seed(version), greedy=task.greedy)
        return [], None

    def decide(self, slots: Sequence[int], decisions: Sequence[Decision]) -> list[Choice]:
        return self.actor.decide(slots, decisions)


class ManagerDeciders:
    """Managers that do not learn (random, an oracle, a scripted order): one per slot,
    asked one decision at a time (they have no forward pass to batch)."""

    def __init__(self, make: Callable[[int, RolloutTask, int, Any], Manager]) -> None:
        self.make = make
        self.managers: dict[int, tuple[Manager, bool, int]] = {}
        """Per slot: its manager, whether it is a user's, the episode's task seed."""

    def begin(self, slot: int, task: RolloutTask, version: int, env: Any) -> tuple[list[Callable], Callable | None]:
        manager = self.make(slot, task, version, env)
        self.managers[slot] = (manager, is_users(manager), task.task_seed)
        hook, start = getattr(manager, "option_end", None), getattr(manager, "episode_start", None)
        return ([hook] if callable(hook) else []), (start if callable(start) else None)

    def decide(self, slots: Sequence[int], decisions: Sequence[Decision]) -> list[Choice]:
        out = []
        for slot, d in zip(slots, decisions, strict=True):
            manager, users, seed = self.managers[slot]
            out.append(ask(manager, d, users_manager=users, seed=seed))
        return out


# ---------------------------------------------------------------------------- the worker's kit
@dataclass
class RolloutKit:
    """Env instances (one per slot, made as needed), their library, and the manager pieces
    a worker decides with."""

    env: Any
    """The first env: shapes, the evaluator's replays, and slot 0's episodes."""
    library: OptionLibrary
    manager_kind: str
    max_steps: int | None
    make_env: Callable[[], Any] | None = None
    """Builds another env for a slot (None: one slot only)."""
    num_envs: int = 1
    """Episodes in flight at once (``rollout.num_envs``)."""
    featurizer: Featurizer | None = None
    policy: ManagerPolicy | None = None
    critic: Critic | None = None
    state_scaler: StateScaler | None = None
    """Set when the critic is centralised (values the global state)."""
    make_fixed: Callable[[Any], Manager] | None = None
    """Builds the non-learning manager (oracle, scripted order) for a slot's env."""
    version: int | None = None
    """Policy version whose weights are loaded."""
    rules: Any = None
    """A RewardScorer whose rule engine checks env state at option and episode ends
    (None when the config has no rules)."""
    option_timeout_s: float | None = None
    episode_timeout_s: float | None = None
    """Wall-clock bounds of an option call and an episode (``backend.*_timeout_s``)."""
    on_fault: str = "stop"
    """``backend.on_fault``: whether a fault of the user's code stops the run or is played on through."""
    llm_engine: str | None = None
    """Who scores the LLM manager's options in rollouts: ``transformers`` (its module) or
    ``vllm``; None for the MLP manager."""
    _envs: dict[int, Any] = field(default_factory=dict, repr=False)
    """Each slot's env, made as needed."""
    _fixed: dict[int, Manager] = field(default_factory=dict, repr=False)
    _actor: PolicyActor | None = field(default=None, repr=False)
    _vllm: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._envs[0] = self.env

    @classmethod
    def from_config(cls, config: Any) -> RolloutKit:
        """Build from an :class:`~gyre_ma.config.ExperimentConfig` exactly as the learner does."""
        def new_env() -> Any:
            return make_env(config.env.id, **config.env.kwargs)

        env = new_env()
        agents = env.possible_agents
        m = config.manager
        if m.kind == "flat":
            library = primitive_library(env.task_graph(), env.action_space(agents[0]))
        else:
            library = make_library(config.env.id, env, config.library, config.library_kwargs)
        kit = cls(env, library, m.kind, config.train.max_steps, make_env=new_env, num_envs=config.rollout.num_envs,
                  option_timeout_s=config.backend.option_timeout_s, episode_timeout_s=config.backend.episode_timeout_s,
                  on_fault=config.backend.on_fault)
        rewards = getattr(config, "rewards", None)
        if rewards is not None and (rewards.rules or rewards.rules_file):
            from gyre_ma.rewards.scorer import RewardScorer

            kit.rules = RewardScorer(rewards, library.graph, option_names=library.names)
        if m.learns:
            with torch.random.fork_rng():  # initial weights are overwritten; leave the caller's RNG alone
                kit._build_modules(config, agents)
        elif m.kind in ("oracle", "scripted"):
            kit.make_fixed = lambda slot_env: make_oracle(config.env.id, slot_env, library, m.policy)
        return kit

    def _build_modules(self, config: Any, agents: list[str]) -> None:
        """Featurizer, policy and critic shaped as the learner's."""
        m = config.manager
        self.featurizer = self._featurizer(agents)
        if m.kind == "llm":
            from gyre_ma.llm.manager import LLMManagerPolicy

            self.policy = LLMManagerPolicy.from_config(m.llm, self.library, agents)
            self.llm_engine = m.llm.engine
        else:
            self.policy = ManagerPolicy(self.featurizer.dim, len(self.library), len(agents), hidden=m.hidden,
                                        layers=m.layers, agent_embedding=m.agent_embedding,
                                        option_features=self.featurizer.option_features)
        if getattr(m, "centralised_critic", False):
            self.state_scaler = StateScaler(self.env.state_space)
        inputs = self.state_scaler.dim if self.state_scaler else self.featurizer.dim
        self.critic = Critic(inputs, len(agents), hidden=m.hidden, layers=m.layers,
                             agent_embedding=m.agent_embedding)

    def _featurizer(self, agents: list[str]) -> Featurizer:
        """The manager's featurizer: with a bit per goal where the env says each episode's
        goals and the graph has several."""
        goals = self.library.graph.goals
        return Featurizer(self.env.observation_space(agents[0]), self.library, len(agents),
                          goals=goals if len(goals) > 1 and declares_goals(self.env) else (),
                          example=self._example_observation(agents[0]),
                          bound=None if self.option_timeout_s is None else TimeBound(self.option_timeout_s))

    FEATURE_SEED = 0
    """The task seed of the reset whose observation sizes the options' features."""

    def _example_observation(self, agent: str) -> Any:
        """Where options have ``features``: ``agent``'s observation after a reset of the env
        (task seed :attr:`FEATURE_SEED`), a state the features are written for; else None."""
        if all(option.features is None for option in self.library):
            return None
        try:
            observations, _ = self.env.reset(seed=self.FEATURE_SEED)
        except UserCodeError:
            raise
        except Exception as exc:
            raise UserCodeError(f"environment {type(unwrap(self.env)).__name__}.reset (task seed {self.FEATURE_SEED}, "
                                "for an observation to size the options' features)", exc) from exc
        return observations.get(agent)

    @property
    def learns(self) -> bool:
        return self.policy is not None

    def modules(self) -> tuple[Featurizer, ManagerPolicy, Critic]:
        """The featurizer, policy and critic; for a manager that does not learn, untrained
        stand-ins shaped like a learner's, so that checkpoints and evaluation stay uniform."""
        if self.learns:
            return self.featurizer, self.policy, self.critic
        agents = self.env.possible_agents
        featurizer = self._featurizer(agents)
        policy = ManagerPolicy(featurizer.dim, len(self.library), len(agents),
                               option_features=featurizer.option_features)
        return featurizer, policy, Critic(featurizer.dim, len(agents))

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
            if self._vllm is not None:  # vLLM serves the manager: its weights replaced in place
                self._vllm.load_weights(self.policy.model.state_dict())
            if "critic" in weights and self.critic is not None:
                self.critic.load_state_dict(weights["critic"])
        self.version = version

    # ------------------------------------------------------------------ slots
    def env_for(self, slot: int) -> Any:
        """Slot ``slot``'s env (slot 0: :attr:`env`), made the first time it is needed."""
        env = self._envs.get(slot)
        if env is None:
            if self.make_env is None:
                raise ValueError(f"this kit has one env and no make_env: it cannot fill slot {slot}")
            env = self._envs[slot] = self.make_env()
        return env

    def discard_env(self, slot: int) -> None:
        """Forget a slot's env after a fault (its state is unknown); the slot gets a fresh one."""
        self._envs.pop(slot, None)
        self._fixed.pop(slot, None)

    def deciders(self, version: int) -> Deciders:
        """Who decides in this kit's slots: the learned manager batched, else one manager per slot."""
        if self.learns:
            if self._actor is None:
                self._actor = self._make_actor()
                self._actor.library = self.library  # its milestones no goal needs: greedy's detours
            return PolicyDeciders(self._actor)
        return ManagerDeciders(self._slot_manager)

    def _make_actor(self) -> PolicyActor:
        if self.llm_engine is None:
            return PolicyActor(self.policy, self.featurizer, critic=self.critic, state_scaler=self.state_scaler,
                               slots=self.num_envs)
        from gyre_ma.llm.manager import LLMActor

        if self.llm_engine == "vllm" and self._vllm is None:
            self._vllm = self.policy.vllm_engine()
        return LLMActor(self.policy, self.featurizer, critic=self.critic, state_scaler=self.state_scaler,
                        slots=self.num_envs, engine=self._vllm)

    def _slot_manager(self, slot: int, task: RolloutTask, version: int, env: Any) -> Manager:
        if self.manager_kind == "random":
            return RandomManager(seed=task.manager_seed(version))
        if slot not in self._fixed:
            self._fixed[slot] = self.make_fixed(env)
        return self._fixed[slot]

    def cap(self, task: RolloutTask) -> int | None:
        """``task``'s step cap, where the task or the config sets one; None: its env's own
        ``max_cycles``, read after the episode's reset (an env may give each episode its own)."""
        return task.max_steps if task.max_steps is not None else self.max_steps

    def episode(self, slot: int, task: RolloutTask, version: int,
                deciders: Deciders) -> Generator[Decision, Choice, Trajectory]:
        """``task``'s episode in ``slot``, as a coroutine (see :func:`~gyre_ma.rollout.play_episode`)."""
        env = self.env_for(slot)
        hooks, on_start = deciders.begin(slot, task, version, env)
        if self.rules is not None:
            hooks = [self.rules.on_option_end, *hooks]
        traj = yield from play_episode(env, self.library, seed=task.task_seed, policy_version=version,
                                       max_steps=self.cap(task), record_state=self.state_scaler is not None,
                                       on_option_end=hooks, on_start=on_start, option_timeout_s=self.option_timeout_s,
                                       episode_timeout_s=self.episode_timeout_s, on_fault=self.on_fault)
        if self.rules is not None:
            traj.rule_results = self.rules.end_episode(traj, env)
            traj.vetoed = traj.rule_results.vetoed  # known here, so a validation episode carries it too
        return traj

    def tag(self, traj: Trajectory, task: RolloutTask, *, worker: int, seconds: float) -> RoleTrajectory:
        return tag(traj, role=task.role, episode=task.episode, worker=worker, noise=task.noise, greedy=task.greedy,
                   step_cap=traj.horizon, score=milestone_score(traj, self.library.graph), seconds=seconds)

    def play(self, task: RolloutTask, version: int, *, worker: int = -1, role: Role | None = None) -> RoleTrajectory:
        """One episode (as its role plays it; default: the default roles')."""
        roles = default_roles() if role is None else {task.role: role}
        return play_many(self, [task], version, roles=roles, worker=worker)[0]


def policy_weights(policy: ManagerPolicy, critic: Critic | None = None) -> dict[str, dict[str, torch.Tensor]]:
    """A detached CPU snapshot of the learner's weights, safe to hand to a backend."""
    out = {"policy": {k: v.detach().cpu().clone() for k, v in policy.state_dict().items()}}
    if critic is not None:
        out["critic"] = {k: v.detach().cpu().clone() for k, v in critic.state_dict().items()}
    return out


# ---------------------------------------------------------------------------- the worker
class RolloutWorker:
    """Plays :class:`RolloutTask` s, ``rollout.num_envs`` at a time; one per process
    (in-process backend, or a Ray actor)."""

    def __init__(self, config: Any, *, worker_id: int = 0, roles: Mapping[str, Role] | None = None) -> None:
        self.kit = RolloutKit.from_config(config)
        self.worker_id = worker_id
        self.roles = dict(roles) if roles is not None else default_roles()
        missing = [r for r in ROLES if r not in self.roles]
        if missing:
            raise ValueError(f"roles: missing {missing}; give one object per role in {list(ROLES)}")

    def run(self, task: RolloutTask, weights: Weights | None, version: int) -> RoleTrajectory:
        return self.run_many([task], weights, version)[0]

    def run_many(self, tasks: Sequence[RolloutTask], weights: Weights | None, version: int, *,
                 stop: Callable[[], bool] | None = None,
                 faults: Literal["raise", "collect"] = "raise") -> list[RoleTrajectory | EpisodeFault | None]:
        """Play ``tasks`` with ``version``'s weights on the batched engine; see :func:`play_many`."""
        self.kit.load(weights, version)
        return play_many(self.kit, tasks, version, roles=self.roles, worker=self.worker_id, stop=stop,
                         faults=faults)
