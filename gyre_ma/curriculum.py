"""Curriculum: horizon phases promoted on verified completion.

``warmup`` runs on a short step cap (optionally towards a nearer goal milestone),
``reinforce`` on the full cap towards the real goal, ``refine`` keeps the full goal (and
optionally a tighter cap) once the task is mostly solved. A phase is promoted when the
mean verified completion over the last ``window`` observations reaches ``threshold``.
Every step cap is ``k ×`` the oracle's path length to the phase's goal.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from gyre_ma.envs.registry import has_oracle, make_oracle
from gyre_ma.rollout import Trajectory, run_episode

if TYPE_CHECKING:
    from gyre_ma.config import ExperimentConfig
    from gyre_ma.options.library import OptionLibrary

Phase = Literal["warmup", "reinforce", "refine"]
PHASES: tuple[Phase, ...] = ("warmup", "reinforce", "refine")


def oracle_path_lengths(trajectories: Iterable[Trajectory]) -> dict[str, float]:
    """Mean first-verification step of each milestone over (oracle) trajectories that
    reached it: the path length a step cap is a multiple of."""
    steps: dict[str, list[int]] = {}
    for t in trajectories:
        for m, s in t.milestone_steps.items():
            steps.setdefault(m, []).append(s)
    return {m: sum(v) / len(v) for m, v in steps.items()}


class Curriculum:
    """A small state machine over :data:`PHASES`; the loop reads ``step_cap`` and ``goal``."""

    def __init__(
        self,
        path_length: float,
        *,
        k: float = 2.5,
        threshold: float = 0.8,
        window: int = 5,
        warmup: bool = True,
        warmup_k: float | None = 1.5,
        warmup_goal: str | None = None,
        warmup_path_length: float | None = None,
        refine_k: float | None = None,
    ) -> None:
        """``path_length``: oracle steps to the real goal. ``warmup_goal`` (a nearer
        milestone) needs ``warmup_path_length``, the oracle steps to it. ``warmup_k`` /
        ``refine_k`` replace ``k`` in those phases (None: ``k``)."""
        checks = [
            ("path_length", path_length, math.isfinite(path_length) and path_length > 0, "> 0"),
            ("k", k, k > 0, "> 0"),
            ("threshold", threshold, 0.0 < threshold <= 1.0, "in (0, 1]"),
            ("window", window, window >= 1, ">= 1"),
            ("warmup_k", warmup_k, warmup_k is None or warmup_k > 0, "None or > 0"),
            ("refine_k", refine_k, refine_k is None or refine_k > 0, "None or > 0"),
            ("warmup_path_length", warmup_path_length,
             warmup_path_length is None or (math.isfinite(warmup_path_length) and warmup_path_length > 0),
             "None or > 0"),
        ]
        for name, value, ok, expected in checks:
            if not ok:
                raise ValueError(f"`{name}` ({value!r}) must be {expected}")
        if (warmup_goal is None) != (warmup_path_length is None):
            raise ValueError(f"`warmup_goal` ({warmup_goal!r}) and `warmup_path_length` "
                             f"({warmup_path_length!r}) must be given together")
        self.path_length = float(path_length)
        self.k = k
        self.threshold = threshold
        self.window = window
        self.warmup_k = warmup_k
        self.warmup_goal = warmup_goal
        self.warmup_path_length = warmup_path_length
        self.refine_k = refine_k
        self.phase: Phase = "warmup" if warmup else "reinforce"
        self.history: deque[float] = deque(maxlen=window)
        self.observations = 0
        self.promotions: list[tuple[int, Phase, Phase]] = []
        """(observation count, from, to) of every promotion."""

    @staticmethod
    def oracle(config: ExperimentConfig, env: Any, library: OptionLibrary) -> Any:
        """The oracle whose episodes measure the path length: the env's own, or the one
        ``manager.policy`` builds (the learned manager still learns; this one only plays the
        measuring episodes)."""
        if config.manager.policy is None and not has_oracle(config.env.id):
            raise ValueError(f"curriculum.enabled: the horizon curriculum sets its step caps from the path length "
                             f"of oracle episodes, and environment {config.env.id!r} has no built-in oracle; set "
                             "manager.policy to a 'module:callable' that builds one (the manager still learns: "
                             "the oracle only plays the measuring episodes)")
        return make_oracle(config.env.id, env, library, config.manager.policy)

    @classmethod
    def from_config(cls, config: ExperimentConfig, env: Any, library: OptionLibrary) -> Curriculum:
        """Phases from ``config.curriculum``, path lengths from oracle episodes on ``env``."""
        cur = config.curriculum
        if cur.warmup_goal is not None and cur.warmup_goal not in library.graph:
            raise ValueError(f"curriculum.warmup_goal: {cur.warmup_goal!r} is not a milestone; "
                             f"known: {list(library.graph.names)}")
        runs = [run_episode(env, library, cls.oracle(config, env, library), seed=10**9 + s)
                for s in range(cur.oracle_episodes)]
        return cls.from_oracle(runs, warmup_goal=cur.warmup_goal, k=cur.k, warmup_k=cur.warmup_k,
                               refine_k=cur.refine_k, threshold=cur.threshold, window=cur.window)

    def metrics(self) -> dict[str, float]:
        """The phase (index into :data:`PHASES`) and step cap episodes now run under."""
        return {"curriculum_phase": float(PHASES.index(self.phase)), "curriculum_step_cap": float(self.step_cap)}

    @classmethod
    def from_oracle(cls, trajectories: Sequence[Trajectory], goal: str | None = None, *,
                    warmup_goal: str | None = None, **kwargs: Any) -> Curriculum:
        """Path lengths measured on oracle trajectories: to ``goal`` (None: the mean length
        of the successful ones, i.e. to every goal) and to ``warmup_goal``."""
        lengths = oracle_path_lengths(trajectories)
        for name in (goal, warmup_goal):
            if name is not None and name not in lengths:
                raise ValueError(f"milestone {name!r} was never verified by the oracle trajectories; "
                                 f"verified: {sorted(lengths)}")
        if goal is None:
            done = [t.length for t in trajectories if t.success]
            if not done:
                raise ValueError(f"none of the {len(trajectories)} oracle trajectories succeeded; "
                                 "cannot measure the path length")
            path = sum(done) / len(done)
        else:
            path = lengths[goal]
        return cls(path, warmup_goal=warmup_goal,
                   warmup_path_length=lengths[warmup_goal] if warmup_goal else None, **kwargs)

    # ----------------------------------------------------------- what the loop reads
    @property
    def goal(self) -> str | None:
        """Milestone that counts as completion in this phase; None: the task's own goals."""
        return self.warmup_goal if self.phase == "warmup" else None

    @property
    def step_cap(self) -> int:
        """Primitive step cap of episodes in this phase: ⌈k × oracle path length⌉."""
        if self.phase == "warmup":
            path = self.warmup_path_length if self.warmup_goal is not None else self.path_length
            k = self.warmup_k if self.warmup_k is not None else self.k
        else:
            path = self.path_length
            k = self.refine_k if self.phase == "refine" and self.refine_k is not None else self.k
        return max(1, math.ceil(k * path - 1e-9))

    def succeeded(self, traj: Trajectory) -> bool:
        """Verified completion of this phase's goal (a guard's veto making it none)."""
        if traj.vetoed:
            return False
        return traj.success if self.goal is None else self.goal in traj.milestone_steps

    def success_rate(self, trajectories: Sequence[Trajectory]) -> float:
        return sum(self.succeeded(t) for t in trajectories) / len(trajectories) if trajectories else 0.0

    # ----------------------------------------------------------- transitions
    def observe(self, success_rate: float) -> bool:
        """Record one iteration's verified completion; return whether the phase changed."""
        if not (isinstance(success_rate, (int, float)) and 0.0 <= success_rate <= 1.0):
            raise ValueError(f"success_rate must be a number in [0, 1], got {success_rate!r}")
        self.observations += 1
        self.history.append(float(success_rate))
        if self.phase == PHASES[-1] or len(self.history) < self.window:
            return False
        if sum(self.history) / self.window < self.threshold:
            return False
        old = self.phase
        self.phase = PHASES[PHASES.index(old) + 1]
        self.history.clear()
        self.promotions.append((self.observations, old, self.phase))
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "history": list(self.history), "observations": self.observations,
                "promotions": [list(p) for p in self.promotions]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("phase") not in PHASES:
            raise ValueError(f"curriculum state: phase {state.get('phase')!r} is not one of {list(PHASES)}")
        self.phase = state["phase"]
        self.history = deque((float(x) for x in state["history"]), maxlen=self.window)
        self.observations = int(state["observations"])
        self.promotions = [(int(n), a, b) for n, a, b in state["promotions"]]

    def __repr__(self) -> str:
        return f"Curriculum(phase={self.phase!r}, step_cap={self.step_cap}, goal={self.goal!r})"
