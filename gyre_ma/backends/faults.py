"""Fault injection for backend tests: an environment that raises, crashes or hangs.

:func:`faulty_env` wraps a registered environment and, at primitive step ``at_step`` of
an episode, claims a *fault token* from ``fault_dir`` (a file, claimed by deleting it,
so each token fires exactly once across processes and restarts). A claimed token
raises :class:`InjectedFault` (mode ``raise``), kills the process (``exit``) or sleeps
forever (``hang``). Tokens made by :func:`arm_faults` for worker ``w`` fire only in the
process whose ``GYRE_MA_WORKER_ID`` is ``w`` (set by Ray rollout actors); tokens for a
task seed fire only in an episode reset with that seed.
With no token left the wrapper is transparent: same observations, milestones, rewards.

Lives in the package (not under tests/) so that Ray workers can import it.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from gyre_ma.envs.registry import make_env

WORKER_ID_ENV = "GYRE_MA_WORKER_ID"
FaultMode = Literal["raise", "exit", "hang"]


class InjectedFault(RuntimeError):
    """The fault a test asked for."""


def arm_faults(fault_dir: str | Path, n: int, *, mode: FaultMode = "raise", worker: int | None = None,
               seed: int | None = None) -> list[Path]:
    """Create ``n`` fault tokens of one mode, for one worker index or (``None``) any process,
    and for episodes of one task seed or (``None``) any."""
    if mode not in ("raise", "exit", "hang"):
        raise ValueError(f"mode must be raise, exit or hang, got {mode!r}")
    d = Path(fault_dir)
    d.mkdir(parents=True, exist_ok=True)
    who = "any" if worker is None else f"w{worker}"
    which = "all" if seed is None else f"s{seed}"
    paths = []
    for _ in range(n):
        path = d / f"{who}-{which}-{uuid.uuid4().hex}.token"
        path.write_text(mode)
        paths.append(path)
    return paths


def tokens_left(fault_dir: str | Path) -> int:
    return len(list(Path(fault_dir).glob("*.token")))


class FaultyEnv:
    """Delegates everything to the wrapped env; ``step`` may fire a fault."""

    def __init__(self, env: Any, *, fault_dir: str, at_step: int) -> None:
        self.env, self.fault_dir, self.at_step = env, Path(fault_dir), at_step
        self._steps, self._seed = 0, None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["env"], name)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self._steps, self._seed = 0, seed
        return self.env.reset(seed=seed, options=options)

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        self._steps += 1
        mode = self._claim() if self._steps == self.at_step else None
        if mode == "raise":
            raise InjectedFault(f"injected fault at step {self._steps} in worker {self._worker()}")
        if mode == "exit":
            os._exit(17)
        while mode == "hang":
            time.sleep(60)
        return self.env.step(actions)

    def _worker(self) -> str:
        """This process's worker index; outside a rollout actor ("driver") no worker token
        fires (a test's leftover tokens must never kill the test process itself)."""
        return os.environ.get(WORKER_ID_ENV, "driver")

    def _claim(self) -> str | None:
        """The mode of a token this process claimed, or None."""
        patterns = [f"{who}-{which}-*.token" for who in (f"w{self._worker()}", "any")
                    for which in ("all", f"s{self._seed}")]
        for pattern in patterns:
            for token in sorted(self.fault_dir.glob(pattern)):
                try:
                    mode = token.read_text()
                    token.unlink()
                except FileNotFoundError:  # another process claimed it first
                    continue
                return mode
        return None


def faulty_env(*, base: str = "workflow_v0", fault_dir: str, at_step: int = 5, **kwargs: Any) -> FaultyEnv:
    """``env.id: gyre_ma.backends.faults:faulty_env`` with ``env.kwargs`` {base, fault_dir,
    at_step, ...the base env's own kwargs}; set ``library`` to the base env's library."""
    return FaultyEnv(make_env(base, **kwargs), fault_dir=fault_dir, at_step=at_step)


class Stuck:
    """A sub-policy that blocks for ``seconds`` (a stuck request, a deadlock) on every step."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.__name__ = self.__qualname__ = "Stuck"

    def __call__(self, ctx: Any) -> int:
        time.sleep(self.seconds)
        return 0


def stuck_library(env: Any = None, *, seconds: float = 3600.0) -> Any:
    """coverage_v0's library plus an option ``stuck`` whose sub-policy blocks for
    ``seconds``: ``library: gyre_ma.backends.faults:stuck_library`` (``library_kwargs``:
    ``seconds``) for tests of the wall-clock bounds, on any backend."""
    from gyre_ma.envs.coverage.options import make_library
    from gyre_ma.options.option import Option

    library = make_library(env=env)
    library.add(Option("stuck", Stuck(seconds), None, done=lambda ctx: ctx.steps >= 1, max_steps=1,
                       description="blocks"))
    return library
