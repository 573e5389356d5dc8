"""Option-level rollout: agents pick options, options emit primitive actions.

Each agent of a PettingZoo ParallelEnv runs its current option until the option
terminates; then the manager chooses the next one among the eligible options. Every
choice becomes an :class:`OptionCall`; an episode becomes a :class:`Trajectory`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
import types
import warnings
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from gyre_ma.envs.base import GyreEnv, episode_goals
from gyre_ma.options.decision import Choice, Decision, Manager
from gyre_ma.options.errors import UserAnswerError, UserCodeError, callable_name
from gyre_ma.options.library import OptionLibrary
from gyre_ma.options.option import CANNOT_PROCEED, Option, OptionContext, Termination, is_behaviour
from gyre_ma.watchdog import EpisodeTimeout, OptionTimeout, watchdog


@dataclass
class OptionCall:
    """One manager decision and everything that happened while its option ran.

    ``raw_reward`` is the environment's reward summed over the call's steps, as played.
    ``reward`` is the option reward the learner backs up, ``reward + γ^duration · V(next)``:
    the call's arbitrated, verified reward discounted inside the option, Σ_k γ^k r_{t+k},
    set by :func:`gyre_ma.rewards.scorer.apply_breakdowns` (the one place the discount
    inside an option is computed); 0 until the call is scored.
    """

    agent: str
    agent_index: int
    option: int
    observation: Any
    mask: np.ndarray
    achieved: frozenset[str]
    last_option: int
    time_fraction: float
    log_prob: float
    value: float
    start_step: int
    policy_version: int
    task_seed: int
    duration: int = 0
    reward: float = 0.0
    raw_reward: float = 0.0
    milestones: tuple[str, ...] = ()
    terminated: bool = False
    truncated: bool = False
    termination: Termination | None = None
    state: np.ndarray | None = None
    """Global state at the decision (only with ``record_state``; centralised critic)."""
    others: tuple[int, ...] = ()
    """The options the other agents were running when this one was chosen (Decision.others)."""
    breakdown: Any = None
    """The arbitrated RewardBreakdown once the evaluator scored it; ``reward`` is then its total."""
    goals: tuple[str, ...] = ()
    """The episode's goals, where the env sets them per episode (Decision.goals); (): the graph's."""

    @property
    def option_terminated(self) -> bool:
        return self.termination is not None


_CALL_FIELDS = tuple(f.name for f in dataclasses.fields(OptionCall))


@dataclass
class Trajectory:
    """A whole episode: option calls in decision order, per agent and overall."""

    task_seed: int
    policy_version: int
    calls: list[OptionCall] = field(default_factory=list)
    length: int = 0
    """Primitive (team) steps taken."""
    horizon: int = 0
    """The step cap the episode ran under (the env's own ``max_cycles`` if lower); 0 if unknown."""
    milestone_steps: dict[str, int] = field(default_factory=dict)
    """First step at which each milestone was verified."""
    success: bool = False
    """Every goal verified on environment state at the end."""
    total_reward: float = 0.0
    tool_calls: int | None = None
    """Tool calls made in the episode, where the env counts them (``env.tool_calls()``)."""
    scores: dict[str, float] = field(default_factory=dict)
    """The env's own figures of the episode (``env.episode_scores()``, asked as it ended; an
    adapter's ``scores``): a schedule's makespan against a heuristic's, say."""
    rule_results: Any = None
    """What the rule engine found at option and episode ends (gyre_ma.rewards.rules.RuleResults)."""
    milestone_agents: dict[str, str] = field(default_factory=dict)
    """The agent each milestone is attributed to, where the env tells (``milestone_agent``);
    a milestone attributed to one agent is not another agent's call's achievement."""
    dead_ends: list[str] = field(default_factory=list)
    """Agents for which no option was eligible (a dead end of the library, e.g. a one-shot
    option whose milestone was lost): the episode was cut there, as a truncation."""
    dead_end_why: str = ""
    """Why the first dead end had no option, in words (:func:`dead_end_reason`)."""
    option_timeouts: list[str] = field(default_factory=list)
    """Options whose call ran past ``backend.option_timeout_s`` (ended as failures)."""
    faults: list[str] = field(default_factory=list)
    """Faults the episode played on through (``backend.on_fault: continue``), one line each:
    a sub-policy that raised or answered an unusable action (its call ended as
    ``Termination.FAULT``), or the env's step that raised (the episode was cut there)."""
    cut_by_fault: bool = False
    """The env raised in a step (or its reset) and the episode was cut there, as a truncation."""
    timed_out: bool = False
    """The episode ran past ``backend.episode_timeout_s`` and was cut, as a truncation."""
    subpolicy_seconds: float = 0.0
    """Wall time spent inside the options' sub-policies (the user's code), for profiling."""
    llm_requests: int = 0
    """Model requests of LLM-backed sub-policies (retries included)."""
    llm_invalid: int = 0
    """Model outputs an LLM-backed sub-policy could not use (each one retried or replaced)."""
    llm_fallbacks: int = 0
    """Steps whose LLM-backed sub-policy ran out of retries and took its fallback action."""
    goals: tuple[str, ...] = ()
    """This episode's goals, where the env sets them per episode (``env.episode_goals()``);
    () means the task graph's. Success is every one of them verified."""
    vetoed: bool = False
    """A guard rule vetoed the episode (set where the rule engine ends the episode, and
    again when its rewards are arbitrated)."""

    @property
    def counted_success(self) -> bool:
        """Verified success that no guard vetoed: what the learner counts as a win (its
        outcome, self-imitation's group best, the elite order, the curriculum). A guard veto
        ranks above the outcome, so a shortcut the guards catch is worth a failure, not a
        success the learner would chase."""
        return self.success and not self.vetoed

    def agent_calls(self, agent: str) -> list[OptionCall]:
        return [c for c in self.calls if c.agent == agent]

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled with its calls as columns: one array per array field (observation, mask,
        state) where every call's has the same shape and dtype, else a list. A Ray actor
        ships its trajectories to the driver this way; pickled call by call, a tech-tree
        batch cost the driver ~10 µs per array to unpickle (two arrays a call), CPU that
        the actors, on a small machine, then lacked."""
        state = dict(self.__dict__)
        calls = state.pop("calls")
        return _unpickle_trajectory, (type(self), state, _calls_to_columns(calls))


_STACKABLE = ("observation", "mask", "state")
"""OptionCall fields stacked into one array per trajectory when pickled, where they can be."""


def _calls_to_columns(calls: list[OptionCall]) -> dict[str, Any]:
    columns: dict[str, Any] = {}
    for name in _CALL_FIELDS:
        values = [c.__dict__[name] for c in calls]
        if name in _STACKABLE and _stackable(values):
            columns[name] = np.stack(values)
        else:
            columns[name] = values
    return columns


def _stackable(values: list[Any]) -> bool:
    """Every value an ndarray (not a subclass) of one shape (ndim >= 1: a stack's rows of a
    0-d array would come back as numpy scalars) and dtype."""
    if not values or type(values[0]) is not np.ndarray or values[0].ndim == 0:
        return False
    shape, dtype = values[0].shape, values[0].dtype
    return all(type(v) is np.ndarray and v.shape == shape and v.dtype == dtype for v in values)


def _unpickle_trajectory(cls: type[Trajectory], state: dict[str, Any], columns: dict[str, Any]) -> Trajectory:
    traj = cls.__new__(cls)
    traj.__dict__.update(state)
    names = list(columns)
    calls = []
    for row in zip(*(list(col) if isinstance(col, np.ndarray) else col for col in columns.values()), strict=True):
        call = OptionCall.__new__(OptionCall)
        call.__dict__.update(zip(names, row))
        calls.append(call)
    traj.calls = calls
    return traj


class _Running:
    """An option call in progress. The per-step sums live here and reach ``call`` when it
    ends (:meth:`close`): the step loop touches only these slots."""

    __slots__ = ("call", "ctx", "option", "policy", "behaviour", "raw", "spent", "batched")

    def __init__(self, call: OptionCall, ctx: OptionContext, option: Option) -> None:
        self.call, self.ctx, self.option = call, ctx, option
        if is_behaviour(option.policy):  # an option with state: a fresh instance per call
            self.behaviour = option.policy()
            self.behaviour.start(ctx)
            self.policy = self.behaviour.act
        else:
            self.behaviour, self.policy = None, option.policy
        self.batched = (callable(getattr(self.policy, "request", None))
                        and callable(getattr(self.policy, "resolve", None)))
        """Its action comes from a batched model call (an LLM option): asked of the driver."""
        self.raw = 0.0
        self.spent = 0.0
        """Seconds its sub-policy has run in this call."""

    def termination(self, verified: frozenset[str]) -> Termination | None:
        return self.option.termination(self.ctx, verified, self.behaviour)

    def close(self, terminated: bool, truncated: bool, reason: Termination,
              milestone_steps: dict[str, int], milestone_agents: dict[str, str]) -> OptionCall:
        call = self.call
        call.duration, call.raw_reward = self.ctx.steps, self.raw
        call.terminated, call.truncated, call.termination = terminated, truncated, reason
        mine = []
        for m, s in reversed(milestone_steps.items()):  # stamped in step order: the call's come last
            if s <= call.start_step:
                break
            if milestone_agents.get(m, call.agent) == call.agent:
                mine.append(m)
        call.milestones = tuple(reversed(mine))
        return call


def run_episode(
    env: GyreEnv,
    library: OptionLibrary,
    manager: Manager,
    *,
    seed: int,
    policy_version: int = 0,
    max_steps: int | None = None,
    record_state: bool = False,
    step_log: list[tuple[dict, dict]] | None = None,
    on_option_end: Callable[[OptionCall, Any], None] | None = None,
    option_timeout_s: float | None = None,
    episode_timeout_s: float | None = None,
    on_fault: str = "stop",
) -> Trajectory:
    """Roll one episode out, option by option, and return its whole trajectory: the
    episode :func:`play_episode` plays, with each decision asked of ``manager``.

    The manager's own hooks run too: ``episode_start(env, seed)`` after the reset and
    ``option_end(call, env)`` as each call ends, where it has them."""
    hooks = [h for h in (on_option_end, getattr(manager, "option_end", None)) if callable(h)]
    begin = getattr(manager, "episode_start", None)
    play = play_episode(env, library, seed=seed, policy_version=policy_version, max_steps=max_steps,
                        record_state=record_state, step_log=step_log, on_option_end=hooks,
                        on_start=begin if callable(begin) else None, option_timeout_s=option_timeout_s,
                        episode_timeout_s=episode_timeout_s, on_fault=on_fault)
    users = is_users(manager)
    try:
        pending = next(play)
        while True:
            if isinstance(pending, Decision):
                pending = play.send(ask(manager, pending, users_manager=users, seed=seed))
            else:  # LLM-backed sub-policies' requests (gyre_ma.llm.option.ActionRequests)
                from gyre_ma.llm.option import answer

                pending = play.send(answer(pending.requests))
    except StopIteration as done:
        return done.value


def is_users(manager: Any) -> bool:
    """Whether ``manager`` is a user's (its errors are named as theirs) rather than one of gyre-ma's."""
    return not type(manager).__module__.startswith("gyre_ma.")


def ask(manager: Manager, decision: Decision, *, users_manager: bool, seed: int) -> Choice:
    """``manager``'s one choice for ``decision``; an exception from a user's manager is a
    :class:`UserCodeError` naming it."""
    try:
        choices = manager.decide([decision])
    except Exception as exc:
        if not users_manager:  # gyre-ma's own managers: a bug keeps its traceback
            raise
        raise UserCodeError(f"manager {callable_name(manager.decide)} (agent {decision.agent!r}, "
                            f"task seed {seed})", exc) from exc
    if len(choices) != 1:
        raise ValueError(f"manager {type(manager).__name__}.decide returned {len(choices)} choices for "
                         "1 decision; expected one Choice per Decision")
    return choices[0]


def play_episode(
    env: GyreEnv,
    library: OptionLibrary,
    *,
    seed: int,
    policy_version: int = 0,
    max_steps: int | None = None,
    record_state: bool = False,
    step_log: list[tuple[dict, dict]] | None = None,
    on_option_end: Sequence[Callable[[OptionCall, Any], None]] = (),
    on_start: Callable[[Any, int], None] | None = None,
    option_timeout_s: float | None = None,
    episode_timeout_s: float | None = None,
    on_fault: str = "stop",
) -> Generator[Decision, Choice, Trajectory]:
    """Play one episode, option by option, as a coroutine: it yields each
    :class:`Decision` to be made and takes the :class:`Choice` sent back, and yields the
    model requests of LLM-backed sub-policies (:class:`~gyre_ma.llm.option.ActionRequests`,
    every such agent of a step together) and takes their answers; it returns the whole
    :class:`Trajectory`. :func:`run_episode` drives it with one manager; the batched
    engine (:mod:`gyre_ma.backends.engine`) drives many at once.

    At each step every live agent between options gets one decision, in ``env.agents``
    order, seeing the options the others run (those just chosen included; an option
    run by as many of them as its ``exclusive`` allows is not eligible); then every
    agent's option emits one primitive action. A sub-policy that returns
    :data:`~gyre_ma.options.option.CANNOT_PROCEED` ends its call there, without a step,
    and its agent decides again (that option set aside until the next step). An agent
    with no eligible option is a dead end of the library: the episode is cut there, as a
    truncation, and the agent is listed in ``Trajectory.dead_ends``.

    ``max_steps`` is the primitive step cap (defaults to the env's own ``max_cycles``);
    reaching it truncates every running option. ``record_state`` stores ``env.state()``
    at every decision (for a centralised critic); ``step_log`` receives each step's
    (actions, rewards), for the trajectory store; each ``on_option_end`` hook ``(call, env)``
    runs as an option call ends, while the env holds the state it ended in (rule checks),
    and ``on_start(env, seed)`` after the reset. Once every goal is verified the task is
    done: the episode ends there, as a termination.

    ``on_fault`` (``backend.on_fault``): ``"stop"`` raises the first fault of the user's
    code as one :class:`UserCodeError`; ``"continue"`` ends a call whose sub-policy raised
    or answered an unusable action as :attr:`~gyre_ma.options.option.Termination.FAULT`
    (its agent decides again, that option set aside until the next step), and cuts the
    episode at an env step that raised, as a truncation (``cut_by_fault``), or before its
    first step where the reset raised; each is kept in ``Trajectory.faults`` and warned once
    per source.

    Wall-clock bounds (:mod:`gyre_ma.watchdog`; None: none): an option call whose
    sub-policy has run ``option_timeout_s`` seconds in all ends as
    :attr:`~gyre_ma.options.option.Termination.TIMEOUT` (a failure, listed in
    ``Trajectory.option_timeouts``, warned once per option), set aside like a blocked
    one; an episode past ``episode_timeout_s`` is cut as a truncation
    (``Trajectory.timed_out``).
    """
    try:
        observations, _ = env.reset(seed=seed)
    except Exception as exc:  # a flaky env's reset (a remote service's): cut before its first step
        fault = _env_fault(exc, f"environment {_env_name(env)}.reset (task seed {seed})", on_fault)
        cut = Trajectory(task_seed=seed, policy_version=policy_version, horizon=_horizon(env, max_steps)[1],
                         cut_by_fault=True)
        _faulted(cut, f"environment {_env_name(env)}.reset", fault, seed, 0)
        return cut
    checks = {a: action_check(env.action_space(a), a) for a in env.possible_agents}
    cap, horizon = _horizon(env, max_steps)
    traj_goals = episode_goals(env, library.graph, seed)
    goals = frozenset(traj_goals or library.graph.goals)
    agent_index = {a: i for i, a in enumerate(env.possible_agents)}
    rng = np.random.default_rng(seed)
    traj = Trajectory(task_seed=seed, policy_version=policy_version, horizon=horizon, goals=traj_goals)
    running: dict[str, _Running | None] = {a: None for a in env.agents}
    previous: dict[str, OptionCall | None] = {a: None for a in env.possible_agents}  # its last call, ended
    hooks = list(on_option_end)
    capacity = [opt.capacity for opt in library]
    asks_state = library.asks_state
    attribute = getattr(env, "milestone_agent", None)
    attribute = attribute if callable(attribute) else None
    if on_start is not None:
        on_start(env, seed)

    def end(run: _Running, terminated: bool, truncated: bool, reason: Termination) -> None:
        call = run.close(terminated, truncated, reason, traj.milestone_steps, traj.milestone_agents)
        previous[call.agent] = call
        for hook in hooks:
            hook(call, env)

    def decision(agent: str, step: int, verified: frozenset[str], set_aside: set[int]) -> Decision | None:
        """The decision ``agent`` faces; None at a dead end (no eligible option)."""
        obs = observations.get(agent, _ABSENT)
        if obs is _ABSENT or agent not in agent_index:
            raise ValueError(_unknown_agent(env, agent, step))
        ctx = OptionContext(agent=agent, env=env, observation=obs, achieved=verified, rng=rng) if asks_state else None
        mask = library.mask(verified, ctx)
        if set_aside:
            mask[list(set_aside)] = False
        others = tuple(r.call.option for b in env.agents if b != agent and (r := running.get(b)) is not None)
        for option in others:
            if (most := capacity[option]) is not None and (most == 1 or others.count(option) >= most):
                mask[option] = False
        if not np.count_nonzero(mask):  # ndarray.any costs four times as much on a mask this small
            return None
        before = previous[agent]
        if before is None:
            return Decision(agent, agent_index[agent], obs, mask, verified, -1, step / cap, env, others, None,
                            traj_goals)
        return Decision(agent, agent_index[agent], obs, mask, verified, before.option, step / cap, env, others,
                        before.termination, traj_goals, before.duration)

    def start(d: Decision, choice: Choice, step: int) -> _Running:
        """The call ``choice`` starts for decision ``d``."""
        mask = d.mask
        if not (0 <= choice.option < len(mask)) or not mask[choice.option]:
            name = library[choice.option].name if 0 <= choice.option < len(mask) else choice.option
            raise ValueError(f"manager chose option {name!r} for agent {d.agent!r}, which the mask forbids")
        call = OptionCall(
            agent=d.agent, agent_index=d.agent_index, option=choice.option, observation=d.observation, mask=mask,
            achieved=d.achieved, last_option=d.last_option, time_fraction=d.time_fraction,
            log_prob=choice.log_prob, value=choice.value, start_step=step, policy_version=policy_version,
            task_seed=seed, state=_global_state(env) if record_state else None, others=d.others, goals=d.goals,
        )
        traj.calls.append(call)
        return _Running(call, OptionContext(d.agent, env, d.observation, d.achieved, rng=rng), library[choice.option])

    verified = _verified(env, 0, names=True)
    for m in verified:
        traj.milestone_steps.setdefault(m, 0)
    step = 0
    option_limit = math.inf if option_timeout_s is None else float(option_timeout_s)
    watch = watchdog() if option_timeout_s is not None or episode_timeout_s is not None else _UNWATCHED
    # the episode's budget counts its own play (env, options), not the waits for its
    # decisions, which a batched worker shares among the episodes in flight
    budget = math.inf if episode_timeout_s is None else float(episode_timeout_s)
    resumed = time.perf_counter()
    watch.episode_deadline = resumed + budget
    try:
        while env.agents and step < cap and not goals <= verified:
            actions = {}
            deferred: list[str] = []
            for a in env.agents:
                set_aside: set[int] = set()
                while a not in actions:
                    run = running.get(a)
                    if run is None:
                        d = decision(a, step, verified, set_aside)
                        if d is None:
                            if not traj.dead_ends:
                                traj.dead_end_why = dead_end_reason(library, a, step, verified, set_aside, running, env,
                                                                     observations.get(a))
                            traj.dead_ends.append(a)
                            break
                        budget -= time.perf_counter() - resumed
                        watch.episode_deadline = math.inf  # no deadline while others play
                        choice = yield d
                        resumed = time.perf_counter()
                        watch.episode_deadline = resumed + budget
                        run = running[a] = start(d, choice, step)
                    if run.batched:  # its action is asked of the driver with the step's others
                        deferred.append(a)
                        break
                    started = time.perf_counter()
                    if started >= watch.episode_deadline:
                        raise EpisodeTimeout()
                    watch.option_deadline = started + option_limit - run.spent
                    fault = None
                    try:
                        action = run.policy(run.ctx)
                    except OptionTimeout:
                        action = OptionTimeout
                    except Exception as exc:
                        fault = UserCodeError(f"sub-policy {callable_name(run.policy)} of option "
                                              f"{run.option.name!r} (agent {a!r})", exc)
                        fault.playable = True
                        if on_fault != "continue":
                            raise fault from exc
                    finally:
                        watch.option_deadline = math.inf
                        spent = time.perf_counter() - started
                        run.spent += spent
                        traj.subpolicy_seconds += spent
                    timed_out = fault is None and (action is OptionTimeout or run.spent > option_limit)
                    if fault is None and not timed_out and action is not CANNOT_PROCEED:
                        try:
                            actions[a] = checks[a](action, run.option.name, run.policy)
                            continue
                        except UserCodeError as exc:  # an action the env cannot take
                            exc.playable = True
                            if on_fault != "continue":
                                raise
                            fault = exc
                    if fault is not None:
                        _faulted(traj, run.option.name, fault, seed, step)
                    elif timed_out:
                        _timed_out(traj, run, option_limit)
                    set_aside.add(run.call.option)  # the call ends without a step
                    running[a] = None
                    end(run, False, False, Termination.FAULT if fault is not None
                        else Termination.TIMEOUT if timed_out else Termination.BLOCKED)
                if traj.dead_ends:
                    break
            if traj.dead_ends:
                break
            if deferred:
                budget -= time.perf_counter() - resumed
                watch.episode_deadline = math.inf
                yield from _ask_models(deferred, running, actions, checks, traj)
                resumed = time.perf_counter()
                watch.episode_deadline = resumed + budget
                actions = {a: actions[a] for a in env.agents if a in actions}  # the env's agent order
            try:
                observations, rewards, terms, truncs, _ = env.step(actions)
            except Exception as exc:
                fault = _env_fault(exc, f"environment {_env_name(env)}.step (step {step})", on_fault)
                _faulted(traj, f"environment {_env_name(env)}.step", fault, seed, step)
                traj.cut_by_fault = True
                break
            if step_log is not None:
                step_log.append((actions, dict(rewards)))
            step += 1
            verified = _verified(env, step)
            if len(verified) != len(traj.milestone_steps):  # monotone: only new ones to stamp
                for m in sorted(verified.difference(traj.milestone_steps)):
                    traj.milestone_steps[m] = step
                    if attribute is not None and (agent := attribute(m)) is not None:
                        traj.milestone_agents[m] = agent
            finished = goals <= verified
            at_cap = step >= cap
            for a in actions:
                run = running[a]
                r = rewards.get(a, 0.0)
                if r.__class__ is not float:  # a number of another type, or not a number
                    r = _reward(env, a, r, step - 1)
                if r:
                    if not math.isfinite(r):
                        raise ValueError(f"environment {_env_name(env)}.step (step {step - 1}): agent {a!r}'s reward "
                                         f"is {r}; expected a finite number")
                    run.raw += r
                    traj.total_reward += r
                ctx = run.ctx
                ctx.steps += 1
                ctx.achieved = verified
                if a in observations:
                    ctx.observation = observations[a]
                try:
                    reason = run.termination(verified)
                except UserCodeError:
                    raise
                except Exception as exc:
                    raise UserCodeError(f"a done/failure predicate of option {run.option.name!r} (agent {a!r})",
                                        exc) from exc
                terminated = finished or bool(terms.get(a, False))
                truncated = bool(truncs.get(a, False)) or (at_cap and not terminated)
                if terminated or truncated:
                    reason = reason or Termination.EPISODE
                if reason is not None:
                    running[a] = None
                    end(run, terminated, truncated, reason)
    except EpisodeTimeout:
        traj.timed_out = True
        warnings.warn(f"an episode (task seed {seed}) ran past backend.episode_timeout_s={episode_timeout_s:g} s "
                      f"at step {step}: cut as a truncation", RuntimeWarning, stacklevel=2)
    finally:
        watch.episode_deadline = watch.option_deadline = math.inf
    for run in running.values():  # agents still mid-option when the env ended it unflagged, or cut
        if run is not None:
            end(run, False, True, Termination.EPISODE)
    if callable(getattr(env, "tool_calls", None)):
        traj.tool_calls = int(env.tool_calls())
    if callable(getattr(env, "episode_scores", None)) and not traj.cut_by_fault:
        traj.scores = _scores(env, step)
    traj.length = step
    traj.success = goals <= verified
    return traj


def _ask_models(agents: list[str], running: dict[str, _Running | None], actions: dict[str, Any],
                checks: dict[str, Callable[[Any, str], Any]], traj: Trajectory) -> Generator[Any, Any, None]:
    """The actions of ``agents``, whose LLM-backed sub-policies ask a model: their requests
    are yielded together (:class:`~gyre_ma.llm.option.ActionRequests`) and the answers sent
    back; an output a policy cannot use is retried the same way until it gives an action."""
    from gyre_ma.llm.option import ActionRequests

    def user(what: str, run: _Running, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:
            raise UserCodeError(f"{what} of {callable_name(run.policy)}, option {run.option.name!r} "
                                f"(agent {run.ctx.agent!r})", exc) from exc

    runs = {a: running[a] for a in agents}
    pending = {a: user("the request", r, lambda r=r: r.policy.request(r.ctx)) for a, r in runs.items()}
    while pending:
        traj.llm_requests += len(pending)
        replies = yield ActionRequests(list(pending.values()))
        retry = {}
        for (a, request), reply in zip(pending.items(), replies, strict=True):
            run = runs[a]
            got = user("resolve", run, lambda run=run, request=request, reply=reply:
                       run.policy.resolve(run.ctx, request, reply))
            traj.llm_invalid += bool(got.invalid)
            traj.llm_fallbacks += bool(got.fallback)
            if got.retry is not None:
                retry[a] = got.retry
            else:
                actions[a] = checks[a](got.action, run.option.name, run.policy)
        pending = retry


_UNWATCHED = types.SimpleNamespace(option_deadline=math.inf, episode_deadline=math.inf)
"""Deadlines of an episode played without wall-clock bounds."""
_WARNED_TIMEOUTS: set[str] = set()
_WARNED_FAULTS: set[str] = set()


def _env_fault(exc: Exception, where: str, on_fault: str) -> UserCodeError:
    """The fault of the env's call ``where`` (its reset, a step) that raised ``exc``, as one
    :class:`UserCodeError` to play on through (``on_fault: continue``); raised instead where
    it stops the run: under ``stop``, and a check's finding always (as it is)."""
    if getattr(exc, "never_played_through", False):
        raise exc
    fault = exc if isinstance(exc, UserCodeError) else UserCodeError(where, exc)
    fault.playable = True
    if on_fault != "continue":
        if fault is exc:
            raise exc  # as it is, its cause (the user's exception) kept
        raise fault from exc
    return fault


def _faulted(traj: Trajectory, source: str, fault: Exception, seed: int, step: int) -> None:
    """Keep a fault the episode plays on through (``backend.on_fault: continue``) on its
    trajectory, warned once per ``source`` (an option, the env's step) and process."""
    where = "" if "(step " in str(fault) else f", step {step}"  # an env's own message says its step
    text = f"{fault} [episode of task seed {seed}{where}]"
    traj.faults.append(text)
    if source not in _WARNED_FAULTS:
        _WARNED_FAULTS.add(source)
        warnings.warn(f"{text}; played on (backend.on_fault: continue): "
                      + ("the episode was cut there" if source.startswith("environment") else
                         "the call ended as a failure") + " (counted as faults/*; further faults of it are not "
                      "warned)", RuntimeWarning, stacklevel=3)


def _timed_out(traj: Trajectory, run: _Running, limit: float) -> None:
    name = run.option.name
    traj.option_timeouts.append(name)
    if name not in _WARNED_TIMEOUTS:  # one line per option and process, not per call
        _WARNED_TIMEOUTS.add(name)
        warnings.warn(f"option {name!r} (agent {run.call.agent!r}): its sub-policy ran past "
                      f"backend.option_timeout_s={limit:g} s; the call ended as a failure (counted as "
                      "option_timeouts)", RuntimeWarning, stacklevel=3)


def _horizon(env: Any, max_steps: int | None) -> tuple[int, int]:
    """The episode's step cap (``max_steps``, else the env's own ``max_cycles``, else 10,000)
    and the horizon it runs under (the lower of the cap and ``max_cycles``)."""
    env_cap = getattr(env, "max_cycles", None)  # the env's own step limit, where it has one
    cap = max_steps if max_steps is not None else int(env_cap if env_cap is not None else 10_000)
    return cap, min(cap, int(env_cap)) if env_cap is not None else cap


def _ask_env(env: Any, method: str, step: int) -> Any:
    """``env.<method>()``; what it raises is an error naming the env, the method and the step
    (a :class:`UserCodeError` of the user's code raised as it is)."""
    try:
        return getattr(env, method)()
    except UserCodeError:
        raise
    except Exception as exc:
        raise UserCodeError(f"environment {_env_name(env)}.{method} (step {step})", exc) from exc


def _verified(env: Any, step: int, *, names: bool = False) -> frozenset[str] | set[str]:
    """``env.verified_milestones()``, checked: a set (and with ``names``, as at an episode's
    start, of strings: a check per milestone, too dear for every step); what else it raises
    or returns is an error naming the env and the step."""
    verified = _ask_env(env, "verified_milestones", step)
    if not isinstance(verified, (frozenset, set)) or (names and not all(isinstance(m, str) for m in verified)):
        raise ValueError(f"environment {_env_name(env)}.verified_milestones (step {step}) returned "
                         f"{str(verified)[:200]!r} ({type(verified).__name__}); expected a set of milestone names")
    return verified


def _reward(env: Any, agent: str, reward: Any, step: int) -> float:
    """An env's reward for ``agent`` as a float: a real number (a NumPy scalar, an int, a
    bool); anything else (a string, an array, None) is an error naming the env, agent and step."""
    if isinstance(reward, (int, float, np.integer, np.floating)):
        return float(reward)
    raise ValueError(f"environment {_env_name(env)}.step (step {step}): agent {agent!r}'s reward is "
                     f"{str(reward)[:100]!r} ({type(reward).__name__}); expected a number")


def _scores(env: Any, step: int) -> dict[str, float]:
    """``env.episode_scores()`` as the episode ended, checked: names to finite numbers."""
    scores = _ask_env(env, "episode_scores", step)
    where = f"environment {_env_name(env)}.episode_scores (step {step})"
    if not isinstance(scores, Mapping):
        raise ValueError(f"{where} returned {str(scores)[:100]!r} ({type(scores).__name__}); expected a dict of "
                         "names to numbers")
    out = {}
    for name, value in scores.items():
        if value is None:  # this episode has no such figure
            continue
        if not isinstance(name, str) or isinstance(value, bool) or not isinstance(
                value, (int, float, np.integer, np.floating)) or not math.isfinite(value):
            raise ValueError(f"{where}: score {name!r} is {str(value)[:100]!r} ({type(value).__name__}); expected "
                             "a finite number (or None, to leave the episode out of it)")
        out[name] = float(value)
    return out


_ABSENT = object()


def _unknown_agent(env: Any, agent: str, step: int) -> str:
    where = f"environment {_env_name(env)}.{'reset' if step == 0 else 'step'} (step {max(step - 1, 0)})"
    if agent not in env.possible_agents:
        return (f"{where}: live agent {agent!r} (env.agents) is not one of possible_agents "
                f"{list(env.possible_agents)}; expected every agent that can ever act listed in possible_agents")
    return (f"{where} returned no observation for live agent {agent!r}; expected one for every agent in env.agents "
            "(an agent that is done leaves env.agents)")


def dead_end_reason(library: OptionLibrary, agent: str, step: int, verified: frozenset[str], set_aside: set[int],
                    running: dict[str, Any], env: Any, observation: Any) -> str:
    """Why ``agent`` had no eligible option at ``step``, in words: the library's graph left it
    none, its options were set aside this step, or every option it could run was exclusive and
    taken by the other agents (a library with fewer tasks than agents and no option to wait)."""
    where = f"agent {agent!r} at step {step}"
    mask = library.mask(verified, None if not library.asks_state else
                        OptionContext(agent=agent, env=env, observation=observation, achieved=verified))
    if not mask.any():
        return (f"{where}: no option of the library was eligible (verified {sorted(verified) or 'nothing'}: each "
                "option's milestone verified, its prerequisites unmet or its initiation false)")
    mask[list(set_aside)] = False
    if not mask.any():
        return f"{where}: its eligible options all ended this step without acting (CANNOT_PROCEED, a fault, a timeout)"
    held = {library[r.call.option].name: b for b, r in running.items() if r is not None and b != agent}
    return (f"{where}: every option it could run is exclusive and run by the other agents ({held}); for an agent "
            "with nothing to do, give the library an option that is always eligible, e.g. stay: one step of a no-op, "
            "repeatable")


def ended_by_env(t: Trajectory) -> bool:
    """Whether the env itself ended ``t`` (every agent done), not the step cap, a dead end of
    the library, a timeout or a fault; a success or not."""
    return (not t.dead_ends and not t.timed_out and not t.cut_by_fault
            and not (t.horizon and t.length >= t.horizon))


def short_of_goals(trajectories: Sequence[Trajectory], goals: Sequence[str]) -> str | None:
    """Where at least half of ``trajectories`` were ended by the env itself with some of the
    graph's ``goals`` verified but not all, the first such case in words; else None. That is
    what an env whose episodes each have their own goals looks like when it does not say
    them (``episode_goals()``): every episode is judged on all the goals."""
    if len(goals) < 2 or not trajectories or any(t.goals for t in trajectories):
        return None
    ended = [t for t in trajectories if ended_by_env(t) and 0 < len(set(goals) & set(t.milestone_steps)) < len(goals)]
    if 2 * len(ended) < len(trajectories):
        return None
    t = ended[0]
    got = [g for g in goals if g in t.milestone_steps]
    return (f"{len(ended)} of {len(trajectories)} episodes ended by the env with some goals verified (task seed "
            f"{t.task_seed}: {got}, not {[g for g in goals if g not in got]}); an episode succeeds only when every "
            "goal of the task graph is verified. If each episode has its own goals, say which with episode_goals() "
            "(README: Goals that change per episode)")


def _env_name(env: Any) -> str:
    return type(getattr(env, "unwrapped", env)).__name__


def action_check(space: Any, agent: str) -> Callable[..., Any]:
    """A check of one sub-policy action for ``agent``'s action space, called as
    ``check(action, option_name, policy)``: returns the action, or raises a ValueError (a
    :class:`~gyre_ma.options.errors.UserAnswerError` where the sub-policy ``policy`` is
    given) naming the option, the agent, the action, the space, and the sub-policy with
    the file and line that define it. A
    ``Discrete`` space takes an integer in range (not a bool, None or NaN); a ``Box`` an
    array (or list, or for shape (1,) a number) of its shape, cast to its dtype, finite and
    within its bounds; other spaces their own ``contains``, and float arrays must be finite."""
    if isinstance(space, spaces.Discrete):
        low, high = int(space.start), int(space.start) + int(space.n)

        def discrete(action: Any, option: str, policy: Any = None) -> Any:
            if isinstance(action, (int, np.integer)) and not isinstance(action, (bool, np.bool_)):
                if low <= action < high:
                    return action
            elif isinstance(action, np.ndarray) and action.shape == () and action.dtype.kind in "iu":
                if low <= int(action) < high:
                    return action
            raise _bad_action(option, agent, action, f"an integer in [{low}, {high}) for {space}", policy)

        return discrete

    if isinstance(space, spaces.MultiDiscrete) and space.nvec.ndim == 1:
        bounds = list(zip(space.start.tolist(), (space.start + space.nvec).tolist(), strict=True))
        shape = (len(bounds),)

        def multi_discrete(action: Any, option: str, policy: Any = None) -> Any:  # space.contains costs ~30 µs a step
            if isinstance(action, np.ndarray) and action.shape == shape and action.dtype.kind in "iu":
                for a, (lo, hi) in zip(action.tolist(), bounds):  # a loop: all() over a generator costs 2.5×
                    if not lo <= a < hi:
                        break
                else:
                    return action
            elif isinstance(action, (list, tuple)) and len(action) == len(bounds) and all(
                    isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_)) and lo <= a < hi
                    for a, (lo, hi) in zip(action, bounds)):
                return action
            raise _bad_action(option, agent, action, f"integers within {space}", policy)

        return multi_discrete

    if isinstance(space, spaces.Box):
        shape, kinds = space.shape, ("fiu" if space.dtype.kind == "f" else "iu")
        wanted = (f"an array of shape {shape} and dtype {space.dtype} within {space}, finite (an array or list of "
                  f"another {'numeric' if space.dtype.kind == 'f' else 'integer'} dtype is cast to it"
                  + ("; a single number stands for shape (1,))" if shape == (1,) else ")"))

        def box(action: Any, option: str, policy: Any = None) -> Any:
            """A Box action cast to the space's dtype (a controller's float64 array fits a
            float32 Box, whose ``contains`` refuses it), a number to shape (1,)."""
            try:
                a = np.asarray(action)
            except Exception:  # noqa: BLE001 - not array-like at all
                a = None
            if a is None or a.dtype.kind not in kinds or not (a.shape == shape or (a.shape == () and shape == (1,))):
                got = "" if a is None else f" (shape {a.shape}, dtype {a.dtype})"
                raise _bad_action(option, agent, action, wanted + got, policy)
            cast = a.astype(space.dtype, copy=False).reshape(shape)
            if space.dtype.kind == "f" and not np.isfinite(cast).all():
                raise _bad_action(option, agent, action, wanted + " (it holds a value that is not finite)", policy)
            if not space.contains(cast):
                out = np.flatnonzero((cast < space.low) | (cast > space.high))
                at = int(out[0]) if out.size else 0
                raise _bad_action(option, agent, action, f"{wanted} (element {at}, {cast.ravel()[at]!r}, lies outside "
                                  f"[{space.low.ravel()[at]!r}, {space.high.ravel()[at]!r}]; clip it)", policy)
            return cast

        return box

    def general(action: Any, option: str, policy: Any = None) -> Any:
        try:
            finite = not isinstance(action, (float, np.floating, np.ndarray)) or bool(np.all(np.isfinite(action)))
            ok = finite and bool(space.contains(action))
        except Exception:  # noqa: BLE001 - a space may raise on an action of the wrong kind
            ok = False
        if not ok:
            raise _bad_action(option, agent, action, f"an element of {space}, finite", policy)
        return action

    return general


