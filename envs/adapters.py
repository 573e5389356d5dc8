"""Adapters: outside PettingZoo and Gymnasium environments as gyre environments.

An environment gyre-ma did not write knows nothing of milestones. The user supplies them:
one detector per task-graph node, a predicate over the *unwrapped* environment (the
innermost env, whose attributes a scripted controller would read). :class:`GyreAdapter`
runs every detector after each ``reset`` and ``step`` and keeps what fired, so that
``verified_milestones()`` is monotone within an episode and never depends on an agent's
own claim.

>>> env = from_gymnasium(
...     "MiniGrid-DoorKey-5x5-v0",
...     milestones={"has_key": has_key, "door_open": door_open, "reached_goal": at_goal},
...     graph={"goals": ["reached_goal"], "milestones": {
...         "has_key": {}, "door_open": {"requires": ["has_key"]},
...         "reached_goal": {"requires": ["door_open"]}}},
... )
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils.conversions import aec_to_parallel, turn_based_aec_to_parallel

from gyre_ma.envs.base import NumericView, episode_goals
from gyre_ma.envs.checks import describe, why_outside
from gyre_ma.options.errors import UserAnswerError, UserCodeError, callable_name
from gyre_ma.options.graph import TaskGraph
from gyre_ma.options.library import reference, resolve

Detector = Callable[[Any], bool]
"""A milestone predicate over the unwrapped environment."""

DEFAULT_MAX_CYCLES = 1000
"""Step cap when neither the caller nor the wrapped env names one."""


class GyreAdapter(ParallelEnv):
    """A PettingZoo ``ParallelEnv`` plus milestones verified by user detectors.

    Rewards, observations and infos pass through unchanged; ``terminated`` and
    ``truncated`` stay apart; reaching ``max_cycles`` steps truncates every live agent.
    ``unwrapped`` is the innermost environment (as for a Gymnasium wrapper): it is what
    the detectors, the graph's ``verifier`` references and scripted options read.

    ``milestone_agent``, where the env can tell who achieved a milestone (who touches the
    landmark), is ``(unwrapped, milestone) -> agent or None``: asked as each milestone is
    first verified, it credits the milestone to that agent's option call only (as a built-in
    env's own ``milestone_agent`` does); None, or no such callable, credits every agent's
    call running then (the team convention).

    ``max_cycles``, the step cap (else the env's own ``max_cycles``, its spec's
    ``max_episode_steps`` or ``max_steps``, else 1,000), may be ``(unwrapped) -> int``, asked
    after each reset: where each episode has its own budget (1.1 times an instance's
    heuristic route), the manager's time input and the truncation follow it.

    ``scores`` maps names to ``(unwrapped) -> number or None``, asked as each episode ends:
    the task's own figures of it (a schedule's makespan against a heuristic's), which eval
    reports with intervals and ``metrics.csv`` logs as ``score/<name>``; None leaves that
    episode out of the figure.

    ``episode_goals``, where each episode has its own goals (the dish a seed orders), is
    ``(unwrapped) -> goals``, asked after each reset: some of the graph's goals, or None for
    all of them. Without it, the unwrapped env's own ``episode_goals()`` method is asked,
    where it has one.
    """

    def __init__(
        self,
        env: ParallelEnv,
        *,
        milestones: Mapping[str, Detector | str] | None,
        graph: TaskGraph | Mapping[str, Any],
        max_cycles: int | Callable[[Any], int] | None = None,
        check_observations: bool = True,
        milestone_agent: Callable[[Any, str], str | None] | None = None,
        episode_goals: Callable[[Any], Any] | None = None,
        scores: Mapping[str, Callable[[Any], float | None]] | None = None,
    ) -> None:
        if not isinstance(env, ParallelEnv):
            raise TypeError(f"GyreAdapter: expected a pettingzoo ParallelEnv, got {type(env).__name__}")
        for name, given, takes in (("milestone_agent", milestone_agent, "(unwrapped env, milestone) -> agent or None"),
                                   ("episode_goals", episode_goals, "(unwrapped env) -> goals or None")):
            if given is not None and not callable(given):
                raise TypeError(f"GyreAdapter: {name} must be a callable {takes}, got {given!r}")
        if scores is not None and (not isinstance(scores, Mapping) or not all(
                isinstance(k, str) and k and callable(f) for k, f in scores.items())):
            raise TypeError(f"GyreAdapter: scores must map names to callables (unwrapped env) -> number or None, "
                            f"got {scores!r:.200}")
        self._scores = dict(scores or {})
        self._attribute = milestone_agent
        self.credits_by_agent = milestone_agent is not None
        """Whether the user said who reaches each milestone (``milestone_agent``); else every
        agent's running call is credited (``gyre-ma check`` notes it where that happened)."""
        self._goals_of = episode_goals
        own = getattr(env.unwrapped, "episode_goals", None)
        self._own_goals = own if episode_goals is None and callable(own) else None
        """The env's own ``episode_goals`` method, asked where the user gave no callable."""
        self._env = env
        raw = env.unwrapped
        self.metadata = dict(getattr(env, "metadata", None) or {})
        self.metadata["name"] = f"gyre_{self.metadata.get('name') or type(raw).__name__}"
        self.metadata["is_parallelizable"] = True
        self._graph, self._detectors = _bind_milestones(graph, milestones, self.metadata["name"])
        self._cap_of = max_cycles if callable(max_cycles) else None
        """The user's ``(unwrapped) -> int``, the step cap of each episode, asked after its reset."""
        self._cap = _max_cycles(None if self._cap_of is not None else max_cycles, env, raw)
        self.check_observations = check_observations
        self.possible_agents = list(env.possible_agents)
        self.agents: list[str] = []
        self._obs_spaces = {a: env.observation_space(a) for a in self.possible_agents}
        self._act_spaces = {a: env.action_space(a) for a in self.possible_agents}
        self._achieved: set[str] = set()
        self._steps = 0
        self._last_obs: dict[str, Any] = {}
        self._delegate_state = _has_own_state(raw)
        if self._delegate_state and hasattr(env, "state_space"):
            self.state_space = env.state_space
        elif not self._delegate_state:
            self._layout = {a: _flat_leaves(s) for a, s in self._obs_spaces.items()}
            self.state_space = _concat_boxes(
                [spaces.flatten_space(leaf) for a in self.possible_agents for _, leaf in self._layout[a]]
            )

    # ------------------------------------------------------------------ gyre API
    def task_graph(self) -> TaskGraph:
        return self._graph

    def verified_milestones(self) -> frozenset[str]:
        return frozenset(self._achieved)

    @property
    def detectors(self) -> Mapping[str, Detector]:
        """Each task-graph node's detector (``check_env`` re-verifies with them, closures too)."""
        return dict(self._detectors)

    def milestone_agent(self, milestone: str) -> str | None:
        """The agent the user's ``milestone_agent`` credits ``milestone`` to (None: every
        running call); checked to be one of the env's agents."""
        if self._attribute is None:
            return None
        what = f"{self.metadata['name']}: milestone_agent {callable_name(self._attribute)} for milestone {milestone!r}"
        try:
            agent = self._attribute(self._env.unwrapped, milestone)
        except Exception as exc:
            raise UserCodeError(what, exc) from exc
        if agent is not None and agent not in self.possible_agents:
            raise UserCodeError(what, ValueError(f"returned {agent!r}; expected one of the env's agents "
                                                 f"{self.possible_agents} or None"))
        return agent

    def episode_goals(self) -> Any:
        """The goals of the episode just reset (checked by the rollout against the graph's):
        what the user's ``episode_goals`` says, else the env's own; None: the graph's."""
        if self._goals_of is not None:
            return self._goals_of(self._env.unwrapped)
        return None if self._own_goals is None else self._own_goals()

    def episode_scores(self) -> dict[str, float]:
        """The episode's own figures, asked as it ends (the rollout checks them): each of the
        user's ``scores`` on the unwrapped env, those that returned None left out."""
        out = {}
        for name, score in self._scores.items():
            try:
                value = score(self._env.unwrapped)
            except Exception as exc:
                raise UserCodeError(f"{self.metadata['name']}: score {name!r} ({callable_name(score)})", exc) from exc
            if value is not None:
                out[name] = value
        return out

    @property
    def goals_source(self) -> Any:
        """The user's code that says an episode's goals (errors name where it is defined)."""
        return self._goals_of or self._own_goals

    def holds(self, milestone: str) -> bool:
        """Whether ``milestone``'s detector holds on the current state (not latched: a
        dropped key no longer holds ``has_key``); options that restore a lost milestone ask."""
        if milestone not in self._detectors:
            raise ValueError(f"{self.metadata['name']}: holds({milestone!r}): not a task-graph node; "
                             f"nodes: {list(self._detectors)}")
        return bool(self._run_detector(milestone, self._detectors[milestone], self._env.unwrapped,
                                       f"step {self._steps}"))

    # ------------------------------------------------------------------ ParallelEnv API
    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        observations, infos = self._env.reset(seed=seed, options=options)
        if self._cap_of is not None:  # this episode's own step cap (an instance's budget)
            self._cap = self._episode_cap()
        self._steps = 0
        self._achieved = set()
        self.agents = list(self._env.agents)
        self._last_obs = {}
        self._observe(observations, "reset")
        self._detect("reset")
        return observations, infos

    @property
    def max_cycles(self) -> int:
        """The step cap of the episode (with a per-episode ``max_cycles``, the one asked at its
        reset)."""
        return self._cap

    @max_cycles.setter
    def max_cycles(self, cap: int) -> None:
        """A cap assigned from outside (PettingZoo's tests and ``check_env`` assign one) holds
        for every later episode, a per-episode ``max_cycles`` included (a session-60 user's
        check failed: its cap of 5 was asked anew at reset)."""
        self._cap, self._cap_of = int(cap), None

    def _episode_cap(self) -> int:
        what = f"{self.metadata['name']}: max_cycles {callable_name(self._cap_of)}"
        try:
            cap = self._cap_of(self._env.unwrapped)
        except Exception as exc:
            raise UserCodeError(what, exc) from exc
        if isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or cap < 1:
            raise UserCodeError(what, ValueError(f"returned {cap!r}; expected an int >= 1, the episode's step cap"))
        return int(cap)

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        if not self.agents:
            raise ValueError(f"{self.metadata['name']}: step() called with no live agent; call reset() first")
        unknown = sorted(set(actions) - set(self.possible_agents))
        missing = [a for a in self.agents if a not in actions]
        if unknown or missing:
            raise ValueError(
                f"{self.metadata['name']}: step() needs one action per live agent {self.agents}; "
                + (f"missing {missing}" if missing else f"unknown agent(s) {unknown}")
            )
        live = list(self.agents)
        observations, rewards, terminations, truncations, infos = self._env.step(
            {a: actions[a] for a in live}
        )
        self._steps += 1
        terminations = {a: bool(v) for a, v in terminations.items()}
        truncations = {a: bool(v) for a, v in truncations.items()}
        if self._steps >= self._cap:
            for a in live:
                if not terminations.get(a, False):
                    truncations[a] = True
            self.agents = []
        else:
            done = {a for a in live if terminations.get(a, False) or truncations.get(a, False)}
            self.agents = [a for a in self._env.agents if a not in done]
        where = f"step {self._steps}"
        self._observe(observations, where)
        self._detect(where)
        return observations, rewards, terminations, truncations, infos

    def observation_space(self, agent: str) -> spaces.Space:
        return self._space(self._obs_spaces, agent, "observation_space")

    def action_space(self, agent: str) -> spaces.Space:
        return self._space(self._act_spaces, agent, "action_space")

    def state(self) -> np.ndarray:
        """The wrapped env's own ``state()`` if it has one; else every agent's last
        observation, flattened and concatenated in ``possible_agents`` order (zeros for an
        agent not yet observed; parts Gymnasium cannot flatten, such as text, left out)."""
        if self._delegate_state:
            return self._env.state()
        parts = []
        for a in self.possible_agents:
            obs = self._last_obs.get(a)
            for path, leaf in self._layout[a]:
                if obs is None:
                    parts.append(np.zeros(spaces.flatdim(leaf), dtype=np.float32))
                else:
                    parts.append(np.asarray(spaces.flatten(leaf, _at(obs, path)), dtype=np.float32))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)

    def render(self) -> Any:
        return self._env.render()

    def close(self) -> None:
        self._env.close()

    @property
    def render_mode(self) -> str | None:
        return getattr(self._env, "render_mode", None)

    @property
    def unwrapped(self) -> Any:
        return self._env.unwrapped

    def __str__(self) -> str:
        return self.metadata["name"]

    # ------------------------------------------------------------------ internals
    def _space(self, table: dict[str, spaces.Space], agent: str, what: str) -> spaces.Space:
        if agent not in table:
            raise ValueError(
                f"{self.metadata['name']}: {what}({agent!r}): unknown agent; possible agents: "
                f"{self.possible_agents}"
            )
        return table[agent]

    def _observe(self, observations: Mapping[str, Any], where: str) -> None:
        if not isinstance(observations, Mapping):
            raise ValueError(
                f"{self.metadata['name']}: {where}: the wrapped env returned observations of type "
                f"{type(observations).__name__}; expected a dict agent -> observation"
            )
        for agent, obs in observations.items():
            space = self._obs_spaces.get(agent)
            if space is None:
                continue
            if self.check_observations and not space.contains(obs):
                method = getattr(type(self._env.unwrapped), "reset" if where == "reset" else "step", None)
                shown = str(space)
                shown = shown if len(shown) <= _SPACE_SHOWN else shown[:_SPACE_SHOWN - 1] + "…"
                raise UserAnswerError(
                    f"{self.metadata['name']}: {where}: the wrapped env's observation for agent {agent!r}",
                    f"does not fit its observation_space: {why_outside(space, obs, 'it')} (the space: {shown})",
                    method)
            self._last_obs[agent] = obs

    def _detect(self, where: str) -> None:
        raw = self._env.unwrapped
        for name, detector in self._detectors.items():
            if name not in self._achieved and self._run_detector(name, detector, raw, where):
                self._achieved.add(name)

    def _run_detector(self, name: str, detector: Detector, raw: Any, where: str) -> bool:
        what = f"{self.metadata['name']}: {where}: detector {callable_name(detector)} for milestone {name!r}"
        try:
            fired = detector(raw)
        except Exception as exc:
            raise UserCodeError(f"{what} (a predicate over the unwrapped {type(raw).__name__})", exc) from exc
        if not isinstance(fired, (bool, np.bool_)):
            raise UserAnswerError(what, f"returned {describe(fired)} ({type(fired).__name__}); expected a bool",
                                  detector)
        return bool(fired)


