"""PettingZoo MPE's ``simple_spread`` (now the ``mpe2`` package) as a gyre environment,
with the option library a user would write for it.

N agents and N landmarks on a plane; every agent sees its own velocity and position and
where the landmarks and the other agents are. The task, as the env's reward means it:
cover every landmark at once. Milestones are read from the world's state:
``covered_k`` (an agent touches landmark ``k``: their discs overlap, distance below the
agent's size plus the landmark's) and the goal ``spread`` (every landmark touched at the
same step, which ends the episode as a success). Episodes last MPE's 25 steps. ``covered_k``
is credited to the agent touching ``k`` (``milestone_agent``), not to every agent.

Options: ``go_to_k`` per landmark and ``stay``. ``go_to_k`` pushes toward the landmark
with the action that brings the point where the agent would coast to rest closest to it
(MPE's damping makes that point ``p + 0.4 v + 0.2 u`` for a push ``u``); it ends when the
agent touches ``k`` and will come to rest touching it (with ``spread_library(hold=True)`` it
holds the landmark to the end of the episode instead), and fails when another agent is
parked on ``k`` first. ``go_to_k`` is ``exclusive``: while one agent runs it, it is not
eligible for the others, so two agents are never sent to one landmark. ``stay`` pushes
nothing for one step. Which agent goes where is the manager's job.

Needs ``mpe2`` (``pip install --no-deps mpe2``: it asks for ``pygame-ce``, which
overwrites the ``pygame`` that PettingZoo's SISL envs use; ``pygame`` serves both).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

try:
    from mpe2 import simple_spread_v3
except ImportError as exc:  # an optional dependency: say how to get it
    raise ImportError(f"the MPE example needs the mpe2 package ({exc}); install it with: pip install --no-deps "
                      "mpe2 (it needs pygame, scipy and pettingzoo, which gyre-ma's dev extra has)") from exc

from gyre_ma.envs.adapters import GyreAdapter, from_pettingzoo
from gyre_ma.options.decision import Choice, Decision
from gyre_ma.options.graph import TaskGraph
from gyre_ma.options.library import OptionLibrary, export
from gyre_ma.options.option import Option, OptionContext

MAX_LANDMARKS = 6
_NOOP, _LEFT, _RIGHT, _DOWN, _UP = range(5)
_PUSH = {_NOOP: (0.0, 0.0), _LEFT: (-1.0, 0.0), _RIGHT: (1.0, 0.0), _DOWN: (0.0, -1.0), _UP: (0.0, 1.0)}
_COAST, _SHIFT = 0.4, 0.2
"""Where an agent comes to rest without pushing, ``p + 0.4 v``, and how far one push moves that point
(MPE: dt 0.1, damping 0.25, force 5 on a mass of 1; the position moves by the old velocity)."""


# ---------------------------------------------------------------------- state
def _world(env: Any) -> Any:
    return env.world


def _touching(world: Any, agent: Any, k: int) -> bool:
    landmark = world.landmarks[k]
    return bool(np.linalg.norm(agent.state.p_pos - landmark.state.p_pos) < agent.size + landmark.size)


def _rest(agent: Any) -> np.ndarray:
    """Where ``agent`` would coast to rest if it pushed no more."""
    return agent.state.p_pos + _COAST * agent.state.p_vel


def _parked(world: Any, agent: Any, k: int) -> bool:
    """``agent`` touches landmark ``k`` and will come to rest touching it."""
    landmark = world.landmarks[k]
    return _touching(world, agent, k) and bool(
        np.linalg.norm(_rest(agent) - landmark.state.p_pos) < agent.size + landmark.size)


def covered(env: Any, k: int) -> bool:
    """Some agent touches landmark ``k``."""
    world = _world(env)
    return any(_touching(world, a, k) for a in world.agents)


def toucher(env: Any, milestone: str) -> str | None:
    """Who achieved ``covered_k``: the agent touching landmark ``k`` (the nearest, if several);
    None for ``spread``, every agent's doing."""
    if not milestone.startswith("covered_"):
        return None
    world = _world(env)
    k = int(milestone.rsplit("_", 1)[1])
    mark = world.landmarks[k].state.p_pos
    touching = [a for a in world.agents if _touching(world, a, k)]
    if not touching:
        return None
    nearest = min(touching, key=lambda a: float(np.linalg.norm(a.state.p_pos - mark)))
    return env.possible_agents[world.agents.index(nearest)]


def spread(env: Any) -> bool:
    """Every landmark is touched by some agent, now."""
    return all(covered(env, k) for k in range(len(_world(env).landmarks)))


def _covered_k(k: int) -> Any:
    def verify(env: Any) -> bool:
        return covered(env, k)

    return verify


for _k in range(MAX_LANDMARKS):  # module attributes, so the graph's verifier references resolve
    export(globals(), f"covered_{_k}", _covered_k(_k))


