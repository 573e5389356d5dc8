"""Rule engine: declarative, verifiable checks over environment state and the trajectory.

A rule has a *check* (a Python callable, a ``module:callable`` reference, or a
declarative ``given``/``require`` over state keys), *when* it runs (``option_end``: on
the state snapshot taken as each option call ended; ``episode_end``: on the final
state and env), a *weight* and a *kind*:

- ``process`` — pays its weight when it passes, but only where its ``milestone``
  progressed: on the calls during which that milestone was first verified. A process rule
  without a milestone pays wherever it passes (on every call at ``option_end``, on each
  agent's last call at ``episode_end``): the naive pattern a policy can farm, kept
  because it is what a surface grader does — the hacking alarms watch for it.
- ``guard`` — a violation (check false) vetoes all positive reward of the episode and
  charges the guard penalty to the violating calls (see :mod:`.arbiter`).

A rule that breaks — its check raises, reads a state key the snapshot lacks, or returns
something other than a bool — stops the run with one error naming the rule, when it ran
and the user's ``file:line`` (:class:`~gyre_ma.options.errors.UserCodeError` for a check
that raised). It is not disabled and skipped: a guard that silently stopped checking would
let the behaviour it forbids be paid for.

Rules at ``option_end`` need the state as each call ended: the rollout calls
:meth:`RuleEngine.on_option_end` (``run_episode``'s ``on_option_end(call, env)`` hook).
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gyre_ma.envs.base import unwrap
from gyre_ma.options.errors import UserCodeError, callable_name, user_frame
from gyre_ma.options.graph import TaskGraph
from gyre_ma.options.library import resolve
from gyre_ma.options.yaml_file import read_yaml
from gyre_ma.rewards.milestones import first_verified, last_calls
from gyre_ma.rollout import OptionCall, Trajectory

RuleKind = Literal["process", "guard"]
When = Literal["option_end", "episode_end"]
_KINDS = ("process", "guard")
_WHENS = ("option_end", "episode_end")


class UnknownStateKey(KeyError):
    """A rule read a state key the snapshot does not have."""

    def __init__(self, key: str, known: Sequence[str]) -> None:
        super().__init__(key)
        self.key, self.known = key, sorted(known)

    def __str__(self) -> str:
        return f"unknown state key {self.key!r}; known: {self.known}"


class StateView(Mapping[str, Any]):
    """A read-only state snapshot whose missing keys raise :class:`UnknownStateKey`."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)

    def __getitem__(self, key: str) -> Any:
        try:
            return self._data[key]
        except KeyError:
            raise UnknownStateKey(key, list(self._data)) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"StateView({self._data!r})"


Snapshot = Callable[[Any], Mapping[str, Any]]


def default_snapshot(env: Any) -> dict[str, Any]:
    """State keys every gyre env offers: ``verified`` (frozenset), one bool per task-graph
    milestone (verified so far), and the env's ``surface_flags()`` where it has them."""
    base = unwrap(env)
    verified = frozenset(base.verified_milestones())
    out: dict[str, Any] = {"verified": verified}
    graph = base.task_graph() if hasattr(base, "task_graph") else None
    names = graph.names if isinstance(graph, TaskGraph) else sorted(verified)
    out.update({m: m in verified for m in names})
    flags = getattr(base, "surface_flags", None)
    if callable(flags):
        out.update(flags())
    return out


def extended_snapshot(extra: Snapshot) -> Snapshot:
    """:func:`default_snapshot` plus the keys ``extra(env)`` returns (env-specific facts)."""

    def snapshot(env: Any) -> dict[str, Any]:
        return {**default_snapshot(env), **extra(env)}

    return snapshot


@dataclass(frozen=True)
class RuleContext:
    """What a check sees. ``state`` is the snapshot at the call's end (``option_end``) or
    at the episode's end; ``env`` is the final env at ``episode_end`` and None otherwise."""

    when: When
    state: Mapping[str, Any]
    trajectory: Trajectory
    call: OptionCall | None = None
    option: str | None = None
    env: Any = None


Check = Callable[[RuleContext], Any]


