"""Scripted option library for techtree_v0.

Every sub-policy is a module-level function of an :class:`OptionContext`: it reads the
unwrapped env (``ctx.env``), plans a path once with Dijkstra (walking costs 1; chopping or
mining through a tile costs its hits, when the agent holds the tool) and caches it in
``ctx.memory``, replanning only when the path is blocked or its target is gone.

Options are competent at their own job whenever their prerequisites hold: a craft gathers
whatever its recipe still lacks and walks to the table (and furnace) itself; ``eat`` picks
berries first if the inventory has none. Ordering them well is the manager's job.
"""

from __future__ import annotations

import functools
import heapq
from typing import Any

import numpy as np

from gyre_ma.envs.techtree.techtree import (
    COAL_I,
    DIAMOND_I,
    DIRS,
    DO,
    DRINK,
    DRINK_V,
    EAT,
    ENERGY_V,
    FOOD,
    FOOD_V,
    FURNACE,
    IRON_I,
    IRON_PICKAXE,
    ITEM_INDEX,
    MOVES,
    NOOP,
    PLACEABLE,
    RECIPE_ACTION,
    SLEEP,
    SOURCES,
    STATIONS,
    STONE_I,
    STONE_PICKAXE,
    TABLE,
    TILES,
    TOOL_FOR_TILE,
    WALKABLE,
    WATER,
    WATER_I,
    WOOD,
    WOOD_PICKAXE,
    TechTreeEnv,
    _dilate,
    task_graph,
)
from gyre_ma.options.library import OptionLibrary
from gyre_ma.options.option import Option, OptionContext

_INF = 1 << 30
_SOURCE_TILES = {ITEM_INDEX[item]: tiles for item, tiles in SOURCES.items()}
_UNDIGGABLE = _SOURCE_TILES[WATER_I] + _SOURCE_TILES[FOOD]
"""Source tiles that stay in place (water) or regrow (bushes): never routed through."""


# ---------------------------------------------------------------------------- planning
@functools.lru_cache(maxsize=8)
def _neighbours(n: int) -> tuple[tuple[int, ...], ...]:
    out = []
    for u in range(n * n):
        r, c = divmod(u, n)
        out.append(tuple(
            r2 * n + c2 for r2, c2 in ((r, c - 1), (r, c + 1), (r - 1, c), (r + 1, c))
            if 0 <= r2 < n and 0 <= c2 < n
        ))
    return tuple(out)


def _direction(u: int, v: int, n: int) -> int:
    """Facing index (0 left, 1 right, 2 up, 3 down) from cell ``u`` to its neighbour ``v``."""
    diff = v - u
    return 0 if diff == -1 else 1 if diff == 1 else 2 if diff == -n else 3


def _costs(env: TechTreeEnv, i: int) -> list[int]:
    """Cost of entering each tile kind for agent ``i`` (0 = impassable)."""
    inv = env.inventory(i)
    cost = [1 if WALKABLE[t] else 0 for t in range(len(WALKABLE))]
    for tile, tool in TOOL_FOR_TILE.items():
        if tile not in _UNDIGGABLE and (tool is None or inv[tool] > 0):
            cost[tile] = 1 + env.hits_by_tile[tile]
    return cost


def _dijkstra(
    grid: list[int], n: int, start: int, cost: list[int], goal: list[bool]
) -> list[int] | None:
    """Cheapest path of cells from ``start`` to the nearest cell with ``goal`` true. The
    heap holds ``distance * cells + cell``: ordered as (distance, cell) pairs would be
    (ties to the lower cell), and an int compares faster than a tuple."""
    nbrs = _neighbours(n)
    cells = n * n
    dist = [_INF] * cells
    prev = [-1] * cells
    dist[start] = 0
    heap = [start]
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        d, u = divmod(pop(heap), cells)
        if d > dist[u]:
            continue
        if goal[u]:
            path = [u]
            while u != start:
                u = prev[u]
                path.append(u)
            path.reverse()
            return path
        for v in nbrs[u]:
            w = cost[grid[v]]
            if w:
                nd = d + w
                if nd < dist[v]:
                    dist[v] = nd
                    prev[v] = u
                    push(heap, nd * cells + v)
    return None


