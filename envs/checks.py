"""check_env: does an environment keep the promises gyre-ma builds on?

PettingZoo's own conformance tests check the ``ParallelEnv`` API (and, through
``parallel_to_aec``, the AEC API). gyre-ma's credit assignment leans on more: milestones
that are verified on environment state, deterministically, monotonically within an
episode, only among the task graph's nodes, and never ahead of their prerequisites.
:func:`check_env` runs both; the first broken promise raises one :class:`EnvCheckError`
that names the seed, step, agent and milestone, and says how to fix the environment.

Verifier references (a graph node's ``verifier``, ``module:callable``) are called with the
environment's ``unwrapped`` env — the env itself for a native gyre env, the wrapped env
for a :class:`~gyre_ma.envs.adapters.GyreAdapter` — and must return a bool.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium import spaces
from gymnasium.utils.env_checker import data_equivalence

from gyre_ma.envs.base import episode_goals
from gyre_ma.options.errors import UserAnswerError
from gyre_ma.options.graph import TaskGraph
from gyre_ma.options.library import resolve

if TYPE_CHECKING:
    from pettingzoo import ParallelEnv

    from gyre_ma.options.library import OptionLibrary

_GYRE_METHODS = (
    "reset", "step", "observation_space", "action_space", "state", "task_graph", "verified_milestones",
)


class EnvCheckError(AssertionError, ValueError):
    """One broken promise of an environment. An ``AssertionError`` like PettingZoo's own
    conformance failures, and a ``ValueError`` like every other bad input to gyre-ma."""

    never_played_through = True
    """A check's finding, not a fault of the env: ``backend.on_fault: continue`` stops on it."""

    def __init__(
        self,
        check: str,
        problem: str,
        fix: str,
        *,
        seed: int | None = None,
        step: int | None = None,
        agent: str | None = None,
        milestone: str | None = None,
    ) -> None:
        self.check, self.seed, self.step, self.agent, self.milestone = check, seed, step, agent, milestone
        where = ", ".join(
            f"{k}={v!r}"
            for k, v in (("seed", seed), ("step", step), ("agent", agent), ("milestone", milestone))
            if v is not None
        )
        super().__init__(f"check_env [{check}]" + (f" ({where})" if where else "") + f": {problem}\n  fix: {fix}")


@dataclass(frozen=True)
class EnvCheckReport:
    """What a passing :func:`check_env` exercised."""

    name: str
    seeds: tuple[int, ...]
    steps: int
    """Primitive steps taken by the gyre checks (first runs and their replays)."""
    milestones: frozenset[str]
    """Milestones verified at least once: a check that never saw one proved little about it."""
    pettingzoo_tests: tuple[str, ...]
    unverifiable: tuple[str, ...] = ()
    """Milestones with neither a graph ``verifier`` nor an adapter detector: what the env
    reports for them was taken on trust, not re-verified on its state."""


