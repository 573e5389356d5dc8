"""ScienceWorld (Wang et al. 2022) as a one-agent gyre environment: text in, text out.

The simulator (PyPI ``scienceworld``, a Scala program behind py4j; it needs ``java``) runs
30 task families, each in many variations. This module wraps three task graphs whose
sub-tasks a scripted option can do reliably from the simulator's state, each with its own
milestones, options, trap and oracle order:

- *find* (``find-living-thing``, ``find-animal``, ``find-plant``): "focus on a living thing
  (an animal, a plant), then move it to the <colour> box in the <room>";
- *paint* (``chemistry-mix-paint-secondary-color``): "use chemistry to create violet paint,
  then focus on it" — walk to the paints, pour the two ingredients into an empty container,
  mix it, focus on the result;
- *lifespan* (``lifespan-longest-lived``): "the animals are in the 'outside' location; focus
  on the one with the longest life span" — walk there, focus on it (a lookup table of life spans).

- **Milestones** are read from the simulator's own goal progress (``getGoalProgressStr``):
  its sequential subgoals (find: ``focused``, the right kind of thing is focused on, and
  ``in_box``, it is in the answer box, which completes the task at score 100; paint and
  lifespan: ``focused``, which completes it) and some of its optional ones (find:
  ``picked_up``, ``at_box``; paint: ``at_paints``, ``combined`` — the ingredients alone in
  one container — and ``mixed``; lifespan: ``at_animals``). Never the agent's text.
- **Observation**: a Dict of the simulator's text reply (``text``, a gymnasium ``Text``
  the manager's NumericView drops) and the agent's room (``room``, one-hot for the
  manager). **Action**: a command, as text (``open door to kitchen``); the admissible
  ones are ``env.unwrapped.valid_actions()``.
- **Task seeds → variations**: seeds of the training range (≥ 2^31) draw the
  simulator's *train* variations, validation seeds ([2^30, 2^31)) its *dev* ones, and the
  seeds ``gyre-ma eval`` and the benchmarks use (< 2^30) its *test* ones: seed ``s`` is
  ``split[s % len(split)]``. Held-out figures are therefore on variations training never saw.

One JVM serves every env of a process (each env has its own simulator instance on it):
starting one costs about a second and a few hundred MB.
"""

from __future__ import annotations

import json
import re
import string
import tempfile
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

try:
    from scienceworld import ScienceWorldEnv as _Simulator
except ImportError as exc:  # an optional dependency: say which extra brings it
    raise ImportError(f"the ScienceWorld env needs the scienceworld package and java ({exc}); "
                      "install it with: pip install 'gyre-ma[scienceworld]'") from exc

from gyre_ma.envs.adapters import GyreAdapter, from_pettingzoo
from gyre_ma.options.decision import Choice, Decision
from gyre_ma.options.graph import TaskGraph
from gyre_ma.options.library import OptionLibrary
from gyre_ma.options.option import CANNOT_PROCEED, Option, OptionContext

FIND_FAMILIES = ("find-living-thing", "find-animal", "find-plant")
"""The *find* families: one task graph and library, three kinds of target."""
PAINT_FAMILY = "chemistry-mix-paint-secondary-color"
LIFESPAN_FAMILY = "lifespan-longest-lived"
FAMILIES = (*FIND_FAMILIES, PAINT_FAMILY, LIFESPAN_FAMILY)
"""The ScienceWorld task families this env wraps; :data:`GRAPH_OF` says which task graph
(and option library) each plays."""
GRAPH_OF = {**{f: "find" for f in FIND_FAMILIES}, PAINT_FAMILY: "paint", LIFESPAN_FAMILY: "lifespan"}

ROOMS = ("art studio", "bathroom", "bedroom", "foundry", "greenhouse", "hallway", "kitchen", "living room",
         "outside", "workshop")

DOORS: dict[str, tuple[str, ...]] = {
    "hallway": ("art studio", "bedroom", "greenhouse", "kitchen", "living room", "workshop"),
    "kitchen": ("bathroom", "hallway", "outside"),
    "greenhouse": ("hallway", "outside"),
    "outside": ("foundry", "greenhouse", "kitchen"),
    "art studio": ("hallway",), "bedroom": ("hallway",), "living room": ("hallway",), "workshop": ("hallway",),
    "bathroom": ("kitchen",), "foundry": ("outside",),
}
"""ScienceWorld's house: which rooms a door joins (the same in every variation). Options
plan on it and check each door in the room's own description before using it."""

TRAINING_SEEDS = 1 << 31
VALIDATION_SEEDS = 1 << 30
"""Task-seed ranges of ``gyre_ma.roles`` (training ≥ 2^31, validation [2^30, 2^31), eval
below): copied, since an env may not import the core (a test keeps them equal)."""

OBSERVATION_CHARS = string.printable
ACTION_CHARS = string.ascii_letters + string.digits + " -'.,()"
MAX_COMMAND = 160
MAX_TEXT = 4096
DEFAULT_MAX_CYCLES = 60