@functools.lru_cache(maxsize=64)
def _tile_table(tiles: tuple[int, ...]) -> np.ndarray:
    """Tile id → whether it is one of ``tiles``: indexed by a grid, the grid's cells that
    hold one (``np.isin`` gives the same, at several times the cost)."""
    table = np.zeros(len(TILES), dtype=bool)
    table[list(tiles)] = True
    table.flags.writeable = False
    return table


def _near_mask(env: TechTreeEnv, tile: int) -> np.ndarray:
    """Cells within ``nearby`` (Chebyshev) of a ``tile``."""
    k = env.config.nearby
    n = env.config.size
    src = np.zeros((n + 2 * k, n + 2 * k), dtype=bool)
    src[k:-k, k:-k] = env.grid == tile
    out = np.zeros((n, n), dtype=bool)
    for dr in range(2 * k + 1):
        for dc in range(2 * k + 1):
            out |= src[dr: dr + n, dc: dc + n]
    return out


class _Plan:
    """A cached route: cells to walk (or dig) through, then a final action."""

    __slots__ = ("purpose", "path", "k", "target", "tiles", "final", "cost", "steps", "budget")

    def __init__(self, purpose: Any, path: list[int], target: int, tiles: tuple[int, ...],
                 final: int, cost: list[int], budget: int) -> None:
        self.purpose, self.path, self.k = purpose, path, 0
        self.target, self.tiles, self.final, self.cost = target, tiles, final, cost
        self.steps, self.budget = 0, budget


def _make_plan(env: TechTreeEnv, i: int, purpose: Any, tiles: tuple[int, ...] = (),
               stations: tuple[int, ...] = (), final: int = DO) -> _Plan | None:
    """Plan to face one of ``tiles`` (then ``do``), or to stand near every tile in
    ``stations`` (then ``final``). Tiles a teammate has claimed are avoided while others
    remain, so two agents do not dig at the same vein."""
    n = env.config.size
    cost = _costs(env, i)
    if tiles:
        inv = env.inventory(i)
        usable = tuple(t for t in tiles if TOOL_FOR_TILE[t] is None or inv[TOOL_FOR_TILE[t]] > 0)
        if not usable:
            return None
        targets = _tile_table(usable)[env.grid]
        if not targets.any():
            return None
        choices = [targets]
        if WATER not in usable:
            free = targets.copy()
            for j, cell in env.claims.items():
                if j != i and env.alive[j]:
                    free.flat[cell] = False
            if free.any():
                choices.insert(0, free)
    else:
        goal = np.ones((n, n), dtype=bool)
        for station in stations:
            goal &= _near_mask(env, station)
        choices, usable = [goal], ()
    r, c = env.pos[i]
    grid = env.grid.ravel().tolist()
    for targets in choices:  # unclaimed targets first, then any
        goal = _dilate(targets) if usable else targets
        path = _dijkstra(grid, n, r * n + c, cost, goal.ravel().tolist()) if goal.any() else None
        if path is not None:
            break
    else:
        return None
    target = -1
    if usable:
        flat_targets = targets.ravel()
        for v in _neighbours(n)[path[-1]]:
            if flat_targets[v]:
                target = v
                break
        env.claims[i] = target
    max_hits = max(env.hits_by_tile.values())
    return _Plan(purpose, path, target, usable, final, cost, 20 + len(path) * (max_hits + 2))