def check_env(
    env: ParallelEnv | Callable[[], ParallelEnv],
    *,
    seeds: Sequence[int] = (0, 1),
    n_steps: int = 200,
    library: OptionLibrary | None = None,
    drive: Callable[[ParallelEnv, int, int], Any] | None = None,
    module: ModuleType | None = None,
    pettingzoo_tests: bool = True,
) -> EnvCheckReport:
    """Check a gyre environment; raise :class:`EnvCheckError` on the first problem.

    ``env`` is a factory returning a fresh environment (preferred: the seed tests need two
    fresh instances) or an instance, which is deep-copied for them. For every seed, one
    episode of at most ``n_steps`` steps is driven by random actions — or by
    ``drive(env, seed, n_steps)``, which plays one episode on the env it is given
    (:func:`gyre_ma.checks.check_setup` drives it by an option library under a seeded
    random manager, which reaches milestones random actions rarely do) — checking every
    reset and step; then the same seed and actions are replayed and must give the same
    milestones (but where ``drive`` returns True: an episode cut by a fault it played on
    through, which a replay need not meet again). ``library`` checks that the library is
    built on the env's task graph. ``module`` (one that exposes
    ``env(max_cycles=...)`` and ``parallel_env(max_cycles=...)``) adds PettingZoo's
    ``max_cycles_test``.
    """
    factory, instance, owned = _as_factory(env)
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
        raise ValueError(f"check_env: n_steps must be an int >= 1, got {n_steps!r}")
    graph, verifiers = _check_interface(instance)
    if library is not None and set(library.graph.names) != set(graph.names):
        raise EnvCheckError(
            "library",
            f"library {library.name!r} is built on milestones {sorted(library.graph.names)} but "
            f"task_graph() has {sorted(graph.names)}",
            "build the option library on the environment's own task_graph()",
        )
    steps, seen = 0, set()
    for seed in seeds:
        first = _Probe(instance, graph, verifiers, seed)
        if drive is None:
            _random_episode(first, seed, n_steps)
        elif drive(first, seed, n_steps):  # cut by a fault it played on through: no replay
            steps += len(first.trace.actions)
            seen.update(*first.trace.verified)
            continue
        replay = _Probe(instance, graph, verifiers, seed, expected=first.trace)
        _replay(replay, seed, first.trace.actions)
        steps += len(first.trace.actions) + len(replay.trace.actions)
        seen.update(*first.trace.verified)
    _check_max_cycles(factory, seeds[0] if seeds else 0)
    ran: list[str] = []
    if pettingzoo_tests:
        ran = _pettingzoo_tests(factory, n_steps, module)
    if owned:
        instance.close()
    name = str(getattr(instance, "metadata", {}).get("name", type(instance).__name__))
    unverifiable = tuple(m for m in graph.names if m not in verifiers)
    return EnvCheckReport(name, tuple(seeds), steps, frozenset(seen), tuple(ran), unverifiable)


# ---------------------------------------------------------------------- interface
def _as_factory(env: Any) -> tuple[Callable[[], Any], Any, bool]:
    """A factory of fresh instances, the instance to check, and whether check_env made it."""
    if not isinstance(env, type) and hasattr(env, "step") and hasattr(env, "reset"):
        try:
            template = copy.deepcopy(env)
        except Exception as exc:
            raise TypeError(
                f"check_env: cannot deep-copy {type(env).__name__} ({exc}) to get the fresh instances "
                "the seed tests need; pass a factory instead, e.g. check_env(lambda: make_env())"
            ) from None
        return (lambda: copy.deepcopy(template)), env, False
    if callable(env):
        instance = env()
        if not (hasattr(instance, "step") and hasattr(instance, "reset")):
            raise TypeError(
                f"check_env: the factory returned {type(instance).__name__}, expected a PettingZoo ParallelEnv"
            )
        return env, instance, True
    raise TypeError(
        f"check_env: expected a ParallelEnv or a factory returning one, got {type(env).__name__}"
    )


def _check_interface(env: Any) -> tuple[TaskGraph, dict[str, Callable[[Any], Any]]]:
    missing = [m for m in _GYRE_METHODS if not callable(getattr(env, m, None))]
    if missing:
        raise EnvCheckError(
            "interface",
            f"{type(env).__name__} has no method(s) {missing}",
            "implement gyre_ma.envs.base.GyreEnv, or wrap an outside env with "
            "gyre_ma.envs.adapters.from_pettingzoo / from_gymnasium",
        )
    agents = getattr(env, "possible_agents", None)
    if not isinstance(agents, (list, tuple)) or not agents:
        raise EnvCheckError(
            "interface", f"possible_agents is {agents!r}",
            "set possible_agents to the non-empty list of agent names in __init__",
        )
    cycles = getattr(env, "max_cycles", None)
    if isinstance(cycles, bool) or not isinstance(cycles, (int, np.integer)) or cycles < 1:
        raise EnvCheckError(
            "max_cycles", f"max_cycles is {cycles!r}, expected an int >= 1",
            "set self.max_cycles (the episode's step cap) in __init__ and truncate every live "
            "agent when the step count reaches it",
        )
    graph = env.task_graph()
    if not isinstance(graph, TaskGraph):
        raise EnvCheckError(
            "interface", f"task_graph() returned {type(graph).__name__}, expected a TaskGraph",
            "return a gyre_ma.options.TaskGraph (TaskGraph.from_spec builds one from a dict)",
        )
    verifiers = {}
    detectors = getattr(env, "detectors", None) or {}
    for m in graph.milestones:
        if m.verifier is None:  # a closure or lambda detector: re-verify with the adapter's own callable
            if m.name in detectors:
                verifiers[m.name] = detectors[m.name]
            continue
        try:
            fn = resolve(m.verifier, f"task_graph milestone {m.name!r} verifier")
        except ValueError as exc:
            raise EnvCheckError(
                "verifier", str(exc), "make the graph's verifier an importable 'module:callable'",
                milestone=m.name,
            ) from None
        if not callable(fn):
            raise EnvCheckError(
                "verifier", f"verifier {m.verifier!r} is a {type(fn).__name__}, not a callable",
                "point the verifier at a function env -> bool", milestone=m.name,
            )
        verifiers[m.name] = fn
    return graph, verifiers