def _bad_action(option: str, agent: str, action: Any, expected: str, policy: Any = None) -> ValueError:
    text = repr(action)
    hint = (" (a sub-policy with nothing to do, its target reached or out of reach, returns "
            "gyre_ma.options.CANNOT_PROCEED: the call ends without a step and the manager chooses again)"
            if action is None else "")
    problem = f"returned the action {text[:120] + '…' if len(text) > 120 else text}; expected {expected}{hint}"
    if policy is None:
        return ValueError(f"sub-policy of option {option!r} (agent {agent!r}) {problem}")
    return UserAnswerError(f"sub-policy {callable_name(policy)} of option {option!r} (agent {agent!r})", problem,
                           policy)


def _global_state(env: GyreEnv) -> np.ndarray:
    return np.asarray(env.state(), dtype=np.float32).ravel()


# ---------------------------------------------------------------- checkpointable form

def trajectory_to_state(traj: Trajectory) -> dict[str, Any]:
    """A trajectory as plain data (numbers, strings, lists, dicts, numpy arrays) that a
    ``weights_only`` checkpoint can hold; :func:`trajectory_from_state` inverts it. The
    rule engine's raw results are dropped: by then they are folded into the breakdowns."""
    calls = []
    for c in traj.calls:
        d = {f.name: getattr(c, f.name) for f in dataclasses.fields(c)}
        d["achieved"] = sorted(c.achieved)
        d["milestones"] = list(c.milestones)
        d["others"] = list(c.others)
        d["goals"] = list(c.goals)
        d["termination"] = c.termination.value if c.termination is not None else None
        d["breakdown"] = _plain(c.breakdown)
        calls.append(d)
    state = {f.name: getattr(traj, f.name) for f in dataclasses.fields(traj)}
    state = {k: _plain(v) for k, v in state.items()}
    return state | {
        "calls": calls, "rule_results": None,
        "class": f"{type(traj).__module__}:{type(traj).__qualname__}",
    }


