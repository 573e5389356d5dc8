"""ManagerPolicy: a masked categorical over options, shared by every agent of the env."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from gyre_ma.envs.base import NumericView
from gyre_ma.options.errors import UserCodeError, callable_name
from gyre_ma.options.library import OptionLibrary
from gyre_ma.options.option import Option

if TYPE_CHECKING:
    from gyre_ma.options.decision import Decision
    from gyre_ma.rollout import OptionCall


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
    """Decision → manager input: the flat observation scaled into [0, 1], achieved-milestone
    bits, last option (one-hot, with a slot for "none yet"), with several agents the share
    of the other agents running each option (``Decision.others``: what a shared manager
    needs to split work between agents that look alike), the time fraction, where episodes
    have their own goals (``goals``: the graph's, given where the env says each episode's)
    a bit per goal, set for the episode's (``Decision.goals``), and where options have
    ``features`` (:attr:`~gyre_ma.options.option.Option.features`) every option's own,
    option by option (:attr:`option_features` each; zeros for an option without), last.
    They are a function of the decision's fields, so a recorded call is featurised again
    exactly as it was decided.

    Narrow dimensions (tile ids, vitals, flags: span ≤ ``log_span``) scale linearly. Wide
    ones are counts (an inventory bounded by 255), where the few units that decide a recipe
    would vanish under linear scaling (3 / 255 ≈ 0.01); they scale as log1p(x) / log1p(span).
    """

    log_span = 32.0

    bound: Callable[[Callable[[], Any]], Any] | None = None
    """How each call of an option's ``features`` is run: ``bound(call)``, which the rollout
    worker sets to bound its wall-clock time (``backend.option_timeout_s``,
    :class:`gyre_ma.watchdog.TimeBound`), raising past it, so the run stops with an error
    naming the option (a planner that never returned had hung ``train`` without a word).
    None: called as it is."""

    def __init__(self, observation_space: gym.Space, library: OptionLibrary, n_agents: int = 1, *,
                 goals: Sequence[str] = (), example: Any = None,
                 bound: Callable[[Callable[[], Any]], Any] | None = None) -> None:
        self.bound = bound
        self.view = NumericView(observation_space)
        self._others = 1.0 / (n_agents - 1) if n_agents > 1 else 0.0
        """Weight of one other agent in the others slots; no slots for one agent."""
        self.milestones = library.graph.names
        self.n_options = len(library)
        flat = self.view.flat_space
        high = np.asarray(flat.high, dtype=np.float64)
        low = np.asarray(flat.low, dtype=np.float64)
        finite = np.isfinite(high) & np.isfinite(low)
        span = np.where(finite, np.maximum(high - low, 1e-8), 1.0)
        self._offset = np.where(np.isfinite(low), low, 0.0).astype(np.float32)
        self._wide = finite & (span > self.log_span)
        self._scale = np.where(self._wide, 1.0 / np.log1p(span), 1.0 / span).astype(np.float32)
        self.obs_dim = int(flat.shape[0])
        self._others_at = self.obs_dim + len(self.milestones) + self.n_options + 1
        self.time_column = self._others_at + (self.n_options if self._others else 0)
        """The column of the time fraction."""
        self.goals = tuple(goals)
        """The goals whose bits follow the time fraction (the episode's set); (): no such bits."""
        self._goal_index = {g: i for i, g in enumerate(self.goals)}
        self._featured = [(i, opt) for i, opt in enumerate(library) if opt.features is not None]
        self.option_features = self._feature_size(observation_space, example) if self._featured else 0
        """Length of each option's own features, read off ``example`` (an observation the env
        gave; else a sample of the space); 0 where no option has ``features``."""
        self.options_at = self.time_column + 1 + len(self.goals)
        """Where the options' features start: ``n_options`` rows of :attr:`option_features`."""
        self.dim = self.options_at + self.n_options * self.option_features
        self._milestone_index = {m: i for i, m in enumerate(self.milestones)}
        self._bits_of: dict[frozenset[str], np.ndarray] = {}

    def __call__(self, d: Decision | OptionCall) -> np.ndarray:
        return self.many([d])[0]

    def many(self, items: Sequence[Decision | OptionCall]) -> np.ndarray:
        """Features of many decisions (or recorded calls) at once: [N, dim] float32."""
        n = len(items)
        obs = self.view.many([d.observation for d in items]).astype(np.float32) - self._offset
        if self._wide.any():
            obs[:, self._wide] = np.log1p(np.maximum(obs[:, self._wide], 0.0))
        out = np.zeros((n, self.dim), dtype=np.float32)
        out[:, : self.obs_dim] = obs * self._scale
        out[:, self.obs_dim:self.obs_dim + len(self.milestones)] = [self._bits(d.achieved) for d in items]
        last = self.obs_dim + len(self.milestones) + 1  # last_option = -1 → the "none yet" slot
        out[np.arange(n), [last + d.last_option for d in items]] = 1.0
        if self._others:
            for row, d in enumerate(items):
                for option in d.others:
                    out[row, self._others_at + option] += self._others
        out[:, self.time_column] = [d.time_fraction for d in items]
        if self.goals:
            out[:, self.time_column + 1:self.options_at] = [self._goal_bits(d.goals) for d in items]
        if self.option_features:
            out[:, self.options_at:] = self._option_block(items).reshape(n, -1)
        return out

    def _feature_size(self, observation_space: gym.Space, example: Any = None) -> int:
        """The common length of the options' features, read off ``example`` or, without one,
        a sample of the space (which may be no state the env ever gives: a session-56 user's
        Sokoban features planned on a sampled grid with no walls and never returned)."""
        # a copy of the space: the env's keeps its RNG
        sample = example if example is not None else copy.deepcopy(observation_space).sample()
        sizes = {opt.name: self._option_row(opt, sample).shape[0] for _, opt in self._featured}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"the options' features must all have one length (the manager scores them with one "
                             f"network); got {sizes}")
        size = next(iter(sizes.values()))
        if size < 1:
            raise ValueError(f"option {next(iter(sizes))!r}: features returned an empty array; expected a 1-D "
                             "array of floats")
        return size

    def _option_row(self, option: Option, observation: Any) -> np.ndarray:
        features = option.features
        try:
            row = features(observation) if self.bound is None else self.bound(lambda: features(observation))
        except Exception as exc:
            raise UserCodeError(f"features {callable_name(option.features)} of option {option.name!r}", exc) from exc
        try:
            row = np.asarray(row, dtype=np.float32)
        except (TypeError, ValueError):
            raise ValueError(f"option {option.name!r}: features returned {type(row).__name__} {row!r:.80}; "
                             "expected a 1-D array of floats") from None
        if row.ndim != 1:
            raise ValueError(f"option {option.name!r}: features returned an array of shape {row.shape}; "
                             "expected a 1-D array of floats")
        return row

    def _option_block(self, items: Sequence[Decision | OptionCall]) -> np.ndarray:
        """Each item's options' features: [N, n_options, option_features]."""
        size = self.option_features
        block = np.zeros((len(items), self.n_options, size), dtype=np.float32)
        for row, d in enumerate(items):
            for i, opt in self._featured:
                values = self._option_row(opt, d.observation)
                if values.shape[0] != size:
                    raise ValueError(f"option {opt.name!r}: features returned {values.shape[0]} values for agent "
                                     f"{d.agent!r}; expected {size}, the length read off a sample observation when the "
                                     "manager was built")
                if not np.isfinite(values).all():
                    raise ValueError(f"option {opt.name!r}: features returned a value that is not finite for "
                                     f"agent {d.agent!r}: {values.tolist()}")
                block[row, i] = values
        return block

    def _goal_bits(self, goals: Sequence[str]) -> np.ndarray:
        """The goal bits of an episode's goals (() or None: every goal)."""
        bits = np.zeros(len(self.goals), dtype=np.float32)
        if not goals:
            bits[:] = 1.0
        for g in goals:
            i = self._goal_index.get(g)
            if i is not None:
                bits[i] = 1.0
        return bits

    def _bits(self, achieved: frozenset[str]) -> np.ndarray:
        """The milestone bits of a verified set (cached: a rollout's decisions share few sets)."""
        if type(achieved) is not frozenset:
            achieved = frozenset(achieved)
        bits = self._bits_of.get(achieved)
        if bits is None:
            if len(self._bits_of) >= 4096:
                self._bits_of.clear()
            bits = np.zeros(len(self.milestones), dtype=np.float32)
            for m in achieved:
                i = self._milestone_index.get(m)
                if i is not None:
                    bits[i] = 1.0
            self._bits_of[achieved] = bits
        return bits


