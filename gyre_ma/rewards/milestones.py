"""Milestone rewards: a milestone pays its task-graph weight once per episode, on the
option calls during which it was first verified on environment state.

The only input is ``Trajectory.milestone_steps`` (the first step each milestone's
predicate held, recorded by the rollout from ``env.verified_milestones()``) and the
calls' step intervals — never what an option or an agent claims. A call that started at
step ``s`` and ran ``d`` steps covers the steps ``s+1 … s+d``; every agent's call that
covers the first verification is credited (the team reward convention of the envs, which
pay every agent), unless the env attributed the milestone to one agent
(``Trajectory.milestone_agents``): then only that agent's call is. Milestones already
holding at reset (step 0) pay nothing: nobody achieved them. A milestone whose reward the
graph filled in (none given) pays only if the goals still needed it when it was verified
(:func:`declined`): a second alternative of an ``any_of`` group does not; and no more than
its verification lowered the least reward the goals still needed, so that every route to the
goals pays the same in total (:func:`milestone_weights`).
"""

from __future__ import annotations

from gyre_ma.options.graph import TaskGraph
from gyre_ma.rollout import OptionCall, Trajectory


def covers(call: OptionCall, step: int) -> bool:
    """Whether ``step`` (a step counter after ``env.step``) fell inside ``call``."""
    return call.start_step < step <= call.start_step + call.duration


def first_verified(trajectory: Trajectory) -> list[tuple[str, ...]]:
    """Per call (aligned with ``trajectory.calls``), the milestones first verified during it."""
    firsts = sorted(trajectory.milestone_steps.items(), key=lambda kv: (kv[1], kv[0]))
    by = getattr(trajectory, "milestone_agents", None) or {}
    return [tuple(m for m, s in firsts if covers(c, s) and by.get(m, c.agent) == c.agent) for c in trajectory.calls]


def declined(trajectory: Trajectory, graph: TaskGraph) -> frozenset[str]:
    """Milestones of ``trajectory`` whose reward the graph filled in (``implicit_rewards``)
    and that the goals no longer needed when they were first verified
    (:meth:`~gyre_ma.options.graph.TaskGraph.still_needed` of what earlier steps verified):
    they pay nothing. Empty where every reward was given."""
    implicit = graph.implicit_rewards
    if not implicit or not any(m in implicit for m in trajectory.milestone_steps):
        return frozenset()
    out: set[str] = set()
    before: set[str] = set()
    needed, last = frozenset(), None
    for name, step in sorted(trajectory.milestone_steps.items(), key=lambda kv: (kv[1], kv[0])):
        if step != last:  # milestones of one step are judged on what earlier steps verified
            needed, last = graph.still_needed(before, trajectory.goals or None), step
        if name in implicit and name in graph and name not in needed:
            out.add(name)
        before.add(name)
    return frozenset(out)


def milestone_weights(trajectory: Trajectory, graph: TaskGraph) -> dict[str, float]:
    """What each milestone of ``trajectory`` (of ``graph``) pays where it was first verified,
    before the scale: its reward where it was given; where the graph filled it in, its reward
    while the goals still needed it (0 where :func:`declined`), and, where the graph has
    ``any_of`` alternatives, no more than the drop its verification made in the least reward
    the goals still needed (:meth:`~gyre_ma.options.graph.TaskGraph.remaining_pay`, of what
    earlier steps verified). So each route to the goals pays the same in total: a session-55
    user's vault opened by a key (fetch it, unlock) paid twice what kicking the door in paid,
    and the learner kept the longer route; now fetching the key pays nothing while kicking is
    as good, and unlocking pays what kicking would. A graph whose alternatives are single
    milestones of one reward pays as before."""
    weights = {m: graph.milestone(m).reward for m in trajectory.milestone_steps if m in graph}
    unpaid = declined(trajectory, graph)
    for m in unpaid:
        weights[m] = 0.0
    implicit = graph.implicit_rewards
    if not graph.has_alternatives or not any(w > 0 and m in implicit for m, w in weights.items()):
        return weights
    goals = trajectory.goals or None
    before: set[str] = set()
    left, last = 0.0, None
    for name, step in sorted(trajectory.milestone_steps.items(), key=lambda kv: (kv[1], kv[0])):
        if step != last:  # milestones of one step are judged on what earlier steps verified
            left, last = graph.remaining_pay(before, goals), step
        if name in implicit and name not in graph.goals and weights.get(name, 0.0) > 0:
            weights[name] = min(weights[name], max(left - graph.remaining_pay(before | {name}, goals), 0.0))
        before.add(name)
    return weights


def milestone_rewards(trajectory: Trajectory, graph: TaskGraph, *, scale: float = 1.0,
                      include_goals: bool = False) -> list[tuple[float, tuple[str, ...]]]:
    """Per call, the milestone reward and the milestones that paid it.

    Weights are the graph nodes' ``reward`` times ``scale``. Goals are left out unless
    ``include_goals`` (then the episode's own goals pay): the verified outcome pays for them
    (see :mod:`.arbiter`), and a part of the breakdown should have one source. A goal of
    the graph that is not the episode's (``trajectory.goals``) never pays.
    """
    out = []
    weights = milestone_weights(trajectory, graph)
    own = frozenset(trajectory.goals or graph.goals) if include_goals else frozenset()
    for names in first_verified(trajectory):
        paid = tuple(m for m in names if m in graph and (m in own or m not in graph.goals) and weights[m] > 0)
        out.append((scale * sum(weights[m] for m in paid), paid))
    return out


def last_calls(trajectory: Trajectory) -> list[int]:
    """Index of each agent's last call (an agent that left the episode early, e.g. died,
    has its last call end there)."""
    last: dict[str, int] = {}
    for i, c in enumerate(trajectory.calls):
        last[c.agent] = i
    return sorted(last.values())


def calls_at_end(trajectory: Trajectory) -> list[int]:
    """Index of each call still running when the episode ended: the last call of every
    agent that was in the episode to its end (not of one that died or left before)."""
    return [i for i in last_calls(trajectory)
            if trajectory.calls[i].start_step + trajectory.calls[i].duration >= trajectory.length]