def trajectory_from_state(state: dict[str, Any]) -> Trajectory:
    """The trajectory :func:`trajectory_to_state` wrote. Checkpoint contents are data: the
    record types named in ``state`` must be gyre-ma's own (:func:`record_types`), so a
    crafted checkpoint cannot make loading build, import or call anything else."""
    state = dict(state)
    cls = _record_type(state.pop("class"), "trajectory class", Trajectory)
    calls = []
    for d in state.pop("calls"):
        d = dict(d)
        d["achieved"] = frozenset(d["achieved"])
        d["milestones"] = tuple(d["milestones"])
        d["others"] = tuple(d.get("others", ()))
        d["goals"] = tuple(d.get("goals", ()))
        d["termination"] = Termination(d["termination"]) if d["termination"] is not None else None
        d["breakdown"] = _revive(d["breakdown"])
        calls.append(OptionCall(**d))
    for dropped in ("final", "final_state"):  # written before session 10; nothing reads them
        state.pop(dropped, None)
    state = {k: _revive(v) for k, v in state.items()}
    state["goals"] = tuple(state.get("goals", ()))
    return cls(calls=calls, **state)


RECORD_TYPES = ("gyre_ma.rollout:Trajectory", "gyre_ma.roles:RoleTrajectory",
                "gyre_ma.rewards.breakdown:RewardBreakdown", "gyre_ma.agents.noise:NoiseSetting")