@dataclass(frozen=True)
class Rule:
    """One rule; see the module docstring for the kinds and when they pay."""

    name: str
    check: Check
    kind: RuleKind = "process"
    when: When = "episode_end"
    weight: float = 1.0
    milestone: str | None = None
    """Process rules only: pay only where this milestone was first verified."""
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"rule: name must be a non-empty string, got {self.name!r}")
        if self.kind not in _KINDS:
            raise ValueError(f"rule {self.name!r}: kind must be one of {list(_KINDS)}, got {self.kind!r}")
        if self.when not in _WHENS:
            raise ValueError(f"rule {self.name!r}: when must be one of {list(_WHENS)}, got {self.when!r}")
        if not callable(self.check):
            raise TypeError(f"rule {self.name!r}: check must be callable, got {type(self.check).__name__}")
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)) or not (
            math.isfinite(self.weight) and self.weight >= 0
        ):
            raise ValueError(f"rule {self.name!r}: weight must be a finite number >= 0, got {self.weight!r}")
        if self.kind == "guard" and self.milestone is not None:
            raise ValueError(
                f"rule {self.name!r}: a guard applies to the whole episode; remove milestone "
                f"{self.milestone!r} (only process rules are bound to a milestone)"
            )


def state_check(require: Mapping[str, Any], given: Mapping[str, Any] | None = None) -> Check:
    """Declarative check: where every ``given`` key equals its value, every ``require`` key
    must equal its value (vacuously true where ``given`` does not hold)."""
    req, cond = dict(require), dict(given or {})

    def check(ctx: RuleContext) -> bool:
        if any(ctx.state[k] != v for k, v in cond.items()):
            return True
        return all(ctx.state[k] == v for k, v in req.items())

    check.__qualname__ = f"state_check(require={req!r}, given={cond!r})"
    return check


class RuleSpec(BaseModel):
    """A rule as written in YAML (``rewards.rules``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str = Field(min_length=1)
    """Unique name; logs, warnings and breakdown sources use it."""
    kind: RuleKind = "process"
    """``process`` pays its weight where it passes (and its milestone progressed);
    ``guard`` vetoes the episode's positive reward when violated."""
    when: When = "episode_end"
    """``option_end`` (state as each call ended) or ``episode_end`` (final state and env)."""
    weight: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    """Reward of a passing process rule (a guard's penalty is ``rewards.guard_penalty``)."""
    milestone: str | None = None
    """Process rules: pay only on calls during which this milestone was first verified."""
    check: str | None = None
    """``module:callable`` taking a RuleContext and returning a bool."""
    given: dict[str, Any] = Field(default_factory=dict)
    """Declarative: the state keys and values under which ``require`` applies."""
    require: dict[str, Any] = Field(default_factory=dict)
    """Declarative: state keys and the values they must have."""
    description: str = ""
    """What the rule verifies, for people."""

    @model_validator(mode="after")
    def _one_check(self) -> RuleSpec:
        if (self.check is None) == (not self.require):
            raise ValueError(
                f"rule {self.name!r}: give exactly one of `check` (module:callable) or `require` "
                f"(state keys), got check={self.check!r}, require={self.require!r}"
            )
        if self.given and not self.require:
            raise ValueError(f"rule {self.name!r}: `given` needs `require`")
        return self

    def build(self, where: str = "rule") -> Rule:
        check = resolve(self.check, f"{where}.check") if self.check else state_check(self.require, self.given)
        if not callable(check):
            raise ValueError(f"{where}.check: {self.check!r} is not callable")
        return Rule(self.name, check, self.kind, self.when, float(self.weight), self.milestone,
                    self.description)


def load_rules(source: str | Path | Sequence[Mapping[str, Any] | RuleSpec | Rule]) -> list[Rule]:
    """Rules from a YAML file (a list, or a mapping with a ``rules`` list) or a sequence of
    mappings / specs / rules. Errors name the rule's index."""
    where = "rules"
    items: Any = source
    if isinstance(source, (str, Path)):
        path = Path(source)
        items = read_yaml(path, "rules file")
        where = path.name
        if isinstance(items, Mapping):
            items = items.get("rules")
    if not isinstance(items, Sequence) or isinstance(items, (str, bytes)):
        raise ValueError(f"{where}: expected a list of rules, got {type(items).__name__}")
    rules = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        if isinstance(item, Rule):
            rules.append(item)
            continue
        try:
            spec = item if isinstance(item, RuleSpec) else RuleSpec.model_validate(item)
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            loc = ".".join(str(p) for p in err["loc"])
            raise ValueError(f"{at}{'.' + loc if loc else ''}: {err['msg']} (got {err['input']!r})") from None
        rules.append(spec.build(at))
    return rules