def _follow(env: TechTreeEnv, i: int, plan: _Plan) -> int | None:
    """The next action along ``plan``, or None when it no longer holds (replan)."""
    n = env.config.size
    r, c = env.pos[i]
    pos = r * n + c
    path = plan.path
    k = plan.k
    if k + 1 < len(path) and path[k + 1] == pos:
        k = plan.k = k + 1
    if path[k] != pos or plan.steps > plan.budget:
        return None
    grid = env.grid
    if k + 1 < len(path):
        nxt = path[k + 1]
        d = _direction(pos, nxt, n)
        tile = int(grid.flat[nxt])
        if WALKABLE[tile]:
            return MOVES[d]
        if not plan.cost[tile]:
            return None
        return MOVES[d] if env.facing[i] != d else DO
    if plan.target < 0:
        return plan.final
    if int(grid.flat[plan.target]) not in plan.tiles:
        return None
    d = _direction(pos, plan.target, n)
    return MOVES[d] if env.facing[i] != d else DO


def _pursue(ctx: OptionContext, purpose: Any, tiles: tuple[int, ...] = (),
            stations: tuple[int, ...] = (), final: int = DO) -> int:
    """Follow (or make) the cached plan for ``purpose``; mark the call failed if none."""
    env = ctx.env
    i = env.agent_index[ctx.agent]
    mem = ctx.memory
    plan = mem.get("plan")
    action = None
    if plan is not None and plan.purpose == purpose:
        action = _follow(env, i, plan)
    if action is None:
        # every unit collected ends a plan; beyond that, at most 30 replans per call
        units = sum(env.collected_units(i))
        first = mem.setdefault("units", units)
        replans = mem["replans"] = mem.get("replans", 0) + 1
        ok = replans <= 30 + units - first
        plan = _make_plan(env, i, purpose, tiles, stations, final) if ok else None
        mem["plan"] = plan
        if plan is None or (action := _follow(env, i, plan)) is None:
            mem["failed"] = True
            return NOOP
    plan.steps += 1
    return action


def _agent(ctx: OptionContext) -> tuple[TechTreeEnv, int]:
    env = ctx.env
    return env, env.agent_index[ctx.agent]


# ---------------------------------------------------------------------------- behaviours
def _gather(ctx: OptionContext, item: int) -> int:
    env, i = _agent(ctx)
    if "start" not in ctx.memory:
        ctx.memory["start"] = env.collected_by(i, item)
    return _pursue(ctx, ("gather", item), tiles=_SOURCE_TILES[item])


def _gathered(ctx: OptionContext, item: int) -> bool:
    env, i = _agent(ctx)
    return env.collected_by(i, item) > ctx.memory.get("start", _INF)


@functools.lru_cache(maxsize=64)
def _sources(items: tuple[int, ...]) -> tuple[int, ...]:
    """The source tiles of ``items``, in order (asked at every step of a craft that gathers)."""
    return tuple(t for item in items for t in _SOURCE_TILES[item])


def _craft(ctx: OptionContext, recipe: str) -> int:
    """Gather what the recipe lacks (nearest source first), walk to its stations, then
    craft or place."""
    env, i = _agent(ctx)
    inv = env.inventory(i)
    missing = tuple([item for item, n in env.recipes[recipe] if inv[item] < n])
    if missing:  # fetch the nearest of whatever is still missing
        return _pursue(ctx, ("gather", missing), tiles=_sources(missing))
    table, furnace = STATIONS[recipe]
    stations = ((TABLE,) if table else ()) + ((FURNACE,) if furnace else ())
    action = RECIPE_ACTION[recipe]
    if all(env.near(i, s) for s in stations):
        if recipe in ("table", "furnace") and env.free_neighbour(i) is None:
            return _step_aside(env, i)
        return action
    return _pursue(ctx, ("station", recipe), stations=stations, final=action)


def _step_aside(env: TechTreeEnv, i: int) -> int:
    r, c = env.pos[i]
    n = env.config.size
    for d, (dr, dc) in enumerate(DIRS):
        if 0 <= r + dr < n and 0 <= c + dc < n and PLACEABLE[env.grid[r + dr, c + dc]]:
            return MOVES[d]
    return NOOP


