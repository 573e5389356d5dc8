"""Farama MiniGrid DoorKey as a gyre environment, with a scripted option library.

The example of :mod:`gyre_ma.envs.adapters` on an environment gyre-ma did not write:
three milestones read from MiniGrid's own state (``has_key → door_open → reached_goal``)
and one scripted option per milestone that plans with breadth-first search over
``env.unwrapped.grid``, plus an always-eligible ``turn`` option.
"""

from __future__ import annotations

from collections import deque
from typing import Any

try:
    from minigrid.core.actions import Actions
    from minigrid.core.constants import DIR_TO_VEC
    from minigrid.core.world_object import Door, Goal, Key
except ImportError as exc:  # an optional dependency: say which extra brings it
    raise ImportError(f"the MiniGrid example needs the minigrid package ({exc}); "
                      "install it with: pip install 'gyre-ma[minigrid]'") from exc

from gyre_ma.envs.adapters import GyreAdapter, from_gymnasium
from gyre_ma.options.graph import TaskGraph
from gyre_ma.options.library import OptionLibrary
from gyre_ma.options.option import Option, OptionContext

ENV_ID = "MiniGrid-DoorKey-5x5-v0"


# ---------------------------------------------------------------------- milestones
def has_key(env: Any) -> bool:
    """The agent carries a key."""
    return isinstance(env.carrying, Key)


def door_open(env: Any) -> bool:
    """Some door of the grid is open."""
    return any(isinstance(obj, Door) and obj.is_open for obj in env.grid.grid)


def reached_goal(env: Any) -> bool:
    """The agent stands on the goal square."""
    return isinstance(env.grid.get(*env.agent_pos), Goal)


def task_graph() -> TaskGraph:
    return TaskGraph.from_spec({
        "goals": ["reached_goal"],
        "milestones": {
            "has_key": {"description": "pick up the key", "verifier": f"{__name__}:has_key", "duration": 6.0},
            "door_open": {
                "description": "unlock the door", "verifier": f"{__name__}:door_open",
                "requires": ["has_key"], "duration": 5.0,
            },
            "reached_goal": {
                "description": "step onto the goal", "verifier": f"{__name__}:reached_goal",
                "requires": ["door_open"], "duration": 6.0,
            },
        },
    })


def make_env(env_id: str = ENV_ID, *, max_cycles: int | None = None, **make_kwargs: Any) -> GyreAdapter:
    """DoorKey (any size) as a one-agent gyre environment; the agent is ``agent_0``."""
    return from_gymnasium(
        env_id,
        milestones={"has_key": has_key, "door_open": door_open, "reached_goal": reached_goal},
        graph=task_graph(),
        max_cycles=max_cycles,
        **make_kwargs,
    )


# ---------------------------------------------------------------------- planning
def _find(grid: Any, kind: type) -> tuple[int, int] | None:
    for i, obj in enumerate(grid.grid):
        if isinstance(obj, kind):
            return i % grid.width, i // grid.width
    return None


def _passable(grid: Any, x: int, y: int) -> bool:
    obj = grid.get(x, y)
    return obj is None or (obj.can_overlap() and obj.type != "lava")


def first_step(env: Any, arrived: Any) -> int | None:
    """First action of a shortest left/right/forward path from the agent's pose to a pose
    ``(x, y, dir)`` where ``arrived`` holds; None when none is reachable. The current pose
    is not checked (the caller has)."""
    start = (int(env.agent_pos[0]), int(env.agent_pos[1]), int(env.agent_dir))
    first: dict[tuple[int, int, int], int | None] = {start: None}
    queue = deque([start])
    while queue:
        x, y, d = queue.popleft()
        dx, dy = DIR_TO_VEC[d]
        moves = [(Actions.left, (x, y, (d - 1) % 4)), (Actions.right, (x, y, (d + 1) % 4))]
        if _passable(env.grid, x + dx, y + dy):
            moves.append((Actions.forward, (int(x + dx), int(y + dy), d)))
        for action, nxt in moves:
            if nxt in first:
                continue
            first[nxt] = first[(x, y, d)] if first[(x, y, d)] is not None else int(action)
            if arrived(*nxt):
                return first[nxt]
            queue.append(nxt)
    return None


def _plan(env: Any, target: tuple[int, int], *, face: bool) -> int | None:
    """First action of a shortest path that ends facing ``target`` (``face``) or standing
    on it. None when unreachable or already there."""

    def arrived(x: int, y: int, d: int) -> bool:
        if not face:
            return (x, y) == target
        dx, dy = DIR_TO_VEC[d]
        return (x + dx, y + dy) == target

    if arrived(int(env.agent_pos[0]), int(env.agent_pos[1]), int(env.agent_dir)):
        return None
    return first_step(env, arrived)


def _approach_and(env: Any, kind: type, act: Actions) -> int:
    target = _find(env.grid, kind)
    if target is None:
        return int(Actions.left)
    step = _plan(env, target, face=True)
    if step is None:
        facing = tuple(int(v) for v in env.front_pos) == target
        return int(act) if facing else int(Actions.left)
    return step


# ---------------------------------------------------------------------- options
def get_key(ctx: OptionContext) -> int:
    """Walk up to the key and pick it up."""
    return _approach_and(ctx.env.unwrapped, Key, Actions.pickup)


def open_door(ctx: OptionContext) -> int:
    """Walk up to the door and toggle it (the carried key unlocks it)."""
    return _approach_and(ctx.env.unwrapped, Door, Actions.toggle)


def go_to_goal(ctx: OptionContext) -> int:
    """Walk onto the goal square."""
    env = ctx.env.unwrapped
    target = _find(env.grid, Goal)
    step = None if target is None else _plan(env, target, face=False)
    return int(Actions.left) if step is None else step


def turn(ctx: OptionContext) -> int:
    """Turn left once: the always-eligible fallback."""
    return int(Actions.left)


def one_step(ctx: OptionContext) -> bool:
    return ctx.steps >= 1


def make_library() -> OptionLibrary:
    """Options for :func:`make_env`'s graph, in the order a competent player uses them."""
    library = OptionLibrary("minigrid_doorkey", task_graph())
    library.add(Option("get_key", get_key, milestone="has_key", max_steps=60))
    library.add(Option("open_door", open_door, milestone="door_open", max_steps=60))
    library.add(Option("go_to_goal", go_to_goal, milestone="reached_goal", max_steps=60))
    library.add(Option("turn", turn, done=one_step, max_steps=1))
    return library.validate()