def task_graph(n: int = 3) -> TaskGraph:
    return TaskGraph.from_spec({
        "goals": ["spread"],
        "milestones": {
            **{f"covered_{k}": {"description": f"an agent touches landmark {k}", "verifier": f"{__name__}:covered_{k}",
                                "duration": 10.0} for k in range(n)},
            "spread": {"description": "every landmark is touched at once", "verifier": f"{__name__}:spread",
                       "requires": [f"covered_{k}" for k in range(n)], "side_effect": True, "duration": 2.0},
        },
    })


def make_spread(*, n: int = 3, max_cycles: int = 25, **kwargs: Any) -> GyreAdapter:
    """``simple_spread_v3`` with ``n`` agents and landmarks and discrete actions as a gyre
    environment; ``kwargs`` go to its ``parallel_env`` (``local_ratio`` …)."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_LANDMARKS:
        raise ValueError(f"make_spread: n must be an int in [1, {MAX_LANDMARKS}], got {n!r}")
    env = simple_spread_v3.parallel_env(N=n, max_cycles=max_cycles, continuous_actions=False, **kwargs)
    milestones = {f"covered_{k}": globals()[f"covered_{k}"] for k in range(n)} | {"spread": spread}
    return from_pettingzoo(env, milestones=milestones, graph=task_graph(n), max_cycles=max_cycles,
                           milestone_agent=toucher)


# ---------------------------------------------------------------------- options
def _me(ctx: OptionContext) -> tuple[Any, Any]:
    world = _world(ctx.env.unwrapped)
    return world, world.agents[ctx.env.possible_agents.index(ctx.agent)]


def push_toward(agent: Any, target: np.ndarray) -> int:
    """The push whose resting point lies closest to ``target`` (no push on a tie)."""
    rest = _rest(agent)
    return min(_PUSH, key=lambda a: (float(np.linalg.norm(rest + _SHIFT * np.array(_PUSH[a]) - target)), a))


class GoTo:
    """Sub-policy of ``go_to_k``."""

    def __init__(self, k: int) -> None:
        self.k = k

    def __call__(self, ctx: OptionContext) -> int:
        world, me = _me(ctx)
        return push_toward(me, world.landmarks[self.k].state.p_pos)


def _parked_on(k: int) -> Any:
    def parked(ctx: OptionContext) -> bool:
        """Touching landmark ``k``, and coming to rest touching it."""
        world, me = _me(ctx)
        return _parked(world, me, k)

    return parked


def _taken(k: int) -> Any:
    def taken(ctx: OptionContext) -> bool:
        """Another agent is parked on landmark ``k`` and this one does not touch it (an agent
        passing over it on its way elsewhere takes nothing)."""
        world, me = _me(ctx)
        return not _touching(world, me, k) and any(_parked(world, a, k) for a in world.agents if a is not me)

    return taken


def _open(k: int) -> Any:
    parked, taken = _parked_on(k), _taken(k)

    def open_(ctx: OptionContext) -> bool:
        """Initiation: nobody else holds landmark ``k`` and this agent is not parked on it."""
        return not taken(ctx) and not parked(ctx)

    return open_


class LandmarkFeatures:
    """``go_to_k``'s features, read off the deciding agent's observation (MPE lays it out as
    its velocity, its position, each landmark's position and each other agent's relative to
    it, then the silent channel: 6N numbers): the distance table seen from landmark ``k``.

    Where ``k`` lies from the agent and how far (3 numbers); how far each other agent is
    from ``k``, nearest first (N − 1); how far each of those agents, in that order, is from
    each other landmark, the other landmarks ordered by their distance from the deciding
    agent ((N − 1)²); and how far the deciding agent is from those landmarks (N − 1). The
    same layout for every landmark, so what the manager learns of one holds for all: the
    nearer, the better, unless another agent is nearer still, and what taking ``k`` leaves
    the others. With ``k``'s column alone (the first 2 + N numbers; session 44) the learned
    paths were 1.11–1.15× the oracle's held out, greedy, and as a bandit the scorer's first
    choice stopped near 0.70 agreement with the oracle's bottleneck assignment however many
    layouts it saw; with the table, 1.04–1.08×, and the bandit's agreement keeps rising
    with data (0.79 at 12,000 layouts; ``benchmarks/results/README.md``, session 45)."""

    def __init__(self, k: int) -> None:
        self.k = k

    def __call__(self, observation: Any) -> np.ndarray:
        obs = np.asarray(observation, dtype=np.float64)
        n = obs.shape[0] // 6
        marks = obs[4: 4 + 2 * n].reshape(n, 2)
        others = obs[4 + 2 * n: 4 + 2 * n + 2 * (n - 1)].reshape(n - 1, 2)
        mine = np.linalg.norm(marks, axis=1)
        theirs = np.linalg.norm(others[:, None] - marks[None], axis=2)  # [other agent, landmark]
        k = self.k
        rest = np.array([j for j in range(n) if j != k], dtype=np.int64)
        rest = rest[np.argsort(mine[rest], kind="stable")]
        order = np.argsort(theirs[:, k], kind="stable")
        return np.concatenate([marks[k], [mine[k]], theirs[order, k], theirs[np.ix_(order, rest)].ravel(),
                               mine[rest]])


_GO_TO = [(export(globals(), f"go_to_{k}", GoTo(k)), export(globals(), f"parked_{k}", _parked_on(k)),
           export(globals(), f"taken_{k}", _taken(k)), export(globals(), f"open_{k}", _open(k)),
           export(globals(), f"landmark_{k}", LandmarkFeatures(k)))
          for k in range(MAX_LANDMARKS)]
"""Per landmark: ``go_to_k``'s sub-policy, its done, failure and initiation predicates and
its features, module attributes (a dumped library's references resolve)."""


def stay(ctx: OptionContext) -> int:
    return _NOOP


def one_step(ctx: OptionContext) -> bool:
    return ctx.steps >= 1


def never(ctx: OptionContext) -> bool:
    return False


def spread_library(n: int = 3, hold: bool = False, features: bool = True) -> OptionLibrary:
    """``go_to_0`` … ``go_to_{n-1}`` (exclusive: one agent heads for a landmark at a time)
    and ``stay``. With ``hold``, ``go_to_k`` does not end once its agent is parked on ``k``:
    it holds the landmark until the episode ends (or another agent takes it), so each agent
    is assigned once, not asked again every step. With ``features`` (the default), each
    ``go_to_k`` describes its landmark to the manager (:class:`LandmarkFeatures`), whose
    shared option scorer then learns one rule for every landmark: without them it had to
    learn which landmark suits which layout option by option, and after 600 iterations
    played little better than a fixed assignment (``benchmarks/results/README.md``,
    session 44).

    Without ``exclusive`` (session 40) a later agent could head for the landmark an earlier
    one had just taken, and the learner kept doing so on 5-8 % of layouts; a parked agent,
    asked every step, could leave for any landmark, so staying took ten or more ``stay``
    choices in a row, and the default learner did no better than a random order (0.18-0.23
    held-out success). Exclusive, a parked agent's only eligible option once every other
    landmark is taken or headed for is ``stay``: a forced call, not a choice."""
    library = OptionLibrary("mpe_spread", task_graph(n))
    for k, (go, parked, taken, open_, landmark) in enumerate(_GO_TO[:n]):
        library.add(Option(f"go_to_{k}", go, milestone=f"covered_{k}", repeatable=True, initiation=open_,
                           done=never if hold else parked, failure=taken, max_steps=25, exclusive=True,
                           features=landmark if features else None,
                           description=f"drive onto landmark {k} and {'hold it' if hold else 'come to rest there'}"))
    library.add(Option("stay", stay, done=one_step, max_steps=1, description="push nothing for one step"))
    return library.validate()


def _assignment(world: Any) -> tuple[int, ...]:
    """Landmark per agent minimising the largest agent-to-landmark distance (then the sum)."""
    agents = [a.state.p_pos for a in world.agents]
    marks = [m.state.p_pos for m in world.landmarks]
    dist = np.array([[np.linalg.norm(a - m) for m in marks] for a in agents])
    best = min(itertools.permutations(range(len(marks)), len(agents)),
               key=lambda p: (max(dist[i, k] for i, k in enumerate(p)), sum(dist[i, k] for i, k in enumerate(p))))
    return tuple(best)


class _Assigned:
    """Each agent runs ``go_to`` its landmark (``_target``) while that is eligible, else stays."""

    def __init__(self, *, library: OptionLibrary) -> None:
        go = [n for n in library.names if n.startswith("go_to_")]
        if not go or "stay" not in library.names:
            raise ValueError(f"{type(self).__name__}: library {library.name!r} lacks go_to_k / stay options; "
                             f"it has {library.names}")
        self.library = library

    def _target(self, d: Decision) -> int:
        raise NotImplementedError

    def decide(self, decisions: Sequence[Decision]) -> list[Choice]:
        out = []
        for d in decisions:
            want = self.library.index(f"go_to_{self._target(d)}")
            out.append(Choice(want if d.mask[want] else self.library.index("stay")))
        return out


class SpreadOracle(_Assigned):
    """The assignment that minimises the longest drive, recomputed from the current state."""

    def _target(self, d: Decision) -> int:
        world = _world(d.env.unwrapped)
        return _assignment(world)[d.agent_index]


class FixedAssignment(_Assigned):
    """Agent ``k`` → landmark ``k``, whatever the layout."""

    def _target(self, d: Decision) -> int:
        return d.agent_index
