"""Scripted option library for coverage_v0: ``go_to_k`` per landmark and ``stay``.

``go_to_k`` walks a shortest route to landmark ``k`` that steps on no other uncovered
landmark (stepping on one would claim it and freeze the agent there), following the env's
:meth:`~gyre_ma.envs.coverage.coverage.CoverageEnv.route_field`; where every such route is
cut off it walks straight at ``k``. It ends when ``covered_k`` is verified — by this agent
or by another one that got there first, and then the manager chooses again — or, as a
failure, when its agent got frozen on another landmark after all. Which agent goes where
is the manager's job.
"""

from __future__ import annotations

from typing import Any

from gyre_ma.envs.coverage.coverage import DOWN, LEFT, MAX_AGENTS, MOVES, RIGHT, STAY, UP, milestone, task_graph
from gyre_ma.options.library import OptionLibrary
from gyre_ma.options.option import Option, OptionContext


def _agent(ctx: OptionContext) -> tuple[Any, int]:
    env = ctx.env.unwrapped
    return env, env.agent_index[ctx.agent]


def step_toward(env: Any, i: int, k: int) -> int:
    """Agent ``i``'s next action toward landmark ``k``: down the route field, the longer
    axis first; straight at ``k`` where the field is cut off."""
    r, c = (int(x) for x in env.agent_pos[i])
    tr, tc = (int(x) for x in env.landmark_pos[k])
    dr, dc = tr - r, tc - c
    vertical = DOWN if dr > 0 else UP
    horizontal = RIGHT if dc > 0 else LEFT
    order = [a for a, d in ((vertical, dr), (horizontal, dc)) if d]
    if abs(dc) > abs(dr):
        order.reverse()
    field = env.route_field(k)
    here = int(field[r, c])
    if here > 0:
        last = env.config.size - 1
        for act in order + [a for a in (UP, DOWN, LEFT, RIGHT) if a not in order]:
            nr, nc = r + MOVES[act][0], c + MOVES[act][1]
            if 0 <= nr <= last and 0 <= nc <= last and field[nr, nc] == here - 1:
                return act
    return order[0] if order else STAY


class GoTo:
    """Sub-policy of ``go_to_k`` (a module attribute per ``k``, importable by reference)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.__name__ = self.__qualname__ = f"go_to_{k}"
        self.__module__ = __name__

    def __call__(self, ctx: OptionContext) -> int:
        env, i = _agent(ctx)
        if env.claim[i] >= 0 or env.covered_by[self.k] >= 0:
            return STAY
        return step_toward(env, i, self.k)

    def __repr__(self) -> str:
        return f"GoTo({self.k})"


go_to_0 = GoTo(0)
go_to_1 = GoTo(1)
go_to_2 = GoTo(2)
go_to_3 = GoTo(3)
go_to_4 = GoTo(4)
go_to_5 = GoTo(5)
go_to_6 = GoTo(6)
go_to_7 = GoTo(7)
_GO_TO = (go_to_0, go_to_1, go_to_2, go_to_3, go_to_4, go_to_5, go_to_6, go_to_7)


def can_move(ctx: OptionContext) -> bool:
    """Initiation of every ``go_to_k``: the agent has not claimed a landmark."""
    env, i = _agent(ctx)
    return bool(env.claim[i] < 0)


def frozen(ctx: OptionContext) -> bool:
    """Failure of ``go_to_k``: its agent claimed another landmark on the way."""
    return not can_move(ctx)


def stay(ctx: OptionContext) -> int:
    return STAY


def stay_done(ctx: OptionContext) -> bool:
    return ctx.steps >= 1


def make_library(n_agents: int | None = None, *, size: int | None = None, env: Any = None,
                 name: str = "coverage") -> OptionLibrary:
    """``go_to_0 .. go_to_{n-1}`` (one-shot, milestone ``covered_k``, step cap the grid
    diameter plus a detour; exclusive: one agent heads for a landmark at a time) and an
    always-eligible one-step ``stay``. ``n_agents`` and ``size`` default to ``env``'s when
    it is given, else to 3 and 9."""
    if env is not None:
        cfg = env.unwrapped.config
        for key, value in (("n_agents", n_agents), ("size", size)):
            if value is not None and value != getattr(cfg, key):
                raise ValueError(f"coverage library: {key}={value!r} but the env has {key}={getattr(cfg, key)!r}")
        n_agents, size = cfg.n_agents, cfg.size
    n_agents = 3 if n_agents is None else n_agents
    size = 9 if size is None else size
    if isinstance(n_agents, bool) or not isinstance(n_agents, int) or not 1 <= n_agents <= MAX_AGENTS:
        raise ValueError(f"coverage library: n_agents must be an int in [1, {MAX_AGENTS}], got {n_agents!r}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 2:
        raise ValueError(f"coverage library: size must be an int >= 2, got {size!r}")
    lib = OptionLibrary(name, task_graph(n_agents, size))
    for k in range(n_agents):
        lib.add(Option(f"go_to_{k}", _GO_TO[k], milestone(k), initiation=can_move, failure=frozen,
                       max_steps=2 * (size - 1) + 2, exclusive=True,
                       description=f"walk to landmark {k} and claim it"))
    lib.add(Option("stay", stay, None, done=stay_done, max_steps=1, description="stay put for a step"))
    return lib.validate()