_ROOM = re.compile(r"called the ([a-z ]+?)\.")
_BOX = re.compile(r"move it to the (\w+) box in the ([a-z ]+?)\.")
_RESULT = re.compile(r"\(([a-z ]+)\)")
_SAME_ROOM = "be in same location as "
_TASK_PLACE = re.compile(r"in the '([a-z ]+)' location")


# ====================================================================== the simulator
_HOST: _Simulator | None = None


def _new_simulator() -> Any:
    """A fresh simulator instance on this process's JVM (started on first use)."""
    global _HOST
    if _HOST is None:
        _HOST = _Simulator("", envStepLimit=10**9)
    return _HOST._gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()


_SPLITS: dict[str, dict[str, list[int]]] = {}


def variation_splits(family: str) -> dict[str, list[int]]:
    """The simulator's train / dev / test variations of ``family``."""
    if family not in _SPLITS:
        server = _new_simulator()
        server.load(family, 0, "", False)
        _SPLITS[family] = {"train": list(server.getVariationsTrain()), "dev": list(server.getVariationsDev()),
                           "test": list(server.getVariationsTest())}
    return _SPLITS[family]


def variation(family: str, seed: int) -> int:
    """The variation a task seed plays (see the module docstring)."""
    split = "train" if seed >= TRAINING_SEEDS else "dev" if seed >= VALIDATION_SEEDS else "test"
    pool = variation_splits(family)[split]
    return pool[seed % len(pool)]


def parse_goal_progress(text: str) -> dict[str, list[tuple[str, bool]]]:
    """The simulator's goal-progress report as ``{"sequential": [(description, done)],
    "optional": [...]}``, in its own order."""
    out: dict[str, list[tuple[str, bool]]] = {"sequential": [], "optional": []}
    section = None
    for line in text.splitlines():
        if line.startswith("Sequential Subgoals"):
            section = "sequential"
        elif line.startswith("Unordered and Optional Subgoals"):
            section = "optional"
        elif section is not None:
            parts = line.split("\t")
            if len(parts) >= 4 and parts[0].strip().isdigit() and parts[1] in ("true", "false"):
                out[section].append((parts[3].strip(), parts[1] == "true"))
    return out


def canonical(text: str) -> str:
    """``text`` with each list of tab-indented items (what a room holds, its doors) sorted,
    an item's deeper-indented lines kept with it: the simulator lists them in an order that
    changes from one load of a variation to the next, though the world does not."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("\t"):
            out.append(lines[i])
            i += 1
            continue
        j = i
        while j < len(lines) and lines[j].startswith("\t"):
            j += 1
        level = min(len(x) - len(x.lstrip("\t")) for x in lines[i:j])
        blocks: list[list[str]] = []
        for line in lines[i:j]:
            if len(line) - len(line.lstrip("\t")) == level or not blocks:
                blocks.append([line])
            else:
                blocks[-1].append(line)
        out.extend(line for block in sorted(blocks) for line in block)
        i = j
    return "\n".join(out)


@dataclass(frozen=True)
class Thing:
    """One object of the simulator's object tree."""

    uuid: str
    name: str
    type: str
    room: str
    parent: str
    """The uuid of what holds it (a room, a container, the agent's inventory)."""
    alive: bool
    kind: str
    """Its life form (``pea``, ``turtle``), empty for a thing that never lived."""


