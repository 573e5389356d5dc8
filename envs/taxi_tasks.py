"""Gymnasium's Taxi (Dietterich's MAXQ taxi; ``Taxi-v4``, ``Taxi-v3`` before Gymnasium 1.2)
as a one-agent gyre environment, with the option library a user would write for it.

A taxi on a 5×5 grid with walls must fetch a passenger waiting at one of four stands
(R, G, Y, B) and drop them at another. The observation is Taxi's own ``Discrete(500)``
state (taxi row and column, passenger location, destination), which the manager sees
one-hot. Milestones are read from that state (``env.unwrapped.s``): ``picked_up`` (the
passenger is in the taxi) and ``delivered`` (the passenger stands at the destination).

The options are Dietterich's: ``go_to_R`` … ``go_to_B`` (breadth-first search over the
map's walls, ending at the stand), ``pickup`` and ``dropoff`` (one primitive action
each). Which stand to drive to is in the observation only, so the manager must read it,
as in coverage_v0 but with one agent. A pickup or dropoff at the wrong cell changes
nothing (Taxi's −10), except that dropping the passenger at a stand that is not the
destination leaves them there: ``pickup`` restores ``picked_up`` (it is eligible whenever
the passenger is out of the taxi), so such a mistake costs steps, not the episode.

By default each option also describes the place it acts on (:class:`PlaceFeatures`,
``Option.features``), so the manager can learn one rule for all 500 states rather than
each state apart (``taxi_library(features=False)``: without).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.envs.toy_text import taxi as taxi_module
from gymnasium.wrappers import TransformObservation

from gyre_ma.envs.adapters import GyreAdapter, from_gymnasium
from gyre_ma.options.decision import Choice, Decision
from gyre_ma.options.graph import TaskGraph
from gyre_ma.options.library import OptionLibrary, export
from gyre_ma.options.option import CANNOT_PROCEED, Option, OptionContext

TAXI_ID = "Taxi-v4" if "Taxi-v4" in gymnasium.registry else "Taxi-v3"
"""Gymnasium 1.2 renamed Taxi-v3 to v4 (v3 is refused there); older releases have v3 only."""
STANDS = "RGYB"
"""The four stands, in Taxi's order of ``locs`` (passenger location and destination index)."""
_MOVES = {0: (1, 0), 1: (-1, 0), 2: (0, 1), 3: (0, -1)}
"""Taxi's actions south, north, east, west → (row, column) change."""
_PICKUP, _DROPOFF = 4, 5


def _state(env: Any) -> tuple[int, int, int, int]:
    """(taxi row, taxi column, passenger location 0–3 or 4 in the taxi, destination 0–3)."""
    row, col, passenger, destination = env.decode(env.s)
    return int(row), int(col), int(passenger), int(destination)


# ---------------------------------------------------------------------- milestones
def picked_up(env: Any) -> bool:
    """The passenger is in the taxi."""
    return _state(env)[2] == 4


def delivered(env: Any) -> bool:
    """The passenger stands at the destination (Taxi ends the episode there)."""
    _, _, passenger, destination = _state(env)
    return passenger == destination


def task_graph() -> TaskGraph:
    return TaskGraph.from_spec({
        "goals": ["delivered"],
        "milestones": {
            "picked_up": {"description": "the passenger is in the taxi", "verifier": f"{__name__}:picked_up",
                          "duration": 6.0},
            "delivered": {"description": "the passenger is at the destination", "verifier": f"{__name__}:delivered",
                          "requires": ["picked_up"], "duration": 6.0},
        },
    })


def make_taxi(*, max_cycles: int | None = None, observation: str = "state", **make_kwargs: Any) -> GyreAdapter:
    """Taxi-v4 as a one-agent gyre environment (agent ``agent_0``; 200 steps, Taxi's own
    limit, unless ``max_cycles``); ``make_kwargs`` go to ``gymnasium.make``.

    ``observation``: ``state``, Taxi's own ``Discrete(500)`` index (one-hot to the manager:
    each of the 500 states learned apart); ``decoded``, its four parts as
    ``MultiDiscrete([5, 5, 5, 4])`` (taxi row, column, passenger location, destination; one
    one-hot each, so what is learned about a passenger at stand R holds wherever the taxi is)."""
    if observation not in ("state", "decoded"):
        raise ValueError(f"make_taxi: observation must be 'state' or 'decoded', got {observation!r}")
    env = gymnasium.make(TAXI_ID, **make_kwargs)
    if observation == "decoded":
        env = TransformObservation(env, lambda s: np.array(list(env.unwrapped.decode(s)), dtype=np.int64),
                                   spaces.MultiDiscrete([5, 5, 5, 4]))
    return from_gymnasium(env, milestones={"picked_up": picked_up, "delivered": delivered},
                          graph=task_graph(), max_cycles=max_cycles)


