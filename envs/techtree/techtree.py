"""techtree_v0: a multi-agent, Crafter-inspired survival-and-crafting world.

A procedurally generated grid (from the reset seed) holds forest, grassland with lakes and
berry bushes, and a mountain of stone with coal, a few iron veins and the diamonds at its
far end. N agents (1-8) gather, craft and keep themselves alive; the team shares one
inventory by default. Milestones are verified on environment state only: the episode's
counters of what was ever collected, placed, crafted or consumed.

Why the order of options matters here:

* **Step budget** — the oracle's path to the diamond is over a thousand team steps;
  surplus gathering, distractor crafts and idle upkeep eat the same ``max_cycles``.
* **Scarce iron** — the map holds ``n_iron`` iron (4); the iron pickaxe needs 3 and the
  iron sword 2, so a sword made first makes the pickaxe, and the diamond, impossible.
* **Vitals** — food, drink and energy drain; at zero, health drains; at zero health the
  agent dies (terminated). Upkeep has to happen in time, not at random.
* **Coordination** — agents share the inventory, so duplicated work wastes the budget and
  one agent's craft consumes what another was gathering for.

Stepping is plain Python over agents (at most 8) plus numpy slices for the views; nothing
loops over the whole grid per step.

Coordinates are ``(row, col)``; ``grid[row, col]`` holds a tile id (``TILES``).
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils import wrappers
from pettingzoo.utils.conversions import parallel_to_aec

from gyre_ma.options.graph import TaskGraph

# ---------------------------------------------------------------------------- tiles
TILES = (
    "out", "grass", "sand", "water", "tree", "stone", "coal", "iron", "diamond", "table",
    "furnace", "path", "bush", "bush_empty", "agent",
)
(OUT, GRASS, SAND, WATER, TREE, STONE, COAL, IRON, DIAMOND, TABLE, FURNACE, PATH, BUSH,
 BUSH_EMPTY, AGENT) = range(len(TILES))
WALKABLE = tuple(t in (GRASS, SAND, PATH) for t in range(len(TILES)))
"""Indexed by tile id: whether an agent can stand there (agents may share a tile)."""
PLACEABLE = WALKABLE

# ---------------------------------------------------------------------------- actions
ACTIONS = (
    "noop", "move_left", "move_right", "move_up", "move_down", "do", "sleep", "place_table",
    "place_furnace", "make_wood_pickaxe", "make_stone_pickaxe", "make_iron_pickaxe",
    "make_wood_sword", "make_stone_sword", "make_iron_sword", "eat", "drink",
)
(NOOP, LEFT, RIGHT, UP, DOWN, DO, SLEEP, PLACE_TABLE, PLACE_FURNACE, MAKE_WOOD_PICKAXE,
 MAKE_STONE_PICKAXE, MAKE_IRON_PICKAXE, MAKE_WOOD_SWORD, MAKE_STONE_SWORD, MAKE_IRON_SWORD,
 EAT, DRINK) = range(len(ACTIONS))
MOVES = (LEFT, RIGHT, UP, DOWN)
DIRS = ((0, -1), (0, 1), (-1, 0), (1, 0))
"""(d_row, d_col) for facing 0..3 = left, right, up, down (the order of MOVES)."""

# ---------------------------------------------------------------------------- items
ITEMS = (
    "wood", "stone", "coal", "iron", "diamond", "food", "water",
    "wood_pickaxe", "stone_pickaxe", "iron_pickaxe", "wood_sword", "stone_sword", "iron_sword",
)
(WOOD, STONE_I, COAL_I, IRON_I, DIAMOND_I, FOOD, WATER_I, WOOD_PICKAXE, STONE_PICKAXE,
 IRON_PICKAXE, WOOD_SWORD, STONE_SWORD, IRON_SWORD) = range(len(ITEMS))
ITEM_INDEX = {name: i for i, name in enumerate(ITEMS)}

SOURCES = {
    "wood": (TREE,), "stone": (STONE,), "coal": (COAL,), "iron": (IRON,),
    "diamond": (DIAMOND,), "food": (BUSH,), "water": (WATER,),
}
"""Item -> the tiles that yield it when an agent does ``do`` facing them."""

_COLLECT = {
    # tile: (item, tool needed or None, hits key, tile left behind)
    TREE: (WOOD, None, "tree", GRASS),
    STONE: (STONE_I, WOOD_PICKAXE, "stone", PATH),
    COAL: (COAL_I, WOOD_PICKAXE, "coal", PATH),
    IRON: (IRON_I, STONE_PICKAXE, "iron", PATH),
    DIAMOND: (DIAMOND_I, IRON_PICKAXE, "diamond", PATH),
    WATER: (WATER_I, None, "water", WATER),
    BUSH: (FOOD, None, "bush", BUSH_EMPTY),
}
TOOL_FOR_TILE = {tile: rule[1] for tile, rule in _COLLECT.items()}

CRAFT_ACTIONS = {
    MAKE_WOOD_PICKAXE: "wood_pickaxe", MAKE_STONE_PICKAXE: "stone_pickaxe",
    MAKE_IRON_PICKAXE: "iron_pickaxe", MAKE_WOOD_SWORD: "wood_sword",
    MAKE_STONE_SWORD: "stone_sword", MAKE_IRON_SWORD: "iron_sword",
}
RECIPE_ACTION = {v: k for k, v in CRAFT_ACTIONS.items()}
RECIPE_ACTION.update(table=PLACE_TABLE, furnace=PLACE_FURNACE)
STATIONS = {
    # recipe: (needs a table nearby, needs a furnace nearby)
    "table": (False, False), "furnace": (True, False),
    "wood_pickaxe": (True, False), "wood_sword": (True, False),
    "stone_pickaxe": (True, False), "stone_sword": (True, False),
    "iron_pickaxe": (True, True), "iron_sword": (True, True),
}

VITALS = ("health", "food", "drink", "energy")
HEALTH, FOOD_V, DRINK_V, ENERGY_V = range(4)


# ---------------------------------------------------------------------------- milestones
def _default_costs() -> dict[str, dict[str, int]]:
    return {
        "table": {"wood": 8},
        "wood_pickaxe": {"wood": 5},
        "wood_sword": {"wood": 4},
        "stone_pickaxe": {"wood": 3, "stone": 8},
        "stone_sword": {"wood": 2, "stone": 6},
        "furnace": {"stone": 15, "coal": 4},
        "iron_pickaxe": {"wood": 4, "coal": 4, "iron": 3},
        "iron_sword": {"wood": 2, "coal": 2, "iron": 2},
    }


def _default_hits() -> dict[str, int]:
    return {"tree": 10, "stone": 14, "coal": 18, "iron": 40, "diamond": 50, "water": 1, "bush": 1}


class EverCounted:
    """Verifier: the env's episode counter ``kind``/``key`` (e.g. collected/wood) is > 0.

    Instances are module attributes, so the task graph names them by reference
    (``gyre_ma.envs.techtree.techtree:verify_collect_wood``) and reads only env state.
    """

    def __init__(self, kind: str, key: str) -> None:
        self.kind, self.key = kind, key

    def __call__(self, env: Any) -> bool:
        return env.stats[self.kind][self.key] > 0

    def __repr__(self) -> str:
        return f"EverCounted({self.kind!r}, {self.key!r})"


_MILESTONE_EVENTS: dict[str, tuple[str, str]] = {
    "collect_wood": ("collected", "wood"),
    "place_table": ("placed", "table"),
    "make_wood_pickaxe": ("crafted", "wood_pickaxe"),
    "make_wood_sword": ("crafted", "wood_sword"),
    "collect_stone": ("collected", "stone"),
    "place_furnace": ("placed", "furnace"),
    "make_stone_pickaxe": ("crafted", "stone_pickaxe"),
    "make_stone_sword": ("crafted", "stone_sword"),
    "collect_coal": ("collected", "coal"),
    "collect_iron": ("collected", "iron"),
    "make_iron_pickaxe": ("crafted", "iron_pickaxe"),
    "make_iron_sword": ("crafted", "iron_sword"),
    "collect_diamond": ("collected", "diamond"),
    "collect_drink": ("collected", "water"),
    "drink_water": ("consumed", "water"),
    "collect_food": ("collected", "food"),
    "eat_food": ("consumed", "food"),
}
MILESTONES = tuple(_MILESTONE_EVENTS)
EVENT_MILESTONE = {event: name for name, event in _MILESTONE_EVENTS.items()}

verify_collect_wood = EverCounted("collected", "wood")
verify_place_table = EverCounted("placed", "table")
verify_make_wood_pickaxe = EverCounted("crafted", "wood_pickaxe")
verify_make_wood_sword = EverCounted("crafted", "wood_sword")
verify_collect_stone = EverCounted("collected", "stone")
verify_place_furnace = EverCounted("placed", "furnace")
verify_make_stone_pickaxe = EverCounted("crafted", "stone_pickaxe")
verify_make_stone_sword = EverCounted("crafted", "stone_sword")
verify_collect_coal = EverCounted("collected", "coal")
verify_collect_iron = EverCounted("collected", "iron")
verify_make_iron_pickaxe = EverCounted("crafted", "iron_pickaxe")
verify_make_iron_sword = EverCounted("crafted", "iron_sword")
verify_collect_diamond = EverCounted("collected", "diamond")
verify_collect_drink = EverCounted("collected", "water")
verify_drink_water = EverCounted("consumed", "water")
verify_collect_food = EverCounted("collected", "food")
verify_eat_food = EverCounted("consumed", "food")

_GRAPH_NODES: dict[str, dict[str, Any]] = {
    # name: description, reward (milestone weight), requires, duration (expected option steps)
    "collect_wood": dict(description="chop a tree for wood", reward=0.05, duration=12),
    "place_table": dict(
        description="place a crafting table (costs wood)", reward=0.1, duration=5,
        requires=["collect_wood"],
    ),
    "make_wood_pickaxe": dict(
        description="craft a wood pickaxe at a table", reward=0.1, duration=10,
        requires=["place_table"],
    ),
    "make_wood_sword": dict(
        description="craft a wood sword at a table (a distractor: it only costs wood)",
        reward=0.02, duration=10, requires=["place_table"],
    ),
    "collect_stone": dict(
        description="mine stone (needs a wood pickaxe)", reward=0.1, duration=20,
        requires=["make_wood_pickaxe"],
    ),
    "place_furnace": dict(
        description="place a furnace next to a table (costs stone)", reward=0.15, duration=30,
        requires=["collect_stone", "place_table"],
    ),
    "make_stone_pickaxe": dict(
        description="craft a stone pickaxe at a table", reward=0.15, duration=25,
        requires=["collect_stone"],
    ),
    "make_stone_sword": dict(
        description="craft a stone sword at a table (a distractor)", reward=0.02, duration=25,
        requires=["collect_stone"],
    ),
    "collect_coal": dict(
        description="mine coal (needs a wood pickaxe)", reward=0.1, duration=55,
        requires=["make_wood_pickaxe"],
    ),
    "collect_iron": dict(
        description="mine iron (needs a stone pickaxe; the map holds only a few)", reward=0.2,
        duration=120, requires=["make_stone_pickaxe"],
    ),
    "make_iron_pickaxe": dict(
        description="craft an iron pickaxe near a table and a furnace", reward=0.3, duration=30,
        requires=["collect_iron", "collect_coal", "place_furnace"],
    ),
    "make_iron_sword": dict(
        description="craft an iron sword (a trap: it spends the scarce iron)", reward=0.02,
        duration=30, requires=["collect_iron", "collect_coal", "place_furnace"],
    ),
    "collect_diamond": dict(
        description="mine a diamond (needs an iron pickaxe)", reward=1.0, duration=230,
        requires=["make_iron_pickaxe"],
    ),
    "collect_drink": dict(description="fill a flask at water", reward=0.02, duration=8),
    "drink_water": dict(
        description="drink from a flask", reward=0.02, duration=2, requires=["collect_drink"]
    ),
    "collect_food": dict(description="pick berries from a bush", reward=0.02, duration=12),
    "eat_food": dict(
        description="eat berries", reward=0.02, duration=2, requires=["collect_food"]
    ),
}


def task_spec(goal: str = "collect_diamond") -> dict[str, Any]:
    """The techtree task graph as a ``TaskGraph.from_spec`` mapping."""
    milestones = {}
    for name, attrs in _GRAPH_NODES.items():
        node = dict(attrs)
        node["verifier"] = f"{__name__}:verify_{name}"
        node["duration"] = float(node["duration"])
        milestones[name] = node
    return {"goals": [goal], "milestones": milestones}


@functools.lru_cache(maxsize=None)
def task_graph(goal: str = "collect_diamond") -> TaskGraph:
    """The techtree TaskGraph (importable as ``gyre_ma.envs.techtree.techtree:task_graph``)."""
    return TaskGraph.from_spec(task_spec(goal))


# ---------------------------------------------------------------------------- config
@dataclass(frozen=True)
class TechTreeConfig:
    """Every knob of techtree_v0; ``parallel_env(**kwargs)`` takes these as keywords."""

    n_agents: int = 2
    """Number of agents (1-8)."""
    size: int = 32
    """Side of the square map (16-96)."""
    max_cycles: int | None = None
    """Team steps (``step`` calls) before every agent is truncated; None picks 3000 for a
    team and 4500 for a lone agent (whose oracle path is about twice as long)."""
    shared_inventory: bool = True
    """One team inventory (tools included) rather than one per agent."""
    goal: str = "collect_diamond"
    """The milestone the task is judged on; verifying it pays +1 and ends the episode."""
    milestone_rewards: bool = False
    """Also pay each milestone's task-graph ``reward`` weight on its first verification."""
    end_on_goal: bool = True
    """Terminate every agent once the goal is verified."""
    view: int = 9
    """Side of the egocentric view (odd)."""
    n_iron: int = 4
    """Iron ore on the map: the iron pickaxe needs 3 and the iron sword 2, so a sword made
    first leaves too little for the pickaxe."""
    n_diamond: int = 2
    """Diamonds, deep in the mountain."""
    n_coal: int = 12
    """Coal veins in the mountain."""
    n_bushes: int = 6
    """Berry bushes (food), which regrow ``bush_regrow`` steps after picking."""
    bush_regrow: int = 60
    """Steps before a picked bush bears berries again."""
    nearby: int = 2
    """Chebyshev distance within which a table / furnace counts as nearby."""
    costs: Mapping[str, Mapping[str, int]] = field(default_factory=_default_costs)
    """Recipe -> item -> quantity consumed (tables and furnaces included). Keywords given
    to the env replace only the recipes they name."""
    hits: Mapping[str, int] = field(default_factory=_default_hits)
    """``do`` actions on one tile needed to collect from it, per tile kind (progress is kept
    while the agent works the same tile). Keywords replace only the kinds they name."""
    max_vital: int = 9
    """Maximum of health, food, drink and energy (all start full)."""
    food_decay: int = 35
    """Steps per point of food lost."""
    drink_decay: int = 30
    """Steps per point of drink lost."""
    energy_decay: int = 40
    """Steps awake per point of energy lost."""
    sleep_steps: int = 5
    """Sleep actions per point of energy regained."""
    hurt_period: int = 10
    """Steps per point of health lost while any of food, drink or energy is zero."""
    heal_period: int = 10
    """Steps per point of health regained while food, drink and energy are all positive."""
    food_gain: int = 6
    """Food restored by eating one berry."""
    drink_gain: int = 6
    """Drink restored by drinking one flask."""

    def __post_init__(self) -> None:
        def bad(key: str, expected: str) -> ValueError:
            return ValueError(f"techtree: {key} must be {expected}, got {getattr(self, key)!r}")

        ints = {
            "n_agents": (1, 8), "size": (16, 96), "view": (3, 31),
            "n_iron": (0, None), "n_diamond": (0, None), "n_coal": (0, None),
            "n_bushes": (0, None), "bush_regrow": (1, None), "nearby": (1, 4),
            "max_vital": (1, 255), "food_decay": (1, None), "drink_decay": (1, None),
            "energy_decay": (1, None), "sleep_steps": (1, None), "hurt_period": (1, None),
            "heal_period": (1, None), "food_gain": (1, None), "drink_gain": (1, None),
        }
        for key, (lo, hi) in ints.items():
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise bad(key, "an int")
            if value < lo or (hi is not None and value > hi):
                raise bad(key, f"in [{lo}, {hi if hi is not None else 'inf'}]")
        if self.max_cycles is not None and (
            isinstance(self.max_cycles, bool) or not isinstance(self.max_cycles, (int, np.integer))
            or self.max_cycles < 1
        ):
            raise bad("max_cycles", "None or an int >= 1")
        if self.view % 2 == 0:
            raise bad("view", "odd")
        for key in ("shared_inventory", "milestone_rewards", "end_on_goal"):
            if not isinstance(getattr(self, key), bool):
                raise bad(key, "a bool")
        if self.goal not in _GRAPH_NODES:
            raise bad("goal", f"one of {list(_GRAPH_NODES)}")
        if set(self.costs) != set(STATIONS):
            raise ValueError(
                f"techtree: costs must name exactly the recipes {sorted(STATIONS)}, "
                f"got {sorted(self.costs)}"
            )
        for recipe, cost in self.costs.items():
            for item, n in cost.items():
                if item not in ITEM_INDEX or isinstance(n, bool) or not isinstance(n, int) or n < 0:
                    raise ValueError(
                        f"techtree: costs.{recipe}.{item} must be a known item with an int >= 0 "
                        f"(items: {list(ITEMS)}), got {n!r}"
                    )
        if set(self.hits) != set(_default_hits()):
            raise ValueError(
                f"techtree: hits must name exactly {sorted(_default_hits())}, "
                f"got {sorted(self.hits)}"
            )
        for key, n in self.hits.items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"techtree: hits.{key} must be an int >= 1, got {n!r}")

    @property
    def cycles(self) -> int:
        """The step cap in force: ``max_cycles``, or its default for the team size."""
        if self.max_cycles is not None:
            return int(self.max_cycles)
        return 3000 if self.n_agents > 1 else 4500

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> TechTreeConfig:
        accepted = {f.name for f in fields(cls)}
        unknown = set(kwargs) - accepted
        if unknown:
            raise ValueError(
                f"techtree: unknown option(s) {sorted(unknown)}; accepted: {sorted(accepted)}"
            )
        kw = dict(kwargs)
        if "costs" in kw:
            merged = _default_costs()
            for recipe, cost in dict(kw["costs"]).items():
                if recipe not in merged:
                    raise ValueError(
                        f"techtree: costs: unknown recipe {recipe!r}; known: {sorted(merged)}"
                    )
                merged[recipe] = dict(cost)
            kw["costs"] = merged
        if "hits" in kw:
            merged_hits = _default_hits()
            for key, n in dict(kw["hits"]).items():
                if key not in merged_hits:
                    raise ValueError(
                        f"techtree: hits: unknown tile kind {key!r}; known: {sorted(merged_hits)}"
                    )
                merged_hits[key] = n
            kw["hits"] = merged_hits
        return cls(**kw)