class ScienceWorldParallel(ParallelEnv):
    """One ScienceWorld task family as a one-agent PettingZoo ``ParallelEnv`` (wrapped by
    :func:`make_env` into a gyre env). ``reset(seed)`` loads the seed's variation."""

    metadata = {"name": "scienceworld_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, family: str = "find-living-thing", *, max_cycles: int = DEFAULT_MAX_CYCLES) -> None:
        if family not in FAMILIES:
            raise ValueError(f"scienceworld_v0: family {family!r} is not wrapped; expected one of {list(FAMILIES)}")
        self.family = family
        self.max_cycles = max_cycles
        self.possible_agents = ["agent_0"]
        self.agents: list[str] = []
        self._obs_space = spaces.Dict({
            "text": spaces.Text(MAX_TEXT, min_length=0, charset=OBSERVATION_CHARS),
            "room": spaces.Discrete(len(ROOMS)),
        })
        self._act_space = spaces.Text(MAX_COMMAND, min_length=1, charset=ACTION_CHARS)
        self._server: Any = None
        self._tree_dir: tempfile.TemporaryDirectory | None = None
        self.variation = -1
        self.episode = 0
        self._clear()

    def _clear(self) -> None:
        self.look = ""
        self.task = ""
        self.score = 0
        self.failed = False
        self.completed = False
        self.subgoals: dict[str, list[tuple[str, bool]]] = {"sequential": [], "optional": []}
        self._moves = 0
        self._cache: dict[str, tuple[int, Any]] = {}
        self.memory: dict[str, Any] = {}
        """Per-episode scratch of the scripted options (the target they chose)."""

    # ------------------------------------------------------------------ ParallelEnv API
    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if self._server is None:
            self._server = _new_simulator()
            self._tree_dir = tempfile.TemporaryDirectory(prefix="gyre-scienceworld-")
        if seed is None:
            seed = self.variation_seed if self.variation >= 0 else 0
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"scienceworld_v0: reset(seed) needs an int >= 0, got {seed!r}")
        self.variation_seed = int(seed)
        self.variation = variation(self.family, int(seed))
        self._server.load(self.family, self.variation, "", False)
        self._server.reset()
        self._clear()
        self.episode += 1
        self.task = str(self._server.getTaskDescription())
        text = str(self._server.step("look around"))
        self._observe()
        self.agents = list(self.possible_agents)
        return {"agent_0": self._obs(text)}, {"agent_0": self._info()}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        if not self.agents:
            raise ValueError("scienceworld_v0: step() called with no live agent; call reset() first")
        command = actions.get("agent_0")
        if not isinstance(command, str):
            raise ValueError(f"scienceworld_v0: the action of 'agent_0' must be a command string, got {command!r}")
        before = self.score
        text = str(self._server.step(command))
        self._observe()
        terminated = self.completed or self.failed
        if terminated:
            self.agents = []
        return ({"agent_0": self._obs(text)}, {"agent_0": float(self.score - before)}, {"agent_0": terminated},
                {"agent_0": False}, {"agent_0": self._info()})

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._act_space

    def close(self) -> None:
        if self._tree_dir is not None:
            self._tree_dir.cleanup()
            self._tree_dir = None
        self._server = None

    # ------------------------------------------------------------------ what options read
    @property
    def room(self) -> str:
        match = _ROOM.search(self.look)
        return match.group(1) if match else ""

    @property
    def answer_box(self) -> tuple[str, str]:
        """(colour, room) of the answer box the task description names."""
        match = _BOX.search(self.task)
        if match is None:
            raise ValueError(f"scienceworld_v0: task {self.task!r} names no '<colour> box in the <room>'")
        return match.group(1), match.group(2)

    def valid_actions(self) -> list[str]:
        """The simulator's admissible commands in the current state (~40 ms: asked lazily)."""
        return self._cached("valid", lambda: [str(a) for a in self._server.getValidActionObjectCombinations()])

    def referents(self, uuid: str) -> list[str]:
        """The names the parser accepts for object ``uuid``."""
        lut = self._cached("lut", lambda: json.loads(str(self._server.getAllObjectIdsTypesReferentsLUTJSON())))
        return [str(r) for r in lut.get(uuid, {}).get("referents", [])]

    def things(self) -> list[Thing]:
        """Every object of the world with its room and holder, from the simulator's object tree."""
        return self._cached("tree", self._read_tree)

    def inventory_uuid(self) -> str:
        """The uuid of the agent's inventory (what holds a picked-up object)."""
        return self._cached("inventory", lambda: next(t.uuid for t in self.things() if t.name == "inventory"))

    # ------------------------------------------------------------------ internals
    def _cached(self, key: str, compute: Any) -> Any:
        hit = self._cache.get(key)
        if hit is not None and hit[0] == self._moves:
            return hit[1]
        value = compute()
        self._cache[key] = (self._moves, value)
        return value

    def _read_tree(self) -> list[Thing]:
        message = self._server.getObjectTree(self._tree_dir.name)
        if message:
            raise RuntimeError(f"scienceworld_v0: the simulator could not write its object tree: {message}")
        tree = json.loads((Path(self._tree_dir.name) / "objectTree.json").read_text())
        out: list[Thing] = []
        stack = [(tree, "", "")]
        while stack:
            node, room, parent = stack.pop()
            for child in (node.get("contents") or {}).values():
                here = room or child["name"]
                life = child.get("propLife")
                out.append(Thing(str(child["uuid"]), str(child["name"]), str(child.get("type") or ""), here,
                                 str(node.get("uuid", "")), bool(life) and not life.get("isDead", False),
                                 str((life or {}).get("lifeformType", ""))))
                stack.append((child, here, child["uuid"]))
        return out

    def _observe(self) -> None:
        server = self._server
        self._moves += 1
        self.look = canonical(str(server.freeActionLook()))
        self.score = int(round(100 * float(server.getScore())))
        self.completed = bool(server.getCompleted())
        self.failed = self.score < 0
        self.subgoals = parse_goal_progress(str(server.getGoalProgressStr()))

    def _obs(self, text: str) -> dict[str, Any]:
        clean = "".join(c if c in OBSERVATION_CHARS else "?" for c in canonical(text))[:MAX_TEXT]
        room = ROOMS.index(self.room) if self.room in ROOMS else 0
        return {"text": clean, "room": room}

    def _info(self) -> dict[str, Any]:
        return {"score": self.score, "variation": self.variation, "task": self.task}


# ====================================================================== milestones
def _subgoal(env: ScienceWorldParallel, section: str, index: int) -> bool:
    goals = env.subgoals[section]
    return index < len(goals) and goals[index][1]


