"""Option: a macro-action — initiation, a sub-policy emitting primitive actions, termination."""

from __future__ import annotations

import enum
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from gyre_ma.options.errors import UserAnswerError, callable_name, defined_at

if TYPE_CHECKING:
    from gyre_ma.options.graph import TaskGraph


@dataclass
class OptionContext:
    """What a sub-policy sees at each primitive step of one option call.

    ``agent``: the agent's name. ``env``: the environment being stepped (scripted options
    may read its state, as a controller would; an adapter exposes the wrapped env as
    ``env.unwrapped``). ``observation``: the agent's current observation (neural and LLM
    options act on it). ``achieved``: the milestones verified so far in the episode.
    ``steps``: primitive steps this call has taken. ``memory``: scratch space that lives for
    the option call (cached paths, retry counters). ``rng``: the episode's generator, seeded
    from its task seed (draw a sub-policy's randomness from it, so episodes replay).
    """

    agent: str
    env: Any
    observation: Any
    achieved: frozenset[str]
    steps: int = 0
    memory: dict[str, Any] = field(default_factory=dict)
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))


@runtime_checkable
class SubPolicy(Protocol):
    """Anything that maps an OptionContext to one primitive action for its agent:
    a plain function, a torch module wrapper, or an LLM-backed policy."""

    def __call__(self, ctx: OptionContext) -> Any: ...


Predicate = Callable[[OptionContext], bool]


class _CannotProceed:
    __slots__ = ()

    def __repr__(self) -> str:
        return "CANNOT_PROCEED"


CANNOT_PROCEED: Any = _CannotProceed()
"""What a sub-policy returns instead of an action when its option cannot make progress
from here (the target is gone, every path is blocked). The call ends at once, with
``Termination.BLOCKED`` and no primitive step taken; the manager chooses again for that
agent, among the eligible options less this one until the next step."""


class Behaviour:
    """A sub-policy with state, for an option that plans once and follows its plan.

    Pass the class itself, ``Option("go_to_door", GoToDoor, ...)``: every call gets a
    fresh instance (two agents running the same option never share one), ``start`` runs
    before its first action, ``act`` gives each primitive action (or
    :data:`CANNOT_PROCEED`), and ``done`` — where a subclass defines it — ends the call
    with ``Termination.DONE``, like an option's ``done`` predicate. The class must build
    without arguments.
    """

    def start(self, ctx: OptionContext) -> None:
        """Before the first action of the call."""

    def act(self, ctx: OptionContext) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.act(ctx) must return a primitive action")

    def done(self, ctx: OptionContext) -> bool:
        return False


def is_behaviour(policy: object) -> bool:
    return isinstance(policy, type) and issubclass(policy, Behaviour)


def _defines_done(behaviour: type[Behaviour]) -> bool:
    return behaviour.done is not Behaviour.done


class Termination(enum.Enum):
    """Why an option call ended. Kept apart from the episode's terminated/truncated."""

    MILESTONE = "milestone"  # its milestone was verified on environment state
    DONE = "done"  # a repeatable option's unit of work is done
    BLOCKED = "blocked"  # its sub-policy returned CANNOT_PROCEED (no step taken)
    FAILURE = "failure"  # its failure predicate held
    MAX_STEPS = "max_steps"  # it ran out of its step cap
    EPISODE = "episode"  # the episode ended (agent terminated or truncated) first
    TIMEOUT = "timeout"  # its sub-policy ran past the call's wall-clock budget (a failure)
    FAULT = "fault"  # its sub-policy raised or answered an unusable action (a failure; backend.on_fault: continue)


