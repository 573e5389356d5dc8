"""Per-iteration metrics of the learner's episodes, as flat ``{name: float}`` mappings."""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

from gyre_ma.config import CreditConfig
from gyre_ma.credit import anchor_values
from gyre_ma.rewards.milestones import calls_at_end, last_calls
from gyre_ma.rollout import Trajectory, ended_by_env
from gyre_ma.training_batch import outcomes, verified_at


def episode_metrics(trajectories: list[Trajectory], milestones: tuple[str, ...]) -> dict[str, float]:
    """Success, length, reward, calls and verified progress, means over ``trajectories``;
    ``milestone/<m>``: the share of episodes that verified m."""
    n = max(len(trajectories), 1)
    out = {
        "success_rate": sum(t.success for t in trajectories) / n,
        "episode_length": float(np.mean([t.length for t in trajectories])) if trajectories else 0.0,
        "episode_reward": float(np.mean([t.total_reward for t in trajectories])) if trajectories else 0.0,
        "option_calls": float(np.mean([len(t.calls) for t in trajectories])) if trajectories else 0.0,
        # the calls the manager chose among two or more eligible options: forced calls (a
        # frozen agent's only option, every step) grow with a failure's length, not with a hack
        # (a call recorded without its mask counts as a choice)
        "option_choices": float(np.mean([sum(c.mask is None or int(np.sum(c.mask)) > 1 for c in t.calls)
                                         for t in trajectories]))
        if trajectories else 0.0,
        # verified progress short of completion: the calls alarms weigh calls against it; a milestone that
        # held at reset is the task seed's luck, not the episode's progress (a session-60 user's lander, over
        # the pad at reset on a quarter of the seeds, raised a false alarm as the mix of seeds moved)
        "milestones_verified": float(np.mean([sum(t.milestone_steps[m] > 0 for m in set(t.milestone_steps)
                                                  & set(milestones)) for t in trajectories]))
        if trajectories else 0.0,
        # agents that died (or left) before the episode ended: a team that sheds members
        # while success holds is slower, and once was a reward hack (see rewards.arbiter);
        # one whose last call verified a milestone left on its work done (a train arrived)
        "agents_lost": float(np.mean([_lost(t) for t in trajectories])) if trajectories else 0.0,
    }
    # episodes cut at a dead end of the library (no eligible option for some agent)
    out["dead_ends"] = sum(bool(t.dead_ends) for t in trajectories) / n
    # wall-clock bounds (backend.option_timeout_s / episode_timeout_s): calls and episodes cut
    out["option_timeouts"] = sum(len(getattr(t, "option_timeouts", ())) for t in trajectories) / n
    out["episode_timeouts"] = sum(bool(getattr(t, "timed_out", False)) for t in trajectories) / n
    if any(t.faults for t in trajectories):  # backend.on_fault: continue
        out["faults/per_episode"] = sum(len(t.faults) for t in trajectories) / n
        out["faults/episodes_cut"] = sum(t.cut_by_fault for t in trajectories) / n
    # the other failures: the env ended the episode before the step cap (every agent
    # terminated: died, lost, ran out of its own time) or the step cap cut it
    failed = [t for t in trajectories if not t.success and not t.dead_ends and not t.timed_out and not t.cut_by_fault]
    ended = sum(map(ended_by_env, failed))
    out["failed_env_ended"] = ended / n
    out["failed_step_cap"] = (len(failed) - ended) / n
    tools = [t.tool_calls for t in trajectories if t.tool_calls is not None]
    if tools:
        out["tool_calls"] = float(np.mean(tools))
    requests = sum(t.llm_requests for t in trajectories)
    if requests:  # LLM-backed sub-policies: per episode, and the unusable outputs' share of the requests
        out["llm/requests"] = requests / n
        out["llm/invalid_share"] = sum(t.llm_invalid for t in trajectories) / requests
        out["llm/fallback_share"] = sum(t.llm_fallbacks for t in trajectories) / requests
    for m in milestones:
        out[f"milestone/{m}"] = sum(m in t.milestone_steps for t in trajectories) / n
    for name in sorted({k for t in trajectories for k in t.scores}):  # the env's own figures, where it gives them
        out[f"score/{name}"] = float(np.mean([t.scores[name] for t in trajectories if name in t.scores]))
    return out


def _lost(trajectory: Trajectory) -> int:
    """Agents that left ``trajectory`` before its end with their last call verifying nothing."""
    at_end = set(calls_at_end(trajectory))
    return sum(i not in at_end and not trajectory.calls[i].milestones for i in last_calls(trajectory))


def option_shares(trajectories: Sequence[Trajectory], names: Sequence[str]) -> dict[str, float]:
    """``option/<name>/share``: the share of ``trajectories``' option calls that ran the option
    ``name`` (0 where there were none): which options the policy leans on, and how that moves."""
    chosen = np.array([c.option for t in trajectories for c in t.calls], dtype=np.int64)
    counts = np.bincount(chosen, minlength=len(names))[: len(names)]
    total = max(int(counts.sum()), 1)
    return {f"option/{name}/share": count / total for name, count in zip(names, counts.tolist(), strict=True)}


def goal_metrics(trajectories: Sequence[Trajectory], goals: Sequence[str]) -> dict[str, float]:
    """Where episodes have their own goals (``Trajectory.goals``), per graph goal ``g``:
    ``goal/<g>/episode_share``, the share of episodes that had it, and ``goal/<g>/success_rate``
    and ``goal/<g>/episode_length`` over those (NaN where none had it). Empty where every
    episode has the graph's goals."""
    if not any(t.goals for t in trajectories):
        return {}
    out: dict[str, float] = {}
    for g in goals:
        had = with_goal(trajectories, g, goals)
        out[f"goal/{g}/episode_share"] = len(had) / max(len(trajectories), 1)
        out[f"goal/{g}/success_rate"] = float(np.mean([t.success for t in had])) if had else math.nan
        out[f"goal/{g}/episode_length"] = float(np.mean([t.length for t in had])) if had else math.nan
    return out


