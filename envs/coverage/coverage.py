"""coverage_v0: N agents must cover N landmarks on an open grid — an assignment task.

A ``size x size`` grid without walls holds ``n_agents`` agents and as many landmarks, on
distinct cells drawn from the reset seed. Every step all live agents move at once
(``Discrete(5)``: stay, up, down, left, right; a move off the grid stays put; agents may
share cells). An unfrozen agent that stands on an uncovered landmark claims it: milestone
``covered_k`` is verified and the agent is frozen there for the rest of the episode (its
actions are ignored). When two arrive together the lower-indexed agent claims. The task
is every ``covered_k``; the episode terminates the step the last landmark is claimed and
is truncated at ``max_cycles``.

Why the order of options matters: each agent can claim only one landmark, so success is
a matching of agents to landmarks, and the step cap is tight. Layouts are redrawn (from
the same seed's stream) until the optimal assignment covers every landmark within
``max_makespan`` steps (``size - 1`` by default) and the cap is one step more
(``size``): the optimal assignment always succeeds, while "agent k → landmark k" does
only when its slowest pair is fast enough (about 70 % of layouts at the defaults), and
duplicated or idle choices lose the race.

Travel times are routes that step on no other uncovered landmark (which would claim it):
:func:`route_field`. Coordinates are ``(row, col)``; row 0 is the top (``up`` is -1).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv
from pettingzoo.utils import wrappers
from pettingzoo.utils.conversions import parallel_to_aec

from gyre_ma.envs.coverage.assignment import bottleneck, matching_size
from gyre_ma.options.graph import TaskGraph

ACTIONS = ("stay", "up", "down", "left", "right")
STAY, UP, DOWN, LEFT, RIGHT = range(len(ACTIONS))
MOVES = ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1))
"""(d_row, d_col) of each action."""
MAX_AGENTS = 8
_LAYOUT_TRIES = 10_000


# ---------------------------------------------------------------------------- milestones
def milestone(k: int) -> str:
    """The milestone of landmark ``k``."""
    return f"covered_{k}"


class Covered:
    """Verifier: landmark ``k`` has been claimed (read from the env's ``covered_by``).

    Instances are module attributes, so the task graph names them by reference
    (``gyre_ma.envs.coverage.coverage:verify_covered_0``)."""

    def __init__(self, k: int) -> None:
        self.k = k

    def __call__(self, env: Any) -> bool:
        return bool(env.covered_by[self.k] >= 0)

    def __repr__(self) -> str:
        return f"Covered({self.k})"


verify_covered_0 = Covered(0)
verify_covered_1 = Covered(1)
verify_covered_2 = Covered(2)
verify_covered_3 = Covered(3)
verify_covered_4 = Covered(4)
verify_covered_5 = Covered(5)
verify_covered_6 = Covered(6)
verify_covered_7 = Covered(7)


@functools.lru_cache(maxsize=None)
def task_graph(n_landmarks: int = 3, size: int = 9) -> TaskGraph:
    """``covered_0 .. covered_{n-1}``, no prerequisites, all of them goals. ``size`` only
    sets the expected duration (the mean distance between two random cells)."""
    if isinstance(n_landmarks, bool) or not isinstance(n_landmarks, int) or not 1 <= n_landmarks <= MAX_AGENTS:
        raise ValueError(f"coverage: n_landmarks must be an int in [1, {MAX_AGENTS}], got {n_landmarks!r}")
    names = [milestone(k) for k in range(n_landmarks)]
    spec = {
        "goals": names,
        "milestones": {
            name: {
                "description": f"an agent stands on landmark {k} (and stays there)",
                "reward": 1.0 / n_landmarks,
                "verifier": f"{__name__}:verify_covered_{k}",
                "duration": max(2.0 * size / 3.0, 1.0),
            }
            for k, name in enumerate(names)
        },
    }
    return TaskGraph.from_spec(spec)


# ---------------------------------------------------------------------------- config
@dataclass(frozen=True)
class CoverageConfig:
    """Every knob of coverage_v0; ``parallel_env(**kwargs)`` takes these as keywords."""

    n_agents: int = 3
    """Agents, and landmarks (1-8). The default cap is tuned for 3."""
    size: int = 9
    """Side of the square grid (2-64); it must hold 2 * n_agents distinct cells."""
    max_cycles: int | None = None
    """Team steps before every agent is truncated; None: ``size`` (one step of slack over
    the default ``max_makespan``)."""
    max_makespan: int | None = None
    """Layouts are redrawn until the optimal assignment needs at most this many steps;
    None: ``size - 1``. ``2 * (size - 1)`` or more keeps every layout (plain uniform)."""
    milestone_rewards: bool = False
    """Also pay each landmark's task-graph weight (1 / n) on its claim; the goal pays 1."""

    def __post_init__(self) -> None:
        def bad(key: str, expected: str) -> ValueError:
            return ValueError(f"coverage: {key} must be {expected}, got {getattr(self, key)!r}")

        for key, (lo, hi) in {"n_agents": (1, MAX_AGENTS), "size": (2, 64)}.items():
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise bad(key, "an int")
            if not lo <= value <= hi:
                raise bad(key, f"in [{lo}, {hi}]")
        if self.size * self.size < 2 * self.n_agents:
            raise ValueError(
                f"coverage: a {self.size}x{self.size} grid cannot hold {self.n_agents} agents and "
                f"{self.n_agents} landmarks on distinct cells; raise size"
            )
        for key in ("max_cycles", "max_makespan"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                                      or value < 1):
                raise bad(key, "None or an int >= 1")
        if not isinstance(self.milestone_rewards, bool):
            raise bad("milestone_rewards", "a bool")

    @property
    def cycles(self) -> int:
        """The step cap in force: ``max_cycles``, or ``size``."""
        return int(self.max_cycles) if self.max_cycles is not None else self.size

    @property
    def makespan_bound(self) -> int:
        """The layout bound in force: ``max_makespan``, or ``size - 1``."""
        return int(self.max_makespan) if self.max_makespan is not None else self.size - 1

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> CoverageConfig:
        accepted = {f.name for f in fields(cls)}
        unknown = set(kwargs) - accepted
        if unknown:
            raise ValueError(f"coverage: unknown option(s) {sorted(unknown)}; accepted: {sorted(accepted)}")
        return cls(**kwargs)


# ---------------------------------------------------------------------------- geometry
def route_field(size: int, landmarks: np.ndarray, uncovered: Sequence[bool], k: int) -> np.ndarray:
    """Steps from every cell to landmark ``k`` on routes that step on no other uncovered
    landmark, as a ``(size, size)`` int array; -1 where every route is cut off."""
    n = size
    blocked = [False] * (n * n)
    for j, (r, c) in enumerate(np.asarray(landmarks).tolist()):
        if j != k and uncovered[j]:
            blocked[r * n + c] = True
    dist = [-1] * (n * n)
    r0, c0 = (int(x) for x in landmarks[k])
    start = r0 * n + c0
    dist[start] = 0
    frontier = [start]
    while frontier:
        nxt = []
        for u in frontier:
            r, c = divmod(u, n)
            d = dist[u] + 1
            for v, ok in ((u - n, r > 0), (u + n, r < n - 1), (u - 1, c > 0), (u + 1, c < n - 1)):
                if ok and dist[v] < 0 and not blocked[v]:
                    dist[v] = d
                    nxt.append(v)
        frontier = nxt
    return np.asarray(dist, dtype=np.int64).reshape(n, n)


def travel_costs(size: int, agents: np.ndarray, landmarks: np.ndarray, uncovered: Sequence[bool]) -> np.ndarray:
    """``cost[a, k]``: steps agent ``a`` needs to reach landmark ``k`` (``inf`` if cut
    off); covered landmarks are ``inf`` too."""
    cost = np.full((len(agents), len(landmarks)), np.inf)
    rows, cols = np.asarray(agents).T
    for k in range(len(landmarks)):
        if uncovered[k]:
            steps = route_field(size, landmarks, uncovered, k)[rows, cols]
            cost[:, k] = np.where(steps >= 0, steps, np.inf)
    return cost


def generate_layout(cfg: CoverageConfig, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Agent and landmark cells (two ``(n, 2)`` int arrays, all distinct), redrawn until
    the optimal assignment covers every landmark within ``cfg.makespan_bound`` steps."""
    n, size = cfg.n_agents, cfg.size
    bound = cfg.makespan_bound
    uncovered = [True] * n
    for _ in range(_LAYOUT_TRIES):
        cells = rng.choice(size * size, size=2 * n, replace=False)
        pos = np.stack(np.divmod(cells, size), axis=1).astype(np.int64)
        agents, landmarks = pos[:n], pos[n:]
        if bound >= 2 * (size - 1):
            return agents, landmarks
        cost = travel_costs(size, agents, landmarks, uncovered)
        if matching_size(np.isfinite(cost)) == n and bottleneck(cost) <= bound:
            return agents, landmarks
    raise RuntimeError(
        f"coverage: no layout in {_LAYOUT_TRIES} draws has an assignment within max_makespan={bound} "
        f"steps on a {size}x{size} grid; raise max_makespan"
    )


# ---------------------------------------------------------------------------- the environment
class CoverageEnv(ParallelEnv):
    """The native PettingZoo ParallelEnv of coverage_v0 (what ``run_episode`` drives).

    Observation (per agent, a flat ``float32`` Box; slices in :attr:`obs_layout`): its own
    position / (size - 1), the offsets to every landmark, the covered flags, the offsets
    to every other agent (in agent order), whether it is frozen, whether each other agent
    is, and the grid (Manhattan) distance of every agent, itself first and then the others
    in agent order, to every landmark. Offsets are divided by ``size - 1`` and distances by
    twice that, so everything lies in [-1, 1]: the distances are what an assignment is
    decided on, which a policy would otherwise have to learn to compute from the offsets.
    ``state()`` is the global counterpart (absolute positions, flags, and the time fraction).

    Scripted options and planners read the public state: ``agent_pos``, ``landmark_pos``,
    ``covered_by`` (claiming agent or -1 per landmark), ``claim`` (claimed landmark or -1
    per agent), :attr:`frozen`, ``t``, ``episode``, and :meth:`route_field`.
    """

    metadata = {
        "name": "coverage_v0",
        "render_modes": ["ansi"],
        "is_parallelizable": True,
        "render_fps": 4,
    }

    def __init__(self, render_mode: str | None = None, **kwargs: Any) -> None:
        self.config = cfg = CoverageConfig.from_kwargs(kwargs)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"coverage: render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}"
            )
        self.render_mode = render_mode
        self.max_cycles = cfg.cycles
        n = cfg.n_agents
        self.n_landmarks = n
        self.possible_agents = [f"agent_{i}" for i in range(n)]
        self.agents: list[str] = []
        self.agent_index = {a: i for i, a in enumerate(self.possible_agents)}
        self._graph = task_graph(n, cfg.size)
        self._milestones = tuple(milestone(k) for k in range(n))
        self._claim_reward = 1.0 / n if cfg.milestone_rewards else 0.0
        layout, start = {}, 0
        for name, length in (("position", 2), ("landmarks", 2 * n), ("covered", n), ("others", 2 * (n - 1)),
                             ("frozen", 1), ("others_frozen", n - 1), ("distances", n * n)):
            layout[name] = slice(start, start + length)
            start += length
        self.obs_layout: dict[str, slice] = layout
        """Where each part of the flat observation lies."""
        low = np.full(start, -1.0, dtype=np.float32)
        for name in ("position", "covered", "frozen", "others_frozen", "distances"):
            low[layout[name]] = 0.0
        self._obs_space = spaces.Box(low, np.ones(start, dtype=np.float32), dtype=np.float32)
        self.observation_spaces = {a: self._obs_space for a in self.possible_agents}
        self.action_spaces = {a: spaces.Discrete(len(ACTIONS)) for a in self.possible_agents}
        self.state_space = spaces.Box(0.0, 1.0, shape=(6 * n + 1,), dtype=np.float32)
        self._scale = np.float32(1.0 / (cfg.size - 1))
        self._seed_rng: np.random.Generator | None = None
        self.episode = 0
        """Resets so far (planners use it to notice a new episode)."""
        self._init_state(np.zeros((n, 2), dtype=np.int64), np.zeros((n, 2), dtype=np.int64))

    # ------------------------------------------------------------------ spaces
    def observation_space(self, agent: str) -> spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self.action_spaces[agent]

    # ------------------------------------------------------------------ gyre-ma protocol
    def task_graph(self) -> TaskGraph:
        return self._graph

    def verified_milestones(self) -> frozenset[str]:
        """``covered_k`` for every claimed landmark: state-based, and claims are permanent."""
        return self._verified

    def milestone_agent(self, milestone: str) -> str | None:
        """The agent that claimed the landmark of ``milestone`` (None while unclaimed)."""
        k = int(milestone.rsplit("_", 1)[1])
        who = int(self.covered_by[k])
        return self.possible_agents[who] if who >= 0 else None

    # ------------------------------------------------------------------ state access
    @property
    def frozen(self) -> np.ndarray:
        """Per agent: whether it has claimed a landmark (and so no longer moves)."""
        return self.claim >= 0

    @property
    def uncovered(self) -> np.ndarray:
        return self.covered_by < 0

    def route_field(self, k: int) -> np.ndarray:
        """Steps from every cell to landmark ``k`` avoiding the other uncovered landmarks
        (-1 where cut off): what ``go_to_k`` walks and the oracle plans with."""
        return route_field(self.config.size, self.landmark_pos, self.uncovered.tolist(), k)

    # ------------------------------------------------------------------ PettingZoo API
    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self._seed_rng = np.random.default_rng(seed)
        elif self._seed_rng is None:
            self._seed_rng = np.random.default_rng()
        self._init_state(*generate_layout(self.config, self._seed_rng))
        self.episode += 1
        self.agents = list(self.possible_agents)
        obs = {a: self._observe(i) for i, a in enumerate(self.possible_agents)}
        return obs, {a: {} for a in self.agents}

    def place(self, agents: Sequence[Sequence[int]], landmarks: Sequence[Sequence[int]]) -> dict:
        """Start the current episode over from a hand-made layout (tests, demos): ``(row,
        col)`` cells of every agent and every landmark, landmarks on distinct cells none of
        which an agent starts on. Returns the observations."""
        n, size = self.config.n_agents, self.config.size
        a, lm = np.asarray(agents, dtype=np.int64), np.asarray(landmarks, dtype=np.int64)
        for what, cells in (("agents", a), ("landmarks", lm)):
            if cells.shape != (n, 2) or cells.min() < 0 or cells.max() >= size:
                raise ValueError(f"coverage: place() needs {n} {what} cells (row, col) in [0, {size}), got "
                                 f"{cells.tolist()}")
        spots = {tuple(c) for c in lm.tolist()}
        if len(spots) < n or spots & {tuple(c) for c in a.tolist()}:
            raise ValueError(f"coverage: place() needs distinct landmark cells free of agents, got agents "
                             f"{a.tolist()} and landmarks {lm.tolist()}")
        self._init_state(a, lm)
        self.agents = list(self.possible_agents)
        return {ag: self._observe(i) for i, ag in enumerate(self.possible_agents)}

    def _init_state(self, agents: np.ndarray, landmarks: np.ndarray) -> None:
        n = self.config.n_agents
        self.agent_pos = np.array(agents, dtype=np.int64)
        self.landmark_pos = np.array(landmarks, dtype=np.int64)
        self.covered_by = np.full(n, -1, dtype=np.int64)
        self.claim = np.full(n, -1, dtype=np.int64)
        self._landmark_at = {(int(r), int(c)): k for k, (r, c) in enumerate(self.landmark_pos)}
        self._verified: frozenset[str] = frozenset()
        self.t = 0

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        live = self.agents
        if not live:
            raise ValueError("coverage: step() called with no live agents; call reset() first")
        self.t += 1
        last = self.config.size - 1
        pos, claim = self.agent_pos, self.claim
        for a in live:
            i = self.agent_index[a]
            act = actions.get(a, STAY)
            act = STAY if act is None else int(act)
            if not 0 <= act < len(ACTIONS):
                raise ValueError(f"coverage: action for {a!r} must be in [0, {len(ACTIONS)}), got {act}")
            if act != STAY and claim[i] < 0:
                dr, dc = MOVES[act]
                pos[i, 0] = min(max(pos[i, 0] + dr, 0), last)
                pos[i, 1] = min(max(pos[i, 1] + dc, 0), last)
        claimed = 0
        for a in live:  # agent order: the lower index claims a landmark two reach together
            i = self.agent_index[a]
            if claim[i] >= 0:
                continue
            k = self._landmark_at.get((int(pos[i, 0]), int(pos[i, 1])))
            if k is not None and self.covered_by[k] < 0:
                self.covered_by[k], claim[i] = i, k
                self._verified = self._verified | {self._milestones[k]}
                claimed += 1
        done = len(self._verified) == self.n_landmarks
        reward = claimed * self._claim_reward + (1.0 if done else 0.0)
        timeout = self.t >= self.max_cycles
        obs = {a: self._observe(self.agent_index[a]) for a in live}
        rewards = dict.fromkeys(live, reward)
        terms = dict.fromkeys(live, done)
        truncs = dict.fromkeys(live, timeout and not done)
        infos = {a: {} for a in live}
        self.agents = [] if done or timeout else live
        return obs, rewards, terms, truncs, infos

    # ------------------------------------------------------------------ observations
    def _observe(self, i: int) -> np.ndarray:
        s = self._scale
        pos = self.agent_pos
        own = pos[i]
        others = np.delete(np.arange(self.config.n_agents), i)
        frozen = self.frozen
        return np.concatenate([
            own * s,
            ((self.landmark_pos - own) * s).ravel(),
            self.covered_by >= 0,
            ((pos[others] - own) * s).ravel(),
            frozen[i:i + 1],
            frozen[others],
            (np.abs(pos[[i, *others], None, :] - self.landmark_pos[None, :, :]).sum(-1) * (s / 2)).ravel(),
        ]).astype(np.float32)

    def state(self) -> np.ndarray:
        """Agent positions, landmark positions (both / (size - 1)), covered flags, frozen
        flags, then ``t / max_cycles``: ``float32`` in [0, 1]."""
        s = self._scale
        return np.concatenate([
            (self.agent_pos * s).ravel(), (self.landmark_pos * s).ravel(), self.covered_by >= 0,
            self.frozen, [min(self.t / max(self.max_cycles, 1), 1.0)],
        ]).astype(np.float32)

    # ------------------------------------------------------------------ rendering
    def render(self) -> str | None:
        if self.render_mode is None:
            import warnings

            warnings.warn("coverage: render() called without a render_mode", stacklevel=2)
            return None
        size = self.config.size
        rows = [["."] * size for _ in range(size)]
        for k, (r, c) in enumerate(self.landmark_pos.tolist()):
            rows[r][c] = chr(ord("a") + k)
        for i, (r, c) in enumerate(self.agent_pos.tolist()):
            rows[r][c] = str(i) if self.claim[i] < 0 else chr(ord("A") + int(self.claim[i]))
        lines = ["".join(row) for row in rows]
        lines.append(f"t={self.t}/{self.max_cycles} covered={sorted(self._verified)}")
        return "\n".join(lines) + "\n"

    def close(self) -> None:
        pass

    def __str__(self) -> str:
        return "coverage_v0"


def parallel_env(**kwargs: Any) -> CoverageEnv:
    """The native ParallelEnv (what ``gyre_ma.rollout.run_episode`` drives)."""
    return CoverageEnv(**kwargs)


def raw_env(**kwargs: Any) -> AECEnv:
    """The AEC version, converted from the parallel env."""
    return parallel_to_aec(CoverageEnv(**kwargs))


def env(**kwargs: Any) -> AECEnv:
    """The AEC version with PettingZoo's standard wrappers."""
    aec = raw_env(**kwargs)
    aec = wrappers.AssertOutOfBoundsWrapper(aec)
    return wrappers.OrderEnforcingWrapper(aec)