def mlp_body(inputs: int, hidden: int, layers: int) -> nn.Sequential:
    """Layer-normalised hidden layers: parameter-space noise needs comparable scales."""
    blocks: list[nn.Module] = []
    for i in range(layers):
        blocks += [nn.Linear(inputs if i == 0 else hidden, hidden), nn.LayerNorm(hidden), nn.Tanh()]
    return nn.Sequential(*blocks)


class ManagerPolicy(nn.Module):
    """Masked categorical policy: ineligible options get probability exactly zero.

    Its logits are the head's output times ``inverse_temperature``, a buffer (not trained,
    not perturbed by parameter noise) that the learner sets each iteration from
    ``train.temperature_final``'s schedule; it travels with the weights to the rollout
    workers and into checkpoints, so every copy of a policy version samples alike."""

    def __init__(self, features: int, n_options: int, n_agents: int, *, hidden: int = 128,
                 layers: int = 2, agent_embedding: int = 8, option_features: int = 0) -> None:
        super().__init__()
        self.agent_embedding = nn.Embedding(n_agents, agent_embedding)
        self.body = mlp_body(features + agent_embedding, hidden, layers)
        self.head = nn.Linear(hidden, n_options)
        nn.init.orthogonal_(self.head.weight, gain=0.01)
        nn.init.zeros_(self.head.bias)
        self.register_buffer("inverse_temperature", torch.ones(()))
        self.option_features = option_features
        """Length of each option's own features, the last ``n_options × option_features``
        of ``features`` (:attr:`Featurizer.option_features`); 0: none."""
        if option_features:
            # one scorer for every option, from that option's features alone: what it
            # learns of one option holds for all (the nearer target is better, whichever)
            self.option_body = mlp_body(option_features, hidden, layers)
            self.option_head = nn.Linear(hidden, 1)
            nn.init.orthogonal_(self.option_head.weight, gain=0.01)
            nn.init.zeros_(self.option_head.bias)

    def forward(self, features: torch.Tensor, agent: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """features [B, F], agent [B] long, mask [B, K] bool → masked logits [B, K]: the
        head's logit of each option, plus with option features the shared scorer's, computed
        for the eligible options alone: in the learner's and the noise measurement's batches
        that took features ÷ plain training time from 1.93× to 1.63× on Taxi and from 1.99×
        to 1.45× on MPE (``benchmarks/option_features_cost.py``). The rollouts' row-by-row
        forward (:class:`~gyre_ma.agents.noise.RowwiseForward`) scores every option."""
        x = torch.cat([features, self.agent_embedding(agent)], dim=-1)
        logits = self.head(self.body(x))
        if self.option_features:  # the scorer on eligible options only: the others' logits are masked below
            own = features[:, features.shape[1] - logits.shape[1] * self.option_features:]
            scores = self.option_head(self.option_body(own.reshape(*logits.shape, -1)[mask])).squeeze(-1)
            logits = logits.masked_scatter(mask, logits[mask] + scores)
        logits = logits * self.inverse_temperature
        return logits.masked_fill(~mask, torch.finfo(logits.dtype).min)

    def set_temperature(self, temperature: float) -> None:
        """Sample at ``temperature`` (> 0): the logits are divided by it."""
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        self.inverse_temperature.fill_(1.0 / temperature)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        # weights saved before the temperature existed sampled at 1
        state_dict.setdefault(prefix + "inverse_temperature", torch.ones(()))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def distribution(self, features: torch.Tensor, agent: torch.Tensor,
                     mask: torch.Tensor) -> torch.distributions.Categorical:
        return torch.distributions.Categorical(logits=self(features, agent, mask))

    def batch_logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Masked logits of a training batch's rows (its features, agents and masks)."""
        return self(batch["features"], batch["agent"], batch["mask"])


class Critic(nn.Module):
    """Value of a decision state; local (manager features) or centralised (global state)."""

    def __init__(self, inputs: int, n_agents: int, *, hidden: int = 128, layers: int = 2,
                 agent_embedding: int = 8) -> None:
        super().__init__()
        self.agent_embedding = nn.Embedding(n_agents, agent_embedding)
        self.body = mlp_body(inputs + agent_embedding, hidden, layers)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor, agent: torch.Tensor) -> torch.Tensor:
        """x [B, D], agent [B] long → values [B]."""
        return self.head(self.body(torch.cat([x, self.agent_embedding(agent)], dim=-1))).squeeze(-1)

    @torch.no_grad()
    def initialise(self, value: float) -> None:
        """Start with every state worth ``value`` (the mean return of the first batch:
        :func:`~gyre_ma.training_batch.warm_start_value`)."""
        nn.init.zeros_(self.head.weight)
        self.head.bias.fill_(value)
