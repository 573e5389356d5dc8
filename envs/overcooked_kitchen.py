"""Two-agent Overcooked (PyPI ``overcooked``, a maintained fork of overcooked_ai) as a
gyre environment, with a scripted option library and an oracle manager.

The task is one onion soup: three onions into a pot, an interact on the full pot to start
it cooking (this fork's default dynamics; ``auto_cook=True`` selects the old dynamics,
where a full pot starts by itself), twenty ticks of cooking, a dish, the soup plated and
carried to the serving counter. :class:`OvercookedKitchen` is a small PettingZoo
``ParallelEnv`` stepping the library's ``OvercookedGridworld`` MDP directly (its
``OvercookedEnv`` wrapper builds a motion planner on the first step that nothing here
needs); :func:`make_env` wraps it in a :class:`~gyre_ma.envs.adapters.GyreAdapter` whose
milestone detectors read the MDP state:

    onion_in_pot → pot_full → cooking_started → soup_ready ─┐
                                       └────→ dish_held ────┴→ soup_plated → soup_served

Each detector implies the ones its node requires, on any play, primitive actions
included: a pot that starts cooking with fewer than three onions (this fork allows it)
reaches no milestone, and a dish counts as ``dish_held`` only while the soup cooks.

The options walk shortest paths over the walkable tiles (breadth-first search around the
other cook where a detour exists), face their target and interact. They share one
blackboard, ``OvercookedKitchen.plans`` (the path each agent is walking; the dynamics
never read it), so that an idle cook steps off the other's path; a cook that fails to move
for a few steps takes a random free step, which breaks the head-on deadlocks of narrow
kitchens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

try:
    from overcooked.mdp.actions import Action, Direction
    from overcooked.mdp.overcooked_mdp import OvercookedGridworld, OvercookedState
except ImportError as exc:  # an optional dependency: say which extra brings it
    raise ImportError(f"the Overcooked kitchen needs the overcooked package ({exc}); "
                      "install it with: pip install 'gyre-ma[overcooked]'") from exc

from gyre_ma.envs.adapters import GyreAdapter
from gyre_ma.options.decision import Choice, Decision
from gyre_ma.options.graph import TaskGraph
from gyre_ma.options.library import OptionLibrary
from gyre_ma.options.option import Option, OptionContext

LAYOUTS = ("cramped_room", "asymmetric_advantages")
"""Layouts this library's options are scripted for: every station is reachable by each cook
without handing things over counters (forced_coordination and the like need hand-overs)."""

HORIZON = 400
"""Steps per episode unless ``max_cycles`` says otherwise."""

AGENTS = ("agent_0", "agent_1")
SOUP_ONIONS = 3
"""Onions in the one recipe these layouts order."""

MAX_POTS = 2
"""Pots the observation has room for (both layouts have at most two)."""

_STAY, _INTERACT = Action.ACTION_TO_INDEX[Action.STAY], Action.ACTION_TO_INDEX[Action.INTERACT]
_HELD = ("onion", "dish", "soup")
OBS_DIM = 2 * (2 + 4 + len(_HELD)) + 5 * MAX_POTS + len(_HELD) + 2
"""Length of a cook's observation (see :meth:`OvercookedKitchen.observe`)."""
_STUCK_STEPS = 3
"""Steps a cook means to move without moving (queued, yielding or bumped) before it
takes a random free step."""