# ---------------------------------------------------------------------------- world generation
def _value_noise(rng: np.random.Generator, h: int, w: int, cell: float) -> np.ndarray:
    """Smooth noise in [0, 1]: a coarse random lattice, smoothstep-interpolated."""
    gh, gw = int(h / cell) + 2, int(w / cell) + 2
    lattice = rng.random((gh, gw))
    ys, xs = np.arange(h) / cell, np.arange(w) / cell
    y0, x0 = ys.astype(int), xs.astype(int)
    fy, fx = ys - y0, xs - x0
    fy, fx = fy * fy * (3 - 2 * fy), fx * fx * (3 - 2 * fx)
    top = lattice[y0][:, x0] * (1 - fx) + lattice[y0][:, x0 + 1] * fx
    bottom = lattice[y0 + 1][:, x0] * (1 - fx) + lattice[y0 + 1][:, x0 + 1] * fx
    return top * (1 - fy)[:, None] + bottom * fy[:, None]


_BARE_HANDS = (GRASS, SAND, PATH, TREE)
_WOOD_TOOLS = _BARE_HANDS + (STONE, COAL)
_STONE_TOOLS = _WOOD_TOOLS + (IRON,)
_ALL_TOOLS = _STONE_TOOLS + (DIAMOND,)


def _reachable(
    grid: np.ndarray, start: tuple[int, int], passable_tiles: tuple[int, ...]
) -> np.ndarray:
    """Cells an agent can get to from ``start`` by walking through, chopping or mining
    ``passable_tiles`` (the tiles its tools let it clear)."""
    passable = np.isin(grid, passable_tiles)
    seen = np.zeros_like(passable)
    seen[start] = True
    frontier = seen.copy()
    while frontier.any():
        grown = np.zeros_like(frontier)
        grown[1:] |= frontier[:-1]
        grown[:-1] |= frontier[1:]
        grown[:, 1:] |= frontier[:, :-1]
        grown[:, :-1] |= frontier[:, 1:]
        frontier = grown & passable & ~seen
        seen |= frontier
    return seen