def _optional(env: ScienceWorldParallel, description: str) -> bool:
    return any(done for text, done in env.subgoals["optional"] if text == description)


def focused(env: ScienceWorldParallel) -> bool:
    """The simulator's first sequential subgoal: the agent focused on a thing of the kind asked."""
    return _subgoal(env, "sequential", 0)


def picked_up(env: ScienceWorldParallel) -> bool:
    """The simulator's optional subgoal 'Pick up object'."""
    return _optional(env, "Pick up object")


def at_box(env: ScienceWorldParallel) -> bool:
    """The simulator's optional subgoal 'Move to the location of the answer box'."""
    return _optional(env, "Move to the location of the answer box")


def in_box(env: ScienceWorldParallel) -> bool:
    """The simulator's last sequential subgoal: the thing is in the answer box (the task is complete)."""
    return _subgoal(env, "sequential", 1)


def find_graph() -> TaskGraph:
    """The find families' task graph: the thing can go into the box only once it was focused
    on and picked up and the agent has been where the box is."""
    return TaskGraph.from_spec({
        "goals": ["in_box"],
        "milestones": {
            "focused": {"description": "focus on a thing of the kind the task asks for",
                        "verifier": f"{__name__}:focused", "duration": 4.0},
            "picked_up": {"description": "pick up the thing", "verifier": f"{__name__}:picked_up",
                          "duration": 2.0},
            "at_box": {"description": "go to the room of the answer box", "verifier": f"{__name__}:at_box",
                       "duration": 4.0},
            "in_box": {"description": "move the thing into the answer box", "verifier": f"{__name__}:in_box",
                       "requires": ["focused", "picked_up", "at_box"], "duration": 1.0, "reward": 1.0},
        },
    })


def paint_names(env: ScienceWorldParallel) -> tuple[list[str], str]:
    """(the ingredient paints, the paint to make) of a paint task, as its goal progress names
    them: optional subgoals 'be in same location as <paint>' and the sequential subgoal
    'focus on the mixing result (<paint>)'."""
    goals = env.subgoals["sequential"]
    match = _RESULT.search(goals[0][0]) if goals else None
    if match is None:
        raise ValueError(f"scienceworld_v0: the goal progress of {env.family!r} names no mixing result: {goals!r}")
    result = match.group(1)
    ingredients = [text[len(_SAME_ROOM):] for text, _ in env.subgoals["optional"]
                   if text.startswith(_SAME_ROOM) and text[len(_SAME_ROOM):] != result]
    return ingredients, result


def at_paints(env: ScienceWorldParallel) -> bool:
    """The simulator's optional subgoals 'be in same location as <ingredient>', all of them."""
    ingredients, _ = paint_names(env)
    return bool(ingredients) and all(_optional(env, _SAME_ROOM + p) for p in ingredients)


def combined(env: ScienceWorldParallel) -> bool:
    """The simulator's optional subgoal 'have all ingredients alone in a single container'."""
    return _optional(env, "have all ingredients alone in a single container")


def mixed(env: ScienceWorldParallel) -> bool:
    """The simulator's optional subgoal 'be in same location as <result>': the mixed paint exists here."""
    return _optional(env, _SAME_ROOM + paint_names(env)[1])


def at_animals(env: ScienceWorldParallel) -> bool:
    """The simulator's optional subgoal 'Move to the location asked by the task'."""
    return _optional(env, "Move to the location asked by the task")


def paint_graph() -> TaskGraph:
    """The paint family's task graph: go where the paints are, pour the two ingredients
    alone into one container, mix it, focus on the result."""
    return TaskGraph.from_spec({
        "goals": ["focused"],
        "milestones": {
            "at_paints": {"description": "go to the room of the ingredient paints", "verifier": f"{__name__}:at_paints",
                          "duration": 4.0},
            "combined": {"description": "pour the ingredient paints into one empty container",
                         "verifier": f"{__name__}:combined", "requires": ["at_paints"], "duration": 2.0},
            "mixed": {"description": "mix the container", "verifier": f"{__name__}:mixed", "requires": ["combined"],
                      "duration": 1.0},
            "focused": {"description": "focus on the mixed paint", "verifier": f"{__name__}:focused",
                        "requires": ["mixed"], "duration": 1.0, "reward": 1.0},
        },
    })


def lifespan_graph() -> TaskGraph:
    """The lifespan family's task graph: go where the animals are, focus on the longest-lived."""
    return TaskGraph.from_spec({
        "goals": ["focused"],
        "milestones": {
            "at_animals": {"description": "go to the location the task names",
                           "verifier": f"{__name__}:at_animals", "duration": 4.0},
            "focused": {"description": "focus on the animal with the longest life span",
                        "verifier": f"{__name__}:focused", "requires": ["at_animals"], "duration": 1.0,
                        "reward": 1.0},
        },
    })


_GRAPHS = {"find": (find_graph, {"focused": focused, "picked_up": picked_up, "at_box": at_box, "in_box": in_box}),
           "paint": (paint_graph, {"at_paints": at_paints, "combined": combined, "mixed": mixed,
                                   "focused": focused}),
           "lifespan": (lifespan_graph, {"at_animals": at_animals, "focused": focused})}