_SPACE_SHOWN = 160
"""Characters of an observation space shown in an error (a Dict's repr runs to hundreds);
what falls outside it comes first, in full."""


_OLD_GYM = ("an old gym env's API (reset returning the observation alone, step four values: obs, reward, done, "
             "info)? Wrap it in a gymnasium.Env whose reset(seed=None, options=None) seeds it and returns "
             "(observation, info), and whose step returns (observation, reward, terminated, truncated, info); "
             "README: Old gym environments")


class _GymnasiumParallel(ParallelEnv):
    """A Gymnasium env (``_gym``) seen as a ParallelEnv: its render, close and unwrapped, and
    its reset and step checked for Gymnasium's API (an old gym env's is named as such)."""

    _gym: gymnasium.Env

    def _reset(self, seed: int | None, options: dict | None) -> tuple[Any, dict]:
        out = self._gym.reset(seed=seed, options=options)
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
            raise ValueError(f"{self.metadata['name']}.reset returned {out!r:.120}; expected (observation, info), "
                             f"a tuple of two with info a dict: {_OLD_GYM}")
        return out

    def _step(self, action: Any) -> tuple[Any, Any, Any, Any, Any]:
        out = self._gym.step(action)
        try:
            obs, reward, terminated, truncated, info = out
        except (TypeError, ValueError):
            raise ValueError(f"{self.metadata['name']}.step returned {out!r:.120}; expected five values "
                             f"(observation, reward, terminated, truncated, info): {_OLD_GYM}") from None
        return obs, reward, terminated, truncated, info

    def render(self) -> Any:
        return self._gym.render()

    def close(self) -> None:
        self._gym.close()

    @property
    def unwrapped(self) -> Any:
        return self._gym.unwrapped