def _dilate(mask: np.ndarray, radius: int = 0) -> np.ndarray:
    """4-neighbour dilation (``radius=0``) or the Chebyshev ball of ``radius``."""
    if radius:
        h, w = mask.shape
        src = np.zeros((h + 2 * radius, w + 2 * radius), dtype=bool)
        src[radius:-radius, radius:-radius] = mask
        out = np.zeros_like(mask)
        for dr in range(2 * radius + 1):
            for dc in range(2 * radius + 1):
                out |= src[dr: dr + h, dc: dc + w]
        return out
    out = mask.copy()
    out[1:] |= mask[:-1]
    out[:-1] |= mask[1:]
    out[:, 1:] |= mask[:, :-1]
    out[:, :-1] |= mask[:, 1:]
    return out


def _playable(grid: np.ndarray, spawn: tuple[int, int], cfg: TechTreeConfig) -> bool:
    """Every stage of the tech tree is reachable with the tools of the stage before: water,
    berries, wood and the mountain's face by hand, coal with a wood pickaxe, every iron
    with a stone one, every diamond with an iron one."""
    def facing(passable: tuple[int, ...], tile: int) -> int:
        return int(((grid == tile) & _dilate(_reachable(grid, spawn, passable))).sum())

    return (
        facing(_BARE_HANDS, WATER) > 0
        and facing(_BARE_HANDS, BUSH) == cfg.n_bushes
        and facing(_BARE_HANDS, STONE) > 0
        and int((_reachable(grid, spawn, _BARE_HANDS) & (grid == TREE)).sum()) >= 30
        and facing(_WOOD_TOOLS, COAL) == cfg.n_coal
        and facing(_STONE_TOOLS, IRON) == cfg.n_iron
        and facing(_ALL_TOOLS, DIAMOND) == cfg.n_diamond
    )


