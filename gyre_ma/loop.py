"""The gyre: A rollout → B segment → C score → D update, one iteration at a time."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gyre_ma import batch as B
from gyre_ma.agents.baselines import RandomManager
from gyre_ma.agents.flat import primitive_library
from gyre_ma.agents.manager import Critic, Featurizer, LearnedManager, ManagerPolicy, StateScaler
from gyre_ma.config import ExperimentConfig
from gyre_ma.credit import group_outcome_advantages, option_advantages, smdp_returns
from gyre_ma.envs.registry import make_env, make_library, make_oracle
from gyre_ma.rollout import OptionCall, Trajectory, run_episode
from gyre_ma.trainers.critic import CriticModule
from gyre_ma.trainers.fit import Fitter
from gyre_ma.trainers.manager import ManagerModule


@dataclass
class Segments:
    """Trajectories laid out as rows (one per episode × agent) of option calls."""

    calls: list[list[OptionCall]]
    episode: torch.Tensor  # [R] long
    bootstrap: list[tuple[Any, frozenset[str], int, Any] | None]
    """Per row, where the episode was cut rather than ended: (obs, achieved, agent, state)."""

    @property
    def width(self) -> int:
        return max((len(r) for r in self.calls), default=0)


def task_seed(seed: int, iteration: int, group: int) -> int:
    """Distinct, reproducible task seeds per (run seed, iteration, group)."""
    return int(np.random.SeedSequence([seed, iteration, group]).generate_state(1)[0])


class Gyre:
    """One experiment's learner and its rollout, on the local backend."""

    def __init__(self, config: ExperimentConfig) -> None:
        self.config = config
        torch.manual_seed(config.seed)
        self.env = make_env(config.env.id, **config.env.kwargs)
        agents = self.env.possible_agents
        if config.manager.kind == "flat":
            self.library = primitive_library(self.env.task_graph(), self.env.action_space(agents[0]))
        else:
            self.library = make_library(config.env.id, self.env, config.library)
        self.featurizer = Featurizer(self.env.observation_space(agents[0]), self.library)
        m = config.manager
        self.policy = ManagerPolicy(self.featurizer.dim, len(self.library), len(agents),
                                    hidden=m.hidden, layers=m.layers, agent_embedding=m.agent_embedding)
        self.state_scaler = StateScaler(self.env.state_space) if m.centralised_critic else None
        critic_inputs = self.state_scaler.dim if self.state_scaler else self.featurizer.dim
        self.critic = Critic(critic_inputs, len(agents), hidden=m.hidden, layers=m.layers,
                             agent_embedding=m.agent_embedding)
        if m.kind in ("learned", "flat"):
            self.manager: Any = LearnedManager(self.policy, self.critic, self.featurizer,
                                               seed=config.seed, state_scaler=self.state_scaler)
        elif m.kind == "random":
            self.manager = RandomManager(seed=config.seed)
        else:
            self.manager = make_oracle(config.env.id, self.env)
        t = config.train
        self.fitter = Fitter()
        self.manager_module = self.fitter.setup(ManagerModule(
            self.policy, lr=t.lr, clip=t.clip, entropy_coef=t.entropy_coef, kl_coef=t.kl_coef))
        self.critic_module = self.fitter.setup(
            CriticModule(self.critic, lr=t.critic_lr, centralised=m.centralised_critic))
        self.generator = torch.Generator().manual_seed(config.seed)
        self.version = 0
        self.env_steps = 0
        self.critic_initialised = False

    @property
    def learns(self) -> bool:
        return self.config.manager.kind in ("learned", "flat")

    # ---------------------------------------------------------------- A: rollout
    def rollout(self, iteration: int) -> list[Trajectory]:
        t = self.config.train
        trajectories = []
        for group in range(t.groups_per_iteration):
            seed = task_seed(self.config.seed, iteration, group)
            for _ in range(t.group_size):
                traj = run_episode(self.env, self.library, self.manager, seed=seed,
                                   gamma=self.config.credit.gamma, policy_version=self.version,
                                   max_steps=t.max_steps, record_state=self.state_scaler is not None)
                self.env_steps += traj.length
                trajectories.append(traj)
        return trajectories

    # ---------------------------------------------------------------- B: segment
    def segment(self, trajectories: list[Trajectory]) -> Segments:
        calls, episode, bootstrap = [], [], []
        for e, traj in enumerate(trajectories):
            for i, agent in enumerate(self.env.possible_agents):
                row = traj.agent_calls(agent)
                if not row:
                    continue
                calls.append(row)
                episode.append(e)
                final = traj.final.get(agent)
                cut = final is not None and not row[-1].terminated
                bootstrap.append((*final, i, traj.final_state) if cut else None)
        return Segments(calls, torch.tensor(episode, dtype=torch.long), bootstrap)

    # ---------------------------------------------------------------- C: score
    def score(self, trajectories: list[Trajectory], seg: Segments) -> B.Batch:
        R, T = len(seg.calls), seg.width
        f32 = dict(dtype=torch.float32)
        rewards, values = torch.zeros(R, T, **f32), torch.zeros(R, T, **f32)
        durations = torch.ones(R, T, dtype=torch.long)
        terminated, truncated, milestones, mask = (torch.zeros(R, T, dtype=torch.bool) for _ in range(4))
        for r, row in enumerate(seg.calls):
            n = len(row)
            rewards[r, :n] = torch.tensor([c.reward for c in row])
            values[r, :n] = torch.tensor([c.value for c in row])
            durations[r, :n] = torch.tensor([max(c.duration, 1) for c in row])
            terminated[r, :n] = torch.tensor([c.terminated for c in row])
            truncated[r, :n] = torch.tensor([c.truncated for c in row])
            milestones[r, :n] = torch.tensor([bool(c.milestones) for c in row])
            mask[r, :n] = True
        bootstrap = self._bootstrap_values(seg)
        outcomes = torch.tensor([float(t.success) for t in trajectories])
        groups = torch.tensor([t.task_seed for t in trajectories], dtype=torch.long)
        credit = self.config.credit
        advantages, returns = option_advantages(
            mode=credit.mode, rewards=rewards, values=values, durations=durations,
            terminated=terminated, truncated=truncated, gamma=credit.gamma, lam=credit.lam,
            milestones=milestones, bootstrap_value=bootstrap, mask=mask, outcomes=outcomes,
            groups=groups, episode_index=seg.episode, w_max=credit.outcome_weight, std_ref=0.5,
        )
        if self.config.train.objective == "grpo":
            per_episode = group_outcome_advantages(outcomes=outcomes, groups=groups)
            advantages = per_episode[seg.episode].unsqueeze(-1).expand(R, T) * mask
        flat = [c for row in seg.calls for c in row]
        features = torch.from_numpy(np.stack([self.featurizer(c) for c in flat]))
        extra = {}
        if self.state_scaler is not None:
            extra[B.STATE] = torch.from_numpy(np.stack([self.state_scaler(c.state) for c in flat]))
        return extra | {
            B.FEATURES: features,
            B.AGENT: torch.tensor([c.agent_index for c in flat], dtype=torch.long),
            B.MASK: torch.from_numpy(np.stack([c.mask for c in flat])),
            B.OPTION: torch.tensor([c.option for c in flat], dtype=torch.long),
            B.LOG_PROB: torch.tensor([c.log_prob for c in flat], dtype=torch.float32),
            B.VALUE: values[mask],
            B.ADVANTAGE: advantages[mask],
            B.RETURN: returns[mask],
        }

    @torch.no_grad()
    def _bootstrap_values(self, seg: Segments) -> torch.Tensor:
        """Critic value of each row's last state where the episode was cut, not ended."""
        out = torch.zeros(len(seg.calls))
        if not self.critic_initialised:
            return out
        feats, agents, rows = [], [], []
        for r, final in enumerate(seg.bootstrap):
            if final is not None:
                obs, achieved, agent, state = final
                feats.append(self.state_scaler(state) if self.state_scaler else
                             self.featurizer(_FinalState(obs, achieved, seg.calls[r][-1].option)))
                agents.append(agent)
                rows.append(r)
        if rows:
            out[rows] = self.critic(torch.from_numpy(np.stack(feats)), torch.tensor(agents))
        return out

    # ---------------------------------------------------------------- D: update
    def update(self, batch: B.Batch, trajectories: list[Trajectory], seg: Segments) -> dict[str, float]:
        t = self.config.train
        if not self.critic_initialised:
            self._warm_start_critic(trajectories)
        metrics = self.fitter.fit(self.manager_module, batch, epochs=t.epochs,
                                  minibatch_size=t.minibatch_size, generator=self.generator)
        metrics |= self.fitter.fit(self.critic_module, self._mc_targets(batch, seg), epochs=t.epochs,
                                   minibatch_size=t.minibatch_size, generator=self.generator)
        self.version += 1
        return metrics

    def _warm_start_critic(self, trajectories: list[Trajectory]) -> None:
        """Initialise values conservatively at mean per-step reward / (1 − γ)."""
        steps = sum(max(t.length, 1) * len(self.env.possible_agents) for t in trajectories)
        mean_reward = sum(t.total_reward for t in trajectories) / max(steps, 1)
        gamma = self.config.credit.gamma
        self.critic.initialise(mean_reward / (1.0 - gamma) if gamma < 1 else mean_reward)
        self.critic_initialised = True

    def _mc_targets(self, batch: B.Batch, seg: Segments) -> B.Batch:
        """Critic targets: Monte-Carlo SMDP returns on complete rows, λ-returns elsewhere."""
        targets = batch[B.RETURN].clone()
        start = 0
        gamma = self.config.credit.gamma
        for row in seg.calls:
            n = len(row)
            if row[-1].terminated:
                mc = smdp_returns(
                    rewards=torch.tensor([c.reward for c in row]),
                    durations=torch.tensor([max(c.duration, 1) for c in row]),
                    terminated=torch.tensor([c.terminated for c in row]),
                    truncated=torch.zeros(n, dtype=torch.bool), gamma=gamma, bootstrap_value=0.0,
                )
                targets[start:start + n] = mc
            start += n
        return {**batch, B.RETURN: targets}

    # ---------------------------------------------------------------- one turn
    def iteration(self, i: int) -> dict[str, float]:
        start = time.perf_counter()
        trajectories = self.rollout(i)
        rollout_s = time.perf_counter() - start
        metrics: dict[str, float] = {"iteration": float(i)}
        if self.learns:
            seg = self.segment(trajectories)
            batch = self.score(trajectories, seg)
            metrics |= self.update(batch, trajectories, seg)
        metrics |= episode_metrics(trajectories, self.library.graph.names)
        metrics |= {"env_steps": float(self.env_steps), "policy_version": float(self.version),
                    "rollout_seconds": rollout_s, "iteration_seconds": time.perf_counter() - start}
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.state_dict(), "critic": self.critic.state_dict(),
            "manager_optimizer": self.manager_module.optimizers().optimizer.state_dict(),
            "critic_optimizer": self.critic_module.optimizers().optimizer.state_dict(),
            "version": self.version, "env_steps": self.env_steps,
            "critic_initialised": self.critic_initialised,
            "config": self.config.model_dump(mode="json"),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.critic.load_state_dict(state["critic"])
        self.manager_module.optimizers().optimizer.load_state_dict(state["manager_optimizer"])
        self.critic_module.optimizers().optimizer.load_state_dict(state["critic_optimizer"])
        self.version, self.env_steps = state["version"], state["env_steps"]
        self.critic_initialised = state["critic_initialised"]


@dataclass(frozen=True)
class _FinalState:
    """A state after the last option call, shaped like a Decision for the featurizer."""

    observation: Any
    achieved: frozenset[str]
    last_option: int
    time_fraction: float = 1.0


def episode_metrics(trajectories: list[Trajectory], milestones: tuple[str, ...]) -> dict[str, float]:
    n = max(len(trajectories), 1)
    out = {
        "success_rate": sum(t.success for t in trajectories) / n,
        "episode_length": float(np.mean([t.length for t in trajectories])) if trajectories else 0.0,
        "episode_reward": float(np.mean([t.total_reward for t in trajectories])) if trajectories else 0.0,
        "option_calls": float(np.mean([len(t.calls) for t in trajectories])) if trajectories else 0.0,
    }
    for m in milestones:
        out[f"milestone/{m}"] = sum(m in t.milestone_steps for t in trajectories) / n
    return out