def _sated(env: TechTreeEnv, i: int, vital: int) -> bool:
    return env.vitals[i][vital] >= env.config.max_vital - 1


def _consume(ctx: OptionContext, item: int, vital: int, action: int) -> int:
    env, i = _agent(ctx)
    if _sated(env, i, vital):
        return NOOP
    if env.inventory(i)[item] > 0:
        return action
    return _pursue(ctx, ("gather", item), tiles=_SOURCE_TILES[item])


# ---------------------------------------------------------------------------- sub-policies
# Module-level so that a library can be dumped to YAML and loaded back by reference.
def gather_wood(ctx: OptionContext) -> int:
    return _gather(ctx, WOOD)


def gather_wood_done(ctx: OptionContext) -> bool:
    return _gathered(ctx, WOOD)


def gather_stone(ctx: OptionContext) -> int:
    return _gather(ctx, STONE_I)


def gather_stone_done(ctx: OptionContext) -> bool:
    return _gathered(ctx, STONE_I)


def gather_coal(ctx: OptionContext) -> int:
    return _gather(ctx, COAL_I)


def gather_coal_done(ctx: OptionContext) -> bool:
    return _gathered(ctx, COAL_I)


def gather_iron(ctx: OptionContext) -> int:
    return _gather(ctx, IRON_I)


def gather_iron_done(ctx: OptionContext) -> bool:
    return _gathered(ctx, IRON_I)


def gather_food(ctx: OptionContext) -> int:
    return _gather(ctx, FOOD)


def gather_food_done(ctx: OptionContext) -> bool:
    return _gathered(ctx, FOOD)


def gather_water(ctx: OptionContext) -> int:
    return _gather(ctx, WATER_I)


def gather_water_done(ctx: OptionContext) -> bool:
    return _gathered(ctx, WATER_I)


def mine_diamond(ctx: OptionContext) -> int:
    return _gather(ctx, DIAMOND_I)


def place_table(ctx: OptionContext) -> int:
    return _craft(ctx, "table")


def place_furnace(ctx: OptionContext) -> int:
    return _craft(ctx, "furnace")


def make_wood_pickaxe(ctx: OptionContext) -> int:
    return _craft(ctx, "wood_pickaxe")


def make_wood_sword(ctx: OptionContext) -> int:
    return _craft(ctx, "wood_sword")


def make_stone_pickaxe(ctx: OptionContext) -> int:
    return _craft(ctx, "stone_pickaxe")


def make_stone_sword(ctx: OptionContext) -> int:
    return _craft(ctx, "stone_sword")


def make_iron_pickaxe(ctx: OptionContext) -> int:
    return _craft(ctx, "iron_pickaxe")


def make_iron_sword(ctx: OptionContext) -> int:
    return _craft(ctx, "iron_sword")


def eat(ctx: OptionContext) -> int:
    return _consume(ctx, FOOD, FOOD_V, EAT)


def eat_done(ctx: OptionContext) -> bool:
    env, i = _agent(ctx)
    return _sated(env, i, FOOD_V)


def drink(ctx: OptionContext) -> int:
    return _consume(ctx, WATER_I, DRINK_V, DRINK)


def drink_done(ctx: OptionContext) -> bool:
    env, i = _agent(ctx)
    return _sated(env, i, DRINK_V)


def hungry(ctx: OptionContext) -> bool:
    """Initiation of ``eat``: it has work to do (the agent is not sated)."""
    return not eat_done(ctx)


def thirsty(ctx: OptionContext) -> bool:
    return not drink_done(ctx)


def tired(ctx: OptionContext) -> bool:
    return not sleep_done(ctx)


def sleep(ctx: OptionContext) -> int:
    return SLEEP


def sleep_done(ctx: OptionContext) -> bool:
    env, i = _agent(ctx)
    return env.vitals[i][ENERGY_V] >= env.config.max_vital


def wait(ctx: OptionContext) -> int:
    return NOOP


def wait_done(ctx: OptionContext) -> bool:
    return ctx.steps >= 1