# ---------------------------------------------------------------------- per-step checks
@dataclass
class _Trace:
    actions: list[dict] = field(default_factory=list)
    verified: list[frozenset[str]] = field(default_factory=list)
    observations: list[dict] = field(default_factory=list)
    agents: list[tuple[str, ...]] = field(default_factory=list)
    goals: tuple[str, ...] = ()
    """What ``episode_goals()`` said after the reset (() where the env has the graph's)."""


class _Probe:
    """Stands in for the environment in a rollout and checks every reset and step.

    Attributes it does not define (``agents``, ``unwrapped``, ``max_cycles`` ...) are the
    environment's, so ``run_episode`` and scripted options drive it like the env itself.
    """

    def __init__(
        self,
        env: Any,
        graph: TaskGraph,
        verifiers: dict[str, Callable[[Any], Any]],
        seed: int,
        expected: _Trace | None = None,
    ) -> None:
        self._env = env
        self._graph = graph
        self._verifiers = verifiers
        self._seed = seed
        self._expected = expected
        self._step = 0
        self._prev: frozenset[str] = frozenset()
        self.trace = _Trace()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        out = self._env.reset(seed=seed, options=options)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise EnvCheckError(
                "reset", f"reset() returned {type(out).__name__}, expected (observations, infos)",
                "return two dicts keyed by agent", seed=self._seed, step=0,
            )
        self._step = 0
        self._prev = frozenset()
        self._after(out[0], None)
        self._check_goals()
        return out

    def _check_goals(self) -> None:
        """The episode's own goals, where the env says them (:func:`~gyre_ma.envs.base.episode_goals`,
        the rollout's reading of them): the graph's goals, and the same for the same seed."""
        try:
            goals = episode_goals(self._env, self._graph, self._seed)
        except UserAnswerError as exc:
            raise self._fail("episode_goals", str(exc),
                             "name only goals the graph declares: its goals are every goal an episode may have")
        if self._expected is not None and goals != self._expected.goals:
            raise self._fail("determinism", f"with the same seed, episode_goals() after reset was "
                             f"{list(self._expected.goals)} then {list(goals)}",
                             "draw the episode's goals from reset(seed=...)'s random state")
        self.trace.goals = goals

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        self.trace.actions.append(dict(actions))
        out = self._env.step(actions)
        self._step += 1
        if not (isinstance(out, tuple) and len(out) == 5):
            raise EnvCheckError(
                "step",
                f"step() returned {type(out).__name__} of length {len(out) if hasattr(out, '__len__') else '?'}",
                "return (observations, rewards, terminations, truncations, infos), each a dict keyed by agent",
                seed=self._seed, step=self._step,
            )
        self._after(out[0], out[1:], acted=list(actions))
        return out

    def _fail(self, check: str, problem: str, fix: str, **where: Any) -> EnvCheckError:
        return EnvCheckError(check, problem, fix, seed=self._seed, step=self._step, **where)

    @property
    def _when(self) -> str:
        return "at reset" if self._step == 0 else f"after step {self._step}"

    def _after(self, observations: Any, outputs: tuple | None, acted: Sequence[str] = ()) -> None:
        env = self._env
        if not isinstance(observations, Mapping):
            raise self._fail(
                "observations", f"observations {self._when} are a {type(observations).__name__}",
                "return a dict agent -> observation",
            )
        verified = env.verified_milestones()
        agents = tuple(env.agents)
        if self._expected is not None:
            self._compare(observations, verified, agents)
        self.trace.observations.append(copy.deepcopy(dict(observations)))
        self.trace.agents.append(agents)
        possible = set(env.possible_agents)
        stray = [a for a in agents if a not in possible]
        if stray:
            raise self._fail(
                "agents", f"live agent(s) {stray} are not in possible_agents {env.possible_agents}",
                "list every agent that can ever act in possible_agents", agent=stray[0],
            )
        for agent, obs in observations.items():
            if agent not in possible:
                continue
            space = env.observation_space(agent)
            if not space.contains(obs):
                raise self._fail(
                    "observation_space",
                    f"the observation for agent {agent!r} {self._when} is outside "
                    f"observation_space({agent!r}): {why_outside(space, obs, 'observation')}",
                    "clip or cast the observation to the declared space, or widen the space "
                    "(its bounds, shape and dtype) to what the env really emits",
                    agent=agent,
                )
        if outputs is not None:
            self._check_outputs(outputs, acted)
        self._check_state()
        self._check_milestones(verified)
        self.trace.verified.append(frozenset(verified))
        self._prev = frozenset(verified)

    def _compare(self, observations: Mapping, verified: Any, agents: tuple[str, ...]) -> None:
        exp = self._expected
        t = self._step
        fix_env = (
            "seed every source of randomness from reset(seed=...) (self.np_random, the action "
            "and observation spaces), clear all per-episode state in reset(), and iterate no set "
            "of objects (nor a dict keyed by them) without sorting it: its order follows memory "
            "addresses, which differ from one episode to the next (the replay resets the same "
            "instance with the same seed and feeds it the same actions)"
        )
        if t >= len(exp.verified):
            raise self._fail(
                "determinism",
                f"replaying the same seed and actions ran past the original episode's {len(exp.verified) - 1} step(s)",
                fix_env,
            )
        if agents != exp.agents[t]:
            raise self._fail(
                "determinism",
                f"with the same seed and actions, live agents {self._when} were {list(exp.agents[t])} "
                f"then {list(agents)}",
                fix_env,
            )
        for agent in sorted(set(observations) | set(exp.observations[t]), key=str):
            if not data_equivalence(observations.get(agent), exp.observations[t].get(agent)):
                raise self._fail(
                    "determinism",
                    f"with the same seed and actions, agent {agent!r}'s observation {self._when} differs "
                    "between two runs, first "
                    f"{first_difference(exp.observations[t].get(agent), observations.get(agent))}",
                    fix_env, agent=agent,
                )
        if frozenset(verified) != exp.verified[t]:
            diff = sorted(frozenset(verified) ^ exp.verified[t])
            raise self._fail(
                "determinism",
                f"with the same seed and actions (and identical observations), verified_milestones() "
                f"{self._when} was {sorted(exp.verified[t])} then {sorted(verified)}: the verifier is "
                "not deterministic",
                "verify milestones from environment state only — no unseeded RNG, clock, or "
                "counter that survives reset()",
                milestone=diff[0],
            )

    def _check_outputs(self, outputs: tuple, acted: Sequence[str]) -> None:
        names = ("rewards", "terminations", "truncations", "infos")
        for name, value in zip(names, outputs, strict=True):
            if not isinstance(value, Mapping):
                raise self._fail(
                    "step", f"{name} {self._when} is a {type(value).__name__}, expected a dict keyed by agent",
                    f"return {name} as a dict agent -> value",
                )
        rewards, terminations, truncations, _ = outputs
        for agent in acted:
            for name, table in (("terminations", terminations), ("truncations", truncations)):
                if agent not in table:
                    raise self._fail(
                        "step", f"agent {agent!r} acted but has no entry in {name} {self._when}",
                        "give every agent that acted a terminations and a truncations entry "
                        "(gyre keeps them apart: truncation is bootstrapped, termination is not)",
                        agent=agent,
                    )
            r = rewards.get(agent, 0.0)
            if isinstance(r, bool) or not isinstance(r, (int, float, np.number)) or not math.isfinite(float(r)):
                several = isinstance(r, (list, tuple, np.ndarray)) and np.ndim(r) == 1 and len(r) > 1
                raise self._fail(
                    "step", f"reward for agent {agent!r} {self._when} is {r!r}, expected a finite number",
                    "return a finite float reward per agent" + (
                        "; a list of rewards, one per agent, is a multi-agent Gymnasium env's: adapt it with "
                        f"from_gymnasium(env, agents={len(r)}, ...), which gives each agent its entry of the Tuple "
                        "spaces, observations and rewards" if several else ""), agent=agent,
                )

    def _check_state(self) -> None:
        env = self._env
        try:
            state = env.state()
        except NotImplementedError:
            raise self._fail(
                "state", "state() raises NotImplementedError",
                "implement state() (a global view of the env; the critics read it)",
            ) from None
        space = getattr(env, "state_space", None)
        if space is not None and not space.contains(state):
            raise self._fail(
                "state", f"state() {self._when} is outside state_space: {why_outside(space, state, 'state')}",
                "make state_space describe what state() returns",
            )

    def _check_milestones(self, verified: Any) -> None:
        graph = self._graph
        if not isinstance(verified, (set, frozenset)) or not all(isinstance(m, str) for m in verified):
            raise self._fail(
                "milestones", f"verified_milestones() {self._when} returned {verified!r}",
                "return a frozenset of milestone names",
            )
        for m in sorted(verified):
            if m not in graph:
                raise self._fail(
                    "graph_nodes",
                    f"verified_milestones() {self._when} reports {m!r}, which is not a node of "
                    f"task_graph(); nodes: {list(graph.names)}",
                    "add the milestone to the task graph, or stop reporting it",
                    milestone=m,
                )
        lost = sorted(self._prev - verified)
        if lost:
            raise self._fail(
                "monotone",
                f"milestone {lost[0]!r} was verified "
                f"{'at reset' if self._step == 1 else f'after step {self._step - 1}'} but not {self._when}; "
                "verified_milestones() must be monotone within an episode",
                "keep a set of achieved milestones, add to it after each step, clear it only in reset()",
                milestone=lost[0],
            )
        for m in sorted(verified):
            if graph.unlocked(m, verified):
                continue
            spec = graph.milestone(m)
            needs = [f"{d!r}" for d in spec.requires if d not in verified]
            needs += [
                "one of " + ", ".join(repr(d) for d in group)
                for group in spec.any_of
                if not any(d in verified for d in group)
            ]
            raise self._fail(
                "graph_order",
                f"milestone {m!r} is verified {self._when} but its prerequisite(s) are not: "
                f"{'; '.join(needs)} (verified: {sorted(verified)})",
                "make the env's rules enforce the graph (no achieving a milestone before what it "
                "needs), or fix the graph's edges to match the env",
                milestone=m,
            )
        raw = self._env.unwrapped
        new = verified - self._prev
        for m, fn in self._verifiers.items():
            try:
                holds = fn(raw)
            except Exception as exc:
                raise self._fail(
                    "verifier",
                    f"verifier {graph.milestone(m).verifier!r} raised {type(exc).__name__}: {exc} {self._when}",
                    f"make the verifier a total predicate over {type(raw).__name__} returning a bool",
                    milestone=m,
                ) from exc
            if m in new and not holds:
                raise self._fail(
                    "verifier",
                    f"verified_milestones() reports {m!r} {self._when}, but its verifier "
                    f"{graph.milestone(m).verifier!r} is false on the env state: the milestone has "
                    "no state to support it",
                    "report a milestone only when the state satisfies its verifier (check the "
                    "verifier after each step rather than trusting an agent's claim)",
                    milestone=m,
                )
            if holds and m not in verified:
                raise self._fail(
                    "verifier",
                    f"the state satisfies {m!r}'s verifier {graph.milestone(m).verifier!r} {self._when}, "
                    "but verified_milestones() does not report it",
                    "run the milestone's verifier after every reset and step, and add what holds",
                    milestone=m,
                )


