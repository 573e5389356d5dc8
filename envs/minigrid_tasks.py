"""Two harder Farama MiniGrid tasks as gyre environments, with the option libraries a
user would write for them and a scripted oracle manager for each.

- ``MiniGrid-ObstructedMaze-1Dlhb-v0``: the key to the locked door is hidden in a box,
  a ball blocks the door, and the goal is to pick up the target ball in the other room.
  The agent carries one object at a time, so the *order* matters beyond the graph: taking
  the key before moving the ball means dropping the key and fetching it again.
- ``MiniGrid-LockedRoom-v0``: the mission names the room that holds the key; open that
  room, take the key, unlock the locked room and reach its goal.

Milestones are read from MiniGrid's own state; options plan with breadth-first search
over ``env.unwrapped.grid`` with :mod:`gyre_ma.envs.minigrid_doorkey`'s search (and share its
``has_key``, ``reached_goal`` and ``turn``), and each library has an always-eligible
one-step ``turn`` so that no state is a dead end.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

try:
    from minigrid.core.actions import Actions
    from minigrid.core.constants import DIR_TO_VEC
    from minigrid.core.world_object import Ball, Box, Door, Goal, Key, Wall
except ImportError as exc:  # an optional dependency: say which extra brings it
    raise ImportError(f"the MiniGrid tasks need the minigrid package ({exc}); "
                      "install it with: pip install 'gyre-ma[minigrid]'") from exc

from gyre_ma.envs.adapters import GyreAdapter, from_gymnasium
from gyre_ma.envs.minigrid_doorkey import first_step, has_key, one_step, reached_goal, turn
from gyre_ma.options.decision import Choice, Decision
from gyre_ma.options.graph import TaskGraph
from gyre_ma.options.library import OptionLibrary
from gyre_ma.options.option import Option, OptionContext

OBSTRUCTED_MAZE_ID = "MiniGrid-ObstructedMaze-1Dlhb-v0"
LOCKED_ROOM_ID = "MiniGrid-LockedRoom-v0"

Cell = tuple[int, int]


# ====================================================================== planning
def _cells(grid: Any, match: Callable[[Any], bool]) -> list[Cell]:
    return [(i % grid.width, i // grid.width) for i, obj in enumerate(grid.grid) if obj is not None and match(obj)]


def _find(grid: Any, match: Callable[[Any], bool]) -> Cell | None:
    found = _cells(grid, match)
    return found[0] if found else None


def _ahead(x: int, y: int, d: int) -> Cell:
    dx, dy = DIR_TO_VEC[d]
    return int(x + dx), int(y + dy)


def _front(env: Any) -> Cell:
    return int(env.front_pos[0]), int(env.front_pos[1])


def _face_and(env: Any, target: Cell | None, act: Actions) -> int:
    """Walk until facing ``target``, then ``act`` on it; turn in place when it is gone or
    unreachable (the option's step cap ends the call)."""
    if target is None:
        return int(Actions.left)
    if _front(env) == target:
        return int(act)
    step = first_step(env, lambda x, y, d: _ahead(x, y, d) == target)
    return int(Actions.left) if step is None else step


def _walk_onto(env: Any, target: Cell | None) -> int:
    if target is None:
        return int(Actions.left)
    step = first_step(env, lambda x, y, d: (x, y) == target)
    return int(Actions.left) if step is None else step


def _neighbours(cell: Cell) -> list[Cell]:
    x, y = cell
    return [(x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1)]


def _region(grid: Any, start: Cell, blocked: Cell | None = None) -> set[Cell]:
    """Cells connected to ``start`` through empty, overlappable or door cells: what the
    agent could reach once every door is open."""
    seen, queue = {start}, deque([start])
    while queue:
        for nxt in _neighbours(queue.popleft()):
            if nxt in seen or nxt == blocked or not (0 <= nxt[0] < grid.width and 0 <= nxt[1] < grid.height):
                continue
            obj = grid.get(*nxt)
            if obj is None or obj.can_overlap() or isinstance(obj, Door):
                seen.add(nxt)
                queue.append(nxt)
    return seen


def _safe_drops(env: Any) -> set[Cell]:
    """Empty cells where a dropped object cuts no path: not next to a door, and every
    cell and object the agent can reach stays reachable."""
    grid, agent = env.grid, (int(env.agent_pos[0]), int(env.agent_pos[1]))
    region = _region(grid, agent)
    near_doors = {n for door in _cells(grid, lambda o: isinstance(o, Door)) for n in _neighbours(door)}
    objects = [c for c in _cells(grid, lambda o: not isinstance(o, (Wall, Door)) and not o.can_overlap())
               if any(n in region for n in _neighbours(c))]
    safe = set()
    for cell in region:
        if cell == agent or cell in near_doors or grid.get(*cell) is not None:
            continue
        rest = _region(grid, agent, blocked=cell)
        if rest == region - {cell} and all(any(n in rest for n in _neighbours(o)) for o in objects):
            safe.add(cell)
    return safe


def _drop_safely(env: Any) -> int:
    """Put the carried object down where it blocks nothing (free the hands first)."""
    safe = _safe_drops(env)
    if _front(env) in safe:
        return int(Actions.drop)
    step = first_step(env, lambda x, y, d: _ahead(x, y, d) in safe)
    return int(Actions.left) if step is None else step


def _turn_option() -> Option:
    return Option("turn", turn, done=one_step, max_steps=1, description="turn left once")


class _ScriptedOracle:
    """A manager that reads the true state and names the option a competent player runs
    next (``_want``); where the mask forbids it, the first eligible option of ``order``."""

    order: tuple[str, ...] = ()

    def __init__(self, *, library: OptionLibrary) -> None:
        missing = [n for n in (*self.order, "turn") if n not in library.names]
        if missing:
            raise ValueError(f"{type(self).__name__}: library {library.name!r} lacks option(s) {missing}; "
                             f"it has {library.names}, expected {[*self.order, 'turn']}")
        self.library = library
        self._order = [library.index(n) for n in (*self.order, "turn")]

    def _want(self, env: Any, achieved: frozenset[str]) -> str:
        raise NotImplementedError

    def decide(self, decisions: Sequence[Decision]) -> list[Choice]:
        out = []
        for d in decisions:
            want = self.library.index(self._want(d.env.unwrapped, d.achieved))
            eligible = [i for i in [want, *self._order] if d.mask[i]]
            if not eligible:
                eligible = [int(i) for i in d.mask.nonzero()[0]]
            if not eligible:
                raise ValueError(f"{type(self).__name__}: decision for {d.agent!r} has no eligible option "
                                 f"(mask {d.mask.tolist()})")
            out.append(Choice(eligible[0]))
        return out


# ====================================================================== ObstructedMaze-1Dlhb
def _maze_door(env: Any) -> tuple[Door, Cell]:
    """The locked door out of the start room and the cell before it, where the ball sits."""
    door = env.get_room(0, 0).doors[0]
    if door is None:
        raise ValueError(f"{type(env).__name__}: the start room has no door on its right wall; these "
                         "milestones expect the ObstructedMaze-1Dl* layout (two rooms side by side)")
    dx, dy = DIR_TO_VEC[0]
    x, y = int(door.cur_pos[0]), int(door.cur_pos[1])
    return door, (x - dx, y - dy)


def key_revealed(env: Any) -> bool:
    """The key is out of its box (on the floor or carried)."""
    return isinstance(env.carrying, Key) or any(isinstance(o, Key) for o in env.grid.grid)


def door_unblocked(env: Any) -> bool:
    """Nothing stands before the locked door and the agent's hands are not full of the
    blocking ball: the ball has been put down elsewhere."""
    _, front = _maze_door(env)
    carried = env.carrying
    return env.grid.get(*front) is None and not (isinstance(carried, Ball) and carried is not env.obj)


def door_open(env: Any) -> bool:
    """The door between the two rooms is open (unlocking it opens it)."""
    return bool(_maze_door(env)[0].is_open)


def has_target(env: Any) -> bool:
    """The agent holds the target ball: the task's goal (MiniGrid ends the episode)."""
    return env.carrying is not None and env.carrying is env.obj


def obstructed_maze_graph() -> TaskGraph:
    return TaskGraph.from_spec({
        "goals": ["has_target"],
        "milestones": {
            "key_revealed": {"description": "open the box that hides the key",
                             "verifier": f"{__name__}:key_revealed", "duration": 6.0},
            "door_unblocked": {"description": "carry the ball away from the door and drop it",
                               "verifier": f"{__name__}:door_unblocked", "duration": 8.0},
            "has_key": {"description": "pick up the key", "verifier": f"{__name__}:has_key",
                        "requires": ["key_revealed"], "duration": 2.0},
            "door_open": {"description": "unlock the door with the key", "verifier": f"{__name__}:door_open",
                          "requires": ["has_key", "door_unblocked"], "duration": 6.0},
            "has_target": {"description": "pick up the target ball in the other room",
                           "verifier": f"{__name__}:has_target", "requires": ["door_open"], "duration": 10.0},
        },
    })


def make_obstructed_maze(*, max_cycles: int | None = None, **make_kwargs: Any) -> GyreAdapter:
    """ObstructedMaze-1Dlhb as a one-agent gyre environment (agent ``agent_0``);
    ``make_kwargs`` go to ``gymnasium.make`` (``render_mode``, ``blocked``, ``key_in_box``)."""
    return from_gymnasium(
        OBSTRUCTED_MAZE_ID,
        milestones={"key_revealed": key_revealed, "door_unblocked": door_unblocked, "has_key": has_key,
                    "door_open": door_open, "has_target": has_target},
        graph=obstructed_maze_graph(),
        max_cycles=max_cycles,
        **make_kwargs,
    )


def open_box(ctx: OptionContext) -> int:
    """Walk up to the box and toggle it: the key takes its place."""
    env = ctx.env.unwrapped
    return _face_and(env, _find(env.grid, lambda o: isinstance(o, Box)), Actions.toggle)


def move_ball(ctx: OptionContext) -> int:
    """Pick up the ball before the door and drop it where it blocks nothing; whatever is
    in hand (the key) is put down first, as only one object can be carried."""
    env = ctx.env.unwrapped
    if env.carrying is not None:
        return _drop_safely(env)
    _, front = _maze_door(env)
    return _face_and(env, front, Actions.pickup)


def get_key(ctx: OptionContext) -> int:
    """Walk up to the key and pick it up, putting down anything else held."""
    env = ctx.env.unwrapped
    if env.carrying is not None and not isinstance(env.carrying, Key):
        return _drop_safely(env)
    return _face_and(env, _find(env.grid, lambda o: isinstance(o, Key)), Actions.pickup)


def open_maze_door(ctx: OptionContext) -> int:
    """Walk up to the locked door and toggle it with the key in hand."""
    env = ctx.env.unwrapped
    door, _ = _maze_door(env)
    return _face_and(env, (int(door.cur_pos[0]), int(door.cur_pos[1])), Actions.toggle)


def get_target(ctx: OptionContext) -> int:
    """Put down the key, walk up to the target ball and pick it up."""
    env = ctx.env.unwrapped
    if env.carrying is not None:
        return _drop_safely(env)
    return _face_and(env, _find(env.grid, lambda o: o is env.obj), Actions.pickup)


def _door_locked(ctx: OptionContext) -> bool:
    return not door_open(ctx.env.unwrapped)


def _holding_key(ctx: OptionContext) -> bool:
    return has_key(ctx.env.unwrapped)


def obstructed_maze_library() -> OptionLibrary:
    """One option per milestone plus ``turn``. ``get_key`` restores ``has_key`` (it is
    eligible again whenever the key is not in hand while the door is locked), because
    ``move_ball`` drops a carried key; ``open_door`` needs the key in hand."""
    library = OptionLibrary("minigrid_obstructed_maze", obstructed_maze_graph())
    library.add(Option("open_box", open_box, milestone="key_revealed", max_steps=40,
                       description="open the box hiding the key"))
    library.add(Option("move_ball", move_ball, milestone="door_unblocked", max_steps=60,
                       description="move the ball away from the door"))
    library.add(Option("get_key", get_key, milestone="has_key", repeatable=True, initiation=_door_locked,
                       max_steps=50, description="pick up the key (again, if it was put down)"))
    library.add(Option("open_door", open_maze_door, milestone="door_open", initiation=_holding_key,
                       max_steps=40, description="unlock the door"))
    library.add(Option("get_target", get_target, milestone="has_target", max_steps=60,
                       description="pick up the target ball"))
    library.add(_turn_option())
    return library.validate()


class ObstructedMazeOracle(_ScriptedOracle):
    """Move the ball while the hands are empty, open the box, take the key, unlock the
    door, fetch the target: no object is ever put down twice."""

    order = ("move_ball", "open_box", "get_key", "open_door", "get_target")

    def _want(self, env: Any, achieved: frozenset[str]) -> str:
        if "door_unblocked" not in achieved:
            return "move_ball"
        if "key_revealed" not in achieved:
            return "open_box"
        if "door_open" not in achieved:
            return "open_door" if has_key(env) else "get_key"
        return "get_target"


# ====================================================================== LockedRoom
_MISSION = re.compile(r"get the (\w+) key from the (\w+) room")


def _locked_room_doors(env: Any) -> tuple[tuple[Door, Cell], tuple[Door, Cell]]:
    """The door (and its cell) of the room the mission says holds the key, and those of
    the locked room (the one the key's colour opens)."""
    match = _MISSION.match(str(env.mission))
    if match is None:
        raise ValueError(f"{type(env).__name__}: mission {env.mission!r} does not read "
                         "'get the <colour> key from the <colour> room, ...'; expected a LockedRoom mission")
    key_colour, room_colour = match.groups()
    doors = {room.color: (env.grid.get(*room.doorPos), (int(room.doorPos[0]), int(room.doorPos[1])))
             for room in env.rooms}
    return doors[room_colour], doors[key_colour]


def key_room_open(env: Any) -> bool:
    """The door of the room holding the key is open."""
    return bool(_locked_room_doors(env)[0][0].is_open)


def locked_door_open(env: Any) -> bool:
    """The locked room's door is unlocked and open."""
    return bool(_locked_room_doors(env)[1][0].is_open)


def locked_room_graph() -> TaskGraph:
    return TaskGraph.from_spec({
        "goals": ["reached_goal"],
        "milestones": {
            "key_room_open": {"description": "open the door of the room the mission names",
                              "verifier": f"{__name__}:key_room_open", "duration": 12.0},
            "has_key": {"description": "pick up the key", "verifier": f"{__name__}:has_key",
                        "requires": ["key_room_open"], "duration": 8.0},
            "door_open": {"description": "unlock the locked room's door",
                          "verifier": f"{__name__}:locked_door_open", "requires": ["has_key"], "duration": 20.0},
            "reached_goal": {"description": "step onto the goal", "verifier": f"{__name__}:reached_goal",
                             "requires": ["door_open"], "duration": 8.0},
        },
    })


def make_locked_room(*, max_cycles: int | None = None, **make_kwargs: Any) -> GyreAdapter:
    """LockedRoom as a one-agent gyre environment (agent ``agent_0``); ``make_kwargs`` go
    to ``gymnasium.make`` (``render_mode``, ``size``, ``max_steps``)."""
    return from_gymnasium(
        LOCKED_ROOM_ID,
        milestones={"key_room_open": key_room_open, "has_key": has_key, "door_open": locked_door_open,
                    "reached_goal": reached_goal},
        graph=locked_room_graph(),
        max_cycles=max_cycles,
        **make_kwargs,
    )


def open_key_room(ctx: OptionContext) -> int:
    """Walk up to the door of the room the mission names and open it."""
    env = ctx.env.unwrapped
    return _face_and(env, _locked_room_doors(env)[0][1], Actions.toggle)


def fetch_key(ctx: OptionContext) -> int:
    """Walk into the open key room and pick up the key."""
    env = ctx.env.unwrapped
    return _face_and(env, _find(env.grid, lambda o: isinstance(o, Key)), Actions.pickup)


def unlock_room(ctx: OptionContext) -> int:
    """Walk up to the locked door and toggle it with the key."""
    env = ctx.env.unwrapped
    return _face_and(env, _locked_room_doors(env)[1][1], Actions.toggle)


def go_to_goal(ctx: OptionContext) -> int:
    """Walk onto the goal square."""
    env = ctx.env.unwrapped
    return _walk_onto(env, _find(env.grid, lambda o: isinstance(o, Goal)))


def locked_room_library() -> OptionLibrary:
    """One option per milestone, in the order a competent player uses them, plus ``turn``."""
    library = OptionLibrary("minigrid_locked_room", locked_room_graph())
    library.add(Option("open_key_room", open_key_room, milestone="key_room_open", max_steps=60,
                       description="open the key room's door"))
    library.add(Option("get_key", fetch_key, milestone="has_key", max_steps=40, description="pick up the key"))
    library.add(Option("open_door", unlock_room, milestone="door_open", max_steps=80,
                       description="unlock the locked room"))
    library.add(Option("go_to_goal", go_to_goal, milestone="reached_goal", max_steps=40,
                       description="step onto the goal"))
    library.add(_turn_option())
    return library.validate()


class LockedRoomOracle(_ScriptedOracle):
    """Open the named room, take its key, unlock the locked room, walk to the goal."""

    order = ("open_key_room", "get_key", "open_door", "go_to_goal")

    def _want(self, env: Any, achieved: frozenset[str]) -> str:
        if "key_room_open" not in achieved:
            return "open_key_room"
        if "door_open" not in achieved:
            return "open_door" if has_key(env) else "get_key"
        return "go_to_goal"

