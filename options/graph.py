"""TaskGraph: the milestones of a task and the prerequisites between them.

An edge ``u -> v`` means *v needs u*. Edges carry an optional ``group``: the in-edges of
a node that share a group are alternatives (v needs u1 *or* u2); edges in different
groups, or without one, are all required (AND). A milestone is unlocked when every one of
its prerequisite groups has at least one achieved member.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Iterator, Mapping, Set
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import networkx as nx
import numpy as np

if TYPE_CHECKING:
    from gyre_ma.options.library import OptionLibrary


@dataclass(frozen=True)
class Milestone:
    """A named predicate over environment state; the graph's node payload."""

    name: str
    description: str = ""
    reward: float | None = None
    """Reward weight paid on the first verified achievement in an episode. None (not given):
    1.0 where a goal needs the milestone (a goal, or a prerequisite of one, alternatives
    included), 0.0 where none does, so a milestone declared only to be verified and seen
    (a distractor, a side task) does not pay the learner to detour for it; the
    :class:`TaskGraph` fills it in. A reward filled in so pays only where the milestone
    is still needed when it is verified (:meth:`TaskGraph.still_needed`): the first
    alternative of an ``any_of`` group pays, a second one, and the prerequisites of its
    route, do not; a reward given pays whenever."""
    verifier: str | None = None
    """Reference (``module:callable``) to the state predicate that verifies it."""
    duration: float = 1.0
    """Expected primitive steps of the option that achieves it (for the critical path)."""
    requires: tuple[str, ...] = ()
    """Milestones all needed first (AND)."""
    any_of: tuple[tuple[str, ...], ...] = ()
    """Groups of alternatives: at least one milestone of each group is needed first (an AND
    of ORs: ``[[campfire, farm]]`` is "campfire or farm"; ``[[campfire], [farm]]`` would be
    both, and a group of one is refused)."""
    side_effect: bool = False
    """Reached through other options' effects (one toggle both unlocks and opens a door; a
    pot starts cooking when full): no option has to achieve it for the goal to be reachable."""