DANGER = 2
"""A vital at or below this is in danger: about 70 steps from zero at the default decay."""


def _interrupted(ctx: OptionContext, spared: int | None) -> bool:
    """A vital (other than ``spared``, the one this option restores) fell to the library's
    danger level during the call: the option yields, so the manager can decide on upkeep in
    time instead of foreseeing how long every job will take. Vitals already there when the
    call began do not interrupt it (calling a job anyway is the manager's choice)."""
    env, i = _agent(ctx)
    vitals = env.vitals[i]
    start = ctx.memory.get("vitals_at_start")
    if start is None:  # first check, after the call's first step
        ctx.memory["vitals_at_start"] = start = tuple(vitals)
    for v in (FOOD_V, DRINK_V, ENERGY_V):  # a loop, not any(genexpr): asked at every step of a call
        if v != spared and vitals[v] <= DANGER < start[v]:
            return True
    return False


def safe(ctx: OptionContext) -> bool:
    """None of the agent's food, drink and energy is in danger: a job (tens to hundreds of
    steps) can start. In danger only upkeep, fetching food or water, and ``wait`` can:
    a job begun there would starve the agent before it ends."""
    env, i = _agent(ctx)
    vitals = env.vitals[i]
    return vitals[FOOD_V] > DANGER and vitals[DRINK_V] > DANGER and vitals[ENERGY_V] > DANGER


def no_route(ctx: OptionContext) -> bool:
    """The sub-policy found no route to its target."""
    return bool(ctx.memory.get("failed"))


def failed(ctx: OptionContext) -> bool:
    """Failure of a job: no route, or a vital fell into danger during the call."""
    return no_route(ctx) or _interrupted(ctx, None)


def failed_eating(ctx: OptionContext) -> bool:
    return no_route(ctx) or _interrupted(ctx, FOOD_V)


def failed_drinking(ctx: OptionContext) -> bool:
    return no_route(ctx) or _interrupted(ctx, DRINK_V)


def failed_sleeping(ctx: OptionContext) -> bool:
    return _interrupted(ctx, ENERGY_V)


def has_wood_pickaxe(ctx: OptionContext) -> bool:
    env, i = _agent(ctx)
    return env.inventory(i)[WOOD_PICKAXE] > 0


def has_stone_pickaxe(ctx: OptionContext) -> bool:
    env, i = _agent(ctx)
    return env.inventory(i)[STONE_PICKAXE] > 0


def has_iron_pickaxe(ctx: OptionContext) -> bool:
    env, i = _agent(ctx)
    return env.inventory(i)[IRON_PICKAXE] > 0


def safe_with_wood_pickaxe(ctx: OptionContext) -> bool:
    return safe(ctx) and has_wood_pickaxe(ctx)


def safe_with_stone_pickaxe(ctx: OptionContext) -> bool:
    return safe(ctx) and has_stone_pickaxe(ctx)


def safe_with_iron_pickaxe(ctx: OptionContext) -> bool:
    return safe(ctx) and has_iron_pickaxe(ctx)


_SAFE = {None: safe, has_wood_pickaxe: safe_with_wood_pickaxe, has_stone_pickaxe: safe_with_stone_pickaxe,
         has_iron_pickaxe: safe_with_iron_pickaxe}
"""A job's initiation → the same, only while the agent is :func:`safe` (importable
predicates: a library is saved by reference)."""


