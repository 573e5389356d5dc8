"""A planning manager for workflow_v0: the upper bound the learned manager is measured by.

It reads the task graph and ``decision.env``: an agent with a timed-out call retries
it; every other agent takes the option of the earliest frontier milestone that the goal
still needs, resolving each ``any_of`` group by the cheapest alternative (expected
durations of the graph, as on the critical path). Several agents on one option share its
work (the options split checks and sections and wait on exclusive calls).
"""

from __future__ import annotations

from collections.abc import Sequence

from gyre_ma.envs.base import unwrap
from gyre_ma.options.decision import Choice, Decision
from gyre_ma.options.graph import TaskGraph
from gyre_ma.options.library import OptionLibrary


def needed_milestones(graph: TaskGraph, achieved: frozenset[str], goal: str | None = None) -> set[str]:
    """Unachieved milestones on the cheapest route from ``achieved`` to ``goal``."""
    goal = goal or graph.goals[0]
    cost = {name: graph.critical_path(name)[0] for name in graph.names}
    needed: set[str] = set()
    stack = [goal]
    while stack:
        node = stack.pop()
        if node in achieved or node in needed:
            continue
        needed.add(node)
        m = graph.milestone(node)
        stack.extend(m.requires)
        for group in m.any_of:
            if not any(g in achieved for g in group):
                stack.append(min(group, key=lambda g: (cost[g], graph.names.index(g))))
    return needed


class OracleManager:
    """Graph planner over a workflow option library (reads ``decision.env``)."""

    def __init__(self, env: object = None, library: OptionLibrary | None = None) -> None:
        """``env`` is accepted (and unused) so registries may pass it: the oracle reads
        each decision's env. ``library`` defaults to :func:`options.make_library`; the
        chosen indices refer to it."""
        if library is None:
            from gyre_ma.envs.workflow.options import make_library

            library = make_library()
        self.library = library
        self.graph = library.graph
        self._order = {n: i for i, n in enumerate(self._topological())}
        self._by_milestone: dict[str, int] = {}
        for i, opt in enumerate(library):
            if opt.milestone is not None and not opt.repeatable:
                self._by_milestone.setdefault(opt.milestone, i)
        self._retry = library.index("retry_tool")
        self._wait = library.index("wait")
        self._plans: dict[frozenset[str], int] = {}

    def _topological(self) -> list[str]:
        import networkx as nx

        return list(nx.lexicographical_topological_sort(self.graph.graph, key=self.graph.names.index))

    def target(self, achieved: frozenset[str]) -> str | None:
        """The milestone to work on next: earliest needed one on the frontier."""
        needed = needed_milestones(self.graph, achieved)
        front = [n for n in self.graph.frontier(achieved) if n in needed]
        return min(front, key=self._order.__getitem__) if front else None

    def _plan(self, achieved: frozenset[str]) -> int:
        if achieved not in self._plans:
            target = self.target(achieved)
            self._plans[achieved] = self._by_milestone.get(target, self._wait) if target else self._wait
        return self._plans[achieved]

    def decide(self, decisions: Sequence[Decision]) -> list[Choice]:
        out = []
        for d in decisions:
            env = d.env if hasattr(d.env, "workspace") else unwrap(d.env)
            status = env.workspace.agents[d.agent]
            if status.failed is not None and d.mask[self._retry]:
                choice = self._retry
            else:
                choice = self._plan(d.achieved)
                if not d.mask[choice]:
                    choice = self._wait
            out.append(Choice(int(choice)))
        return out