def make_env(family: str = "find-living-thing", *, max_cycles: int = DEFAULT_MAX_CYCLES) -> GyreAdapter:
    """One ScienceWorld task family (see :data:`FAMILIES`) as a one-agent gyre env (agent ``agent_0``)."""
    if isinstance(max_cycles, bool) or not isinstance(max_cycles, int) or max_cycles < 1:
        raise ValueError(f"scienceworld_v0: max_cycles must be an int >= 1, got {max_cycles!r}")
    raw = ScienceWorldParallel(family, max_cycles=max_cycles)
    graph, milestones = _GRAPHS[GRAPH_OF[family]]
    return from_pettingzoo(raw, milestones=milestones, graph=graph(), max_cycles=max_cycles)


parallel_env = make_env


# ====================================================================== scripted options
def _path(start: str, goal: str) -> list[str]:
    """Rooms to walk through from ``start`` to ``goal`` (breadth-first on :data:`DOORS`)."""
    came: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        room = queue.popleft()
        if room == goal:
            break
        for nxt in DOORS.get(room, ()):
            if nxt not in came:
                came[nxt] = room
                queue.append(nxt)
    if goal not in came:
        return []
    path, room = [], goal
    while room != start:
        path.append(room)
        room = came[room]
    return path[::-1]


def walk_to(env: ScienceWorldParallel, room: str) -> str | None:
    """The next command towards ``room`` (open the door, then go through), or None when the
    agent is there; CANNOT_PROCEED when the way is not in the room's description."""
    here = env.room
    if here == room:
        return None
    path = _path(here, room)
    if not path or f"A door to the {path[0]} (" not in env.look:
        return CANNOT_PROCEED
    if f"A door to the {path[0]} (that is closed)" in env.look:
        return f"open door to {path[0]}"
    return f"go to {path[0]}"


def _wanted(env: ScienceWorldParallel, thing: Thing) -> bool:
    if not thing.alive or thing.name.startswith("bee"):  # the bees are shut in their hive
        return False
    plant = thing.type == "plant"
    return {"find-plant": plant, "find-animal": not plant}.get(env.family, True)


def target(env: ScienceWorldParallel) -> tuple[Thing, Thing]:
    """The thing the options fetch this episode and what to carry it in (a plant's flower
    pot, else the thing itself): the living thing of the asked kind in the nearest room,
    read from the simulator's object tree. Chosen once per episode."""
    if "target" not in env.memory:
        things = env.things()
        by_uuid = {t.uuid: t for t in things}
        candidates = [t for t in things if _wanted(env, t)]
        if not candidates:
            raise ValueError(f"scienceworld_v0: variation {env.variation} of {env.family!r} has no living thing "
                             "of the kind asked in its object tree")
        here = env.room
        def key(t: Thing) -> tuple:  # never the uuid: it changes from one load of a variation to the next
            holder = by_uuid.get(t.parent)
            return len(_path(here, t.room)) if t.room != here else 0, t.name, t.kind, holder.name if holder else ""

        thing = min(candidates, key=key)
        holder = by_uuid.get(thing.parent)
        carry = holder if thing.type == "plant" and holder is not None and "pot" in holder.name else thing
        env.memory["target"] = (thing, carry)
    return env.memory["target"]


def _command(env: ScienceWorldParallel, uuid: str, form: str) -> str | None:
    """``form`` (``"focus on {}"``) with a name of ``uuid`` that makes an admissible command."""
    valid = set(env.valid_actions())
    for name in env.referents(uuid):
        command = form.format(name)
        if command in valid:
            return command
    return None


def _raw(ctx: OptionContext) -> ScienceWorldParallel:
    return ctx.env.unwrapped


def _ambiguous(env: ScienceWorldParallel, ctx: OptionContext) -> bool:
    return "Ambiguous request" in str(ctx.observation.get("text", "")) if isinstance(ctx.observation, dict) else False


def focus_thing(ctx: OptionContext) -> Any:
    """Walk to the thing and focus on it — only on it: a wrong focus ends the task."""
    env = _raw(ctx)
    if _ambiguous(env, ctx):
        return "0"
    thing, _ = target(env)
    return walk_to(env, thing.room) or _command(env, thing.uuid, "focus on {}") or CANNOT_PROCEED


def pick_up_thing(ctx: OptionContext) -> Any:
    """Walk to the thing and pick it up (a plant with its flower pot)."""
    env = _raw(ctx)
    if _ambiguous(env, ctx):
        return "0"
    _, carry = target(env)
    return walk_to(env, carry.room) or _command(env, carry.uuid, "pick up {}") or CANNOT_PROCEED


def go_to_box(ctx: OptionContext) -> Any:
    """Walk to the room of the answer box."""
    env = _raw(ctx)
    return walk_to(env, env.answer_box[1]) or CANNOT_PROCEED