# ---------------------------------------------------------------------------- the library
_CRAFT_OPTIONS = (
    (place_table, "place_table", "place a table (chopping the wood it costs first)"),
    (make_wood_pickaxe, "make_wood_pickaxe", "craft a wood pickaxe at a table"),
    (make_wood_sword, "make_wood_sword", "craft a wood sword at a table (a distractor)"),
    (place_furnace, "place_furnace", "place a furnace next to a table"),
    (make_stone_pickaxe, "make_stone_pickaxe", "craft a stone pickaxe at a table"),
    (make_stone_sword, "make_stone_sword", "craft a stone sword at a table (a distractor)"),
    (make_iron_pickaxe, "make_iron_pickaxe", "craft an iron pickaxe at a table and furnace"),
    (make_iron_sword, "make_iron_sword", "craft an iron sword (spends the scarce iron)"),
)
_GATHER_OPTIONS = (
    # policy, done, milestone, initiation, step cap, description
    (gather_wood, gather_wood_done, "collect_wood", None, 250, "chop one more wood"),
    (gather_stone, gather_stone_done, "collect_stone", has_wood_pickaxe, 250,
     "mine one more stone"),
    (gather_coal, gather_coal_done, "collect_coal", has_wood_pickaxe, 250, "mine one more coal"),
    (gather_iron, gather_iron_done, "collect_iron", has_stone_pickaxe, 300,
     "tunnel to iron and mine one more"),
    (gather_food, gather_food_done, "collect_food", None, 250, "pick one more berry"),
    (gather_water, gather_water_done, "collect_drink", None, 250, "fill one more flask"),
)


def make_library(goal: str | None = None, name: str = "techtree", env: Any = None, *,
                 yield_in_danger: bool = True, jobs_in_danger: bool = False) -> OptionLibrary:
    """The scripted techtree library over ``task_graph(goal)``: one option per milestone,
    repeatable collectors, upkeep (eat, drink, sleep: eligible while it has work to do) and
    an always-eligible ``wait``. With ``yield_in_danger`` every option but ``wait`` yields
    when one of its agent's vitals falls into danger (``DANGER``), so the manager decides on
    upkeep in time. Unless ``jobs_in_danger``, the jobs (crafting, mining, gathering wood,
    stone, coal or iron) are eligible only while the agent is :func:`safe`: otherwise the
    manager could start a long job on a starving agent, and a learned one does (it lost an
    agent that way in every episode, halving the team). Given ``env``, the goal is that
    environment's.

    Step caps are generous: a craft called with an empty inventory gathers everything its
    recipe needs within one call.
    """
    if goal is None:
        goal = env.task_graph().goals[0] if env is not None else "collect_diamond"
    lib = OptionLibrary(name, task_graph(goal))
    job, eating, drinking, sleeping = (
        (failed, failed_eating, failed_drinking, failed_sleeping) if yield_in_danger
        else (no_route, no_route, no_route, None)
    )

    def gate(initiation: Any) -> Any:
        return initiation if jobs_in_danger else _SAFE[initiation]

    for policy, done, milestone, initiation, cap, text in _GATHER_OPTIONS:
        if milestone not in ("collect_food", "collect_drink"):  # fetching food or water is upkeep
            initiation = gate(initiation)
        lib.add(Option(policy.__name__, policy, milestone, initiation=initiation, done=done,
                       failure=job, max_steps=cap, repeatable=True, description=text))
    for policy, milestone, text in _CRAFT_OPTIONS:
        lib.add(Option(policy.__name__, policy, milestone, initiation=gate(None), failure=job, max_steps=1000,
                       description=text))
    lib.add(Option("mine_diamond", mine_diamond, "collect_diamond", initiation=gate(has_iron_pickaxe),
                   failure=job, max_steps=500, description="tunnel to a diamond and mine it"))
    lib.add(Option("eat", eat, "eat_food", initiation=hungry, done=eat_done, repeatable=True,
                   failure=eating, max_steps=150,
                   description="eat berries until sated (picking some first)"))
    lib.add(Option("drink", drink, "drink_water", initiation=thirsty, done=drink_done,
                   repeatable=True, failure=drinking, max_steps=150,
                   description="drink until sated (filling a flask first)"))
    lib.add(Option("sleep", sleep, None, initiation=tired, done=sleep_done, failure=sleeping,
                   max_steps=60, description="sleep until energy is full"))
    lib.add(Option("wait", wait, None, done=wait_done, max_steps=1,
                   description="do nothing for a step"))
    return lib.validate()