def with_goal(trajectories: Sequence[Trajectory], goal: str, goals: Sequence[str]) -> list[Trajectory]:
    """The ``trajectories`` whose episode had ``goal``: its own goals, else the graph's ``goals``."""
    return [t for t in trajectories if goal in (t.goals or goals)]


def counted_success_rate(trajectories: Sequence[Trajectory]) -> float:
    """The share of ``trajectories`` that the learner counts as wins: verified success that
    no guard vetoed (:attr:`~gyre_ma.rollout.Trajectory.counted_success`). Validation, and
    so ``best.pt`` and the rollbacks, judge a policy by it."""
    return sum(t.counted_success for t in trajectories) / max(len(trajectories), 1)


def out_of_order(trajectories: Sequence[Trajectory], graph: Any) -> tuple[float, str | None]:
    """The share of ``trajectories`` that verified a milestone before the task graph's
    prerequisites of it (by the same step), and the first such case in words (None where
    none did). An env whose rules enforce the graph never does this: a detector the episode
    fooled does, or a graph that does not match the env (``gyre-ma check`` fails both)."""
    first, count = None, 0
    for t in trajectories:
        for m, step in sorted(t.milestone_steps.items(), key=lambda item: item[1]):
            if m not in graph:
                continue
            before = {x for x, s in t.milestone_steps.items() if s <= step}
            if not graph.unlocked(m, before):
                count += 1
                if first is None:
                    spec = graph.milestone(m)
                    needs = [*(d for d in spec.requires if d not in before),
                             *("one of " + " / ".join(g) for g in spec.any_of if not set(g) & before)]
                    first = f"{m!r} at step {step} before {', '.join(needs)} (task seed {t.task_seed})"
                break
    return count / max(len(trajectories), 1), first


def anchor_metrics(trajectories: list[Trajectory], credit: CreditConfig, names: tuple[str, ...]) -> dict[str, float]:
    """``anchor/<milestone>``: V(m) − ō over these episodes, what verifying m says about the
    outcome (negative: episodes that verify it end worse; 0: not verified or not telling).
    The values anchored credit uses, before its scaling, on the rollout alone (the
    training batch may add buffer elites)."""
    if not trajectories:
        return {}
    mean, values = anchor_values(outcomes=outcomes(trajectories, credit), verified_at=verified_at(trajectories, names),
                                 prior=credit.anchor_prior)
    return {f"anchor/{name}": float(v - mean) for name, v in zip(names, values, strict=True)}


def wilson_interval(successes: int, n: int, *, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a success rate: ``successes`` of ``n`` episodes, at
    ``confidence`` (two-sided); it stays inside [0, 1] and is sound at 0 % and 100 %."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n >= 1, got successes={successes}, n={n}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    return low, 1.0 if successes == n else min(1.0, centre + half)


def paired_difference(both: int, first_only: int, second_only: int, neither: int, *,
                      confidence: float = 0.95) -> tuple[float, float, float]:
    """The difference of two success rates measured on the same tasks (task seeds), with its
    interval: Newcombe's square-and-add interval for paired proportions (Newcombe 1998,
    *Statistics in Medicine* 17:2635, method 10), built from each rate's Wilson interval and
    the correlation of the pairs. The counts are the 2x2 table of tasks: both succeeded,
    the first alone, the second alone, neither. Returns (difference, low, high), first − second."""
    counts = (both, first_only, second_only, neither)
    if any(c < 0 for c in counts) or sum(counts) < 1:
        raise ValueError(f"need counts >= 0 of at least one task, got {counts}")
    n = sum(counts)
    first, second = both + first_only, both + second_only
    p1, p2 = first / n, second / n
    l1, u1 = wilson_interval(first, n, confidence=confidence)
    l2, u2 = wilson_interval(second, n, confidence=confidence)
    margins = first * (n - first) * second * (n - second)
    cross = both * neither - first_only * second_only
    if margins == 0 or 0 <= cross <= n / 2:  # a positive cross product is shrunk by n/2 (continuity)
        phi = 0.0
    else:
        phi = (cross - n / 2 if cross > 0 else cross) / math.sqrt(margins)
    down = math.sqrt(max(0.0, (p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2)))
    up = math.sqrt(max(0.0, (p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1)))
    return p1 - p2, max(-1.0, p1 - p2 - down), min(1.0, p1 - p2 + up)


def mcnemar_exact(first_only: int, second_only: int) -> float:
    """The exact (binomial) McNemar test's two-sided p-value: of the tasks on which exactly one
    of two policies succeeded, are the first's as likely as the second's?"""
    if first_only < 0 or second_only < 0:
        raise ValueError(f"need counts >= 0, got {first_only} and {second_only}")
    n, k = first_only + second_only, min(first_only, second_only)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def heldout_result(episodes: Sequence[tuple[bool, int]]) -> dict[str, Any]:
    """Held-out episodes as (success, length) → their success rate with its Wilson 95 %
    interval, mean length, and mean length of the successes (``steps_to_goal``; None
    without one): the numbers every held-out evaluation reports."""
    if not episodes:
        raise ValueError("need at least one held-out episode")
    wins = sum(bool(s) for s, _ in episodes)
    won = [n for s, n in episodes if s]
    return {"success": wins / len(episodes), "ci95": list(wilson_interval(wins, len(episodes))),
            "episode_length": sum(n for _, n in episodes) / len(episodes),
            "steps_to_goal": sum(won) / len(won) if won else None}