def _sample(env: Any, agent: str, observations: Mapping, infos: Mapping) -> Any:
    obs, info = observations.get(agent), infos.get(agent) or {}
    mask = None
    if isinstance(obs, Mapping) and "action_mask" in obs:
        mask = obs["action_mask"]
    elif isinstance(info, Mapping) and "action_mask" in info:
        mask = info["action_mask"]
    space = env.action_space(agent)
    return space.sample(mask=mask) if mask is not None else space.sample()


def _random_episode(probe: _Probe, seed: int, n_steps: int) -> None:
    observations, infos = probe.reset(seed=seed)
    for i, agent in enumerate(probe.possible_agents):
        probe.action_space(agent).seed(seed + i)
    for _ in range(n_steps):
        if not probe.agents:
            return
        actions = {a: _sample(probe, a, observations, infos) for a in probe.agents}
        observations, _, _, _, infos = probe.step(actions)


def _replay(probe: _Probe, seed: int, actions: list[dict]) -> None:
    probe.reset(seed=seed)
    for act in actions:
        probe.step({a: v for a, v in act.items() if a in probe.agents})
    expected = probe._expected
    if expected is not None and len(probe.trace.verified) != len(expected.verified):
        raise probe._fail(
            "determinism",
            f"replaying the same seed and actions ended after {len(probe.trace.verified) - 1} step(s), "
            f"the original after {len(expected.verified) - 1}",
            "seed every source of randomness from reset(seed=...)",
        )