# ---------------------------------------------------------------------- the environment
class _Kitchen:
    """The static geometry of a layout: walkable tiles, stations, and for every station the
    walkable tiles a cook can work it from."""

    def __init__(self, mdp: OvercookedGridworld) -> None:
        self.width, self.height = mdp.width, mdp.height
        self.walkable = frozenset(mdp.get_valid_player_positions())
        self.tiles = {kind: tuple(sorted(mdp.terrain_pos_dict.get(kind, ()))) for kind in "POTDSX"}
        self.pots = tuple(sorted(mdp.get_pot_locations(), key=lambda p: (p[1], p[0])))
        self.counters = frozenset(self.tiles["X"])
        self.access: dict[tuple[int, int], tuple[tuple[int, int], ...]] = {}
        for y, row in enumerate(mdp.terrain_mtx):
            for x, kind in enumerate(row):
                if kind != " ":
                    self.access[(x, y)] = tuple(self.neighbours((x, y)))

    def neighbours(self, tile: tuple[int, int]) -> list[tuple[int, int]]:
        x, y = tile
        return [(x + dx, y + dy) for dx, dy in Direction.ALL_DIRECTIONS if (x + dx, y + dy) in self.walkable]

    def region(self, start: tuple[int, int]) -> list[tuple[int, int]]:
        """The walkable tiles connected to ``start``, sorted (the same order on every run)."""
        seen, queue = {start}, deque([start])
        while queue:
            for n in self.neighbours(queue.popleft()):
                if n not in seen:
                    seen.add(n)
                    queue.append(n)
        return sorted(seen)