class _SingleAgentParallel(_GymnasiumParallel):
    """A Gymnasium env as a one-agent ParallelEnv; the episode ends when it does.

    A ``Discrete`` observation that the env returns as a Python ``int`` (Taxi, FrozenLake,
    CliffWalking do) is passed on as a NumPy integer of the space's dtype, as PettingZoo's
    API (and its ``api_test``) expects every observation to carry its dtype."""

    def __init__(self, env: gymnasium.Env, agent: str) -> None:
        self._gym = env
        self._agent = agent
        self.possible_agents = [agent]
        self.agents: list[str] = []
        self.metadata = dict(getattr(env, "metadata", None) or {})
        spec = getattr(env, "spec", None)
        self.metadata["name"] = spec.id if spec is not None else type(env.unwrapped).__name__
        self.spec = spec
        self.render_mode = getattr(env, "render_mode", None)
        space = env.observation_space
        self._scalar = space.dtype.type if isinstance(space, spaces.Discrete) else None
        """The NumPy integer type a Discrete observation is given."""

    def _observation(self, obs: Any) -> Any:
        if self._scalar is not None and isinstance(obs, int) and not isinstance(obs, bool):
            return self._scalar(obs)
        return obs

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        obs, info = self._reset(seed, options)
        self.agents = [self._agent]
        return {self._agent: self._observation(obs)}, {self._agent: info}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        a = self._agent
        obs, reward, terminated, truncated, info = self._step(actions[a])
        if terminated or truncated:
            self.agents = []
        return {a: self._observation(obs)}, {a: reward}, {a: terminated}, {a: truncated}, {a: info}

    def observation_space(self, agent: str) -> spaces.Space:
        return self._gym.observation_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._gym.action_space