"""The dataclasses a stored trajectory may name (``module:qualname``): the only types
:func:`trajectory_from_state` builds. Names, not imports: roles and rewards import this
module."""


@functools.lru_cache(maxsize=1)
def record_types() -> dict[str, type]:
    """:data:`RECORD_TYPES`, imported (once: a buffer's load revives every call's breakdown)."""
    from gyre_ma.options.library import resolve

    return {name: resolve(name, "record type") for name in RECORD_TYPES}


def _record_type(name: Any, what: str, base: type | None = None) -> type:
    if not isinstance(name, str) or name not in RECORD_TYPES:
        raise ValueError(f"stored {what} {str(name)[:200]!r} is not one of gyre-ma's record types "
                         f"{list(RECORD_TYPES)}; a checkpoint holds data only, and this one names something else")
    cls = record_types()[name]
    if base is not None and not issubclass(cls, base):
        raise ValueError(f"stored {what} {name!r} is not a {base.__name__}")
    return cls


def _plain(value: Any) -> Any:
    """A dataclass value (a RewardBreakdown, a NoiseSetting) as its class reference and fields."""
    if dataclasses.is_dataclass(value):
        return {"dataclass": f"{type(value).__module__}:{type(value).__qualname__}",
                "fields": dataclasses.asdict(value)}
    return value


def _revive(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"dataclass", "fields"}:
        fields = value["fields"]
        if not isinstance(fields, dict) or not all(isinstance(k, str) for k in fields):
            raise ValueError(f"stored record {str(value['dataclass'])[:200]!r}: fields must be a mapping of names")
        return _record_type(value["dataclass"], "record")(**fields)
    return value