class OvercookedKitchen(ParallelEnv):
    """Overcooked for two cooks, ``agent_0`` and ``agent_1`` (the MDP's players 0 and 1).

    Actions are ``Discrete(6)``: north, south, east, west, stay, interact (the library's
    ``Action.INDEX_TO_ACTION``). Each cook observes a ``Box(0, 1, (33,))`` vector, itself
    first (see :meth:`observe`); ``state()`` is ``agent_0``'s view, which holds everything.
    Both cooks receive the team's delivery reward (20 for the onion soup). The episode
    terminates when a soup the orders ask for is served and truncates at ``max_cycles``.

    ``reset(seed=s)`` draws each cook's start tile (within the part of the kitchen its
    layout start lies in: the two halves of asymmetric_advantages stay apart) and facing
    from ``s``; the rest of the start is the layout's.
    """

    metadata = {"name": "overcooked_kitchen_v0", "render_modes": ["ansi"], "is_parallelizable": True}

    def __init__(self, layout: str = "cramped_room", *, max_cycles: int = HORIZON, auto_cook: bool = False,
                 render_mode: str | None = None) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"overcooked kitchen: layout {layout!r} is not scripted; expected one of {list(LAYOUTS)}")
        if isinstance(max_cycles, bool) or not isinstance(max_cycles, (int, np.integer)) or max_cycles < 1:
            raise ValueError(f"overcooked kitchen: max_cycles must be an int >= 1, got {max_cycles!r}")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"overcooked kitchen: render_mode must be None or 'ansi', got {render_mode!r}")
        self.layout = layout
        self.auto_cook = bool(auto_cook)
        self.max_cycles = int(max_cycles)
        self.render_mode = render_mode
        self.mdp = OvercookedGridworld.from_layout_name(layout, old_dynamics=self.auto_cook)
        self.kitchen = _Kitchen(self.mdp)
        self.possible_agents = list(AGENTS)
        self.agents: list[str] = []
        self._obs_space = spaces.Box(0.0, 1.0, shape=(OBS_DIM,), dtype=np.float32)
        self._act_spaces = {a: spaces.Discrete(Action.NUM_ACTIONS) for a in AGENTS}
        self.state_space = self._obs_space
        self._regions = [self.kitchen.region(tuple(p)) for p in self.mdp.start_player_positions]
        self._rng = np.random.default_rng()
        self.game: OvercookedState = self.mdp.get_standard_start_state()
        self.served = 0
        """Soups delivered this episode that an order asked for."""
        self.events: dict[str, list[bool]] = {}
        """The MDP's event flags (``potting_onion``, ``soup_delivery``, ...) of the last step."""
        self.plans: dict[str, tuple[tuple[int, int], ...]] = {}
        """Blackboard of the scripted options: the tiles each cook is about to walk."""

    # ------------------------------------------------------------------ ParallelEnv API
    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        first = self._regions[0][int(self._rng.integers(len(self._regions[0])))]
        rest = [t for t in self._regions[1] if t != first]
        second = rest[int(self._rng.integers(len(rest)))]
        facing = [Direction.INDEX_TO_DIRECTION[int(i)] for i in self._rng.integers(4, size=2)]
        self.game = OvercookedState.from_players_pos_and_or(
            list(zip((first, second), facing, strict=True)),
            bonus_orders=self.mdp.start_bonus_orders, all_orders=self.mdp.start_all_orders,
        )
        self.served, self.events, self.plans = 0, {}, {}
        self.agents = list(self.possible_agents)
        return {a: self.observe(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        if not self.agents:
            raise ValueError("overcooked kitchen: step() called with no live agent; call reset() first")
        joint = []
        for a in self.possible_agents:
            if a not in actions:
                raise ValueError(f"overcooked kitchen: step() needs an action for each of {self.agents}; "
                                 f"missing {a!r}")
            act = actions[a]
            if isinstance(act, (bool, np.bool_)) or not isinstance(act, (int, np.integer)) or not 0 <= act < 6:
                raise ValueError(f"overcooked kitchen: action for {a!r} must be an int in [0, 6), got {act!r}")
            joint.append(Action.INDEX_TO_ACTION[int(act)])
        self.game, info = self.mdp.get_state_transition(self.game, joint)
        self.events = info["event_infos"]
        sparse = info["sparse_reward_by_agent"]
        self.served += sum(1 for i, r in enumerate(sparse) if r > 0 and self.events["soup_delivery"][i])
        team = float(sum(sparse))
        done = self.served >= 1
        cut = not done and self.game.timestep >= self.max_cycles
        live = list(self.agents)
        if done or cut:
            self.agents = []
        observations = {a: self.observe(a) for a in live}
        infos = {a: {"sparse_reward": float(sparse[i]), "shaped_reward": float(info["shaped_reward_by_agent"][i])}
                 for i, a in enumerate(live)}
        return (observations, {a: team for a in live}, {a: done for a in live}, {a: cut for a in live}, infos)

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._act_spaces[agent]

    def state(self) -> np.ndarray:
        return self.observe(AGENTS[0])

    def render(self) -> str | None:
        return self.mdp.state_string(self.game) if self.render_mode == "ansi" else None

    def close(self) -> None:
        pass

    # ------------------------------------------------------------------ observation
    def observe(self, agent: str) -> np.ndarray:
        """``[me, other]`` × (x, y scaled to [0, 1], facing one-hot N/S/E/W, holding onion /
        dish / soup), then per pot (two slots, sorted by position) present, onions / 3,
        cooking, ready, cook time left / cook time; onions, dishes, soups on counters (each
        min(n, 3) / 3); a soup served; time / max_cycles."""
        i = AGENTS.index(agent)
        players = self.game.players
        out = []
        for p in (players[i], players[1 - i]):
            x, y = p.position
            facing = [0.0] * 4
            facing[Direction.DIRECTION_TO_INDEX[p.orientation]] = 1.0
            held = _held_name(p)
            out += [x / max(self.kitchen.width - 1, 1), y / max(self.kitchen.height - 1, 1), *facing,
                    *(float(held == k) for k in _HELD)]
        for slot in range(MAX_POTS):
            if slot >= len(self.kitchen.pots):
                out += [0.0] * 5
                continue
            soup = self.game.objects.get(self.kitchen.pots[slot])
            if soup is None:
                out += [1.0, 0.0, 0.0, 0.0, 0.0]
                continue
            left = 0.0 if soup.is_idle else soup.cook_time_remaining / max(soup.cook_time, 1)
            out += [1.0, min(soup.ingredients.count("onion"), SOUP_ONIONS) / SOUP_ONIONS,
                    float(soup.is_cooking), float(soup.is_ready), left]
        on_counters = [obj.name for pos, obj in self.game.objects.items() if pos in self.kitchen.counters]
        out += [min(on_counters.count(k), 3) / 3 for k in _HELD]
        out += [float(self.served > 0), min(self.game.timestep / self.max_cycles, 1.0)]
        return np.asarray(out, dtype=np.float32)



# ---------------------------------------------------------------------- state queries
def _held_name(player: Any) -> str | None:
    return None if player.held_object is None else player.held_object.name


def _is_onion_soup(obj: Any) -> bool:
    return obj.name == "soup" and obj.ingredients.count("onion") == SOUP_ONIONS


def _pot_soups(env: OvercookedKitchen) -> list[tuple[tuple[int, int], Any]]:
    return [(pot, env.game.objects[pot]) for pot in env.kitchen.pots if pot in env.game.objects]


def _loose_onion_soups(env: OvercookedKitchen) -> list[Any]:
    """Onion soups out of their pot: carried, or set down on a counter."""
    pots = set(env.kitchen.pots)
    carried = [p.held_object for p in env.game.players if p.held_object is not None]
    placed = [obj for pos, obj in env.game.objects.items() if pos not in pots]
    return [obj for obj in carried + placed if _is_onion_soup(obj)]


def _open_pots(env: OvercookedKitchen) -> list[tuple[tuple[int, int], int]]:
    """Pots that can take an ingredient (empty, or idle and not full) with their count, in
    position order."""
    out = []
    for pot in env.kitchen.pots:
        soup = env.game.objects.get(pot)
        n = 0 if soup is None else len(soup.ingredients)
        if (soup is None or soup.is_idle) and n < SOUP_ONIONS:
            out.append((pot, n))
    return out


def _onions_needed(env: OvercookedKitchen) -> int:
    """Onions still to pot for the one soup: none once a pot holds three (or the soup is
    under way), else three less the fullest open pot's onions."""
    if env.served or _loose_onion_soups(env) or any(_is_onion_soup(s) for _, s in _pot_soups(env)):
        return 0
    open_pots = _open_pots(env)
    return SOUP_ONIONS - max(n for _, n in open_pots) if open_pots else 0


def _pot_for_onion(env: OvercookedKitchen) -> tuple[int, int] | None:
    """The pot an onion should go into: the fullest open one (the first by position on a
    tie, so that both cooks fill the same pot)."""
    if _onions_needed(env) <= 0:
        return None
    return max(_open_pots(env), key=lambda pot_n: pot_n[1])[0]


def _full_idle_pots(env: OvercookedKitchen) -> list[tuple[int, int]]:
    return [pot for pot, s in _pot_soups(env) if s.is_idle and _is_onion_soup(s)]


# ---------------------------------------------------------------------- milestones
def onion_in_pot(env: OvercookedKitchen) -> bool:
    """A pot holds at least one onion."""
    return any("onion" in s.ingredients for _, s in _pot_soups(env))


def pot_full(env: OvercookedKitchen) -> bool:
    """A pot holds the three onions of the soup."""
    return any(_is_onion_soup(s) for _, s in _pot_soups(env))


def cooking_started(env: OvercookedKitchen) -> bool:
    """A pot cooks (or has cooked) a three-onion soup."""
    return any(_is_onion_soup(s) and not s.is_idle for _, s in _pot_soups(env))


def soup_ready(env: OvercookedKitchen) -> bool:
    """A three-onion soup is done in its pot."""
    return any(_is_onion_soup(s) and s.is_ready for _, s in _pot_soups(env))


def dish_held(env: OvercookedKitchen) -> bool:
    """A cook holds a dish while the onion soup cooks or waits in its pot."""
    return cooking_started(env) and any(_held_name(p) == "dish" for p in env.game.players)


def soup_plated(env: OvercookedKitchen) -> bool:
    """The onion soup is out of its pot, on a dish (carried or set down)."""
    return bool(_loose_onion_soups(env))


def soup_served(env: OvercookedKitchen) -> bool:
    """An ordered soup reached the serving counter."""
    return env.served > 0


DETECTORS = {
    "onion_in_pot": onion_in_pot, "pot_full": pot_full, "cooking_started": cooking_started,
    "soup_ready": soup_ready, "dish_held": dish_held, "soup_plated": soup_plated, "soup_served": soup_served,
}


def task_graph(*, auto_cook: bool = False) -> TaskGraph:
    """One onion soup. ``pot_full`` and ``soup_ready`` come about as side effects (the
    third onion, the cooking time); so does ``cooking_started`` under ``auto_cook``."""

    def node(name: str, description: str, duration: float, *requires: str, **extra: Any) -> dict[str, Any]:
        return {"description": description, "verifier": f"{__name__}:{name}", "duration": duration,
                "requires": list(requires), **extra}

    return TaskGraph.from_spec({
        "goals": ["soup_served"],
        "milestones": {
            "onion_in_pot": node("onion_in_pot", "an onion in a pot", 6.0),
            "pot_full": node("pot_full", "three onions in one pot", 12.0, "onion_in_pot", side_effect=True),
            "cooking_started": node("cooking_started", "the full pot cooks", 2.0, "pot_full",
                                    side_effect=auto_cook),
            "soup_ready": node("soup_ready", "the soup is cooked", 20.0, "cooking_started", side_effect=True),
            "dish_held": node("dish_held", "a dish in hand while the soup cooks", 5.0, "cooking_started"),
            "soup_plated": node("soup_plated", "the soup on a dish", 4.0, "soup_ready", "dish_held"),
            "soup_served": node("soup_served", "the soup delivered", 4.0, "soup_plated"),
        },
    })


def make_env(layout: str = "cramped_room", *, max_cycles: int | None = None, auto_cook: bool = False) -> GyreAdapter:
    """The kitchen as a gyre environment; ``max_cycles`` defaults to :data:`HORIZON`."""
    horizon = HORIZON if max_cycles is None else max_cycles
    return GyreAdapter(OvercookedKitchen(layout, max_cycles=horizon, auto_cook=auto_cook),
                       milestones=DETECTORS, graph=task_graph(auto_cook=auto_cook), max_cycles=horizon)


# ---------------------------------------------------------------------- planning
def _direction(src: tuple[int, int], dst: tuple[int, int]) -> int:
    return Action.ACTION_TO_INDEX[(dst[0] - src[0], dst[1] - src[1])]


def _path(kitchen: _Kitchen, start: tuple[int, int], goals: set[tuple[int, int]],
          blocked: set[tuple[int, int]]) -> list[tuple[int, int]] | None:
    """Tiles of a shortest walk from ``start`` to a goal tile (start excluded); None if none."""
    if start in goals:
        return []
    parent: dict[tuple[int, int], tuple[int, int] | None] = {start: None}
    queue = deque([start])
    while queue:
        tile = queue.popleft()
        for n in kitchen.neighbours(tile):
            if n in parent or n in blocked:
                continue
            parent[n] = tile
            if n in goals:
                path = [n]
                while parent[path[-1]] != start:
                    path.append(parent[path[-1]])
                return path[::-1]
            queue.append(n)
    return None


def _me(ctx: OptionContext) -> tuple[OvercookedKitchen, int, Any, Any]:
    env = ctx.env.unwrapped
    i = AGENTS.index(ctx.agent)
    return env, i, env.game.players[i], env.game.players[1 - i]


def _random_step(ctx: OptionContext, avoid: set[tuple[int, int]] = frozenset()) -> int:
    """A step onto a random free neighbouring tile (one off ``avoid`` if there is one)."""
    env, _, me, other = _me(ctx)
    free = [n for n in env.kitchen.neighbours(me.position) if n != other.position]
    free = [n for n in free if n not in avoid] or free
    if not free:
        return _STAY
    return _direction(me.position, free[int(ctx.rng.integers(len(free)))])


def _go_and_interact(ctx: OptionContext, targets: Sequence[tuple[int, int]]) -> int:
    """Walk to the nearest tile next to one of ``targets``, face it and interact.

    Around the other cook where a detour exists; else queue behind it. ``agent_0`` has the
    right of way on a tile both are about to enter (``agent_1`` acts second and reads its
    fresh plan); a cook that has not moved for :data:`_STUCK_STEPS` steps it meant to move
    takes a random free step instead."""
    env, i, me, other = _me(ctx)
    memory = ctx.memory
    stuck = memory.get("stuck", 0) + 1 if memory.get("moving_from") == me.position else 0
    memory["stuck"], memory["moving_from"] = stuck, None
    env.plans[ctx.agent] = ()
    if not targets:
        return _STAY
    for target in targets:
        if me.position in env.kitchen.access[target]:
            facing = (target[0] - me.position[0], target[1] - me.position[1])
            return _INTERACT if me.orientation == facing else Action.ACTION_TO_INDEX[facing]
    stands = {s for t in targets for s in env.kitchen.access[t]}
    path = _path(env.kitchen, me.position, stands, {other.position})
    if path is None:  # no way around the other cook
        path = _path(env.kitchen, me.position, stands, set())
    if not path:
        return _STAY
    env.plans[ctx.agent] = tuple(path)
    memory["moving_from"] = me.position
    theirs = env.plans.get(AGENTS[1 - i], ())
    if stuck >= _STUCK_STEPS:
        memory["stuck"] = 0
        return _random_step(ctx, avoid=set(theirs))
    step = path[0]
    leaving = i == 1 and bool(theirs) and theirs[0] != me.position  # agent_0 moves off, not onto me
    if step == other.position and not leaving:
        return _STAY
    if i == 1 and theirs[:1] == (step,):
        return _STAY
    return _direction(me.position, step)


# ---------------------------------------------------------------------- options
def put_onion_in_pot(ctx: OptionContext) -> int:
    """Fetch an onion (dispenser or counter) and put it into the pot that needs it."""
    env, _, me, _ = _me(ctx)
    held = _held_name(me)
    if held == "onion":
        pot = _pot_for_onion(env)
        return _go_and_interact(ctx, [pot] if pot is not None else [])
    if held is None:
        loose = [pos for pos, obj in env.game.objects.items() if obj.name == "onion"]
        return _go_and_interact(ctx, list(env.kitchen.tiles["O"]) + loose)
    return _STAY


def can_put_onion(ctx: OptionContext) -> bool:
    """An onion in hand and a pot that still needs it, or free hands and an onion the
    soup needs beyond the one the other cook carries."""
    env, _, me, other = _me(ctx)
    held = _held_name(me)
    if held == "onion":
        return _pot_for_onion(env) is not None
    return held is None and _onions_needed(env) - (_held_name(other) == "onion") > 0


def potted_onion(ctx: OptionContext) -> bool:
    env, i, _, _ = _me(ctx)
    return bool(env.events.get("potting_onion", (False, False))[i])


def onion_not_needed(ctx: OptionContext) -> bool:
    return not can_put_onion(ctx)


def start_cooking(ctx: OptionContext) -> int:
    """Interact with the full pot to start it cooking."""
    return _go_and_interact(ctx, _full_idle_pots(ctx.env.unwrapped))


def can_start_cooking(ctx: OptionContext) -> bool:
    env, _, me, _ = _me(ctx)
    return me.held_object is None and bool(_full_idle_pots(env))


def fetch_dish(ctx: OptionContext) -> int:
    """Pick up a dish from the dispenser (or a counter)."""
    env = ctx.env.unwrapped
    loose = [pos for pos, obj in env.game.objects.items() if obj.name == "dish"]
    return _go_and_interact(ctx, list(env.kitchen.tiles["D"]) + loose)


def hands_empty(ctx: OptionContext) -> bool:
    return _me(ctx)[2].held_object is None


def plate_soup(ctx: OptionContext) -> int:
    """Scoop the cooked soup from its pot onto the dish in hand (wait by it if not done)."""
    env = ctx.env.unwrapped
    soups = [(pot, s) for pot, s in _pot_soups(env) if _is_onion_soup(s) and not s.is_idle]
    ready = [pot for pot, s in soups if s.is_ready]
    return _go_and_interact(ctx, ready or [pot for pot, _ in soups])


def holds_dish(ctx: OptionContext) -> bool:
    return _held_name(_me(ctx)[2]) == "dish"


def serve_soup(ctx: OptionContext) -> int:
    """Carry the plated soup to a serving counter and hand it in."""
    return _go_and_interact(ctx, list(ctx.env.unwrapped.kitchen.tiles["S"]))


def holds_soup(ctx: OptionContext) -> bool:
    return _held_name(_me(ctx)[2]) == "soup"


def set_onion_aside(ctx: OptionContext) -> int:
    """Put an onion no pot needs on the nearest free counter, to free the hands."""
    env = ctx.env.unwrapped
    free = [t for t in env.kitchen.tiles["X"] if t not in env.game.objects and env.kitchen.access[t]]
    return _go_and_interact(ctx, free)


def holds_spare_onion(ctx: OptionContext) -> bool:
    env, _, me, _ = _me(ctx)
    return _held_name(me) == "onion" and _pot_for_onion(env) is None


def wait(ctx: OptionContext) -> int:
    """Stay one step — or step off the path the other cook is about to walk."""
    env, i, me, _ = _me(ctx)
    env.plans[ctx.agent] = ()
    their_path = env.plans.get(AGENTS[1 - i], ())
    if me.position in their_path:
        return _random_step(ctx, avoid=set(their_path))
    return _STAY


def one_step(ctx: OptionContext) -> bool:
    return ctx.steps >= 1


def make_library(env: Any = None) -> OptionLibrary:
    """Options for :func:`make_env`'s graph, in the order a cook uses them (built for
    ``env``'s dynamics when given: no ``start_cooking`` where full pots start by themselves)."""
    auto_cook = bool(getattr(getattr(env, "unwrapped", env), "auto_cook", False))
    library = OptionLibrary("overcooked_kitchen", task_graph(auto_cook=auto_cook))
    library.add(Option("put_onion_in_pot", put_onion_in_pot, milestone="onion_in_pot", repeatable=True,
                       initiation=can_put_onion, done=potted_onion, failure=onion_not_needed, max_steps=40,
                       description="fetch an onion and pot it"))
    if not auto_cook:
        library.add(Option("start_cooking", start_cooking, milestone="cooking_started",
                           initiation=can_start_cooking, max_steps=20, description="start the full pot"))
    library.add(Option("fetch_dish", fetch_dish, milestone="dish_held", initiation=hands_empty, max_steps=40,
                       description="pick up a dish"))
    library.add(Option("plate_soup", plate_soup, milestone="soup_plated", initiation=holds_dish, max_steps=40,
                       description="scoop the soup onto the dish"))
    library.add(Option("serve_soup", serve_soup, milestone="soup_served", initiation=holds_soup, max_steps=40,
                       description="deliver the soup"))
    library.add(Option("set_onion_aside", set_onion_aside, initiation=holds_spare_onion, done=hands_empty,
                       max_steps=30, description="put a spare onion on a counter"))
    library.add(Option("wait", wait, done=one_step, max_steps=1, description="stay (or make way) one step"))
    return library.validate()


# ---------------------------------------------------------------------- oracle
class OracleManager:
    """A scripted reference: both cooks fetch onions while the soup needs more than the one
    already on its way, whoever is free starts the full pot, the other fetches the dish
    while it cooks, and the dish holder plates and serves."""

    def __init__(self, library: OptionLibrary) -> None:
        if not isinstance(library, OptionLibrary):
            raise TypeError(f"OracleManager: library must be an OptionLibrary, got {type(library).__name__}")
        self.library = library

    def decide(self, decisions: Sequence[Decision]) -> list[Choice]:
        return [Choice(self._choose(d)) for d in decisions]

    def _choose(self, d: Decision) -> int:
        env = d.env.unwrapped
        lib = self.library
        me, other = env.game.players[d.agent_index], env.game.players[1 - d.agent_index]
        others = {lib[o].name for o in d.others}

        def allowed(name: str) -> bool:
            return name in lib.names and bool(d.mask[lib.index(name)])

        held = _held_name(me)
        if held == "soup":
            wanted = ["serve_soup"]
        elif held == "dish":
            wanted = ["plate_soup"]
        elif held == "onion":
            wanted = ["put_onion_in_pot", "set_onion_aside"]
        else:
            wanted = []
            if "start_cooking" not in others:
                wanted.append("start_cooking")
            if "fetch_dish" not in others and _held_name(other) != "dish":
                wanted.append("fetch_dish")
            on_the_way = _held_name(other) == "onion" or (
                "put_onion_in_pot" in others and other.held_object is None)
            if _onions_needed(env) - on_the_way > 0:
                wanted.append("put_onion_in_pot")
        for name in wanted + ["wait"]:
            if allowed(name):
                return lib.index(name)
        return int(np.flatnonzero(d.mask)[0])
