"""Arbitration: one fixed order turns the reward sources of an option call into its reward.

    guard veto  >  verified outcome  >  milestones, rules and the env's reward  >  PRM

1. **Guard veto.** If any guard rule was violated in the episode, every positive part of
   every call's reward is removed (outcome included) and each violating call is charged
   ``guard_penalty``. Nothing below can undo it.
2. **Verified outcome.** A successful episode (every goal verified on env state) pays
   ``outcome_scale`` × the goals' task-graph reward on the call each agent was running
   when it ended. An agent that died (or left) before the end gets none: paid on its
   last call, the outcome would reach it at its death, almost undiscounted, while the
   survivors' share is discounted over the rest of the episode — dying early would pay
   (a learned manager did exactly that, starving one agent in nearly every episode). Only
   verification sets it. In a *failed* episode each agent's positive shaping (milestones,
   rules, PRM) is scaled down to at most ``failure_cap`` × that outcome reward (when a cap is set), so no
   failure is ever worth as much as a verified success, however many rules it passes.
3. **Milestones and rules.** Milestones first verified during a call pay their graph
   weight × ``milestone_scale`` (goals only in a failed episode, which no outcome pays:
   ``partial_goals``); process rules pay their weight where they pass (and
   their milestone progressed). The environment's own reward (summed over the call's
   steps) enters × ``env_reward`` — 0 by default: it is unverified, and an env that
   already pays its milestones would pay them twice.
4. **PRM.** Last and least: ``min(prm_weight, prm_weight_cap)`` × the drift monitor's
   scale × (score − batch mean score), so |PRM part| ≤ ``prm_weight_cap``, which must be
   below the smallest milestone reward.

The parts stay in the call's :class:`RewardBreakdown`; ``total`` is their sum.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gyre_ma.options.graph import TaskGraph
from gyre_ma.rewards.alarms import AlarmConfig
from gyre_ma.rewards.breakdown import RewardBreakdown
from gyre_ma.rewards.drift import DriftConfig
from gyre_ma.rewards.milestones import calls_at_end, milestone_rewards
from gyre_ma.rewards.rules import RuleResults, RuleSpec
from gyre_ma.rollout import Trajectory


class PRMConfig(BaseModel):
    """Training of the process reward model (``rewards.prm``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    enabled: bool = False
    """Train and use the PRM; off (the default), its part of every breakdown is 0. On the
    default tech-tree task its per-call shaping slowed the manager's learning markedly
    (measured), so it is opt-in until that is understood."""
    hidden: int = Field(64, ge=4, le=4096)
    """Width of its two hidden layers."""
    lr: float = Field(1e-3, gt=0.0, le=1.0)
    """Adam learning rate."""
    epochs: int = Field(2, ge=1, le=100)
    """Passes over each iteration's training calls."""
    minibatch_size: int = Field(256, ge=1)
    """Calls per gradient step."""
    holdout_fraction: float = Field(0.25, ge=0.0, lt=1.0)
    """Share of each iteration's episodes kept out of training to measure drift on."""


class RewardConfig(BaseModel):
    """Verified rewards (the ``rewards:`` section of an experiment config)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    outcome_scale: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    """Multiplies the goals' task-graph reward; paid on the calls running at the end of a verified success."""
    milestone_scale: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    """Multiplies each milestone's task-graph ``reward``, paid on its first verification."""
    guard_penalty: float = Field(1.0, ge=0.0, allow_inf_nan=False)
    """Charged (as −penalty) to each call a guard violation is attributed to. Without it a
    veto only removes reward, which teaches nothing when every episode is vetoed."""
    failure_cap: float | None = Field(None, ge=0.0, le=1.0)
    """In a failed episode, an agent's positive shaping is capped at this fraction of the
    outcome reward (None, the default: no cap). The cap rescales the whole episode, so on
    long chains every failure past the cap is worth the same and deeper progress stops
    paying: the manager stalled on the default tech-tree task with it (measured)."""
    partial_goals: bool = True
    """In a failed episode, each goal it did verify pays its graph weight × ``milestone_scale``
    as a milestone does (a success's outcome, which pays for the goals, does not come). Where
    success needs several goals (cover every landmark), a failure is otherwise worth 0
    whatever it achieved, so in an episode already lost the useful calls and the idle ones
    look alike. A failure of a single-goal task verified no goal (unless it held the goal
    once and lost it again), so there nothing changes."""
    env_reward: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    """Weight (≥ 0) of the environment's own reward, summed over each call's steps, as the
    ``env`` part of its breakdown (0, the default: left out). For a health or survival
    signal the milestones do not see; the guard veto and ``failure_cap`` apply to it."""
    prm_weight: float = Field(0.01, ge=0.0, allow_inf_nan=False)
    """Weight of the PRM part (before the cap and the drift monitor's cut)."""
    prm_weight_cap: float = Field(0.015, ge=0.0, allow_inf_nan=False)
    """Hard cap on the PRM weight; must stay below the smallest milestone reward."""
    rules: list[RuleSpec] = Field(default_factory=list)
    """Rules (see ``gyre_ma.rewards.rules``): process rules and guards over env state."""
    rules_file: str | None = None
    """A YAML file of more rules (a list, or a mapping with ``rules``), added after ``rules``."""
    snapshot: str | None = None
    """``module:callable`` (env → mapping) adding env-specific state keys for rules."""
    prm: PRMConfig = Field(default_factory=PRMConfig)
    """Training of the process reward model."""
    drift: DriftConfig = Field(default_factory=DriftConfig)
    """The PRM drift monitor."""
    alarms: AlarmConfig = Field(default_factory=AlarmConfig)
    """Reward-hacking alarms."""

    @model_validator(mode="after")
    def _unique_rule_names(self) -> RewardConfig:
        seen: set[str] = set()
        for i, r in enumerate(self.rules):
            if r.name in seen:
                raise ValueError(f"rules[{i}]: rule name {r.name!r} is used twice")
            seen.add(r.name)
        return self

    @property
    def effective_prm_weight(self) -> float:
        """The PRM weight after the cap (before drift)."""
        return min(self.prm_weight, self.prm_weight_cap)


_SHAPING = ("milestone", "rules", "env", "prm")
"""The positive parts a failed episode's cap scales."""


def outcome_reward(graph: TaskGraph, config: RewardConfig, goals: Sequence[str] = ()) -> float:
    """What a verified success pays each call running when the episode ended: its goals'
    rewards (``goals``, an episode's; by default the graph's)."""
    return config.outcome_scale * sum(graph.milestone(g).reward for g in goals or graph.goals)


def check_prm_cap(graph: TaskGraph, config: RewardConfig) -> None:
    """PRM below milestones: the PRM cap must be under the smallest positive milestone reward."""
    weights = [config.milestone_scale * m.reward for m in graph.milestones
               if m.name not in graph.goals and m.reward > 0]
    if weights and config.prm_weight > 0 and config.prm_weight_cap >= min(weights):
        raise ValueError(
            f"rewards.prm_weight_cap ({config.prm_weight_cap}) must be below the smallest milestone "
            f"reward ({min(weights)} = graph reward x milestone_scale {config.milestone_scale}) so the "
            "PRM never outweighs a verified milestone"
        )


def score_trajectory(trajectory: Trajectory, graph: TaskGraph, config: RewardConfig, *,
                     rules: RuleResults | None = None,
                     prm: Sequence[float] | None = None) -> list[RewardBreakdown]:
    """The arbitrated breakdown of each call of ``trajectory`` (aligned with its calls).

    ``rules`` comes from :meth:`RuleEngine.end_episode`; ``prm`` is the PRM part per call,
    already weighted (:func:`gyre_ma.rewards.prm.prm_rewards`). Both default to nothing.
    """
    calls = trajectory.calls
    n = len(calls)
    rules = rules if rules is not None else RuleResults.empty(n)
    prm = list(prm) if prm is not None else [0.0] * n
    for name, got in (("rules.process", len(rules.process)), ("prm", len(prm))):
        if got != n:
            raise ValueError(f"score_trajectory: {name} has {got} entries; expected {n}, one per call")
    goal = outcome_reward(graph, config, trajectory.goals)
    at_end = set(calls_at_end(trajectory))
    milestones = milestone_rewards(trajectory, graph, scale=config.milestone_scale,
                                   include_goals=config.partial_goals and not trajectory.success)
    parts = []
    for i in range(n):
        sources = [f"milestone:{m}" for m in milestones[i][1]] + [f"rule:{r}" for r in rules.paid[i]]
        outcome = goal if trajectory.success and i in at_end else 0.0
        if outcome:
            sources.insert(0, "outcome")
        env = config.env_reward * float(calls[i].raw_reward)
        if env:
            sources.append("env")
        if prm[i]:
            sources.append("prm")
        parts.append({"outcome": outcome, "milestone": milestones[i][0], "rules": rules.process[i], "env": env,
                      "prm": float(prm[i]), "removed": 0.0, "sources": sources})

    if rules.vetoed:  # 1. guard veto
        for i, p in enumerate(parts):
            for k in ("outcome", "milestone", "rules", "env", "prm"):
                if p[k] > 0:
                    p["removed"] += p[k]
                    p[k] = 0.0
            p["sources"].append("veto")
    elif not trajectory.success and config.failure_cap is not None:  # 2. outcome dominates
        limit = config.failure_cap * goal
        for agent in {c.agent for c in calls}:
            rows = [i for i, c in enumerate(calls) if c.agent == agent]
            positive = sum(max(parts[i][k], 0.0) for i in rows for k in _SHAPING)
            if positive > limit:
                factor = limit / positive
                for i in rows:
                    for k in _SHAPING:
                        if parts[i][k] > 0:
                            parts[i]["removed"] += parts[i][k] * (1.0 - factor)
                            parts[i][k] *= factor
                    parts[i]["sources"].append("cap")
    out = []
    for i, p in enumerate(parts):
        penalty = -config.guard_penalty * len(rules.penalized[i])
        sources = p["sources"] + [f"guard:{g}" for g in rules.penalized[i]]
        out.append(RewardBreakdown.of(outcome=p["outcome"], milestone=p["milestone"], rules=p["rules"],
                                      env=p["env"], prm=p["prm"], penalty=penalty, guard=rules.vetoed,
                                      removed=p["removed"], sources=sources))
    return out