class _TupleAgentsParallel(_GymnasiumParallel):
    """A multi-agent Gymnasium env as a ParallelEnv: one whose observation and action spaces
    are ``Tuple`` spaces with an entry per agent, as Level-Based Foraging, RWARE and ma-gym's are.

    Agent i's observation and action are entry i; the env's reward is a list with an entry
    per agent (or one number, every agent's); ``terminated`` / ``truncated`` a bool for every
    agent or a list. The episode ends when the env's flag is true, or, a list, when every
    entry is: until then every agent stays and acts (the env takes an action from each)."""

    def __init__(self, env: gymnasium.Env, agents: Sequence[str]) -> None:
        name = env.spec.id if getattr(env, "spec", None) is not None else type(env.unwrapped).__name__
        for what in ("observation_space", "action_space"):
            space = getattr(env, what)
            if not isinstance(space, spaces.Tuple) or len(space) != len(agents):
                raise ValueError(f"from_gymnasium(agents={len(agents)}): {name}'s {what} is {space!r:.200}; "
                                 f"expected a Tuple with one entry per agent ({len(agents)}), the multi-agent "
                                 "Gymnasium form (a PettingZoo env takes from_pettingzoo)")
        self._gym = env
        self.possible_agents = list(agents)
        self.agents: list[str] = []
        self.metadata = dict(getattr(env, "metadata", None) or {}) | {"name": name}
        self.spec = getattr(env, "spec", None)
        self.render_mode = getattr(env, "render_mode", None)

    def _split(self, values: Any, what: str) -> list[Any]:
        """An entry per agent of the env's ``what`` (a list of them, or one value for all)."""
        n = len(self.possible_agents)
        if isinstance(values, (list, tuple, np.ndarray)) and not (isinstance(values, np.ndarray) and values.ndim == 0):
            if len(values) != n:
                raise ValueError(f"{self.metadata['name']}.step returned {what} {values!r:.120} of {len(values)} "
                                 f"entries; expected one per agent ({n}) or one value for every agent")
            return list(values)
        return [values] * n

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        obs, info = self._reset(seed, options)
        self.agents = list(self.possible_agents)
        obs = self._split(obs, "observations")
        return dict(zip(self.agents, obs)), {a: info for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        agents = self.possible_agents
        obs, rewards, terminated, truncated, info = self._step(tuple(actions[a] for a in agents))
        ends = [all(bool(x) for x in self._split(flag, what)) for flag, what in
                ((terminated, "terminated"), (truncated, "truncated"))]
        if any(ends):
            self.agents = []
        return (dict(zip(agents, self._split(obs, "observations"))), dict(zip(agents, self._split(rewards, "rewards"))),
                dict.fromkeys(agents, ends[0]), dict.fromkeys(agents, ends[1] and not ends[0]),
                {a: info for a in agents})

    def observation_space(self, agent: str) -> spaces.Space:
        return self._gym.observation_space[self.possible_agents.index(agent)]

    def action_space(self, agent: str) -> spaces.Space:
        return self._gym.action_space[self.possible_agents.index(agent)]


def from_gymnasium(
    env_or_id: gymnasium.Env | str,
    *,
    milestones: Mapping[str, Detector | str] | None,
    graph: TaskGraph | Mapping[str, Any],
    max_cycles: int | Callable[[Any], int] | None = None,
    agent: str = "agent_0",
    agents: int | Sequence[str] | None = None,
    check_observations: bool = True,
    episode_goals: Callable[[Any], Any] | None = None,
    milestone_agent: Callable[[Any, str], str | None] | None = None,
    scores: Mapping[str, Callable[[Any], float | None]] | None = None,
    **make_kwargs: Any,
) -> GyreAdapter:
    """A Gymnasium env (or registered id, built with ``gymnasium.make(id, **make_kwargs)``)
    as a one-agent gyre environment whose agent is named ``agent``; or, with ``agents`` (a
    count, named ``agent_0`` …, or the names), a multi-agent Gymnasium env whose spaces are
    ``Tuple`` spaces with an entry per agent (:class:`_TupleAgentsParallel`). ``episode_goals``:
    each episode's goals, where they change; ``milestone_agent``: who achieved a milestone;
    ``scores``: each episode's own figures (:class:`GyreAdapter`)."""
    if isinstance(env_or_id, str):
        env = gymnasium.make(env_or_id, **make_kwargs)
    elif make_kwargs:
        raise TypeError(
            f"from_gymnasium: keyword(s) {sorted(make_kwargs)} are gymnasium.make arguments; "
            "pass an env id instead of an env instance to use them"
        )
    elif isinstance(env_or_id, gymnasium.Env):
        env = env_or_id
    elif callable(getattr(env_or_id, "reset", None)) and callable(getattr(env_or_id, "step", None)):
        raise TypeError(f"from_gymnasium: {type(env_or_id).__name__} has reset and step but is not a gymnasium.Env; "
                        f"{_OLD_GYM}")
    else:
        raise TypeError(
            f"from_gymnasium: expected a gymnasium.Env or a registered env id, got {type(env_or_id).__name__}"
        )
    for what in ("observation_space", "action_space"):
        space = getattr(env, what, None)
        if not isinstance(space, spaces.Space):
            raise TypeError(f"from_gymnasium: {type(env.unwrapped).__name__}.{what} is {space!r:.120} "
                            f"({type(space).__name__}); expected a gymnasium.spaces.Space (Box, Discrete, Dict, ...): "
                            "an env written for another package's spaces needs a wrapper that gives Gymnasium's")
    if agents is None:
        if milestone_agent is not None:
            raise TypeError("from_gymnasium: milestone_agent is for several agents (agents=...); a one-agent env's "
                            "milestones are its agent's")
        parallel: ParallelEnv = _SingleAgentParallel(env, agent)
    else:
        names = [f"agent_{i}" for i in range(agents)] if isinstance(agents, int) else list(agents)
        if not names or len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"from_gymnasium: agents must be a count >= 1 or distinct names, got {agents!r}")
        parallel = _TupleAgentsParallel(env, names)
    return GyreAdapter(
        parallel, milestones=milestones, graph=graph, max_cycles=max_cycles,
        check_observations=check_observations, episode_goals=episode_goals, milestone_agent=milestone_agent,
        scores=scores,
    )


