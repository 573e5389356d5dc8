"""Reward-hacking alarms over a window of iterations.

A policy that hacks its reward gets *more reward without more verified completion*. Three
signatures, each a pure function over a metrics history (a list of per-iteration dicts,
oldest first), comparing the mean (for calls, the median) of the window's second half with
its first half:

- ``reward_without_completion`` — total reward rose (relatively, by ``reward_rise``)
  while verified completion did not rise (by more than ``completion_rise``), and the
  reward of the episodes that did *not* complete rose too, to a net payment (``failed_key``;
  failures that merely lose fewer guard penalties are a learner avoiding violations), and
  the rise is not milestones' pay for more milestones verified in the task graph's order
  (sub-goals learnt before the goal);
- ``calls_without_completion`` — option calls (or tool calls) per episode rose, beyond
  their own scatter, while completion did not, calls per verified milestone rose too
  (``progress_key``), and the reward per episode rose (``reward_key``: calls farmed are
  calls paid);
- ``rules_without_success`` — rules certified far more episodes than succeeded: the mean
  ``rule_pay_rate`` exceeded the mean success rate by more than ``rule_margin``.

The two second conditions tell hacking from learning before the first completion. A
policy in that phase explores: it verifies more milestones with more calls, and its first
successes lift the total reward while completion, averaged over the window, still looks
flat. Neither moves what a hacker moves — reward on the episodes that fail, calls that buy
no verified progress. The calls alarm's last condition tells hacking from decline: once
nearly every episode succeeds, a failure that runs to the step cap repeating a cheap option
multiplies its iteration's calls while the reward falls (healthy tech-tree runs raised the
alarm that way before it); calls farmed for pay raise the reward, and the iterations with
more calls are the ones paid more (healthy coverage runs, whose extra calls are failed
retries, raised it while the correlation was negative). Without those metrics in
the history the alarms fall back to the first condition alone. Missing or non-finite
values of the main series, or fewer than ``window`` iterations, raise no alarm.
:class:`HackingMonitor` keeps the history, reports which alarms hold each iteration and
logs each time one starts to hold.
"""

from __future__ import annotations

import functools
import logging
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger("gyre_ma.rewards")

History = Sequence[Mapping[str, float]]


@dataclass(frozen=True)
class Alarm:
    name: str
    message: str
    values: dict[str, float] = field(default_factory=dict)
    iteration: int | None = None


def _series(history: History, key: str, window: int) -> list[float] | None:
    tail = list(history)[-window:]
    if len(tail) < window:
        return None
    values = [m.get(key, math.nan) for m in tail]
    if any(v is None or not math.isfinite(v) for v in values):
        return None
    return [float(v) for v in values]


def _split(values: Sequence[float], caller: str) -> tuple[Sequence[float], Sequence[float]]:
    """The first and second half of ``values``; the middle one goes to neither when the
    length is odd."""
    if len(values) < 2:
        raise ValueError(f"{caller}: need at least 2 values, got {len(values)}")
    k = len(values) // 2
    return values[:k], values[len(values) - k:]


def halves(values: Sequence[float], *, median: bool = False) -> tuple[float, float]:
    """Means (or medians) of the first and second half of ``values`` (the middle one goes to
    neither when the length is odd)."""
    first, second = _split(values, "halves")
    if median:
        return statistics.median(first), statistics.median(second)
    return sum(first) / len(first), sum(second) / len(second)


def rose(values: Sequence[float], *, relative: float, floor: float = 1.0,
         median: bool = False) -> tuple[bool, float, float]:
    """Whether the second half's mean (or median) exceeds the first half's by ``relative`` ×
    max(|first|, ``floor``); returns (rose, first, second)."""
    a, b = halves(values, median=median)
    return b - a > relative * max(abs(a), floor), a, b