def generate_world(
    cfg: TechTreeConfig, rng: np.random.Generator
) -> tuple[np.ndarray, tuple[int, int]]:
    """A map and the spawn cell. The spawn sits near a random corner; the mountain fills
    the far side, coal near its rim, iron inside it and the diamonds deepest."""
    n = cfg.size
    for _attempt in range(64):
        corner = int(rng.integers(4))
        sr, sc = int(rng.integers(3, 7)), int(rng.integers(3, 7))
        if corner & 1:
            sr = n - 1 - sr
        if corner & 2:
            sc = n - 1 - sc
        rr, cc = np.mgrid[0:n, 0:n]
        dist = np.sqrt((rr - sr) ** 2 + (cc - sc) ** 2)
        depth = dist + 8.0 * (_value_noise(rng, n, n, n / 4) - 0.5)
        rim = 0.62 * n
        mountain = depth > rim
        grid = np.full((n, n), GRASS, dtype=np.uint8)
        # lakes and shores in the grassland, away from the spawn
        wet = _value_noise(rng, n, n, n / 5)
        lake = (wet > 0.68) & ~mountain & (dist > 6)
        grid[_dilate(lake) & ~mountain] = SAND
        grid[lake] = WATER
        # forest
        trees = _value_noise(rng, n, n, n / 6)
        forest = (trees > 0.45) & (grid == GRASS) & (dist > 2.5) & (rng.random((n, n)) < 0.7)
        grid[forest] = TREE
        # the mountain, with a few caves
        grid[mountain] = STONE
        caves = mountain & (_value_noise(rng, n, n, 3) > 0.8) & (depth > rim + 2)
        grid[caves] = PATH
        inner = depth - rim
        stone_cells = np.flatnonzero((grid == STONE).ravel())
        rim_cells = np.flatnonzero(((grid == STONE) & (inner < 6)).ravel())
        if rim_cells.size < cfg.n_coal or stone_cells.size < 20:
            continue
        flat = grid.ravel()
        flat[rng.choice(rim_cells, size=cfg.n_coal, replace=False)] = COAL
        order = np.argsort(inner.ravel()[stone_cells], kind="stable")
        deep = stone_cells[order]
        deep = deep[flat[deep] == STONE]
        if deep.size < cfg.n_diamond + cfg.n_iron + 10:
            continue
        deepest = deep[-max(6, 3 * cfg.n_diamond):]
        flat[rng.choice(deepest, size=cfg.n_diamond, replace=False)] = DIAMOND
        middle = deep[deep.size // 3: (deep.size * 3) // 4]
        middle = middle[flat[middle] == STONE]
        if middle.size < cfg.n_iron:
            continue
        flat[rng.choice(middle, size=cfg.n_iron, replace=False)] = IRON
        # solid rock around the ores: no cave leads straight to them
        for ore, radius in ((DIAMOND, 4), (IRON, 2)):
            shell = _dilate(grid == ore, radius) & mountain & (grid == PATH)
            grid[shell] = STONE
        if not (grid == WATER).any():
            # a pond on grass if the noise made no lake
            spots = np.flatnonzero(((grid == GRASS) & (dist > 6) & (dist < 0.5 * n)).ravel())
            if spots.size == 0:
                continue
            pr, pc = divmod(int(rng.choice(spots)), n)
            grid[max(pr - 1, 0): pr + 2, max(pc - 1, 0): pc + 2] = WATER
        grid[max(sr - 1, 0): sr + 2, max(sc - 1, 0): sc + 2] = GRASS
        # berry bushes on grass a walk away, reachable before any tool is made
        bare = _reachable(grid, (sr, sc), _BARE_HANDS)
        grassy = np.flatnonzero(((grid == GRASS) & bare & (dist > 4) & (dist < 0.55 * n)).ravel())
        if grassy.size < cfg.n_bushes:
            continue
        flat[rng.choice(grassy, size=cfg.n_bushes, replace=False)] = BUSH
        if _playable(grid, (sr, sc), cfg):
            return grid, (sr, sc)
    raise RuntimeError(f"techtree: could not generate a playable {n}x{n} map; try another size")


# ---------------------------------------------------------------------------- the environment
_PALETTE = np.array(
    [
        (0, 0, 0), (90, 170, 70), (220, 205, 140), (60, 110, 210), (30, 100, 40),
        (120, 120, 120), (40, 40, 40), (190, 140, 110), (120, 230, 240), (150, 100, 50),
        (200, 80, 40), (170, 160, 140), (200, 40, 120), (110, 140, 80), (250, 250, 60),
    ],
    dtype=np.uint8,
)
_CHARS = " .:~T#ci*HF_%,@"
_AGENT_COLOURS = np.array(
    [(255, 255, 255), (255, 220, 0), (255, 0, 255), (0, 255, 255), (255, 128, 0), (128, 0, 255),
     (0, 255, 128), (255, 0, 0)],
    dtype=np.uint8,
)


class TechTreeEnv(ParallelEnv):
    """The native PettingZoo ParallelEnv of techtree_v0 (what ``run_episode`` drives).

    Observation (per agent, a flat ``uint8`` Box; slices in :attr:`obs_layout`): the
    ``view x view`` tile ids around the agent (other agents shown as ``AGENT``), the
    inventory it uses (clipped to 255), its vitals, its facing and position, and the team's
    milestone bits. ``state()`` is the global counterpart (whole grid, every agent).

    Scripted options and planners read the public state attributes: ``grid``, ``pos``,
    ``facing``, ``vitals``, ``alive``, ``inventory(i)``, ``stats``, ``t``.
    """

    metadata = {
        "name": "techtree_v0",
        "render_modes": ["ansi", "rgb_array"],
        "is_parallelizable": True,
        "render_fps": 10,
    }

    def __init__(self, render_mode: str | None = None, **kwargs: Any) -> None:
        self.config = cfg = TechTreeConfig.from_kwargs(kwargs)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"techtree: render_mode must be one of {self.metadata['render_modes']} or None, "
                f"got {render_mode!r}"
            )
        self.render_mode = render_mode
        self.max_cycles = cfg.cycles
        self.possible_agents = [f"agent_{i}" for i in range(cfg.n_agents)]
        self.agents: list[str] = []
        self.agent_index = {a: i for i, a in enumerate(self.possible_agents)}
        self._graph = task_graph(cfg.goal)
        self.goal = cfg.goal
        self._rewards_by_milestone = {
            m: (self._graph.milestone(m).reward if cfg.milestone_rewards else 0.0)
            for m in MILESTONES
        }
        self._rewards_by_milestone[cfg.goal] = 1.0
        v = cfg.view
        self._half = v // 2
        self._pad_width = max(self._half, cfg.nearby)
        n_inv = len(ITEMS)
        layout, start = {}, 0
        for name, length in (
            ("view", v * v), ("inventory", n_inv), ("vitals", len(VITALS)), ("facing", 1),
            ("position", 2), ("milestones", len(MILESTONES)),
        ):
            layout[name] = slice(start, start + length)
            start += length
        self.obs_layout: dict[str, slice] = layout
        """Where each part of the flat observation lies."""
        self._obs_len = start
        high = np.full(start, 255, dtype=np.uint8)
        high[layout["view"]] = len(TILES) - 1
        high[layout["vitals"]] = cfg.max_vital
        high[layout["facing"]] = 3
        high[layout["position"]] = cfg.size - 1
        high[layout["milestones"]] = 1
        self._obs_space = spaces.Box(0, high, dtype=np.uint8)
        self.observation_spaces = {a: self._obs_space for a in self.possible_agents}
        self.action_spaces = {a: spaces.Discrete(len(ACTIONS)) for a in self.possible_agents}
        n_inv_blocks = 1 if cfg.shared_inventory else cfg.n_agents
        state_len = cfg.size * cfg.size + cfg.n_agents * 8 + n_inv_blocks * n_inv + len(MILESTONES)
        self.state_space = spaces.Box(0, 255, shape=(state_len,), dtype=np.uint8)
        self.hits_by_tile = {tile: cfg.hits[rule[2]] for tile, rule in _COLLECT.items()}
        self.recipes = {
            recipe: tuple((ITEM_INDEX[item], n) for item, n in cost.items() if n > 0)
            for recipe, cost in cfg.costs.items()
        }
        self._seed_rng: np.random.Generator | None = None
        self.episode = 0
        """Resets so far (planners use it to notice a new episode)."""
        self.t = 0
        n = cfg.size
        self._pad = np.zeros((n + 2 * self._pad_width,) * 2, dtype=np.uint8)
        self.grid = self._pad[self._pad_width:-self._pad_width, self._pad_width:-self._pad_width]
        self._init_state(spawn=(n // 2, n // 2))

    # ------------------------------------------------------------------ spaces
    def observation_space(self, agent: str) -> spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self.action_spaces[agent]

    # ------------------------------------------------------------------ gyre-ma protocol
    def task_graph(self) -> TaskGraph:
        return self._graph

    def verified_milestones(self) -> frozenset[str]:
        """Milestones whose episode counter is positive: state-based and monotone."""
        return self._verified

    # ------------------------------------------------------------------ state access
    def inventory(self, i: int) -> list[int]:
        """The inventory agent ``i`` uses (the team's when shared), indexed by ``ITEMS``."""
        return self._inv_of[i]

    def collected_by(self, i: int, item: int) -> int:
        """Units of ``item`` agent ``i`` has collected this episode."""
        return self._agent_collected[i][item]

    def collected_units(self, i: int) -> list[int]:
        """Units of every item agent ``i`` has collected this episode (indexed by ``ITEMS``)."""
        return self._agent_collected[i]

    def near(self, i: int, tile: int) -> bool:
        """Whether a ``tile`` (table, furnace) is within ``nearby`` of agent ``i``."""
        r, c = self.pos[i]
        k, p = self.config.nearby, self._pad_width
        return bool((self._pad[r + p - k: r + p + k + 1, c + p - k: c + p + k + 1] == tile).any())

    # ------------------------------------------------------------------ PettingZoo API
    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self._seed_rng = np.random.default_rng(seed)
        elif self._seed_rng is None:
            self._seed_rng = np.random.default_rng()
        grid, spawn = generate_world(self.config, self._seed_rng)
        self.grid[:] = grid
        self._init_state(spawn)
        self.episode += 1
        self.agents = list(self.possible_agents)
        obs = {a: self._observe(i) for i, a in enumerate(self.possible_agents)}
        return obs, {a: {} for a in self.agents}

    def _init_state(self, spawn: tuple[int, int]) -> None:
        cfg = self.config
        n_agents, full = cfg.n_agents, cfg.max_vital
        sr, sc = spawn
        offsets = ((0, 0), (0, 1), (1, 0), (0, -1), (-1, 0), (1, 1), (-1, -1), (1, -1))
        self.pos = [[sr + dr, sc + dc] for dr, dc in offsets[:n_agents]]
        self.facing = [3] * n_agents
        self.alive = [True] * n_agents
        self.vitals = [[full] * 4 for _ in range(n_agents)]
        # timers: food, drink, energy, sleep, hurt, heal
        self._timers = [[0] * 6 for _ in range(n_agents)]
        if cfg.shared_inventory:
            team = [0] * len(ITEMS)
            self._inventories = [team]
            self._inv_of = [team] * n_agents
        else:
            self._inventories = [[0] * len(ITEMS) for _ in range(n_agents)]
            self._inv_of = list(self._inventories)
        self._work = [[-1, 0] for _ in range(n_agents)]
        self._agent_collected = [[0] * len(ITEMS) for _ in range(n_agents)]
        self.stats: dict[str, dict[str, int]] = {
            "collected": dict.fromkeys(SOURCES, 0),
            "placed": {"table": 0, "furnace": 0},
            "crafted": dict.fromkeys(CRAFT_ACTIONS.values(), 0),
            "consumed": {"food": 0, "water": 0},
        }
        """Episode counters the milestone verifiers read."""
        self._verified: frozenset[str] = frozenset()
        self._milestone_bits = np.zeros(len(MILESTONES), dtype=np.uint8)
        self._new: list[str] = []
        self._regrow: deque[tuple[int, int, int]] = deque()
        self.t = 0
        self.claims: dict[int, int] = {}
        """Scratch space for scripted controllers: the cell each agent means to dig next
        (so teammates pick other veins). Not part of the dynamics or the observations."""

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        live = self.agents
        if not live:
            raise ValueError("techtree: step() called with no live agents; call reset() first")
        self.t += 1
        t = self.t
        n_actions = len(ACTIONS)
        self._new = []
        for a in live:
            i = self.agent_index[a]
            act = actions.get(a, NOOP)
            act = NOOP if act is None else int(act)
            if not 0 <= act < n_actions:
                raise ValueError(
                    f"techtree: action for {a!r} must be in [0, {n_actions}), got {act}"
                )
            self._act(i, act)
            self._tick(i, act == SLEEP)
        regrow = self._regrow
        while regrow and regrow[0][0] <= t:
            _, r, c = regrow.popleft()
            if self.grid[r, c] == BUSH_EMPTY:
                self.grid[r, c] = BUSH
        reward = 0.0
        goal_reached = False
        for m in self._new:
            reward += self._rewards_by_milestone[m]
            goal_reached |= m == self.goal
        end = goal_reached and self.config.end_on_goal
        timeout = t >= self.max_cycles
        obs, rewards, terms, truncs, infos = {}, {}, {}, {}, {}
        survivors = []
        for a in live:
            i = self.agent_index[a]
            obs[a] = self._observe(i)
            rewards[a] = reward
            term = end or not self.alive[i]
            terms[a] = term
            truncs[a] = timeout and not term
            infos[a] = {}
            if not (term or truncs[a]):
                survivors.append(a)
        self.agents = survivors
        return obs, rewards, terms, truncs, infos

    # ------------------------------------------------------------------ dynamics
    def _event(self, kind: str, key: str) -> None:
        counts = self.stats[kind]
        counts[key] += 1
        if counts[key] == 1:
            name = EVENT_MILESTONE.get((kind, key))
            if name is not None:
                self._verified = self._verified | {name}
                self._milestone_bits[MILESTONES.index(name)] = 1
                self._new.append(name)

    def _act(self, i: int, act: int) -> None:
        if act == NOOP or act == SLEEP:
            return
        pos = self.pos[i]
        grid = self.grid
        n = self.config.size
        if act <= DOWN:
            d = act - LEFT
            self.facing[i] = d
            dr, dc = DIRS[d]
            r, c = pos[0] + dr, pos[1] + dc
            if 0 <= r < n and 0 <= c < n and WALKABLE[grid[r, c]]:
                pos[0], pos[1] = r, c
            return
        inv = self._inv_of[i]
        if act == DO:
            dr, dc = DIRS[self.facing[i]]
            r, c = pos[0] + dr, pos[1] + dc
            if not (0 <= r < n and 0 <= c < n):
                return
            tile = int(grid[r, c])
            rule = _COLLECT.get(tile)
            if rule is None:
                return
            item, tool, _, after = rule
            if tool is not None and inv[tool] == 0:
                return
            work = self._work[i]
            key = r * n + c
            if work[0] == key:
                work[1] += 1
            else:
                work[0], work[1] = key, 1
            if work[1] < self.hits_by_tile[tile]:
                return
            work[0], work[1] = -1, 0
            grid[r, c] = after
            if tile == BUSH:
                self._regrow.append((self.t + self.config.bush_regrow, r, c))
            inv[item] += 1
            self._agent_collected[i][item] += 1
            self._event("collected", ITEMS[item])
            return
        if act == EAT or act == DRINK:
            item, vital, gain = (
                (FOOD, FOOD_V, self.config.food_gain) if act == EAT
                else (WATER_I, DRINK_V, self.config.drink_gain)
            )
            if inv[item] > 0:
                inv[item] -= 1
                v = self.vitals[i]
                v[vital] = min(self.config.max_vital, v[vital] + gain)
                self._event("consumed", ITEMS[item])
            return
        if act == PLACE_TABLE or act == PLACE_FURNACE:
            recipe = "table" if act == PLACE_TABLE else "furnace"
            cell = self.free_neighbour(i)
            if cell is None or not self._can_afford(i, recipe):
                return
            self._pay(inv, recipe)
            grid[cell] = TABLE if act == PLACE_TABLE else FURNACE
            self._event("placed", recipe)
            return
        recipe = CRAFT_ACTIONS[act]
        if self._can_afford(i, recipe):
            self._pay(inv, recipe)
            inv[ITEM_INDEX[recipe]] += 1
            self._event("crafted", recipe)

    def _can_afford(self, i: int, recipe: str) -> bool:
        inv = self._inv_of[i]
        for item, n in self.recipes[recipe]:
            if inv[item] < n:
                return False
        table, furnace = STATIONS[recipe]
        return (not table or self.near(i, TABLE)) and (not furnace or self.near(i, FURNACE))

    def _pay(self, inv: list[int], recipe: str) -> None:
        for item, n in self.recipes[recipe]:
            inv[item] -= n

    def free_neighbour(self, i: int) -> tuple[int, int] | None:
        """The facing tile if it takes a placement, else the first free neighbour."""
        r0, c0 = self.pos[i]
        n = self.config.size
        f = self.facing[i]
        for d in (f, 0, 1, 2, 3):
            dr, dc = DIRS[d]
            r, c = r0 + dr, c0 + dc
            if 0 <= r < n and 0 <= c < n and PLACEABLE[self.grid[r, c]]:
                if not any(p[0] == r and p[1] == c for p in self.pos):
                    return r, c
        return None

    def _tick(self, i: int, slept: bool) -> None:
        cfg = self.config
        v, tm = self.vitals[i], self._timers[i]
        tm[0] += 1
        if tm[0] >= cfg.food_decay:
            tm[0] = 0
            if v[FOOD_V] > 0:
                v[FOOD_V] -= 1
        tm[1] += 1
        if tm[1] >= cfg.drink_decay:
            tm[1] = 0
            if v[DRINK_V] > 0:
                v[DRINK_V] -= 1
        if slept:
            tm[3] += 1
            if tm[3] >= cfg.sleep_steps:
                tm[3] = 0
                v[ENERGY_V] = min(cfg.max_vital, v[ENERGY_V] + 1)
        else:
            tm[2] += 1
            if tm[2] >= cfg.energy_decay:
                tm[2] = 0
                if v[ENERGY_V] > 0:
                    v[ENERGY_V] -= 1
        if v[FOOD_V] == 0 or v[DRINK_V] == 0 or v[ENERGY_V] == 0:
            tm[5] = 0
            tm[4] += 1
            if tm[4] >= cfg.hurt_period:
                tm[4] = 0
                v[HEALTH] -= 1
                if v[HEALTH] <= 0:
                    v[HEALTH] = 0
                    self.alive[i] = False
        else:
            tm[4] = 0
            tm[5] += 1
            if tm[5] >= cfg.heal_period:
                tm[5] = 0
                v[HEALTH] = min(cfg.max_vital, v[HEALTH] + 1)

    # ------------------------------------------------------------------ observations
    def _observe(self, i: int) -> np.ndarray:
        obs = np.empty(self._obs_len, dtype=np.uint8)
        lay = self.obs_layout
        r, c = self.pos[i]
        h, p = self._half, self._pad_width
        side = 2 * h + 1
        view = obs[lay["view"]].reshape(side, side)
        view[:] = self._pad[r + p - h: r + p + h + 1, c + p - h: c + p + h + 1]
        for j, (rj, cj) in enumerate(self.pos):
            if j != i and self.alive[j] and abs(rj - r) <= h and abs(cj - c) <= h:
                view[rj - r + h, cj - c + h] = AGENT
        obs[lay["inventory"]] = [x if x < 255 else 255 for x in self._inv_of[i]]
        obs[lay["vitals"]] = self.vitals[i]
        f = lay["facing"].start
        obs[f] = self.facing[i]
        obs[f + 1] = r
        obs[f + 2] = c
        obs[lay["milestones"]] = self._milestone_bits
        return obs

    def state(self) -> np.ndarray:
        """Global state: grid, then per agent (alive, row, col, facing, 4 vitals), then the
        inventories (one if shared), then the milestone bits; ``uint8``, clipped to 255."""
        parts = [self.grid.ravel()]
        agents = [
            [int(self.alive[i]), *self.pos[i], self.facing[i], *self.vitals[i]]
            for i in range(self.config.n_agents)
        ]
        parts.append(np.asarray(agents, dtype=np.int64).ravel().astype(np.uint8))
        inventories = np.asarray(self._inventories, dtype=np.int64).ravel()
        parts.append(np.minimum(inventories, 255).astype(np.uint8))
        parts.append(self._milestone_bits)
        return np.concatenate(parts)

    # ------------------------------------------------------------------ rendering
    def render(self) -> str | np.ndarray | None:
        if self.render_mode is None:
            import warnings

            warnings.warn("techtree: render() called without a render_mode", stacklevel=2)
            return None
        if self.render_mode == "ansi":
            return self._render_ansi()
        return self._render_rgb()

    def _render_ansi(self) -> str:
        rows = [[_CHARS[t] for t in row] for row in self.grid.tolist()]
        for i, (r, c) in enumerate(self.pos):
            if self.alive[i]:
                rows[r][c] = str(i)
        lines = ["".join(row) for row in rows]
        lines.append(f"t={self.t}/{self.max_cycles} milestones={sorted(self._verified)}")
        for i, a in enumerate(self.possible_agents):
            vit = " ".join(f"{k}={v}" for k, v in zip(VITALS, self.vitals[i], strict=True))
            state = "" if self.alive[i] else " (dead)"
            lines.append(f"{a}: {vit}{state}")
        for k, inv in enumerate(self._inventories):
            owner = "team" if self.config.shared_inventory else self.possible_agents[k]
            items = ", ".join(f"{ITEMS[j]}={n}" for j, n in enumerate(inv) if n)
            lines.append(f"{owner} inventory: {items or '-'}")
        return "\n".join(lines) + "\n"

    def _render_rgb(self, cell: int = 8) -> np.ndarray:
        img = _PALETTE[self.grid]
        img = np.repeat(np.repeat(img, cell, axis=0), cell, axis=1)
        q = max(cell // 4, 1)
        for i, (r, c) in enumerate(self.pos):
            if self.alive[i]:
                img[r * cell + q: (r + 1) * cell - q, c * cell + q: (c + 1) * cell - q] = (
                    _AGENT_COLOURS[i % len(_AGENT_COLOURS)]
                )
        return img

    def close(self) -> None:
        pass

    def __str__(self) -> str:
        return "techtree_v0"


def parallel_env(**kwargs: Any) -> TechTreeEnv:
    """The native ParallelEnv (what ``gyre_ma.rollout.run_episode`` drives)."""
    return TechTreeEnv(**kwargs)


def raw_env(**kwargs: Any) -> AECEnv:
    """The AEC version, converted from the parallel env."""
    return parallel_to_aec(TechTreeEnv(**kwargs))


def env(**kwargs: Any) -> AECEnv:
    """The AEC version with PettingZoo's standard wrappers."""
    aec = raw_env(**kwargs)
    aec = wrappers.AssertOutOfBoundsWrapper(aec)
    return wrappers.OrderEnforcingWrapper(aec)