@dataclass(frozen=True)
class RuleResults:
    """One episode's rule outcomes, aligned with ``trajectory.calls``."""

    process: tuple[float, ...]
    """Process-rule reward per call."""
    paid: tuple[tuple[str, ...], ...]
    """Names of the process rules that paid, per call."""
    penalized: tuple[tuple[str, ...], ...]
    """Names of the guards each call is charged for."""
    violations: tuple[str, ...]
    """Guards violated in the episode (any → veto)."""
    evaluated: Mapping[str, int] = field(default_factory=dict)
    passed: Mapping[str, int] = field(default_factory=dict)

    @property
    def vetoed(self) -> bool:
        return bool(self.violations)

    @classmethod
    def empty(cls, n_calls: int) -> RuleResults:
        return cls((0.0,) * n_calls, ((),) * n_calls, ((),) * n_calls, ())


class RuleEngine:
    """Evaluates rules per episode and keeps per-rule statistics."""

    def __init__(self, rules: Sequence[Rule], *, graph: TaskGraph | None = None,
                 snapshot: Snapshot = default_snapshot, option_names: Sequence[str] | None = None) -> None:
        names: set[str] = set()
        for r in rules:
            if not isinstance(r, Rule):
                raise TypeError(f"rule engine: expected Rule objects, got {type(r).__name__}")
            if r.name in names:
                raise ValueError(f"rule engine: rule name {r.name!r} is used twice")
            names.add(r.name)
            if r.milestone is not None and graph is not None and r.milestone not in graph:
                raise ValueError(
                    f"rule {r.name!r}: milestone {r.milestone!r} is not a node of the task graph; "
                    f"known: {list(graph.names)}"
                )
        self.rules = list(rules)
        self.snapshot = snapshot
        self.option_names = list(option_names) if option_names is not None else None
        self.evaluated: dict[str, int] = {r.name: 0 for r in self.rules}
        self.passed: dict[str, int] = {r.name: 0 for r in self.rules}
        self._pending: dict[int, tuple[OptionCall, Mapping[str, Any]]] = {}

    # ------------------------------------------------------------------ state capture
    @property
    def needs_option_end(self) -> bool:
        return any(r.when == "option_end" for r in self.rules)

    def on_option_end(self, call: OptionCall, env: Any) -> None:
        """Rollout hook: the call just ended and ``env`` is in the state it left."""
        if self.needs_option_end:
            self.record(call, self._snapshot(env))

    def _snapshot(self, env: Any) -> dict[str, Any]:
        """The state the rules read; the user's snapshot function is named if it raises."""
        try:
            return self.snapshot(env)
        except Exception as exc:
            raise UserCodeError(f"rule state snapshot {callable_name(self.snapshot)}", exc) from exc

    def record(self, call: OptionCall, state: Mapping[str, Any]) -> None:
        self._pending[id(call)] = (call, state)

    # ------------------------------------------------------------------ evaluation
    def end_episode(self, trajectory: Trajectory, env: Any) -> RuleResults:
        """Evaluate every active rule on the finished episode; ``env`` is in its final state
        (call this before the env is reset)."""
        calls = trajectory.calls
        n = len(calls)
        # this episode's states only: a batched worker interleaves the calls of many episodes
        pending = {key: got for c in calls if (got := self._pending.pop(key := id(c), None)) is not None}
        if not self.rules:
            return RuleResults.empty(n)
        final = StateView(self._snapshot(env))
        last = set(last_calls(trajectory))
        firsts = first_verified(trajectory)
        states: list[Mapping[str, Any]] | None = None
        if self.needs_option_end:
            states = []
            for i, c in enumerate(calls):
                got = pending.get(id(c))
                if got is not None and got[0] is c:
                    states.append(StateView(got[1]))
                elif i in last:
                    states.append(final)
                else:
                    raise RuntimeError(
                        f"rule engine: option_end rules {[r.name for r in self.rules if r.when == 'option_end']} "
                        f"need the state at the end of call {i} ({c.agent}, started at step {c.start_step}); "
                        "pass the engine's on_option_end to run_episode(on_option_end=...)"
                    )
        process = [0.0] * n
        paid: list[list[str]] = [[] for _ in range(n)]
        penalized: list[list[str]] = [[] for _ in range(n)]
        violations: list[str] = []
        evaluated: dict[str, int] = {}
        passed: dict[str, int] = {}
        for rule in self.rules:
            outcomes = self._evaluate(rule, trajectory, env, states, final, firsts, last)
            evaluated[rule.name] = len(outcomes)
            passed[rule.name] = sum(ok for _, ok in outcomes)
            self.evaluated[rule.name] += len(outcomes)
            self.passed[rule.name] += passed[rule.name]
            for targets, ok in outcomes:
                if rule.kind == "process" and ok:
                    for i in targets:
                        process[i] += rule.weight
                        paid[i].append(rule.name)
                elif rule.kind == "guard" and not ok:
                    if rule.name not in violations:
                        violations.append(rule.name)
                    for i in targets:
                        penalized[i].append(rule.name)
        return RuleResults(tuple(process), tuple(map(tuple, paid)), tuple(map(tuple, penalized)),
                           tuple(violations), evaluated, passed)

    def _evaluate(self, rule: Rule, traj: Trajectory, env: Any, states: list | None,
                  final: Mapping[str, Any], firsts: list[tuple[str, ...]],
                  last: set[int]) -> list[tuple[tuple[int, ...], bool]]:
        """(calls it applies to, passed) for each point the rule is checked at."""
        out = []
        if rule.when == "option_end":
            for i, c in enumerate(traj.calls):
                if rule.milestone is not None and rule.milestone not in firsts[i]:
                    continue
                ctx = RuleContext("option_end", states[i], traj, c, self._option(c))
                out.append(((i,), self._run(rule, ctx)))
            return out
        if rule.milestone is not None:
            targets = tuple(i for i, names in enumerate(firsts) if rule.milestone in names)
            if not targets:
                return out
        else:
            targets = tuple(sorted(last))
        out.append((targets, self._run(rule, RuleContext("episode_end", final, traj, env=env))))
        return out

    def _option(self, call: OptionCall) -> str | None:
        names = self.option_names
        return names[call.option] if names is not None and 0 <= call.option < len(names) else None

    def _run(self, rule: Rule, ctx: RuleContext) -> bool:
        what = f"rule {rule.name!r} ({rule.when}) check {callable_name(rule.check)}"
        try:
            result = rule.check(ctx)
        except UnknownStateKey as exc:
            where = user_frame(exc)
            raise ValueError(f"{what}: {exc}" + (f" (at {where})" if where else "")) from None
        except Exception as exc:
            raise UserCodeError(what, exc) from exc
        if not isinstance(result, (bool, np.bool_)):
            raise ValueError(f"{what} returned {reprlib.repr(result)}, expected a bool")
        return bool(result)

    # ------------------------------------------------------------------ statistics
    def pass_rates(self) -> dict[str, float]:
        """Cumulative pass rate of each rule over the run (NaN where never evaluated)."""
        return {r.name: (self.passed[r.name] / self.evaluated[r.name]) if self.evaluated[r.name] else math.nan
                for r in self.rules}

    def state_dict(self) -> dict[str, Any]:
        return {"evaluated": dict(self.evaluated), "passed": dict(self.passed)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.evaluated.update(state["evaluated"])
        self.passed.update(state["passed"])


def rule_metrics(rules: Sequence[Rule], results: Sequence[RuleResults]) -> dict[str, float]:
    """One iteration's rule statistics.

    ``rules/pass_rate/<name>``: passes / evaluations (NaN where not evaluated);
    ``rules/pay_rate/<name>``: fraction of episodes in which a process rule paid;
    ``rule_pay_rate``: mean pay rate over process rules of positive weight — how often
    rules certify an episode, for the alarm that compares it with verified success;
    ``rules/violation_rate``: fraction of episodes with a guard violation;
    """
    n = max(len(results), 1)
    out: dict[str, float] = {}
    pay = []
    for r in rules:
        ev = sum(res.evaluated.get(r.name, 0) for res in results)
        ok = sum(res.passed.get(r.name, 0) for res in results)
        out[f"rules/pass_rate/{r.name}"] = ok / ev if ev else math.nan
        if r.kind == "process":
            rate = sum(any(r.name in p for p in res.paid) for res in results) / n
            out[f"rules/pay_rate/{r.name}"] = rate
            if r.weight > 0:
                pay.append(rate)
    out["rule_pay_rate"] = float(np.mean(pay)) if pay else math.nan
    out["rules/violation_rate"] = sum(res.vetoed for res in results) / n
    return out