def rise_p_value(values: Sequence[float]) -> float:
    """One-sided p-value that the second half of ``values`` is stochastically larger than the
    first (the halves of :func:`halves`): the exact Mann–Whitney U test, ties counted a half.
    Under the null every split of the ranks between the halves is equally likely; with ties,
    the observed U is rounded down, so the p-value errs large (toward no alarm)."""
    first, second = _split(values, "rise_p_value")
    u = sum((b > a) + 0.5 * (b == a) for b in second for a in first)
    ways = _u_counts(len(first), len(second))
    return sum(ways[math.floor(u):]) / sum(ways)


@functools.cache
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """Number of arrangements of ``m`` + ``n`` distinct values giving each Mann–Whitney U of
    the ``m`` (0 .. m·n), by the recursion on the largest value: it is one of the ``m`` (U
    gains ``n``) or one of the ``n``."""
    if m == 0 or n == 0:
        return (1,) + (0,) * (m * n)
    with_m, with_n = _u_counts(m - 1, n), _u_counts(m, n - 1)
    return tuple((with_m[u - n] if u >= n else 0) + (with_n[u] if u < len(with_n) else 0) for u in range(m * n + 1))


ORDER_KEY = "milestones/out_of_order_episodes"
"""The share of an iteration's episodes that verified a milestone before its prerequisites."""


def _flat(values: Sequence[float], completion_rise: float) -> tuple[bool, float, float]:
    a, b = halves(values)
    return b - a <= completion_rise, a, b


def reward_without_completion(history: History, *, window: int = 10, reward_key: str = "reward/total",
                              completion_key: str = "success_rate", reward_rise: float = 0.25,
                              completion_rise: float = 0.05, floor: float = 1.0,
                              failed_key: str | None = "reward/total_failed",
                              progress_key: str | None = "milestones_verified",
                              order_key: str | None = ORDER_KEY) -> Alarm | None:
    """Total reward up by ``reward_rise`` (relative) while completion rose ≤ ``completion_rise``,
    and the reward of episodes that did not complete (``failed_key``) up by ``reward_rise`` too,
    to above 0 (a failure paid; one that loses fewer penalties is not a hack), and the rise not
    the pay of sub-goals learnt in order: where verified milestones (``reward/milestone``) paid
    ``MILESTONE_SHARE`` of it, the milestones verified per episode (``progress_key``) rose, and
    no episode of the window verified a milestone before its prerequisites (``order_key``), the
    policy reaches more of the task's milestones, each on env state and after the work the task
    graph puts before it: how learning looks before the first completions (a session-57 user's
    PressurePlate runs raised the alarm that way in every run, on their way to 93 %). A hack of
    milestone pay is a detector the episode fools, which verifies milestones out of order; a
    detector fooled in order is beyond what the metrics can tell (``gyre-ma check``'s
    detector probes and the spot checks look at the episodes themselves).

    The second condition is skipped when ``failed_key`` is None or not measured over the
    whole window (an iteration in which every episode completed has no failed reward); the
    third is never met where ``progress_key`` or ``order_key`` is None or not measured over
    the whole window."""
    reward = _series(history, reward_key, window)
    done = _series(history, completion_key, window)
    if reward is None or done is None:
        return None
    up, r0, r1 = rose(reward, relative=reward_rise, floor=floor)
    flat, c0, c1 = _flat(done, completion_rise)
    if not (up and flat):
        return None
    values = {"reward_before": r0, "reward_after": r1, "completion_before": c0, "completion_after": c1}
    also = ""
    failed = _series(history, failed_key, window) if failed_key else None
    if failed is not None:
        failed_up, f0, f1 = rose(failed, relative=reward_rise, floor=floor)
        if not failed_up or f1 <= 0:  # completion's rise, or fewer penalties: not a hack
            return None
        values |= {"failed_reward_before": f0, "failed_reward_after": f1}
        also = f", and on the episodes that did not complete it rose {f0:.3g} -> {f1:.3g}"
    milestone = _series(history, MILESTONE_REWARD_KEY, window)
    if milestone is not None:
        m0, m1 = halves(milestone)
        if m1 - m0 >= MILESTONE_SHARE * (r1 - r0):  # the rise is milestones' pay: a hack, or sub-goals learnt first
            doubt = _doubt_in_milestones(history, window, progress_key, order_key)
            if doubt is None:
                return None
            values |= {"milestone_reward_before": m0, "milestone_reward_after": m1}
            also += (f"; the rise is verified milestone reward ({MILESTONE_REWARD_KEY} {m0:.3g} -> {m1:.3g}), and "
                     f"{doubt}: a hack where milestones are verified without their work (a detector the env's state "
                     f"does not back; see the spot checks), a gain where {completion_key} follows")
    return Alarm("reward_without_completion",
                 f"{reward_key} rose {r0:.3g} -> {r1:.3g} over {window} iterations while "
                 f"{completion_key} went {c0:.3g} -> {c1:.3g}{also}", values)