def from_pettingzoo(
    env: ParallelEnv | AECEnv,
    *,
    milestones: Mapping[str, Detector | str] | None,
    graph: TaskGraph | Mapping[str, Any],
    max_cycles: int | Callable[[Any], int] | None = None,
    turn_based: bool = False,
    check_observations: bool = True,
    milestone_agent: Callable[[Any, str], str | None] | None = None,
    episode_goals: Callable[[Any], Any] | None = None,
    scores: Mapping[str, Callable[[Any], float | None]] | None = None,
) -> GyreAdapter:
    """A PettingZoo env as a gyre environment. An AEC env is converted with
    ``aec_to_parallel`` (it must declare ``is_parallelizable``), or with
    ``turn_based_aec_to_parallel`` when ``turn_based`` (one agent moves per step).
    ``milestone_agent``: who achieved a milestone, where the env can tell; ``episode_goals``:
    each episode's goals, where they change; ``scores``: each episode's own figures
    (:class:`GyreAdapter`)."""
    if isinstance(env, AECEnv):
        if turn_based:
            env = turn_based_aec_to_parallel(env)
        elif not env.metadata.get("is_parallelizable", False):
            raise ValueError(
                f"from_pettingzoo: AEC env {env.metadata.get('name', type(env).__name__)!r} does not "
                "declare metadata['is_parallelizable'] = True, so it cannot be stepped as a parallel "
                "env; pass turn_based=True if one agent moves at a time"
            )
        else:
            env = aec_to_parallel(env)
    elif not isinstance(env, ParallelEnv):
        raise TypeError(
            f"from_pettingzoo: expected a pettingzoo ParallelEnv or AECEnv, got {type(env).__name__}"
        )
    return GyreAdapter(
        env, milestones=milestones, graph=graph, max_cycles=max_cycles,
        check_observations=check_observations, milestone_agent=milestone_agent, episode_goals=episode_goals,
        scores=scores,
    )