def put_in_box(ctx: OptionContext) -> Any:
    """Walk (back) to the answer box and move the carried thing into it."""
    env = _raw(ctx)
    if _ambiguous(env, ctx):
        return "0"
    _, carry = target(env)
    colour, room = env.answer_box
    return walk_to(env, room) or _command(env, carry.uuid, f"move {{}} to {colour} box") or CANNOT_PROCEED


def focus_first(ctx: OptionContext) -> Any:
    """A careless focus: on the first object the room lists. Usually the wrong one, which
    ends the task (the trap of this library)."""
    env = _raw(ctx)
    for line in env.look.splitlines():
        item = line.strip()
        if item.startswith(("a ", "an ")) and "door" not in item:
            name = re.split(r"[(.,]", item.split(" ", 1)[1])[0].strip()
            return f"focus on {name}"
    return CANNOT_PROCEED


def look_around(ctx: OptionContext) -> str:
    """Look around (wasteful: the observation already says what is here)."""
    return "look around"


def wander(ctx: OptionContext) -> Any:
    """Walk to a random neighbouring room (wasteful)."""
    env = _raw(ctx)
    if "wander_to" not in ctx.memory:
        rooms = [r for r in DOORS.get(env.room, ()) if f"A door to the {r} (" in env.look]
        if not rooms:
            return CANNOT_PROCEED
        ctx.memory["wander_to"] = rooms[int(ctx.rng.integers(len(rooms)))]
    return walk_to(env, ctx.memory["wander_to"]) or "look around"


def one_step(ctx: OptionContext) -> bool:
    return ctx.steps >= 1


def arrived(ctx: OptionContext) -> bool:
    return "wander_to" in ctx.memory and _raw(ctx).room == ctx.memory["wander_to"]


def _find_library() -> OptionLibrary:
    library = OptionLibrary("scienceworld_find", find_graph())
    library.add(Option("focus_thing", focus_thing, milestone="focused", max_steps=12,
                       description="walk to a living thing of the kind asked and focus on it"))
    library.add(Option("focus_first", focus_first, milestone="focused", max_steps=1,
                       description="focus on the first object in view"))
    library.add(Option("pick_up_thing", pick_up_thing, milestone="picked_up", max_steps=12,
                       description="walk to the thing and pick it up"))
    library.add(Option("go_to_box", go_to_box, milestone="at_box", max_steps=12,
                       description="walk to the room of the answer box"))
    library.add(Option("put_in_box", put_in_box, milestone="in_box", max_steps=12,
                       description="move the thing into the answer box"))
    return library


# ---------------------------------------------------------------------- paint
def _loose(env: ScienceWorldParallel, thing: Thing, by_uuid: dict[str, Thing]) -> bool:
    """``thing`` lies in its room, on the floor, a table or a desk (not shut in a cupboard)."""
    holder = by_uuid.get(thing.parent)
    return holder is not None and (holder.name == thing.room or holder.name in ("table", "desk"))


def paint_room(env: ScienceWorldParallel) -> str:
    """The room where the ingredient paints stand in the open (the nearest, if several)."""
    if "paint_room" not in env.memory:
        ingredients, _ = paint_names(env)
        things = env.things()
        by_uuid = {t.uuid: t for t in things}
        rooms = {t.room for t in things if t.name in ingredients and by_uuid.get(t.parent)
                 and _loose(env, by_uuid[t.parent], by_uuid)}
        if not rooms:
            raise ValueError(f"scienceworld_v0: variation {env.variation} of {env.family!r} has no ingredient paint "
                             f"{ingredients} in the open")
        here = env.room
        env.memory["paint_room"] = min(rooms, key=lambda r: (len(_path(here, r)) if r != here else 0, r))
    return env.memory["paint_room"]


def mixer(env: ScienceWorldParallel) -> Thing | None:
    """The empty container the paints go into: one in the open in the paint room (chosen once)."""
    if "mixer" not in env.memory:
        things = env.things()
        by_uuid = {t.uuid: t for t in things}
        room = paint_room(env)
        empty = [t for t in things if t.room == room and _loose(env, t, by_uuid)
                 and any(r.endswith("containing nothing") for r in env.referents(t.uuid))]
        if not empty:
            return None
        env.memory["mixer"] = min(empty, key=lambda t: (t.name, t.type))
    return env.memory["mixer"]


def _name(env: ScienceWorldParallel, thing: Thing) -> str:
    """The most specific name of ``thing`` (``glass cup containing red paint``): the
    simulator's admissible-action list spells objects differently from what its parser
    takes, so the paint options speak plainly and answer an ambiguity with its first reading."""
    return max(env.referents(thing.uuid) or [thing.name], key=lambda r: (len(r), r))


def go_to_paints(ctx: OptionContext) -> Any:
    """Walk to the room of the ingredient paints."""
    env = _raw(ctx)
    return walk_to(env, paint_room(env)) or CANNOT_PROCEED


