"""Managers for coverage_v0 that read the env: the optimal assignment, a greedy one and a fixed one.

:class:`OracleManager` plans one assignment of every agent between options to the
landmarks nobody is walking to, on the route lengths ``go_to_k`` walks, and gives each
asking agent its part. The rollout asks one agent at a time (the rest of the step's
askers have not chosen yet, so the plan covers them too and they get the same plan when
asked); a batch of decisions is planned the same way. It remembers which landmark every
agent mid-``go_to`` is walking to (forgotten at the agent's next decision, or at once
through the ``option_end`` hook): those landmarks are taken, and the longest remaining
walk among them is a makespan already committed. :class:`NearestFirst` sends each agent,
in the order they are asked, to the nearest landmark still open to it: what a policy that
learned only "go to the nearest" would do. :class:`FixedAssignment` sends agent ``k`` to
landmark ``k`` whatever the layout: the baseline the assignment has to beat.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gyre_ma.envs.coverage.assignment import OBJECTIVES, assign
from gyre_ma.envs.coverage.coverage import CoverageEnv, milestone
from gyre_ma.options.decision import Choice, Decision
from gyre_ma.options.library import OptionLibrary


def _landmark_options(library: OptionLibrary) -> dict[int, int]:
    """Landmark ``k`` → the index of the option whose milestone is ``covered_k``."""
    by_milestone = {opt.milestone: i for i, opt in enumerate(library) if opt.milestone is not None}
    out, k = {}, 0
    while milestone(k) in by_milestone:
        out[k] = by_milestone[milestone(k)]
        k += 1
    if not out:
        raise ValueError(f"coverage oracle: library {library.name!r} has no option achieving {milestone(0)!r}")
    return out


class OracleManager:
    """Optimal assignment of the agents between options to the free landmarks (see the
    module docstring). ``objective``: ``makespan`` (the default: the cap binds the slowest
    agent; ties go to the least total walk) or ``total``. Agents left without a landmark,
    and frozen ones, ``stay``."""

    def __init__(self, library: OptionLibrary, objective: str = "makespan") -> None:
        if objective not in OBJECTIVES:
            raise ValueError(f"coverage oracle: objective must be one of {list(OBJECTIVES)}, got {objective!r}")
        self.library, self.objective = library, objective
        self._go_to = _landmark_options(library)
        self._stay = library.index("stay")
        self._running: dict[str, int] = {}
        """Agent → the landmark it is walking to, for agents mid-``go_to``."""
        self._episode: tuple[int, int] | None = None

    # ------------------------------------------------------------------ Manager hooks
    def episode_start(self, env: Any, seed: int) -> None:
        self._running = {}
        raw = env.unwrapped
        self._episode = (id(raw), raw.episode)

    def option_end(self, call: Any, env: Any) -> None:
        self._running.pop(call.agent, None)

    # ------------------------------------------------------------------ Manager protocol
    def decide(self, decisions: Sequence[Decision]) -> list[Choice]:
        if not decisions:
            return []
        env: CoverageEnv = decisions[0].env.unwrapped
        if (id(env), env.episode) != self._episode:
            self._episode, self._running = (id(env), env.episode), {}
        asking = {d.agent_index: d for d in decisions}
        for d in decisions:
            self._running.pop(d.agent, None)
        walking = {env.agent_index[a]: k for a, k in self._running.items()
                   if env.covered_by[k] < 0 and env.claim[env.agent_index[a]] < 0}
        free = [i for i in range(len(env.possible_agents)) if env.claim[i] < 0 and i not in walking]
        targets = [k for k in self._go_to if env.covered_by[k] < 0 and k not in walking.values()]
        plan = self._plan(env, free, targets, walking, asking)
        out = []
        for d in decisions:
            k = plan.get(d.agent_index)
            if k is None:
                out.append(Choice(self._stay))
            else:
                self._running[d.agent] = k
                out.append(Choice(self._go_to[k]))
        return out

    def _plan(self, env: CoverageEnv, free: list[int], targets: list[int], walking: dict[int, int],
              asking: dict[int, Decision]) -> dict[int, int]:
        """Agent → landmark for the ``free`` agents over the ``targets`` (a decision's mask
        has the last word for its agent), given the agents ``walking`` to theirs."""
        if not free or not targets:
            return {}
        pos = env.agent_pos
        cost = np.full((len(free), len(targets)), np.inf)
        for b, k in enumerate(targets):
            field = env.route_field(k)
            for a, i in enumerate(free):
                d = asking.get(i)
                if d is not None and not d.mask[self._go_to[k]]:
                    continue
                steps = int(field[pos[i, 0], pos[i, 1]])
                cost[a, b] = steps if steps >= 0 else int(np.abs(env.landmark_pos[k] - pos[i]).sum())
        floor = 0.0
        for i, k in walking.items():
            floor = max(floor, float(env.route_field(k)[pos[i, 0], pos[i, 1]]))
        pairs = assign(cost, objective=self.objective, floor=floor)
        return {free[a]: targets[b] for a, b in pairs}


class NearestFirst:
    """Each asked agent walks to the nearest landmark its decision's mask leaves open (by the
    route ``go_to_k`` walks), one agent after another; a landmark given to an earlier agent
    of the same batch is taken. Agents with none open ``stay``."""

    def __init__(self, library: OptionLibrary) -> None:
        self._go_to = _landmark_options(library)
        self._stay = library.index("stay")

    def decide(self, decisions: Sequence[Decision]) -> list[Choice]:
        out, taken = [], set()
        for d in decisions:
            env: CoverageEnv = d.env.unwrapped
            r, c = (int(x) for x in env.agent_pos[d.agent_index])
            open_ = [k for k, o in self._go_to.items() if d.mask[o] and k not in taken]
            if not open_:
                out.append(Choice(self._stay))
                continue
            steps = {k: int(env.route_field(k)[r, c]) for k in open_}
            nearest = min(open_, key=lambda k: (steps[k] < 0, steps[k], k))
            taken.add(nearest)
            out.append(Choice(self._go_to[nearest]))
        return out


class FixedAssignment:
    """Agent ``k`` walks to landmark ``k``; once that is covered (by anyone), it stays."""

    def __init__(self, library: OptionLibrary) -> None:
        self._go_to = _landmark_options(library)
        self._stay = library.index("stay")

    def decide(self, decisions: Sequence[Decision]) -> list[Choice]:
        out = []
        for d in decisions:
            option = self._go_to.get(d.agent_index)
            out.append(Choice(option if option is not None and d.mask[option] else self._stay))
        return out
