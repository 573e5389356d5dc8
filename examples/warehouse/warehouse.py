"""Your own environment, from scratch: a two-robot warehouse as a PettingZoo ParallelEnv,
wrapped for gyre-ma, with scripted options. A worked example of the README's "Your own
environment"; run it from this folder (gyre-ma imports ``warehouse`` from there)::

    gyre-ma check warehouse.yaml
    gyre-ma train warehouse.yaml
    gyre-ma eval runs/warehouse --episodes 200 --trust-config     # held-out
    gyre-ma eval oracle.yaml --episodes 200                        # the heuristic, same seeds

A SIZE x SIZE grid (seeded layout) has an assembly bench on the left and stations A, B, C on
the right. The product needs ``units`` of each part: A and B delivered → assemble AB at the
bench (ASSEMBLE_TICKS ``assemble`` actions); C delivered and AB → assemble the product (the
goal). Robots carry one item at a time. Actions: 0 noop, 1 N, 2 S, 3 E, 4 W, 5 pick, 6 drop,
7 assemble. Reward: +1 to both robots when the product is done. Two robots fetching different
parts at once finish far sooner than one robot doing everything: the order is the manager's
to learn. (Written by a helper playing a new user, reading only the README; session 50.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from gyre_ma.envs.adapters import from_pettingzoo
from gyre_ma.options import Option, OptionContext, OptionLibrary, TaskGraph
from gyre_ma.options.decision import Choice, Decision
from gyre_ma.options.option import Behaviour

PARTS = ("A", "B", "C")
NOOP, N, S, E, W, PICK, DROP, ASSEMBLE = range(8)
ASSEMBLE_TICKS = 3
_CARRY = {None: 0, "A": 1, "B": 2, "C": 3}


class WarehouseEnv(ParallelEnv):
    metadata = {"name": "warehouse_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, size: int = 12, units: int = 2, max_cycles: int = 300) -> None:
        self.size, self.units, self.max_cycles = int(size), int(units), int(max_cycles)
        self.possible_agents = ["robot_0", "robot_1"]
        self.agents: list[str] = []
        self._obs_space = spaces.Box(0.0, 1.0, shape=(28,), dtype=np.float32)
        self._act_space = spaces.Discrete(8)
        self._rng = np.random.default_rng()
        self._layout(self._rng)

    # ---------------------------------------------------------------- API
    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._act_space

    def _layout(self, rng: np.random.Generator) -> None:
        n = self.size
        left = max(3, n // 4)
        right0 = n - max(4, n // 3)
        self.bench = (int(rng.integers(0, left)), int(rng.integers(0, n)))
        cells = rng.choice((n - right0) * n, size=3, replace=False)
        self.stations = {p: (right0 + int(c) // n, int(c) % n) for p, c in zip(PARTS, cells)}
        self.pos = {a: (int(rng.integers(0, n // 2)), int(rng.integers(0, n))) for a in self.possible_agents}
        self.carry: dict[str, str | None] = {a: None for a in self.possible_agents}
        self.delivered = {p: 0 for p in PARTS}
        self.stock = {p: 0 for p in PARTS}
        self.delivered_by = {a: {p: 0 for p in PARTS} for a in self.possible_agents}
        self.progress_ab = 0
        self.progress_p = 0
        self.ab_done = False
        self.product = False
        self.credit: dict[str, str] = {}
        self.t = 0

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._layout(self._rng)
        self.agents = list(self.possible_agents)
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]):
        self.t += 1
        for a in self.agents:
            self._act(a, int(actions[a]))
        rew = {a: (1.0 if self.product else 0.0) for a in self.agents}
        term = {a: self.product for a in self.agents}
        trunc = {a: (self.t >= self.max_cycles and not self.product) for a in self.agents}
        obs = {a: self._obs(a) for a in self.agents}
        infos = {a: {} for a in self.agents}
        if self.product or self.t >= self.max_cycles:
            self.agents = []
        return obs, rew, term, trunc, infos

    def _act(self, a: str, act: int) -> None:
        x, y = self.pos[a]
        n = self.size
        if act == N:
            y = max(0, y - 1)
        elif act == S:
            y = min(n - 1, y + 1)
        elif act == E:
            x = min(n - 1, x + 1)
        elif act == W:
            x = max(0, x - 1)
        elif act == PICK:
            if self.carry[a] is None:
                for p, st in self.stations.items():
                    if st == (x, y):
                        self.carry[a] = p
        elif act == DROP:
            p = self.carry[a]
            if p is not None and (x, y) == self.bench:
                self.carry[a] = None
                self.stock[p] += 1
                self.delivered[p] += 1
                self.delivered_by[a][p] += 1
                if self.delivered[p] == self.units:
                    self.credit[f"delivered_{p}"] = a
        elif act == ASSEMBLE and (x, y) == self.bench:
            u = self.units
            if not self.ab_done and self.stock["A"] >= u and self.stock["B"] >= u:
                self.progress_ab += 1
                if self.progress_ab >= ASSEMBLE_TICKS:
                    self.ab_done = True
                    self.stock["A"] -= u
                    self.stock["B"] -= u
                    self.credit["assembled_AB"] = a
            elif self.ab_done and not self.product and self.stock["C"] >= u:
                self.progress_p += 1
                if self.progress_p >= ASSEMBLE_TICKS:
                    self.product = True
                    self.stock["C"] -= u
                    self.credit["product_done"] = a
        self.pos[a] = (x, y)

    def _obs(self, a: str) -> np.ndarray:
        n1 = float(self.size - 1)
        other = [b for b in self.possible_agents if b != a][0]
        v = [self.pos[a][0] / n1, self.pos[a][1] / n1, self.pos[other][0] / n1, self.pos[other][1] / n1]
        for who in (a, other):
            oh = [0.0] * 4
            oh[_CARRY[self.carry[who]]] = 1.0
            v += oh
        for p in PARTS:
            v += [self.stations[p][0] / n1, self.stations[p][1] / n1]
        v += [self.bench[0] / n1, self.bench[1] / n1]
        v += [min(1.0, self.delivered[p] / self.units) for p in PARTS]
        v += [float(self.ab_done), self.progress_ab / ASSEMBLE_TICKS, self.progress_p / ASSEMBLE_TICKS,
              float(self.product), min(1.0, self.t / self.max_cycles)]
        return np.asarray(v, dtype=np.float32)

    def render(self) -> None:
        return None

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- milestones (read from env state)
def delivered_A(env: WarehouseEnv) -> bool:
    return env.delivered["A"] >= env.units


def delivered_B(env: WarehouseEnv) -> bool:
    return env.delivered["B"] >= env.units


def delivered_C(env: WarehouseEnv) -> bool:
    return env.delivered["C"] >= env.units


def assembled_AB(env: WarehouseEnv) -> bool:
    return bool(env.ab_done)


def product_done(env: WarehouseEnv) -> bool:
    return bool(env.product)


def who_did(env: WarehouseEnv, milestone: str) -> str | None:
    return env.credit.get(milestone)


GRAPH = {
    "goals": ["product_done"],
    "milestones": {
        "delivered_A": {"description": "all A units are at the bench", "duration": 30},
        "delivered_B": {"description": "all B units are at the bench", "duration": 30},
        "delivered_C": {"description": "all C units are at the bench", "duration": 30},
        "assembled_AB": {"requires": ["delivered_A", "delivered_B"], "description": "AB assembled", "duration": 5},
        "product_done": {"requires": ["assembled_AB", "delivered_C"], "description": "product assembled",
                         "duration": 5, "reward": 1.0},
    },
}


def make_env(size: int = 12, units: int = 2, max_cycles: int = 300):
    raw = WarehouseEnv(size=size, units=units, max_cycles=max_cycles)
    return from_pettingzoo(
        raw,
        milestones={"delivered_A": delivered_A, "delivered_B": delivered_B, "delivered_C": delivered_C,
                    "assembled_AB": assembled_AB, "product_done": product_done},
        graph=GRAPH,
        max_cycles=max_cycles,
        milestone_agent=who_did,
    )


# ---------------------------------------------------------------- options
def _step_toward(src: tuple[int, int], dst: tuple[int, int]) -> int:
    (x, y), (tx, ty) = src, dst
    if x < tx:
        return E
    if x > tx:
        return W
    if y < ty:
        return S
    if y > ty:
        return N
    return NOOP


def _dist(p: tuple[int, int], q: tuple[int, int]) -> int:
    return abs(p[0] - q[0]) + abs(p[1] - q[1])


def remaining(env: WarehouseEnv, part: str) -> int:
    """Units of ``part`` still needed that nobody is carrying."""
    carried = sum(1 for c in env.carry.values() if c == part)
    return env.units - env.delivered[part] - carried


def _fetch(part: str):
    class Fetch(Behaviour):
        """Deliver one unit of ``part``: drop anything else first, go pick, come back, drop."""

        def start(self, ctx: OptionContext) -> None:
            self.start_count = ctx.env.unwrapped.delivered_by[ctx.agent][part]

        def act(self, ctx: OptionContext) -> int:
            env = ctx.env.unwrapped
            me, holding = env.pos[ctx.agent], env.carry[ctx.agent]
            if holding is None:
                st = env.stations[part]
                return PICK if me == st else _step_toward(me, st)
            return DROP if me == env.bench else _step_toward(me, env.bench)

        def done(self, ctx: OptionContext) -> bool:
            return ctx.env.unwrapped.delivered_by[ctx.agent][part] > self.start_count

    Fetch.__name__ = Fetch.__qualname__ = f"Fetch{part}"
    return Fetch


def _can_fetch(part: str):
    def can(ctx: OptionContext) -> bool:
        env = ctx.env.unwrapped
        return env.carry[ctx.agent] == part or remaining(env, part) > 0

    can.__name__ = f"can_fetch_{part}"
    return can


def _features(part: str):
    i = PARTS.index(part)

    def feats(obs: Any) -> np.ndarray:
        o = np.asarray(obs, dtype=np.float64)
        me, other = o[0:2], o[2:4]
        st = o[12 + 2 * i: 14 + 2 * i]
        bench = o[18:20]
        done_frac = o[20 + i]
        return np.array([np.abs(me - st).sum(), np.abs(st - bench).sum(), np.abs(other - st).sum(),
                         1.0 - done_frac, float(o[4 + 1 + i]), float(o[8 + 1 + i])])

    feats.__name__ = f"features_{part}"
    return feats


FetchA, FetchB, FetchC = (_fetch(p) for p in PARTS)
can_fetch_A, can_fetch_B, can_fetch_C = (_can_fetch(p) for p in PARTS)
features_A, features_B, features_C = (_features(p) for p in PARTS)


def assemble(ctx: OptionContext) -> int:
    env = ctx.env.unwrapped
    me = env.pos[ctx.agent]
    if me != env.bench:
        return _step_toward(me, env.bench)
    return DROP if env.carry[ctx.agent] is not None else ASSEMBLE


def wait(ctx: OptionContext) -> int:
    ctx.memory.setdefault("seen", ctx.env.verified_milestones())
    return NOOP


def something_changed(ctx: OptionContext) -> bool:
    """Wait ends when a new milestone is verified (or at max_steps)."""
    return ctx.env.verified_milestones() != ctx.memory.get("seen", ctx.achieved)


def make_library() -> OptionLibrary:
    lib = OptionLibrary("warehouse", TaskGraph.from_spec(GRAPH))
    for p, beh, can, feats in zip(PARTS, (FetchA, FetchB, FetchC), (can_fetch_A, can_fetch_B, can_fetch_C),
                                  (features_A, features_B, features_C)):
        lib.add(Option(f"fetch_{p}", beh, milestone=f"delivered_{p}", repeatable=True, initiation=can,
                       exclusive=True, max_steps=80, features=feats,
                       description=f"bring one unit of {p} to the bench"))
    lib.add(Option("assemble_AB", assemble, milestone="assembled_AB", exclusive=True, max_steps=60,
                   description="go to the bench and assemble AB"))
    lib.add(Option("assemble_product", assemble, milestone="product_done", exclusive=True, max_steps=60,
                   description="go to the bench and assemble the product"))
    lib.add(Option("wait", wait, done=something_changed, max_steps=30,
                   description="idle until a new milestone is verified (at most 30 steps)"))
    return lib.validate()


# ---------------------------------------------------------------- a reference manager
class Oracle:
    """A heuristic order: assemble when possible, else fetch the part with the shortest round
    trip from where the robot stands, else wait (``manager: {kind: scripted, policy:
    'warehouse:Oracle'}``)."""

    def __init__(self, library: OptionLibrary) -> None:
        self.library = library

    def decide(self, decisions: Sequence[Decision]) -> list[Choice]:
        return [Choice(self.library.index(self._choose(d))) for d in decisions]

    def _choose(self, d: Decision) -> str:
        eligible = {name for name in self.library.names if d.mask[self.library.index(name)]}
        for name in ("assemble_product", "assemble_AB"):
            if name in eligible:
                return name
        env = d.env.unwrapped
        me = env.pos[d.agent]
        fetches = [p for p in PARTS if f"fetch_{p}" in eligible]
        if not fetches:
            return "wait"
        part = min(fetches, key=lambda p: _dist(me, env.stations[p]) + _dist(env.stations[p], env.bench))
        return f"fetch_{part}"
