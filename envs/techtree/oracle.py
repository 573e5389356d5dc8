"""OracleManager: a planner over the techtree task graph with quantities and vitals.

It reads the unwrapped env from each :class:`Decision` and, per agent needing an option:

1. keeps the agent alive — before each job it drinks, eats or sleeps if a vital would run
   out during that job (its milestone's ``duration``, with a margin), drinking and eating
   from the team's stock when there is one;
2. advances the goal chain — crafts the next tool when the (shared) inventory affords it,
   else gathers what the remaining recipes still lack, never the distractors (swords);
3. coordinates — it remembers which option every other agent is running, so that only one
   agent crafts a given thing and no more agents gather an item than units are missing;
4. otherwise stocks food and water for the team, tops vitals up, or waits.

With ``shared_inventory=False`` tools belong to whoever crafted them, so only the first
agent works the chain and the others look after themselves.
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

from gyre_ma.envs.techtree.techtree import (
    DRINK_V,
    ENERGY_V,
    FOOD,
    FOOD_V,
    ITEM_INDEX,
    WATER_I,
    TechTreeEnv,
)
from gyre_ma.options.decision import Choice, Decision
from gyre_ma.options.library import OptionLibrary

_CHAIN = (
    "collect_wood", "place_table", "make_wood_pickaxe", "collect_stone", "make_stone_pickaxe",
    "place_furnace", "collect_coal", "collect_iron", "make_iron_pickaxe", "collect_diamond",
)
_CRAFTS = {
    # milestone: (option, recipe)
    "place_table": ("place_table", "table"),
    "make_wood_pickaxe": ("make_wood_pickaxe", "wood_pickaxe"),
    "make_wood_sword": ("make_wood_sword", "wood_sword"),
    "make_stone_pickaxe": ("make_stone_pickaxe", "stone_pickaxe"),
    "make_stone_sword": ("make_stone_sword", "stone_sword"),
    "place_furnace": ("place_furnace", "furnace"),
    "make_iron_pickaxe": ("make_iron_pickaxe", "iron_pickaxe"),
    "make_iron_sword": ("make_iron_sword", "iron_sword"),
}
_COLLECTS = {
    # milestone: (option, item)
    "collect_wood": ("gather_wood", "wood"),
    "collect_stone": ("gather_stone", "stone"),
    "collect_coal": ("gather_coal", "coal"),
    "collect_iron": ("gather_iron", "iron"),
    "collect_diamond": ("mine_diamond", "diamond"),
    "collect_food": ("gather_food", "food"),
    "collect_drink": ("gather_water", "water"),
    "eat_food": ("eat", "food"),
    "drink_water": ("drink", "water"),
}
_GATHER = {
    "wood": "gather_wood", "stone": "gather_stone", "coal": "gather_coal",
    "iron": "gather_iron", "food": "gather_food", "water": "gather_water",
}


class OracleManager:
    """Scripted planner for techtree_v0 (see the module docstring).

    Before each job it checks that every vital outlasts the job's expected duration (the
    task graph's ``duration`` of its milestone) with a margin, and does upkeep first if not.
    """

    def __init__(self, library: OptionLibrary) -> None:
        self.library = library
        graph = library.graph
        chain_rank = {m: k for k, m in enumerate(_CHAIN)}
        needed = graph.required_for(graph.goals[0])
        self.chain = tuple(
            nx.lexicographical_topological_sort(needed, key=lambda m: (chain_rank.get(m, 99), m))
        )
        self._index = {name: k for k, name in enumerate(library.names)}
        self._running: dict[str, str] = {}
        self._episode = -1

    # ------------------------------------------------------------------ Manager protocol
    def decide(self, decisions: Sequence[Decision]) -> list[Choice]:
        out = []
        for d in decisions:
            env: TechTreeEnv = d.env
            if env.episode != self._episode:
                self._episode, self._running = env.episode, {}
            last = self._running.pop(d.agent, None)
            name = self._choose(d, env, last)
            self._running[d.agent] = name
            out.append(Choice(self._index[name]))
        return out

    # ------------------------------------------------------------------ planning
    def _eligible(self, d: Decision, name: str) -> bool:
        return bool(d.mask[self._index[name]])

    def _busy(self, env: TechTreeEnv, name: str) -> int:
        """How many other live agents are running option ``name``."""
        return sum(
            1 for a, n in self._running.items() if n == name and env.alive[env.agent_index[a]]
        )

    def _steps_left(self, env: TechTreeEnv, i: int, vital: int) -> int:
        """Steps before ``vital`` of agent ``i`` reaches zero."""
        cfg = env.config
        decay = {
            FOOD_V: cfg.food_decay, DRINK_V: cfg.drink_decay, ENERGY_V: cfg.energy_decay,
        }[vital]
        return env.vitals[i][vital] * decay

    def _expected(self, name: str) -> float:
        """Steps one call of option ``name`` may take: a generous multiple of its milestone's
        expected duration, capped by the option's step cap."""
        option = self.library[name]
        if option.milestone is None:
            return 1.0
        expected = self.library.graph.milestone(option.milestone).duration
        return min(float(option.max_steps), 2.5 * expected)

    def upkeep(self, d: Decision, horizon: float) -> str | None:
        """The upkeep option to run first if a vital would run out within ``horizon`` steps
        (drink or eat from the stock, fetch some first, or sleep); None if all will last."""
        env, i = d.env, d.agent_index
        cfg = env.config
        urgent = []
        for vital in (DRINK_V, FOOD_V, ENERGY_V):
            left = self._steps_left(env, i, vital)
            if left < horizon and env.vitals[i][vital] < cfg.max_vital - 1:
                urgent.append((left, vital))
        inv = env.inventory(i)
        for _, vital in sorted(urgent):
            if vital == ENERGY_V:
                return "sleep"
            if vital == DRINK_V:
                item, use, fetch = WATER_I, "drink", "gather_water"
            else:
                item, use, fetch = FOOD, "eat", "gather_food"
            if inv[item] > 0 and self._eligible(d, use):
                return use
            if self._eligible(d, fetch):
                return fetch
            if self._eligible(d, use):
                return use
        return None

    def _stock(self, d: Decision, env: TechTreeEnv, i: int, last: str | None) -> str | None:
        """Keep the team's flasks and berries topped up (cheap while standing at the source)."""
        alive = sum(env.alive)
        inv = env.inventory(i)
        for item, option, per_agent in ((WATER_I, "gather_water", 2), (FOOD, "gather_food", 1)):
            want = per_agent * alive
            if inv[item] + self._busy(env, option) < want and self._eligible(d, option):
                if last is None or last == option:
                    return option
        return None

    def _deficits(self, env: TechTreeEnv, i: int, done: frozenset[str]) -> list[str]:
        """Items the remaining chain still lacks, one entry per missing unit, in chain order."""
        inv = list(env.inventory(i))
        missing: list[str] = []
        for m in self.chain:
            if m in done:
                continue
            if m in _CRAFTS:
                for item, n in env.config.costs[_CRAFTS[m][1]].items():
                    k = ITEM_INDEX[item]
                    use = min(inv[k], n)
                    inv[k] -= use
                    missing += [item] * (n - use)
        return missing

    def _choose(self, d: Decision, env: TechTreeEnv, last: str | None) -> str:
        i = d.agent_index
        work = self._work(d, env, i)
        horizon = self._expected(work) + 40 if work else 60.0
        urgent = self.upkeep(d, horizon)
        if urgent is not None:
            return urgent
        if last in ("gather_water", "gather_food"):
            again = self._stock(d, env, i, last)
            if again is not None:
                return again
        if work is not None:
            return work
        # nothing on the chain for this agent: look after the team
        return self._stock(d, env, i, None) or self.upkeep(d, 150.0) or "wait"

    def _work(self, d: Decision, env: TechTreeEnv, i: int) -> str | None:
        """The chain option for agent ``i``: the next craft if affordable and free, else the
        gathering the remaining recipes most need (never a distractor)."""
        done = d.achieved
        if not (env.config.shared_inventory or i == 0):
            return None
        todo = [m for m in self.chain if m not in done]
        if not todo:
            return None
        nxt = todo[0]
        if nxt in _CRAFTS:
            option, recipe = _CRAFTS[nxt]
            inv = env.inventory(i)
            affordable = all(
                inv[ITEM_INDEX[item]] >= n for item, n in env.config.costs[recipe].items()
            )
            if affordable and self._eligible(d, option) and not self._busy(env, option):
                return option
        elif nxt in _COLLECTS:
            option = _COLLECTS[nxt][0]
            limit = 1 if option == "mine_diamond" else 2
            if self._eligible(d, option) and self._busy(env, option) < limit:
                return option
        missing = self._deficits(env, i, done)
        for item in dict.fromkeys(missing):
            option = _GATHER.get(item)
            if (
                option and self._eligible(d, option)
                and self._busy(env, option) < missing.count(item)
            ):
                return option
        return None