# ---------------------------------------------------------------------- episode-level checks
def _check_max_cycles(factory: Callable[[], Any], seed: int) -> None:
    env = factory()
    cap = min(int(env.max_cycles), 5)
    try:
        env.max_cycles = cap
    except AttributeError:
        raise EnvCheckError(
            "max_cycles", "max_cycles cannot be assigned",
            "make max_cycles a plain attribute read at step time (PettingZoo's parallel_api_test sets it)",
        ) from None
    observations, infos = env.reset(seed=seed)
    for step in range(1, cap + 1):
        if not env.agents:
            break
        actions = {a: _sample(env, a, observations, infos) for a in env.agents}
        observations, _, terminations, truncations, infos = env.step(actions)
        if step == cap:
            alive = [a for a in actions if not (terminations.get(a) or truncations.get(a))]
            if alive or env.agents:
                agent = (alive or list(env.agents))[0]
                raise EnvCheckError(
                    "max_cycles",
                    f"with max_cycles = {cap}, agent {agent!r} was neither terminated nor truncated "
                    f"after step {cap} (live agents: {list(env.agents)})",
                    "count steps since reset() and, when the count reaches self.max_cycles, set "
                    "truncations[a] = True for every live agent and empty self.agents",
                    seed=seed, step=cap, agent=agent,
                )
    env.close()


