"""ManagerPolicy: a masked categorical over options, shared by every agent of the env."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from gyre_ma.envs.base import NumericView
from gyre_ma.options.library import OptionLibrary
from gyre_ma.rollout import Choice, Decision


class StateScaler:
    """Global state → float vector scaled into [0, 1] by the state space's bounds."""

    def __init__(self, state_space: gym.spaces.Box) -> None:
        low = np.asarray(state_space.low, dtype=np.float64).ravel()
        high = np.asarray(state_space.high, dtype=np.float64).ravel()
        finite = np.isfinite(low) & np.isfinite(high)
        self._offset = np.where(finite, low, 0.0).astype(np.float32)
        self._scale = np.where(finite, 1.0 / np.maximum(high - low, 1e-8), 1.0).astype(np.float32)
        self.dim = int(low.shape[0])

    def __call__(self, state: np.ndarray) -> np.ndarray:
        return (np.asarray(state, dtype=np.float32).ravel() - self._offset) * self._scale


class Featurizer:
    """Decision → manager input: scaled flat observation, achieved-milestone bits,
    last option (one-hot, with a slot for "none yet") and the time fraction."""

    def __init__(self, observation_space: gym.Space, library: OptionLibrary) -> None:
        self.view = NumericView(observation_space)
        self.milestones = library.graph.names
        self.n_options = len(library)
        flat = self.view.flat_space
        high = np.asarray(flat.high, dtype=np.float64)
        low = np.asarray(flat.low, dtype=np.float64)
        span = np.where(np.isfinite(high) & np.isfinite(low), np.maximum(high - low, 1e-8), 1.0)
        self._offset = np.where(np.isfinite(low), low, 0.0).astype(np.float32)
        self._scale = (1.0 / span).astype(np.float32)
        self.obs_dim = int(flat.shape[0])
        self.dim = self.obs_dim + len(self.milestones) + self.n_options + 2

    def __call__(self, d: Decision) -> np.ndarray:
        obs = self.view(d.observation).astype(np.float32)
        out = np.zeros(self.dim, dtype=np.float32)
        out[: self.obs_dim] = (obs - self._offset) * self._scale
        base = self.obs_dim
        for i, m in enumerate(self.milestones):
            if m in d.achieved:
                out[base + i] = 1.0
        base += len(self.milestones)
        out[base + 1 + d.last_option] = 1.0  # last_option = -1 → slot 0
        out[-1] = d.time_fraction
        return out


def _mlp(inputs: int, hidden: int, layers: int) -> nn.Sequential:
    """Layer-normalised hidden layers: parameter-space noise needs comparable scales."""
    blocks: list[nn.Module] = []
    for i in range(layers):
        blocks += [nn.Linear(inputs if i == 0 else hidden, hidden), nn.LayerNorm(hidden), nn.Tanh()]
    return nn.Sequential(*blocks)


class ManagerPolicy(nn.Module):
    """Masked categorical policy: ineligible options get probability exactly zero."""

    def __init__(self, features: int, n_options: int, n_agents: int, *, hidden: int = 128,
                 layers: int = 2, agent_embedding: int = 8) -> None:
        super().__init__()
        self.agent_embedding = nn.Embedding(n_agents, agent_embedding)
        self.body = _mlp(features + agent_embedding, hidden, layers)
        self.head = nn.Linear(hidden, n_options)
        nn.init.orthogonal_(self.head.weight, gain=0.01)
        nn.init.zeros_(self.head.bias)

    def forward(self, features: torch.Tensor, agent: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """features [B, F], agent [B] long, mask [B, K] bool → masked logits [B, K]."""
        x = torch.cat([features, self.agent_embedding(agent)], dim=-1)
        logits = self.head(self.body(x))
        return logits.masked_fill(~mask, torch.finfo(logits.dtype).min)

    def distribution(self, features: torch.Tensor, agent: torch.Tensor,
                     mask: torch.Tensor) -> torch.distributions.Categorical:
        return torch.distributions.Categorical(logits=self(features, agent, mask))


class Critic(nn.Module):
    """Value of a decision state; local (manager features) or centralised (global state)."""

    def __init__(self, inputs: int, n_agents: int, *, hidden: int = 128, layers: int = 2,
                 agent_embedding: int = 8) -> None:
        super().__init__()
        self.agent_embedding = nn.Embedding(n_agents, agent_embedding)
        self.body = _mlp(inputs + agent_embedding, hidden, layers)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor, agent: torch.Tensor) -> torch.Tensor:
        """x [B, D], agent [B] long → values [B]."""
        return self.head(self.body(torch.cat([x, self.agent_embedding(agent)], dim=-1))).squeeze(-1)

    @torch.no_grad()
    def initialise(self, value: float) -> None:
        """Conservative start: every state worth ``value`` (e.g. mean reward / (1 − γ))."""
        nn.init.zeros_(self.head.weight)
        self.head.bias.fill_(value)


class LearnedManager:
    """The Manager protocol over a ManagerPolicy: batches simultaneous decisions."""

    def __init__(self, policy: ManagerPolicy, critic: Critic | None, featurizer: Featurizer, *,
                 seed: int = 0, greedy: bool = False, state_scaler: StateScaler | None = None) -> None:
        """With a ``state_scaler`` the critic is centralised: it values the global state."""
        self.policy, self.critic, self.featurizer = policy, critic, featurizer
        self.generator = torch.Generator().manual_seed(seed)
        self.greedy = greedy
        self.state_scaler = state_scaler

    def inputs(self, decisions: Sequence[Decision]) -> dict[str, Any]:
        features = torch.from_numpy(np.stack([self.featurizer(d) for d in decisions]))
        agent = torch.tensor([d.agent_index for d in decisions], dtype=torch.long)
        mask = torch.from_numpy(np.stack([d.mask for d in decisions]))
        return {"features": features, "agent": agent, "mask": mask}

    @torch.no_grad()
    def decide(self, decisions: Sequence[Decision]) -> list[Choice]:
        x = self.inputs(decisions)
        dist = self.policy.distribution(x["features"], x["agent"], x["mask"])
        if self.greedy:
            options = dist.probs.argmax(dim=-1)
        else:
            u = torch.rand(len(decisions), 1, generator=self.generator)
            options = (dist.probs.cumsum(-1) < u).sum(-1).clamp_max(dist.probs.shape[-1] - 1)
            # guard against float round-off landing on a masked option
            bad = ~x["mask"].gather(1, options[:, None]).squeeze(1)
            options = torch.where(bad, dist.probs.argmax(-1), options)
        log_probs = dist.log_prob(options)
        if self.critic is None:
            values = torch.zeros(len(decisions))
        elif self.state_scaler is not None:
            state = torch.from_numpy(self.state_scaler(decisions[0].env.state()))
            values = self.critic(state.expand(len(decisions), -1), x["agent"])
        else:
            values = self.critic(x["features"], x["agent"])
        return [Choice(int(o), float(lp), float(v)) for o, lp, v in zip(options, log_probs, values, strict=True)]