def pour_paints(ctx: OptionContext) -> Any:
    """Pour each ingredient paint not poured yet (one standing in the open) into the empty container."""
    env = _raw(ctx)
    if _ambiguous(env, ctx):
        return "0"
    cup = mixer(env)
    if cup is None:
        return CANNOT_PROCEED
    ingredients, _ = paint_names(env)
    things = env.things()
    poured = {t.name for t in things if t.parent == cup.uuid}
    for paint in ingredients:
        if paint not in poured and any(t.name == paint and t.room == env.room for t in things):
            return f"pour {paint} in {_name(env, cup)}"
    return CANNOT_PROCEED


def mix_paints(ctx: OptionContext) -> Any:
    """Mix the container holding the ingredients."""
    env = _raw(ctx)
    if _ambiguous(env, ctx):
        return "0"
    cup = mixer(env)
    return f"mix {_name(env, cup)}" if cup is not None else CANNOT_PROCEED


def focus_result(ctx: OptionContext) -> Any:
    """Focus on the mixed paint."""
    env = _raw(ctx)
    if _ambiguous(env, ctx):
        return "0"
    _, result = paint_names(env)
    return f"focus on {result}" if any(t.name == result and t.room == env.room for t in env.things()) \
        else CANNOT_PROCEED


def focus_ingredient(ctx: OptionContext) -> Any:
    """A careless focus: on an ingredient paint in view, as if it were the answer. It ends
    the task (the trap of this library)."""
    env = _raw(ctx)
    if _ambiguous(env, ctx):
        return "0"
    ingredients, _ = paint_names(env)
    seen = sorted({t.name for t in env.things() if t.name in ingredients and t.room == env.room})
    return f"focus on {seen[0]}" if seen else CANNOT_PROCEED


def _paint_library() -> OptionLibrary:
    library = OptionLibrary("scienceworld_paint", paint_graph())
    library.add(Option("go_to_paints", go_to_paints, milestone="at_paints", max_steps=12,
                       description="walk to the room of the ingredient paints"))
    library.add(Option("pour_paints", pour_paints, milestone="combined", max_steps=4,
                       description="pour the ingredient paints into one empty container"))
    library.add(Option("mix_paints", mix_paints, milestone="mixed", max_steps=2, description="mix the container"))
    library.add(Option("focus_result", focus_result, milestone="focused", max_steps=2,
                       description="focus on the mixed paint"))
    library.add(Option("focus_ingredient", focus_ingredient, done=one_step, max_steps=1,
                       description="focus on an ingredient paint"))
    return library


# ---------------------------------------------------------------------- lifespan
LIFESPANS = {"ant": 0.1, "bee": 0.1, "dragonfly": 0.4, "chameleon": 3.0, "mouse": 4.0, "hedgehog": 5.0, "rabbit": 9.0,
             "common toad": 10.0, "chipmunk": 12.0, "wolf": 14.0, "beaver": 16.0, "brown bear": 30.0,
             "crocodile": 45.0, "elephant": 70.0, "parrot": 80.0, "giant tortoise": 150.0}
"""Typical life spans in years of the animals the lifespan tasks use (the values the
simulator's animals carry): what the scripted option knows, as a player would."""


def task_place(env: ScienceWorldParallel) -> str:
    """The location the lifespan task names (``The animals are in the 'outside' location``)."""
    match = _TASK_PLACE.search(env.task)
    if match is None:
        raise ValueError(f"scienceworld_v0: task {env.task!r} names no '<place>' location")
    return match.group(1)


def _animals_here(env: ScienceWorldParallel) -> list[Thing]:
    return sorted((t for t in env.things() if t.alive and t.room == env.room and t.kind in LIFESPANS),
                  key=lambda t: (t.name, t.kind))


def go_to_animals(ctx: OptionContext) -> Any:
    """Walk to the location the task names."""
    env = _raw(ctx)
    return walk_to(env, task_place(env)) or CANNOT_PROCEED


def focus_longest_lived(ctx: OptionContext) -> Any:
    """Focus on the animal here whose kind lives longest (by :data:`LIFESPANS`)."""
    env = _raw(ctx)
    animals = _animals_here(env)
    if not animals:
        return CANNOT_PROCEED
    best = max(animals, key=lambda t: LIFESPANS[t.kind])
    return _command(env, best.uuid, "focus on {}") or CANNOT_PROCEED


def focus_first_animal(ctx: OptionContext) -> Any:
    """A careless focus: on the animal listed first, whatever its life span. Usually the
    wrong one, which ends the task (the trap of this library)."""
    env = _raw(ctx)
    animals = _animals_here(env)
    return (_command(env, animals[0].uuid, "focus on {}") if animals else None) or CANNOT_PROCEED


def _lifespan_library() -> OptionLibrary:
    library = OptionLibrary("scienceworld_lifespan", lifespan_graph())
    library.add(Option("go_to_animals", go_to_animals, milestone="at_animals", max_steps=12,
                       description="walk to the location the task names"))
    library.add(Option("focus_longest_lived", focus_longest_lived, milestone="focused", max_steps=2,
                       description="focus on the animal with the longest life span"))
    library.add(Option("focus_first_animal", focus_first_animal, milestone="focused", max_steps=1,
                       description="focus on the first animal in view"))
    return library