def _pettingzoo_tests(factory: Callable[[], Any], n_steps: int, module: ModuleType | None) -> list[str]:
    from pettingzoo.test import (
        api_test,
        max_cycles_test,
        parallel_api_test,
        parallel_seed_test,
        seed_test,
    )
    from pettingzoo.utils.conversions import parallel_to_aec

    tests: list[tuple[str, Callable[[], None]]] = [
        ("parallel_api_test", lambda: parallel_api_test(factory(), num_cycles=n_steps)),
        ("parallel_seed_test", lambda: parallel_seed_test(factory, num_cycles=n_steps)),
        ("api_test", lambda: api_test(parallel_to_aec(factory()), num_cycles=n_steps)),
        ("seed_test", lambda: seed_test(lambda: parallel_to_aec(factory()), num_cycles=n_steps)),
    ]
    if module is not None and callable(getattr(module, "parallel_env", None)) and callable(
        getattr(module, "env", None)
    ):
        tests.append(("max_cycles_test", lambda: max_cycles_test(module)))
    for name, run in tests:
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                run()
        except EnvCheckError:
            raise
        except Exception as exc:
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            detail = str(exc) or (frame.line or "").strip()
            raise EnvCheckError(
                f"pettingzoo.{name}",
                f"{type(exc).__name__}: {detail} (at {Path(frame.filename).name}:{frame.lineno})",
                f"PettingZoo's own {name} failed: the line above names the ParallelEnv/AEC rule "
                f"the env breaks (see pettingzoo/test/ for the test's source)",
            ) from exc
    return [name for name, _ in tests]