# ---------------------------------------------------------------------- helpers
def _bind_milestones(
    graph: TaskGraph | Mapping[str, Any],
    milestones: Mapping[str, Detector | str] | None,
    where: str,
) -> tuple[TaskGraph, dict[str, Detector]]:
    """Pair every graph node with one detector; fill the graph's ``verifier`` references
    from importable detectors so that ``check_env`` can re-verify them."""
    if isinstance(graph, Mapping):
        graph = TaskGraph.from_spec(graph)
    elif not isinstance(graph, TaskGraph):
        raise TypeError(f"{where}: graph must be a TaskGraph or a spec mapping, got {type(graph).__name__}")
    nodes = list(graph.names)
    if milestones is None:
        milestones = {}
        for m in graph.milestones:
            if m.verifier is None:
                raise ValueError(
                    f"{where}: milestone {m.name!r} has no detector: milestones=None takes them "
                    "from the graph's 'verifier' references, and this node has none"
                )
            milestones[m.name] = m.verifier
    if not isinstance(milestones, Mapping):
        raise TypeError(f"{where}: milestones must map milestone name -> detector, got {type(milestones).__name__}")
    extra = [n for n in milestones if n not in graph]
    if extra:
        raise ValueError(
            f"{where}: detector(s) for {extra} name no task-graph node; graph nodes: {nodes}"
        )
    missing = [n for n in nodes if n not in milestones]
    if missing:
        raise ValueError(
            f"{where}: task-graph node(s) {missing} have no detector; give one callable per node "
            f"(expected keys: {nodes})"
        )
    detectors: dict[str, Detector] = {}
    updated = []
    for m in graph.milestones:
        fn = milestones[m.name]
        if isinstance(fn, str):
            fn = resolve(fn, f"{where}: milestones.{m.name}")
        if not callable(fn):
            raise TypeError(
                f"{where}: detector for milestone {m.name!r} must be callable (env -> bool), "
                f"got {type(fn).__name__}"
            )
        detectors[m.name] = fn
        try:
            ref = reference(fn)
        except ValueError:
            ref = None
        if m.verifier is None and ref is not None:
            m = dataclasses.replace(m, verifier=ref)
        elif m.verifier is not None and resolve(m.verifier, f"{where}: graph milestone {m.name!r}") is not fn:
            raise ValueError(
                f"{where}: milestone {m.name!r}: the graph's verifier {m.verifier!r} and the "
                f"detector given ({ref or fn!r}) differ; give one source of truth"
            )
        updated.append(m)
    if tuple(updated) != graph.milestones:
        graph = TaskGraph(milestones=tuple(updated), goals=graph.goals)
    return graph, detectors