# ---------------------------------------------------------------------- options
def _passable(desc: np.ndarray, row: int, col: int, action: int) -> bool:
    """Whether ``action`` moves the taxi from (row, col) on the map ``desc`` (the env's
    ``desc``): its walls are ``|`` between columns."""
    if action == 2:
        return desc[1 + row, 2 * col + 2] == b":"
    if action == 3:
        return desc[1 + row, 2 * col] == b":"
    return 0 <= row + _MOVES[action][0] < 5


def _first_move(env: Any, start: tuple[int, int], goal: tuple[int, int]) -> int:
    """The first action of a shortest path from ``start`` to ``goal`` (breadth-first, in
    Taxi's action order, so ties break the same way every time)."""
    came: dict[tuple[int, int], tuple[tuple[int, int], int] | None] = {start: None}
    frontier = deque([start])
    while frontier:
        cell = frontier.popleft()
        for action, (dr, dc) in _MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if nxt in came or not _passable(env.desc, *cell, action):
                continue
            came[nxt] = (cell, action)
            if nxt == goal:
                while (step := came[nxt]) is not None and step[0] != start:
                    nxt = step[0]
                return came[nxt][1]  # type: ignore[index]
            frontier.append(nxt)
    raise ValueError(f"taxi: no path from {start} to {goal} on this map")


def _stand(env: Any, k: int) -> tuple[int, int]:
    return tuple(env.locs[k])  # type: ignore[return-value]


def _drive_to(k: int) -> Callable[[OptionContext], int]:
    def drive(ctx: OptionContext) -> Any:
        env = ctx.env.unwrapped
        row, col, _, _ = _state(env)
        stand = _stand(env, k)
        return CANNOT_PROCEED if (row, col) == stand else _first_move(env, (row, col), stand)

    return drive


def _at_stand(k: int) -> Callable[[OptionContext], bool]:
    def at(ctx: OptionContext) -> bool:
        env = ctx.env.unwrapped
        return _state(env)[:2] == _stand(env, k)

    return at


def _away_from(k: int) -> Callable[[OptionContext], bool]:
    at = _at_stand(k)

    def away(ctx: OptionContext) -> bool:
        return not at(ctx)

    return away


_STANDS = [(export(globals(), f"drive_to_{name}", _drive_to(k)), export(globals(), f"at_{name}", _at_stand(k)),
            export(globals(), f"away_from_{name}", _away_from(k))) for k, name in enumerate(STANDS)]
"""Per stand: ``go_to_<stand>``'s sub-policy and its done and initiation predicates, module
attributes (a dumped library's references resolve)."""


_LOCS = ((0, 0), (0, 4), (4, 0), (4, 3))
"""The stands' cells, as Taxi sets ``locs``."""
_DESC = np.asarray(taxi_module.MAP, dtype="c")
"""Taxi's map, as the env holds it (``desc``)."""


def _decoded(observation: Any) -> tuple[int, int, int, int]:
    """(taxi row, column, passenger location, destination) from Taxi's index or its decoded form."""
    obs = np.asarray(observation)
    if obs.shape == (4,):
        row, col, passenger, destination = (int(v) for v in obs)
        return row, col, passenger, destination
    if obs.shape != () or obs.dtype.kind not in "iu" or not 0 <= int(obs) < 500:
        raise ValueError(f"taxi: expected Taxi's state index (an integer in [0, 500)) or its decoded "
                         f"[row, column, passenger, destination], got {observation!r}")
    i = int(obs)
    return i // 100, i // 20 % 5, i // 4 % 5, i % 4


def _steps_to(stand: tuple[int, int]) -> np.ndarray:
    """Shortest-path steps from every cell of the map to ``stand`` [5, 5] (breadth-first over the walls)."""
    steps = np.full((5, 5), -1, dtype=np.int64)
    steps[stand] = 0
    frontier = deque([stand])
    while frontier:
        cell = frontier.popleft()
        for action, (dr, dc) in _MOVES.items():  # the moves are symmetric: a wall blocks both ways
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < 5 and 0 <= nxt[1] < 5 and steps[nxt] < 0 and _passable(_DESC, *cell, action):
                steps[nxt] = steps[cell] + 1
                frontier.append(nxt)
    return steps