@dataclass(frozen=True)
class TaskGraph:
    """A validated DAG of milestones with the goals the task is judged on."""

    milestones: tuple[Milestone, ...]
    goals: tuple[str, ...]
    graph: nx.DiGraph = field(init=False, repr=False, compare=False)
    implicit_rewards: frozenset[str] = field(init=False, repr=False, compare=False)
    """Milestones whose reward was not given (filled in from whether a goal needs them)."""
    unneeded: tuple[str, ...] = field(init=False, repr=False, compare=False)
    """Milestones no goal needs (neither a goal nor a prerequisite of one)."""

    def __post_init__(self) -> None:
        graph = nx.DiGraph()
        seen: set[str] = set()
        for m in self.milestones:
            if not isinstance(m.name, str) or not m.name:
                raise ValueError(f"task graph: milestone name must be a non-empty string, got {m.name!r}")
            if m.name in seen:
                raise ValueError(f"task graph: milestone {m.name!r} is declared twice")
            if m.duration <= 0:
                raise ValueError(
                    f"task graph: milestone {m.name!r}: duration must be > 0, got {m.duration!r}"
                )
            seen.add(m.name)
            graph.add_node(m.name, milestone=m)
        for m in self.milestones:
            for dep in m.requires:
                self._check_known(seen, m.name, dep)
                graph.add_edge(dep, m.name, group=f"and:{dep}")
            for i, group in enumerate(m.any_of):
                if not group:
                    raise ValueError(f"task graph: milestone {m.name!r}: any_of group {i} is empty")
                if len(group) == 1:
                    raise ValueError(
                        f"task graph: milestone {m.name!r}: any_of group {i} {list(group)} holds one milestone; a "
                        "group lists alternatives, one of which is needed (an AND of ORs): for either of a and b "
                        f"write one group, any_of: [[a, b]]; for a milestone that is needed, requires: [{group[0]}]")
                for dep in group:
                    self._check_known(seen, m.name, dep)
                    graph.add_edge(dep, m.name, group=f"or:{i}")
        try:
            cycle = nx.find_cycle(graph)
        except nx.NetworkXNoCycle:
            cycle = None
        if cycle is not None:
            path = " -> ".join([u for u, _ in cycle] + [cycle[0][0]])
            raise ValueError(f"task graph: prerequisites form a cycle: {path}")
        if not self.goals:
            raise ValueError("task graph: 'goals' is empty; name at least one goal milestone")
        for goal in self.goals:
            if goal not in seen:
                raise ValueError(
                    f"task graph: goal {goal!r} is not a milestone; known: {sorted(seen)}"
                )
        needed = set(self.goals).union(*(nx.ancestors(graph, g) for g in self.goals))
        implicit = frozenset(m.name for m in self.milestones if m.reward is None)
        filled = tuple(replace(m, reward=1.0 if m.name in needed else 0.0) if m.name in implicit else m
                       for m in self.milestones)
        for m in filled:
            graph.nodes[m.name]["milestone"] = m
        object.__setattr__(self, "milestones", filled)
        object.__setattr__(self, "implicit_rewards", implicit)
        object.__setattr__(self, "unneeded", tuple(m.name for m in filled if m.name not in needed))
        object.__setattr__(self, "graph", graph)

    @staticmethod
    def _check_known(known: set[str], node: str, dep: str) -> None:
        if dep not in known:
            raise ValueError(
                f"task graph: milestone {node!r} requires {dep!r}, which is not a declared milestone"
            )

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> TaskGraph:
        """Build from ``{"goals": [...], "milestones": {name: {requires, any_of, ...}}}``."""
        if not isinstance(spec, Mapping):
            raise TypeError(f"task graph: expected a mapping, got {type(spec).__name__}")
        unknown = set(spec) - {"goals", "milestones"}
        if unknown:
            raise ValueError(
                f"task graph: unknown key(s) {sorted(unknown)}; accepted: ['goals', 'milestones']"
            )
        raw = spec.get("milestones")
        if not isinstance(raw, Mapping) or not raw:
            raise ValueError("task graph: 'milestones' must be a non-empty mapping of name -> attributes")
        accepted = {"description", "reward", "verifier", "duration", "requires", "any_of", "side_effect"}
        milestones = []
        for name, attrs in raw.items():
            attrs = dict(attrs or {})
            bad = set(attrs) - accepted
            if bad:
                raise ValueError(
                    f"task graph: milestones.{name}: unknown key(s) {sorted(bad)}; accepted: {sorted(accepted)}"
                )
            requires = attrs.pop("requires", ()) or ()
            any_of = attrs.pop("any_of", ()) or ()
            if isinstance(requires, str) or not all(isinstance(r, str) for r in requires):
                raise ValueError(
                    f"task graph: milestones.{name}.requires must be a list of milestone names, got {requires!r}"
                )
            if isinstance(any_of, str) or not all(
                not isinstance(g, str) and all(isinstance(r, str) for r in g) for g in any_of
            ):
                raise ValueError(
                    f"task graph: milestones.{name}.any_of must be a list of lists of names, got {any_of!r}"
                )
            if "side_effect" in attrs and not isinstance(attrs["side_effect"], bool):
                raise ValueError(
                    f"task graph: milestones.{name}.side_effect must be true or false, got {attrs['side_effect']!r}"
                )
            for key, kind in (("reward", (int, float)), ("duration", (int, float))):
                if key in attrs and (isinstance(attrs[key], bool) or not isinstance(attrs[key], kind)):
                    raise ValueError(
                        f"task graph: milestones.{name}.{key} must be a number, got {attrs[key]!r}"
                    )
            milestones.append(
                Milestone(
                    name=str(name),
                    requires=tuple(requires),
                    any_of=tuple(tuple(g) for g in any_of),
                    **{k: (float(v) if k in ("reward", "duration") else v) for k, v in attrs.items()},
                )
            )
        goals = spec.get("goals")
        if isinstance(goals, str):
            goals = [goals]
        if not isinstance(goals, (list, tuple)):
            raise ValueError(f"task graph: 'goals' must be a list of milestone names, got {goals!r}")
        return cls(milestones=tuple(milestones), goals=tuple(goals))

    def to_spec(self) -> dict[str, Any]:
        """The inverse of :meth:`from_spec` (defaults omitted)."""
        out: dict[str, Any] = {}
        default = Milestone(name="_")
        for m in self.milestones:
            attrs: dict[str, Any] = {}
            for key in ("description", "reward", "verifier", "duration", "side_effect"):
                implicit = key == "reward" and m.name in self.implicit_rewards  # filled in: leave it to be again
                if getattr(m, key) != getattr(default, key) and not implicit:
                    attrs[key] = getattr(m, key)
            if m.requires:
                attrs["requires"] = list(m.requires)
            if m.any_of:
                attrs["any_of"] = [list(g) for g in m.any_of]
            out[m.name] = attrs
        return {"goals": list(self.goals), "milestones": out}

    # ------------------------------------------------------------------ queries
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.milestones)

    def __contains__(self, name: object) -> bool:
        return name in self.graph

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.milestones)

    def milestone(self, name: str) -> Milestone:
        if name not in self.graph:
            raise KeyError(f"unknown milestone {name!r}; known: {list(self.names)}")
        return self.graph.nodes[name]["milestone"]

    def unlocked(self, name: str, achieved: Iterable[str]) -> bool:
        """Whether every prerequisite group of ``name`` has an achieved member."""
        done = achieved if isinstance(achieved, (set, frozenset)) else set(achieved)
        m = self.milestone(name)
        return all(dep in done for dep in m.requires) and all(
            any(dep in done for dep in group) for group in m.any_of
        )

    def still_needed(self, verified: Iterable[str], goals: Iterable[str] | None = None) -> frozenset[str]:
        """The milestones not in ``verified`` that the goals (``goals``, an episode's; by
        default the graph's) still need. Certain: the unverified goals and, transitively,
        their unverified ``requires``. Then, from each milestone needed, every unverified
        alternative of each ``any_of`` group (with what it requires) that neither a verified
        milestone nor a certain one satisfies: a group that a milestone the goals need anyway
        will satisfy leaves its other alternatives unneeded (a cake's ``bake`` satisfies the
        group a shared ``plate`` asks of chop, cook_pasta or bake). A milestone whose
        dependants are verified, or the other alternative of a satisfied group (and what only
        its route needed), is no longer needed."""
        done = set(verified)
        certain = self._required(self.goals if goals is None else goals, done)
        needed, stack = set(certain), list(certain)
        while stack:
            for group in self.milestone(stack.pop()).any_of:
                if done.intersection(group) or certain.intersection(group):
                    continue
                for name in self._required(group, done) - needed:
                    needed.add(name)
                    stack.append(name)
        return frozenset(needed)

    @property
    def has_alternatives(self) -> bool:
        """Whether some milestone has an ``any_of`` group."""
        return any(m.any_of for m in self.milestones)

    def remaining_pay(self, verified: Iterable[str], goals: Iterable[str] | None = None) -> float:
        """The least filled-in reward (``implicit_rewards``, goals aside) that the goals
        (``goals``, an episode's; by default the graph's) still need paid: the unverified
        milestones they require, with each open ``any_of`` group taking the alternative whose
        route (the alternative and what it requires) pays least. A milestone pays no more
        than the drop it makes in this (:func:`gyre_ma.rewards.milestones.milestone_weights`),
        so every route to the goals pays the same in total: a longer route is not paid more."""
        done = frozenset(verified)
        weight = {n: self.milestone(n).reward or 0.0 for n in self.implicit_rewards if n not in self.goals}
        memo: dict[frozenset[str], float] = {}

        def least(needed: frozenset[str]) -> float:
            if needed not in memo:
                open_group = next((g for n in sorted(needed) for g in self.milestone(n).any_of
                                   if not done.intersection(g) and not needed.intersection(g)), None)
                memo[needed] = (sum(weight.get(n, 0.0) for n in needed) if open_group is None else
                                min(least(frozenset(self._required([alt], done, needed))) for alt in open_group))
            return memo[needed]

        return least(frozenset(self._required(self.goals if goals is None else goals, done)))

    def _required(self, names: Iterable[str], done: Set[str], into: Iterable[str] = ()) -> set[str]:
        """``into`` (a set closed under ``requires`` already) with ``names`` not in ``done``
        and, transitively, their ``requires`` not in ``done``."""
        out, stack = set(into), [n for n in names if n not in done]
        while stack:
            name = stack.pop()
            if name not in out:
                out.add(name)
                stack.extend(r for r in self.milestone(name).requires if r not in done)
        return out

    def frontier(self, achieved: Iterable[str]) -> frozenset[str]:
        """Milestones not yet achieved whose prerequisites are all met."""
        done = frozenset(achieved)
        return frozenset(n for n in self.names if n not in done and self.unlocked(n, done))

    def mask(self, library: OptionLibrary, achieved: Iterable[str]) -> np.ndarray:
        """Boolean mask over ``library`` options allowed by the graph alone.

        One-shot options are enabled while their milestone is on the frontier; repeatable
        ones whenever their milestone is unlocked; options without a milestone always.
        """
        done = frozenset(achieved)
        return np.array([opt.graph_eligible(self, done) for opt in library], dtype=bool)

    def topological_orders(self, limit: int | None = None) -> Iterator[tuple[str, ...]]:
        """All topological orders of the graph (AND view of every edge), up to ``limit``."""
        for i, order in enumerate(nx.all_topological_sorts(self.graph)):
            if limit is not None and i >= limit:
                return
            yield tuple(order)

    def required_for(self, goal: str) -> nx.DiGraph:
        """The subgraph a goal needs: the goal and all its ancestors."""
        self.milestone(goal)
        return self.graph.subgraph(nx.ancestors(self.graph, goal) | {goal}).copy()

    def critical_path(self, goal: str | None = None) -> tuple[float, tuple[str, ...]]:
        """Length (sum of expected durations) and nodes of the cheapest route to ``goal``
        that still respects every prerequisite chain: the longest chain, where an OR group
        takes its cheapest alternative."""
        goal = goal or self.goals[0]
        self.milestone(goal)
        best: dict[str, tuple[float, tuple[str, ...]]] = {}
        for node in nx.topological_sort(self.graph):
            m = self.milestone(node)
            candidates = [best[d] for d in m.requires]
            candidates += [min((best[d] for d in group), key=lambda t: t[0]) for group in m.any_of]
            head = max(candidates, key=lambda t: t[0], default=(0.0, ()))
            best[node] = (head[0] + m.duration, head[1] + (node,))
        return best[goal]

    def achievable(self, can_achieve: Iterable[str] | None = None) -> frozenset[str]:
        """Fixpoint of milestones reachable from nothing, using only ``can_achieve``."""
        allowed = set(self.names if can_achieve is None else can_achieve)
        done: set[str] = set()
        changed = True
        while changed:
            changed = False
            for n in self.names:
                if n not in done and n in allowed and self.unlocked(n, done):
                    done.add(n)
                    changed = True
        return frozenset(done)

    # ------------------------------------------------------------------ pictures
    def to_dot(self, achieved: Iterable[str] = ()) -> str:
        """Graphviz DOT text, nodes coloured achieved / frontier / locked."""
        done = frozenset(achieved)
        front = self.frontier(done)
        lines = ["digraph task {", "  rankdir=LR;", "  node [shape=box, style=filled];"]
        for n in self.names:
            colour = _COLOURS["achieved" if n in done else "frontier" if n in front else "locked"]
            peri = ", peripheries=2" if n in self.goals else ""
            lines.append(f'  "{n}" [fillcolor="{colour}"{peri}];')
        for u, v, data in self.graph.edges(data=True):
            style = ' [style=dashed, label="or"]' if data["group"].startswith("or:") else ""
            lines.append(f'  "{u}" -> "{v}"{style};')
        lines.append("}")
        return "\n".join(lines) + "\n"

    def draw(self, path: str, achieved: Iterable[str] = (), title: str | None = None) -> None:
        """Write a PNG: layered left-to-right layout, nodes coloured by status."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        done = frozenset(achieved)
        front = self.frontier(done)
        g = self.graph.copy()
        for layer, nodes in enumerate(nx.topological_generations(g)):
            for n in nodes:
                g.nodes[n]["layer"] = layer
        pos = nx.multipartite_layout(g, subset_key="layer", align="vertical")
        n_layers = max(nx.get_node_attributes(g, "layer").values()) + 1
        width = max(8.0, 2.2 * n_layers)
        height = max(4.0, 1.1 * max(len(ns) for ns in nx.topological_generations(g)))
        fig, ax = plt.subplots(figsize=(width, height))
        colours = [
            _COLOURS["achieved" if n in done else "frontier" if n in front else "locked"] for n in g
        ]
        solid = [(u, v) for u, v, d in g.edges(data=True) if not d["group"].startswith("or:")]
        dashed = [(u, v) for u, v, d in g.edges(data=True) if d["group"].startswith("or:")]
        nx.draw_networkx_edges(g, pos, edgelist=solid, ax=ax, arrowsize=14, node_size=2600)
        nx.draw_networkx_edges(
            g, pos, edgelist=dashed, ax=ax, style="dashed", arrowsize=14, node_size=2600
        )
        nx.draw_networkx_nodes(
            g, pos, ax=ax, node_color=colours, node_size=2600, node_shape="s",
            edgecolors=["black" if n in self.goals else "grey" for n in g],
            linewidths=[3 if n in self.goals else 1 for n in g],
        )
        nx.draw_networkx_labels(
            g, pos, ax=ax, font_size=8,
            labels={n: "\n".join(textwrap.wrap(n.replace("_", " "), 10, break_long_words=False)) for n in g},
        )
        ax.legend(
            handles=[Patch(color=c, label=k) for k, c in _COLOURS.items()]
            + [Patch(facecolor="white", edgecolor="black", label="goal (bold border)")]
            + [Line2D([], [], color="black", linestyle="dashed", label="alternative (any of)")],
            loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=5, fontsize=8, frameon=False,
        )
        ax.margins(x=0.12, y=0.18)
        ax.set_title(title or f"task graph — goals: {', '.join(self.goals)}")
        ax.axis("off")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


_COLOURS = {"achieved": "#8fd18f", "frontier": "#ffd166", "locked": "#d9d9d9"}