_LIBRARIES = {"find": _find_library, "paint": _paint_library, "lifespan": _lifespan_library}


def make_library(env: Any = None, *, family: str | None = None) -> OptionLibrary:
    """The scripted library of ``family`` (default: the family ``env`` plays, else the find
    families'): one option per milestone, a trap (a careless focus that usually fails the
    task) and two wasteful options (``look_around``, ``wander``)."""
    if family is None:
        family = getattr(getattr(env, "unwrapped", env), "family", FIND_FAMILIES[0])
    if family not in FAMILIES:
        raise ValueError(f"scienceworld library: family {family!r} is not wrapped; expected one of {list(FAMILIES)}")
    library = _LIBRARIES[GRAPH_OF[family]]()
    library.add(Option("look_around", look_around, done=one_step, max_steps=1, description="look around"))
    library.add(Option("wander", wander, done=arrived, max_steps=3, description="walk to a neighbouring room"))
    return library.validate()


# ====================================================================== LLM option helpers
def door_actions(ctx: OptionContext) -> list[str]:
    """The movement commands of the agent's room: open each closed door, go through each
    open one (what an LLM-backed navigation option chooses among)."""
    env = _raw(ctx)
    out = []
    for room in DOORS.get(env.room, ()):
        if f"A door to the {room} (that is closed)" in env.look:
            out.append(f"open door to {room}")
        elif f"A door to the {room} (" in env.look:
            out.append(f"go to {room}")
    return out or ["look around"]


def _in_view(env: ScienceWorldParallel) -> tuple[list[Thing], dict[str, Thing]]:
    things = env.things()
    by_uuid = {t.uuid: t for t in things}
    return [t for t in things if t.room == env.room and t.name != env.room], by_uuid


def _containers(env: ScienceWorldParallel) -> list[Thing]:
    here, by_uuid = _in_view(env)
    return sorted((t for t in here if _loose(env, t, by_uuid)
                   and any(" containing " in r for r in env.referents(t.uuid))), key=lambda t: (t.name, t.type))


def pour_actions(ctx: OptionContext) -> list[str]:
    """Pour each paint in view into each container in the open (what an LLM-backed
    ``combined`` option chooses among)."""
    env = _raw(ctx)
    here, _ = _in_view(env)
    paints = sorted({t.name for t in here if t.name.endswith(" paint")})
    return [f"pour {p} in {_name(env, c)}" for p in paints for c in _containers(env)] or ["look around"]


def mix_actions(ctx: OptionContext) -> list[str]:
    """Mix each container in the open (an LLM-backed ``mixed`` option)."""
    env = _raw(ctx)
    return [f"mix {_name(env, c)}" for c in _containers(env)] or ["look around"]


def focus_actions(ctx: OptionContext) -> list[str]:
    """Focus on each paint or animal in view (an LLM-backed ``focused`` option: a wrong
    focus ends the task, so this is where the model's knowledge is tested)."""
    env = _raw(ctx)
    here, _ = _in_view(env)
    names = sorted({t.name for t in here if t.name.endswith(" paint") or (t.alive and t.kind in LIFESPANS)})
    return [f"focus on {n}" for n in names] or ["look around"]


def action_text(ctx: OptionContext, text: str) -> str:
    """An admissible action's text is the env action itself."""
    return text


def observation_text(ctx: OptionContext) -> str:
    """The task and the room as the simulator describes them."""
    env = _raw(ctx)
    return f"{env.task} {env.look}"


# ====================================================================== oracle
ORDERS = {"find": ("focus_thing", "pick_up_thing", "go_to_box", "put_in_box"),
          "paint": ("go_to_paints", "pour_paints", "mix_paints", "focus_result"),
          "lifespan": ("go_to_animals", "focus_longest_lived")}
"""The order a competent player uses in each task graph."""


class OracleManager:
    """The order a competent player uses (:data:`ORDERS`, picked by the options the library
    has): the first eligible option of the order; never the trap or a wasteful option while
    one of these is eligible."""

    order = ORDERS["find"]

    def __init__(self, *, library: OptionLibrary) -> None:
        order = next((o for o in ORDERS.values() if all(n in library.names for n in o)), None)
        if order is None:
            raise ValueError(f"scienceworld oracle: library {library.name!r} has none of the oracle orders "
                             f"{list(ORDERS.values())} complete; it has {library.names}")
        self.order = order
        self._order = [library.index(n) for n in order]

    def decide(self, decisions: Sequence[Decision]) -> list[Choice]:
        out = []
        for d in decisions:
            eligible = [i for i in self._order if d.mask[i]] or [int(i) for i in np.flatnonzero(d.mask)]
            if not eligible:
                raise ValueError(f"scienceworld oracle: decision for {d.agent!r} has no eligible option "
                                 f"(mask {d.mask.tolist()})")
            out.append(Choice(eligible[0]))
        return out