_STEPS = [_steps_to(stand) for stand in _LOCS]
_LONGEST = float(max(s.max() for s in _STEPS))


class PlaceFeatures:
    """An option's features (``Option.features``), read off the observation (Taxi's index
    or its decoded form): what is at the place the option acts on — ``go_to_<stand>`` at
    its stand, ``pickup`` and ``dropoff`` (``stand`` None) at the taxi's own cell. How far
    the taxi is from it (shortest-path steps over the walls, ÷ the map's longest), whether
    the passenger waits there, whether it is the destination, and whether the passenger
    is in the taxi. The same four numbers for every option, so what the manager learns of
    one place (go where the passenger waits, then where they are going; act where you
    stand) holds for every place and every one of the 500 states."""

    def __init__(self, stand: int | None) -> None:
        self.stand = stand

    def __call__(self, observation: Any) -> np.ndarray:
        row, col, passenger, destination = _decoded(observation)
        if self.stand is None:
            place, steps = (row, col), 0
        else:
            place, steps = _LOCS[self.stand], int(_STEPS[self.stand][row, col])
        waits = passenger < 4 and _LOCS[passenger] == place
        return np.array([steps / _LONGEST, waits, _LOCS[destination] == place, passenger == 4], dtype=np.float64)


_PLACES = [export(globals(), f"place_{name}", PlaceFeatures(k)) for k, name in enumerate(STANDS)]
_HERE = export(globals(), "place_here", PlaceFeatures(None))
"""``go_to_<stand>``'s features, and ``pickup``'s and ``dropoff``'s, module attributes (a
dumped library's references resolve)."""


def pickup(ctx: OptionContext) -> int:
    return _PICKUP


def dropoff(ctx: OptionContext) -> int:
    return _DROPOFF


def taxi_library(features: bool = True) -> OptionLibrary:
    """Four ``go_to_<stand>`` options (repeatable, ending at the stand, eligible away from
    it), ``pickup`` (restores ``picked_up``) and ``dropoff`` (one step each). With
    ``features`` (the default) each option describes the place it acts on to the manager
    (:class:`PlaceFeatures`), so one rule serves every state; without them the manager
    learns each of Taxi's 500 states apart, which took it ~360k env steps to reach paths
    within 1.1× the oracle's (``benchmarks/results/README.md``, sessions 44 and 45)."""
    library = OptionLibrary("taxi", task_graph())
    for name, (drive, at, away), place in zip(STANDS, _STANDS, _PLACES, strict=True):
        library.add(Option(f"go_to_{name}", drive, done=at, initiation=away, repeatable=True, max_steps=20,
                           description=f"drive to stand {name}", features=place if features else None))
    here = _HERE if features else None
    library.add(Option("pickup", pickup, milestone="picked_up", repeatable=True, max_steps=1,
                       description="pick the passenger up (again, if they were set down)", features=here))
    library.add(Option("dropoff", dropoff, milestone="delivered", max_steps=1,
                       description="set the passenger down", features=here))
    return library.validate()


class TaxiOracle:
    """Drive to the passenger, pick them up, drive to the destination, set them down."""

    def __init__(self, *, library: OptionLibrary) -> None:
        wanted = [*(f"go_to_{s}" for s in STANDS), "pickup", "dropoff"]
        missing = [n for n in wanted if n not in library.names]
        if missing:
            raise ValueError(f"TaxiOracle: library {library.name!r} lacks option(s) {missing}; "
                             f"it has {library.names}, expected {wanted}")
        self.library = library

    def _want(self, env: Any) -> str:
        row, col, passenger, destination = _state(env)
        target, act = (destination, "dropoff") if passenger == 4 else (passenger, "pickup")
        return act if (row, col) == _stand(env, target) else f"go_to_{STANDS[target]}"

    def decide(self, decisions: Sequence[Decision]) -> list[Choice]:
        out = []
        for d in decisions:
            want = self.library.index(self._want(d.env.unwrapped))
            if not d.mask[want]:
                raise ValueError(f"TaxiOracle: option {self.library[want].name!r} is not eligible for "
                                 f"{d.agent!r} (mask {d.mask.tolist()})")
            out.append(Choice(want))
        return out
