"""Two small user-style Gymnasium tasks for benchmarks/probes.py (session 55).

* ``errands``: the task seed picks one of four errands, each a ``prep`` then a ``do`` step
  (3 primitive steps each); the observation does not say which (a step counter alone), the
  env does, through ``episode_goals()``. Best: 6 steps.
* ``vault``: the door opens by a key (fetch it: 6 steps, unlock: 3) or by a kick (4), then
  3 steps to the stairs, the goal: the kick's route takes 7 steps, the key's 12.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from gyre_ma.envs.adapters import from_gymnasium
from gyre_ma.options import OptionLibrary, TaskGraph

ERRANDS = 4


class Errands(gym.Env):
    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2 * ERRANDS)
        self.done: set[str] = set()

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.errand = int(np.random.default_rng([seed or 0, 11]).integers(ERRANDS))
        self.done, self.t, self.progress = set(), 0, {}
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        k, kind = int(action) // 2, ("prep", "do")[int(action) % 2]
        if kind == "prep" or f"prep_{k}" in self.done:
            self.progress[int(action)] = self.progress.get(int(action), 0) + 1
            if self.progress[int(action)] >= 3:
                self.done.add(f"{kind}_{k}")
        won = f"do_{self.errand}" in self.done
        return np.array([min(self.t / 60, 1.0)], np.float32), float(won), won, self.t >= 60, {}

    def episode_goals(self):
        return [f"do_{self.errand}"]


def errands_graph() -> TaskGraph:
    milestones = {}
    for k in range(ERRANDS):
        milestones[f"prep_{k}"] = {"duration": 3}
        milestones[f"do_{k}"] = {"requires": [f"prep_{k}"], "duration": 3, "reward": 1.0}
    return TaskGraph.from_spec({"goals": [f"do_{k}" for k in range(ERRANDS)], "milestones": milestones})


def make_errands():
    names = [f"{kind}_{k}" for k in range(ERRANDS) for kind in ("prep", "do")]
    return from_gymnasium(Errands(), milestones={n: (lambda e, n=n: n in e.done) for n in names},
                          graph=errands_graph())


def errands_library(env=None) -> OptionLibrary:
    library = OptionLibrary("errands", errands_graph())
    for k in range(ERRANDS):
        for j, kind in enumerate(("prep", "do")):
            library.option(f"{kind}_{k}", milestone=f"{kind}_{k}", max_steps=5)(lambda ctx, a=2 * k + j: a)
    return library.validate()


VAULT = {"goals": ["on_stairs"], "milestones": {
    "got_key": {"duration": 6}, "door_unlocked": {"requires": ["got_key"], "duration": 3},
    "door_kicked": {"duration": 4},
    "vault_open": {"any_of": [["door_unlocked", "door_kicked"]], "side_effect": True},
    "on_stairs": {"requires": ["vault_open"], "duration": 3}}}
WORK = {0: ("got_key", 6), 1: ("door_unlocked", 3), 2: ("door_kicked", 4), 3: ("on_stairs", 3)}
"""Action → the milestone it works towards and the steps it takes."""


class Vault(gym.Env):
    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(0.0, 1.0, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(4)

    def _obs(self):
        return np.array([m in self.done for m in ("got_key", "door_unlocked", "door_kicked", "on_stairs")],
                        np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.done, self.work, self.t = set(), {}, 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        name, cost = WORK[int(action)]
        ok = {"door_unlocked": "got_key" in self.done,
              "on_stairs": bool({"door_unlocked", "door_kicked"} & self.done)}.get(name, True)
        if ok:
            self.work[name] = self.work.get(name, 0) + 1
            if self.work[name] >= cost:
                self.done.add(name)
        won = "on_stairs" in self.done
        return self._obs(), float(won), won, self.t >= 60, {}


def make_vault():
    detectors = {m: (lambda e, m=m: m in e.done) for m in ("got_key", "door_unlocked", "door_kicked", "on_stairs")}
    detectors["vault_open"] = lambda e: bool({"door_unlocked", "door_kicked"} & e.done)
    return from_gymnasium(Vault(), milestones=detectors, graph=VAULT)


def vault_library(env=None) -> OptionLibrary:
    library = OptionLibrary("vault", TaskGraph.from_spec(VAULT))
    for action, (milestone, cost) in WORK.items():
        library.option(milestone if milestone != "on_stairs" else "go_down", milestone=milestone,
                       max_steps=cost + 2)(lambda ctx, a=action: a)
    return library.validate()