def _max_cycles(explicit: int | None, env: Any, raw: Any) -> int:
    candidates = [
        ("max_cycles", explicit),
        ("env.max_cycles", getattr(raw, "max_cycles", None)),
        ("spec.max_episode_steps", getattr(getattr(env, "spec", None), "max_episode_steps", None)),
        ("env.max_steps", getattr(raw, "max_steps", None)),
    ]
    for what, value in candidates:
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            if what == "max_cycles":
                raise ValueError(f"max_cycles must be an int >= 1, got {value!r}")
            continue
        return int(value)
    return DEFAULT_MAX_CYCLES


def _has_own_state(raw: Any) -> bool:
    """Whether the innermost env implements ``state()`` itself (PettingZoo's base classes
    only raise NotImplementedError; some envs keep a non-callable ``state`` attribute)."""
    if not callable(getattr(raw, "state", None)):
        return False
    impl = getattr(type(raw), "state", None)
    return impl is not None and impl not in (AECEnv.state, ParallelEnv.state)


def _flat_leaves(space: spaces.Space, path: tuple = ()) -> list[tuple[tuple, spaces.Space]]:
    """The (path, leaf) pairs of a nested space that Gymnasium can flatten."""
    if isinstance(space, spaces.Dict):
        return [leaf for k, sub in space.spaces.items() for leaf in _flat_leaves(sub, path + (k,))]
    if isinstance(space, spaces.Tuple):
        return [leaf for i, sub in enumerate(space.spaces) for leaf in _flat_leaves(sub, path + (i,))]
    try:
        spaces.flatten_space(space)
    except NotImplementedError:
        return []
    return [(path, space)]