def check_callable(owner: str, what: str, fn: object, n_args: int = 1, takes: str = "an OptionContext") -> None:
    """A TypeError naming option ``owner``'s ``what`` and where it is defined, unless ``fn``
    is None or a callable that takes ``n_args`` positional arguments (``takes`` says which)."""
    if fn is None:
        return
    if not callable(fn):
        raise TypeError(f"option {owner!r}: {what} must be callable, got {type(fn).__name__}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and C callables: trust them
        return
    params = [
        p for p in sig.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    varargs = any(p.kind == p.VAR_POSITIONAL for p in sig.parameters.values())
    positional = [
        p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(params) > n_args or (len(positional) < n_args and not varargs):
        count = "one argument" if n_args == 1 else f"{n_args} arguments"
        where = defined_at(fn)
        raise TypeError(f"option {owner!r}: {what} must take exactly {count} ({takes}), got signature {sig}"
                        + (f" (defined at {where})" if where else ""))


@dataclass(frozen=True)
class Option:
    """One macro-action of an option library.

    ``milestone`` is the task-graph node the option achieves (None for upkeep options such
    as eating, which are always eligible). A one-shot option ends when its milestone is
    verified and is masked afterwards; a ``repeatable`` one (collect one more unit) ends
    when ``done`` holds and stays eligible once its milestone is unlocked. A repeatable
    option with a milestone and no ``done`` *restores* its milestone: it is eligible while
    the milestone does not hold on the current state (the key was dropped) and ends when
    it holds again; that needs an env with ``holds(milestone)`` (every adapter has it).

    ``policy`` is a callable ``OptionContext -> action`` or a :class:`Behaviour` subclass
    (an option with state).

    An ``exclusive`` option is run by one agent at a time: while another agent runs it
    (or chose it earlier in the same step), it is not eligible (a target, a station, a
    door only one agent should head for). ``exclusive: k`` (an int >= 1) allows k agents
    at once (a station with k units to fetch).

    ``features`` describes the option as the deciding agent sees it: a function of that
    agent's observation (what the manager sees) returning a 1-D array of floats, the same
    length for every option of the library that has one (an option without reads as
    zeros). The manager scores every option from its own features with one network shared
    by all of them, beside its per-option head: what it learns about one target (the
    nearer, the better) holds for every target (:class:`~gyre_ma.agents.manager.ManagerPolicy`).
    """

    name: str
    policy: SubPolicy
    milestone: str | None = None
    initiation: Predicate | None = None
    """Extra initiation condition beyond the graph prerequisites."""
    done: Predicate | None = None
    """Success condition of a repeatable (or upkeep) option."""
    failure: Predicate | None = None
    max_steps: int = 200
    repeatable: bool = False
    description: str = ""
    exclusive: bool | int = False
    """Not eligible while another agent runs it (True), or while k others do (an int k)."""
    features: Callable[[Any], Any] | None = None
    """Observation → this option's features (a 1-D float array); see above."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"option name must be an identifier-like string, got {self.name!r}")
        if isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int) or self.max_steps < 1:
            raise ValueError(f"option {self.name!r}: max_steps must be an int >= 1, got {self.max_steps!r}")
        if is_behaviour(self.policy):
            _check_builds(self.name, self.policy)
        else:
            check_callable(self.name, "policy", self.policy)
        for what in ("initiation", "done", "failure"):
            check_callable(self.name, what, getattr(self, what))
        check_callable(self.name, "features", self.features, takes="the deciding agent's observation")
        if not isinstance(self.repeatable, bool):
            raise ValueError(f"option {self.name!r}: repeatable must be true or false, got {self.repeatable!r}")
        if not isinstance(self.exclusive, bool) and not (isinstance(self.exclusive, int) and self.exclusive >= 1):
            raise ValueError(f"option {self.name!r}: exclusive must be true, false or how many agents may run it "
                             f"at once (an int >= 1), got {self.exclusive!r}")
        has_done = self.done is not None or (is_behaviour(self.policy) and _defines_done(self.policy))
        if self.repeatable and not has_done and self.milestone is None:
            raise ValueError(
                f"option {self.name!r}: a repeatable option needs a 'done' predicate "
                "(when is one unit of work finished?) or a milestone it restores"
            )
        if self.milestone is None and not has_done:
            raise ValueError(
                f"option {self.name!r}: an option without a milestone needs a 'done' predicate"
            )

    @property
    def capacity(self) -> int | None:
        """How many agents may run it at once (None: any number)."""
        if isinstance(self.exclusive, bool):
            return 1 if self.exclusive else None
        return self.exclusive

    @functools.cached_property
    def restores(self) -> bool:
        """A repeatable option that re-achieves its milestone when it was lost (fixed by the
        fields, so worked out once: the rollout asks at every step and decision)."""
        return (self.repeatable and self.milestone is not None and self.done is None
                and not (is_behaviour(self.policy) and _defines_done(self.policy)))

    def graph_eligible(self, graph: TaskGraph, achieved: frozenset[str]) -> bool:
        """Eligibility from the task graph alone (no state predicate)."""
        if self.milestone is None:
            return True
        if not self.repeatable and self.milestone in achieved:
            return False
        return graph.unlocked(self.milestone, achieved)

    def can_start(self, ctx: OptionContext) -> bool:
        if self.restores and _holds(ctx, self):
            return False
        return self.initiation is None or _truth(self.initiation(ctx), self, "initiation", self.initiation, ctx)

    def termination(self, ctx: OptionContext, verified: frozenset[str],
                    behaviour: Behaviour | None = None) -> Termination | None:
        """Check termination after a primitive step; ``verified`` is the state's milestones
        and ``behaviour`` the call's instance of a :class:`Behaviour` policy."""
        if self.milestone is not None and not self.repeatable and self.milestone in verified:
            return Termination.MILESTONE
        if self.restores and _holds(ctx, self):
            return Termination.MILESTONE
        if self.done is not None and _truth(self.done(ctx), self, "done", self.done, ctx):
            return Termination.DONE
        if behaviour is not None and _truth(behaviour.done(ctx), self, "behaviour's done", behaviour.done, ctx):
            return Termination.DONE
        if self.failure is not None and _truth(self.failure(ctx), self, "failure", self.failure, ctx):
            return Termination.FAILURE
        if ctx.steps >= self.max_steps:
            return Termination.MAX_STEPS
        return None


def _truth(value: Any, option: Option, which: str, predicate: Any, ctx: OptionContext) -> bool:
    """A predicate's answer: a bool (NumPy's too); anything else (None, a string, a number)
    is an error naming the option, the agent, the predicate and where it is defined, not a
    truth value guessed."""
    if value is True or value is False:
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    raise UserAnswerError(f"option {option.name!r} (agent {ctx.agent!r}): its {which} predicate "
                          f"{callable_name(predicate)}",
                          f"returned {str(value)[:100]!r} ({type(value).__name__}); expected True or False", predicate)


def _holds(ctx: OptionContext, option: Option) -> bool:
    holds = getattr(ctx.env, "holds", None)
    if not callable(holds):
        raise ValueError(
            f"option {option.name!r} is repeatable with no 'done' predicate, so it restores milestone "
            f"{option.milestone!r} when lost; that needs env.holds(milestone) -> bool on the current "
            f"state, which {type(ctx.env).__name__} does not have (every GyreAdapter does): add it, or "
            "give the option a 'done' predicate"
        )
    return bool(holds(option.milestone))


def _check_builds(owner: str, behaviour: type[Behaviour]) -> None:
    try:
        sig = inspect.signature(behaviour)
    except (TypeError, ValueError):
        return
    required = [p.name for p in sig.parameters.values()
                if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if required:
        raise TypeError(f"option {owner!r}: policy {behaviour.__name__} is a Behaviour class, built once per "
                        f"call without arguments, but its constructor requires {required}")
    if behaviour.act is Behaviour.act:
        raise TypeError(f"option {owner!r}: policy {behaviour.__name__} is a Behaviour class without an "
                        "act(ctx) method")
