"""The rollout worker: one env, its option library and a policy skeleton, playing
:class:`~gyre_ma.roles.RolloutTask` s. It is what a backend runs, in-process or as a Ray actor."""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.agents.flat import primitive_library
from gyre_ma.agents.manager import Critic, Featurizer, ManagerPolicy, StateScaler
from gyre_ma.agents.noise import NoisyManager
from gyre_ma.envs.registry import make_env, make_library, make_oracle
from gyre_ma.options.library import OptionLibrary
from gyre_ma.roles import ROLES, Role, RoleTrajectory, RolloutTask, default_roles, milestone_score, tag
from gyre_ma.rollout import run_episode

Weights = Mapping[str, Mapping[str, torch.Tensor]]
"""``{"policy": state_dict, "critic": state_dict}`` (``critic`` optional); None for
managers that do not learn (random, oracle)."""


# ---------------------------------------------------------------------------- the worker's kit
@dataclass
class RolloutKit:
    """One env, its library, and the manager pieces a role builds a manager from."""

    env: Any
    library: OptionLibrary
    manager_kind: str
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
    option_timeout_s: float | None = None
    episode_timeout_s: float | None = None
    """Wall-clock bounds of an option call and an episode (``backend.*_timeout_s``)."""

    @classmethod
    def from_config(cls, config: Any) -> RolloutKit:
        """Build from an :class:`~gyre_ma.config.ExperimentConfig` exactly as the learner does."""
        env = make_env(config.env.id, **config.env.kwargs)
        agents = env.possible_agents
        m = config.manager
        if m.kind == "flat":
            library = primitive_library(env.task_graph(), env.action_space(agents[0]))
        else:
            library = make_library(config.env.id, env, config.library, config.library_kwargs)
        kit = cls(env, library, m.kind, config.train.max_steps, option_timeout_s=config.backend.option_timeout_s,
                  episode_timeout_s=config.backend.episode_timeout_s)
        rewards = getattr(config, "rewards", None)
        if rewards is not None and (rewards.rules or rewards.rules_file):
            from gyre_ma.rewards.scorer import RewardScorer

            kit.rules = RewardScorer(rewards, library.graph, option_names=library.names)
        if m.kind in ("learned", "flat"):
            with torch.random.fork_rng():  # initial weights are overwritten; leave the caller's RNG alone
                kit._build_modules(config, agents)
        elif m.kind in ("oracle", "scripted"):
            kit.fixed = make_oracle(config.env.id, env, library, m.policy)
        return kit

    def _build_modules(self, config: Any, agents: list[str]) -> None:
        """Featurizer, policy, critic (and scratch copy) shaped as the learner's."""
        m = config.manager
        self.featurizer = Featurizer(self.env.observation_space(agents[0]), self.library, len(agents))
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

    def modules(self) -> tuple[Featurizer, ManagerPolicy, Critic]:
        """The featurizer, policy and critic; for a manager that does not learn, untrained
        stand-ins shaped like a learner's, so that checkpoints and evaluation stay uniform."""
        if self.learns:
            return self.featurizer, self.policy, self.critic
        agents = self.env.possible_agents
        featurizer = Featurizer(self.env.observation_space(agents[0]), self.library, len(agents))
        policy = ManagerPolicy(featurizer.dim, len(self.library), len(agents))
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
                           policy_version=version, max_steps=cap,
                           record_state=self.state_scaler is not None, on_option_end=hook,
                           option_timeout_s=self.option_timeout_s, episode_timeout_s=self.episode_timeout_s)
        if self.rules is not None:
            traj.rule_results = self.rules.end_episode(traj, self.env)
        return tag(traj, role=task.role, episode=task.episode, worker=worker, noise=task.noise,
                    greedy=task.greedy, step_cap=cap, score=milestone_score(traj, self.library.graph),
                    seconds=time.perf_counter() - start)


def policy_weights(policy: ManagerPolicy, critic: Critic | None = None) -> dict[str, dict[str, torch.Tensor]]:
    """A detached CPU snapshot of the learner's weights, safe to hand to a backend."""
    out = {"policy": {k: v.detach().cpu().clone() for k, v in policy.state_dict().items()}}
    if critic is not None:
        out["critic"] = {k: v.detach().cpu().clone() for k, v in critic.state_dict().items()}
    return out


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