def _doubt_in_milestones(history: History, window: int, progress_key: str | None,
                         order_key: str | None) -> str | None:
    """What leaves a rise of milestone pay in doubt, in words; None where the window's
    episodes verified more milestones per episode (second half over first) and none of them
    a milestone before its prerequisites."""
    progress = _series(history, progress_key, window) if progress_key else None
    disorder = _series(history, order_key, window) if order_key else None
    if progress is None or disorder is None:
        return f"{progress_key} or {order_key} was not measured in every iteration, so its order is unknown"
    if max(disorder) > 0:
        return (f"up to {max(disorder):.0%} of an iteration's episodes verified a milestone before its "
                f"prerequisites ({order_key})")
    p0, p1 = halves(progress)
    if p1 <= p0:
        return f"the milestones verified per episode did not rise ({progress_key} {p0:.3g} -> {p1:.3g})"
    return None


MILESTONE_REWARD_KEY = "reward/milestone"
"""The milestones' part of the arbitrated reward per episode."""
MILESTONE_SHARE = 0.9
"""Share of a reward rise that, paid by milestones, makes it milestones' pay."""


def calls_without_completion(history: History, *, window: int = 10, calls_key: str = "option_choices",
                             completion_key: str = "success_rate", calls_rise: float = 0.25,
                             completion_rise: float = 0.05, floor: float = 1.0,
                             progress_key: str | None = "milestones_verified",
                             reward_key: str | None = "reward/total",
                             significance: float = 0.05) -> Alarm | None:
    """Calls per episode (``calls_key``: option choices or tool calls) up by ``calls_rise``
    (relative) while completion rose ≤ ``completion_rise``, and calls per verified milestone
    up by ``calls_rise`` too, both as the medians of the window's halves: one iteration in
    which an episode ran to the step cap, repeating a cheap option, multiplies that
    iteration's calls (3 of 11 healthy runs raised this alarm on such iterations), while a
    policy that farms calls raises them iteration after iteration; and the reward per episode
    (``reward_key``) rose, and the window's iterations with more calls did not pay less (a
    negative correlation of calls and reward over the window): calls farmed are calls paid,
    while extra calls that are failed retries come with less reward, and extra calls at a
    level reward bought nothing. The rise must also exceed the series' own scatter: a
    one-sided rank test of the second half against the first (:func:`rise_p_value`) at or
    below ``significance`` (1: no test); with a window of 10, the second half's iterations
    must beat the first's in at least 21 of their 25 pairs. Before these two conditions,
    healthy LockedRoom runs (success 1, every episode paid its 4 milestones, choices per
    episode scattering between 5 and 23) raised the alarm 13 times in 12 runs of the four
    outside envs of ``benchmarks/generalisation.py``. On coverage_v0,
    healthy runs raised this alarm 12-16 times in 1,200 iterations when the calls per
    episode (3 at best) drifted up by one or two in a window; the correlation was negative
    in 31 of those 32 windows. The reward's rise must pass the same rank test: healthy MPE
    simple_spread runs (agents asked every step choosing ``stay`` more, success flat or
    falling) raised the alarm 2-3 times in 600 iterations while the reward per episode moved
    by 1-4 %, within its scatter (rank test p 0.5-0.79); farmed calls are paid, iteration
    after iteration. Option *choices* (calls made among two or more eligible
    options), not all option calls: a forced call is no decision of the manager's, and forced
    calls (a finished agent's only option, every step) multiply as failures run to the cap.

    Calls per verified milestone is ``calls_key`` ÷ max(``progress_key``, 1) per iteration,
    ``progress_key`` holding the milestones an episode verifies on average; the condition is
    skipped when it is None or not measured over the whole window."""
    calls = _series(history, calls_key, window)
    done = _series(history, completion_key, window)
    if calls is None or done is None:
        return None
    up, a0, a1 = rose(calls, relative=calls_rise, floor=floor, median=True)
    flat, c0, c1 = _flat(done, completion_rise)
    if not (up and flat):
        return None
    p = rise_p_value(calls)
    if p > significance:  # halves apart by chance: scatter, not a trend
        return None
    values = {"calls_before": a0, "calls_after": a1, "completion_before": c0, "completion_after": c1,
              "calls_rise_p": p}
    bought = ""
    reward = _series(history, reward_key, window) if reward_key else None
    if reward is not None:
        r0, r1 = halves(reward)
        if r1 <= r0:  # the extra calls bought no reward (failures running long lose it): not farmed for pay
            return None
        paid_p = rise_p_value(reward)
        if paid_p > significance:  # the reward's rise is within its own scatter: nothing was bought
            return None
        values |= {"reward_before": r0, "reward_after": r1, "reward_rise_p": paid_p}
        bought = f"; the reward per episode rose {r0:.3g} -> {r1:.3g} (p = {paid_p:.2g})"
        paid = _correlation(calls, reward)
        if paid is not None:
            if paid < 0:  # the window's iterations with more calls paid less: failures, not farming
                return None
            values["calls_reward_correlation"] = paid
    also = ""
    progress = _series(history, progress_key, window) if progress_key else None
    if progress is not None:
        per = [n / max(p, 1.0) for n, p in zip(calls, progress, strict=True)]
        per_up, p0, p1 = rose(per, relative=calls_rise, floor=floor, median=True)
        if not per_up:  # the extra calls verified milestones in proportion: progress, not a hack
            return None
        values |= {"calls_per_milestone_before": p0, "calls_per_milestone_after": p1}
        also = f", and per verified milestone they rose {p0:.3g} -> {p1:.3g}"
    return Alarm(f"{calls_key}_without_completion",
                 f"{calls_key} per episode rose {a0:.3g} -> {a1:.3g} over {window} iterations (rank test p = {p:.2g}) "
                 f"while {completion_key} went {c0:.3g} -> {c1:.3g}{also}{bought}", values)