# ---------------------------------------------------------------------- messages
def first_difference(a: Any, b: Any, where: str = "") -> str:
    """Where two observations first differ and how: ``at ['image'][3, 4, 0]: 2 vs 5`` (the
    element, not the whole value, so a large array's one changed cell is named)."""
    at = where or "the top level"
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if a.keys() != b.keys():
            return f"at {at}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for key in a:
            if not data_equivalence(a[key], b[key]):
                return first_difference(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if not data_equivalence(x, y):
                return first_difference(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape and a.dtype == b.dtype:
        index = tuple(int(i) for i in np.argwhere(~((a == b) | (a != a) & (b != b)))[0]) if a.size else ()
        if index:
            return f"at {where or 'the array'}[{', '.join(map(str, index))}]: {a[index]!r} vs {b[index]!r}"
    return f"at {at}: {describe(a)} vs {describe(b)}"


def describe(value: Any, limit: int = 120) -> str:
    """A short, readable summary of an observation or action for an error message."""
    if isinstance(value, np.ndarray):
        text = f"array(shape={value.shape}, dtype={value.dtype}"
        if value.size and np.issubdtype(value.dtype, np.number):
            text += f", min={value.min()}, max={value.max()}"
        return text + ")"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k!r}: {describe(v, 40)}" for k, v in value.items()) + "}"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def why_outside(space: spaces.Space, value: Any, label: str = "value") -> str:
    """Which part of ``value`` falls outside ``space``, and how."""
    if isinstance(space, spaces.Dict):
        if not isinstance(value, Mapping):
            return f"{label} is a {type(value).__name__}, expected a dict with keys {list(space.spaces)}"
        for key, sub in space.spaces.items():
            if key not in value:
                return f"{label}[{key!r}] is missing"
            if not sub.contains(value[key]):
                return why_outside(sub, value[key], f"{label}[{key!r}]")
        return f"{label} has extra key(s) {sorted(set(value) - set(space.spaces), key=str)}"
    if isinstance(space, spaces.Tuple) and isinstance(value, (tuple, list)):
        if len(value) != len(space.spaces):
            return f"{label} has {len(value)} item(s), expected {len(space.spaces)}"
        for i, sub in enumerate(space.spaces):
            if not sub.contains(value[i]):
                return why_outside(sub, value[i], f"{label}[{i}]")
    if isinstance(space, spaces.Box):
        arr = np.asarray(value)
        if arr.shape != space.shape:
            return f"{label} has shape {arr.shape}, expected {space.shape}"
        if not np.can_cast(arr.dtype, space.dtype):
            return f"{label} has dtype {arr.dtype}, which does not cast safely to {space.dtype}"
        if np.issubdtype(arr.dtype, np.floating) and np.isnan(arr).any():  # NaN compares outside no bound
            nan = np.argwhere(np.isnan(arr))
            idx = tuple(int(i) for i in nan[0])
            return f"{label}{list(idx) if idx else ''} is NaN ({len(nan)} of {arr.size} value(s) NaN)"
        bad = np.argwhere((arr < space.low) | (arr > space.high))
        if len(bad):
            idx = tuple(int(i) for i in bad[0])
            return (
                f"{label}{list(idx) if idx else ''} = {arr[idx].item()!r} is outside "
                f"[{np.asarray(space.low)[idx].item()!r}, {np.asarray(space.high)[idx].item()!r}] "
                f"({len(bad)} value(s) out of bounds)"
            )
    return f"{label} = {describe(value)} is not in {space}"