def _at(obs: Any, path: tuple) -> Any:
    for key in path:
        obs = obs[key]
    return obs


def _concat_boxes(boxes: list[spaces.Box]) -> spaces.Box:
    if not boxes:
        return spaces.Box(0.0, 0.0, shape=(0,), dtype=np.float32)
    low = np.concatenate([np.asarray(b.low, dtype=np.float32).ravel() for b in boxes])
    high = np.concatenate([np.asarray(b.high, dtype=np.float32).ravel() for b in boxes])
    return spaces.Box(low, high, dtype=np.float32)


class SingleAgentView(gymnasium.Env):
    """A one-agent gyre env seen as a Gymnasium env (for single-agent libraries such as
    Stable-Baselines3). Observations are flattened to a Box; ``info["milestones"]`` holds
    the verified milestones and ``info["success"]`` whether every goal is verified."""

    metadata = {"render_modes": []}

    def __init__(self, env: ParallelEnv) -> None:
        if len(env.possible_agents) != 1:
            raise ValueError(
                f"SingleAgentView needs a one-agent env, got agents {list(env.possible_agents)}"
            )
        self.env = env
        self.agent = env.possible_agents[0]
        self._view = NumericView(env.observation_space(self.agent))
        self.observation_space = self._view.flat_space
        self.action_space = env.action_space(self.agent)
        self._goals = frozenset(env.task_graph().goals)

    def _info(self) -> dict[str, Any]:
        verified = self.env.verified_milestones()
        return {"milestones": verified, "success": self._goals <= verified}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        obs, _ = self.env.reset(seed=seed, options=options)
        graph = self.env.task_graph()
        self._goals = frozenset(episode_goals(self.env, graph, seed if seed is not None else -1)
                                or graph.goals)  # this episode's, where they change
        return self._view(obs[self.agent]), self._info()

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, rewards, terms, truncs, _ = self.env.step({self.agent: action})
        info = self._info()
        terminated = bool(terms.get(self.agent, False)) or info["success"]
        return (self._view(obs[self.agent]), float(rewards.get(self.agent, 0.0)),
                terminated, bool(truncs.get(self.agent, False)) and not terminated, info)


def to_gymnasium(env: ParallelEnv) -> SingleAgentView:
    """The one agent of a gyre env as a ``gymnasium.Env`` (see :class:`SingleAgentView`)."""
    return SingleAgentView(env)