def _correlation(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson correlation of two series; None where either is constant."""
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:
        return None


def rules_without_success(history: History, *, window: int = 10, rule_key: str = "rule_pay_rate",
                          completion_key: str = "success_rate", margin: float = 0.5) -> Alarm | None:
    """Rules paid in more than ``margin`` more of the episodes than succeeded, on average."""
    rules = _series(history, rule_key, window)
    done = _series(history, completion_key, window)
    if rules is None or done is None:
        return None
    r, c = sum(rules) / window, sum(done) / window
    if r - c <= margin:
        return None
    return Alarm("rules_without_success",
                 f"{rule_key} {r:.3g} exceeds {completion_key} {c:.3g} by more than {margin} "
                 f"over {window} iterations",
                 {"rule_rate": r, "completion": c})


class AlarmConfig(BaseModel):
    """Reward-hacking alarms (``rewards.alarms``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    window: int = Field(10, ge=2)
    """Iterations compared (first half against second half)."""
    reward_rise: float = Field(0.25, gt=0.0)
    """Relative rise of total reward that counts as rising."""
    calls_rise: float = Field(0.25, gt=0.0)
    """Relative rise of option or tool calls per episode that counts as rising."""
    completion_rise: float = Field(0.05, ge=0.0, le=1.0)
    """Rise of verified completion (absolute) at or below which it counts as flat."""
    calls_significance: float = Field(0.05, gt=0.0, le=1.0)
    """One-sided p-value of the rank test (second half against first) at or below which a
    rise of calls per episode counts; 1: no test."""
    rule_margin: float = Field(0.5, gt=0.0, le=1.0)
    """How far rule pay rate may exceed success rate before the alarm."""
    floor: float = Field(1.0, gt=0.0)
    """Smallest baseline a relative rise is measured against (avoids alarms near 0)."""
    completion_key: str = "success_rate"
    """Metric holding verified completion."""
    reward_key: str = "reward/total"
    """Metric holding total (arbitrated) reward per episode."""
    calls_keys: tuple[str, ...] = ("option_choices", "tool_calls")
    """Metrics holding calls per episode (absent ones are skipped); ``option_choices``
    counts the option calls made among two or more eligible options."""
    rule_key: str = "rule_pay_rate"
    """Metric holding the rate at which rules certify episodes."""
    failed_key: str | None = "reward/total_failed"
    """Metric holding the mean total reward of the episodes that did not complete: the reward
    alarm also needs it to rise. None: total reward and completion alone."""
    progress_key: str | None = "milestones_verified"
    """Metric holding the milestones an episode verifies on average: the calls alarms also
    need calls per verified milestone to rise, and the reward alarm passes over a rise of
    milestone pay only where it rose. None: calls and completion alone."""
    order_key: str | None = ORDER_KEY
    """Metric holding the share of an iteration's episodes that verified a milestone before
    its prerequisites: the reward alarm passes over a rise of milestone pay only where it
    stayed 0. None: such a rise always raises the alarm."""


class HackingMonitor:
    """Keeps the metrics history and evaluates every alarm each iteration."""

    def __init__(self, config: AlarmConfig | None = None) -> None:
        self.config = config or AlarmConfig()
        self.history: list[dict[str, float]] = []
        self.active: set[str] = set()
        self.fired: list[Alarm] = []
        """Each alarm at the iteration it started to hold."""

    def check(self, history: History) -> list[Alarm]:
        """Alarms holding on ``history`` (pure: no state change)."""
        c = self.config
        found = [
            reward_without_completion(history, window=c.window, reward_key=c.reward_key,
                                      completion_key=c.completion_key, reward_rise=c.reward_rise,
                                      completion_rise=c.completion_rise, floor=c.floor,
                                      failed_key=c.failed_key, progress_key=c.progress_key,
                                      order_key=c.order_key),
            rules_without_success(history, window=c.window, rule_key=c.rule_key,
                                  completion_key=c.completion_key, margin=c.rule_margin),
        ]
        found += [calls_without_completion(history, window=c.window, calls_key=k,
                                           completion_key=c.completion_key, calls_rise=c.calls_rise,
                                           completion_rise=c.completion_rise, floor=c.floor,
                                           progress_key=c.progress_key, reward_key=c.reward_key,
                                           significance=c.calls_significance)
                  for k in c.calls_keys]
        return [a for a in found if a is not None]

    def update(self, metrics: Mapping[str, float], iteration: int | None = None) -> list[Alarm]:
        """Append one iteration's metrics; return the alarms holding now."""
        self.history.append({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))})
        self.history = self.history[-4 * self.config.window:]
        at = iteration if iteration is not None else int(metrics.get("iteration", len(self.history) - 1))
        alarms = [Alarm(a.name, a.message, a.values, at) for a in self.check(self.history)]
        names = {a.name for a in alarms}
        for a in alarms:
            if a.name not in self.active:
                self.fired.append(a)
                log.warning("reward-hacking alarm %s at iteration %s: %s", a.name, at, a.message)
        self.active = names
        return alarms

    def metrics(self) -> dict[str, float]:
        """``alarm/<name>`` = 1.0 for every alarm holding now, and the count."""
        out = {f"alarm/{n}": 1.0 for n in sorted(self.active)}
        out["alarm/active"] = float(len(self.active))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history), "active": sorted(self.active),
                "fired": [asdict(a) for a in self.fired]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.history = [dict(m) for m in state["history"]]
        self.active = set(state["active"])
        self.fired = [Alarm(**a) for a in state["fired"]]
