"""The training batch built from trajectories: B segment and C score, as functions.

:func:`segment` lays trajectories out as rows (one per episode × agent) of option calls;
:func:`build_batch` turns them into option-level advantages (milestone-anchored, blended
with the verified outcome) and critic targets, one tensor per key of :mod:`gyre_ma.batch`.
Everything here is a function of (trajectories, config, featurizer).

Every trajectory is a whole episode whose outcome is verified at its end, and the step
cap is part of the task (the featurizer carries the time fraction), so a row's last call
has nothing after it, whether the env terminated it, truncated it at its cap, or gyre-ma
cut it (its horizon, a dead end): no bootstrap (Pardo et al. 2018, "Time Limits in
Reinforcement Learning"). Bootstrapping a timeout with the critic's value made a failure
at the cap look like a success to the local credit and the critic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from gyre_ma import batch as B
from gyre_ma.credit import episode_outcomes, option_advantages, smdp_returns
from gyre_ma.rewards.milestones import calls_at_end
from gyre_ma.rollout import OptionCall, Trajectory
from gyre_ma.trainers.self_imitation import group_best

if TYPE_CHECKING:
    from gyre_ma.agents.manager import Featurizer, StateScaler
    from gyre_ma.config import CreditConfig, ExperimentConfig


@dataclass
class Segments:
    """Trajectories laid out as rows (one per episode × agent) of option calls."""

    calls: list[list[OptionCall]]
    episode: torch.Tensor
    """long [R]: the episode (index into the trajectories) of each row."""

    @property
    def width(self) -> int:
        return max((len(r) for r in self.calls), default=0)


def segment(trajectories: list[Trajectory], agents: list[str]) -> Segments:
    """One row per (episode, agent) that made a call, in trajectory then agent order."""
    calls, episode = [], []
    for e, traj in enumerate(trajectories):
        for agent in agents:
            row = traj.agent_calls(agent)
            if row:
                calls.append(row)
                episode.append(e)
    return Segments(calls, torch.tensor(episode, dtype=torch.long))


def outcomes(trajectories: list[Trajectory], credit: CreditConfig) -> torch.Tensor:
    """Each episode's verified outcome [E] (success no guard vetoed, less the length term)."""
    return episode_outcomes(
        success=torch.tensor([t.counted_success for t in trajectories], dtype=torch.bool),
        length=torch.tensor([t.length for t in trajectories]),
        horizon=torch.tensor([t.horizon for t in trajectories]),
        length_weight=credit.outcome_length_weight)


def verified_at(trajectories: list[Trajectory], names: tuple[str, ...]) -> torch.Tensor:
    """The step each episode verified each task-graph milestone, [E, M] (−1 never)."""
    index = {name: m for m, name in enumerate(names)}
    out = torch.full((len(trajectories), len(names)), -1, dtype=torch.long)
    for e, traj in enumerate(trajectories):
        for name, step in traj.milestone_steps.items():
            if name not in index:
                raise ValueError(f"episode of task seed {traj.task_seed} verified milestone {name!r}, which "
                                 f"is not in the task graph; expected one of {list(names)}")
            out[e, index[name]] = step
    return out


def anchor_inputs(trajectories: list[Trajectory], seg: Segments, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """What milestone-anchored outcome credit reads: the step each episode verified each
    milestone ([E, M], −1 never), the milestones each call verified ([R, T, M]) and the
    calls running when their episode ended ([R, T])."""
    index = {name: m for m, name in enumerate(names)}
    R, T = len(seg.calls), seg.width
    call_milestones = np.zeros((R, T, len(names)), dtype=bool)
    at_end = np.zeros((R, T), dtype=bool)
    ending = {id(traj.calls[i]) for traj in trajectories for i in calls_at_end(traj)}
    for r, row in enumerate(seg.calls):
        for t, call in enumerate(row):
            for name in call.milestones:
                call_milestones[r, t, index[name]] = True
            at_end[r, t] = id(call) in ending
    return {"verified_at": verified_at(trajectories, names), "call_milestones": torch.from_numpy(call_milestones),
            "at_end": torch.from_numpy(at_end)}


def anchor_states(trajectories: list[Trajectory], seg: Segments, features: np.ndarray,
                  time_column: int = -1) -> torch.Tensor:
    """GiGPO's anchor-state group of every call (in ``seg``'s row order), [N] long: calls
    share a group when they decided for the same agent, in the same task seed, from the same
    decision state — the manager's features, the time fraction (their ``time_column``,
    :attr:`~gyre_ma.agents.manager.Featurizer.time_column`) aside."""
    ids: dict[tuple[int, int, bytes], int] = {}
    out, i = [], 0
    state = np.delete(features, time_column, axis=1)
    for r, row in enumerate(seg.calls):
        seed = trajectories[int(seg.episode[r])].task_seed
        for c in row:
            key = (seed, c.agent_index, state[i].tobytes())
            out.append(ids.setdefault(key, len(ids)))
            i += 1
    return torch.tensor(out, dtype=torch.long)


def build_batch(trajectories: list[Trajectory], seg: Segments, *, config: ExperimentConfig, featurizer: Featurizer,
                state_scaler: StateScaler | None, names: tuple[str, ...],
                inputs: Callable[[list[OptionCall]], B.Batch] | None = None) -> B.Batch:
    """C: option-level advantages and critic targets for the segmented ``trajectories``, one
    tensor per key, a row per option call; each row's last call ends it (module docstring).
    ``inputs`` adds the keys a policy reads besides the features (the LLM manager's prompts)."""
    R, T = len(seg.calls), seg.width
    f32 = dict(dtype=torch.float32)
    rewards, values = torch.zeros(R, T, **f32), torch.zeros(R, T, **f32)
    durations = torch.ones(R, T, dtype=torch.long)
    terminated, milestones, mask = (torch.zeros(R, T, dtype=torch.bool) for _ in range(3))
    for r, row in enumerate(seg.calls):
        n = len(row)
        rewards[r, :n] = torch.tensor([c.reward for c in row])
        values[r, :n] = torch.tensor([c.value for c in row])
        durations[r, :n] = torch.tensor([max(c.duration, 1) for c in row])
        terminated[r, n - 1] = True  # terminated, truncated at the cap, or cut: the episode is over
        milestones[r, :n] = torch.tensor([bool(c.milestones) for c in row])
        mask[r, :n] = True
    credit = config.credit
    flat = [c for row in seg.calls for c in row]
    features = featurizer.many(flat)
    anchors = anchor_inputs(trajectories, seg, names) if credit.anchored else {}
    if credit.mode == "gigpo":
        anchors["anchors"] = torch.zeros(R, T, dtype=torch.long)
        anchors["anchors"][mask] = anchor_states(trajectories, seg, features, featurizer.time_column)
    episode_outcome = outcomes(trajectories, credit)
    groups = torch.tensor([t.task_seed for t in trajectories], dtype=torch.long)
    advantages, _ = option_advantages(
        mode="grpo" if config.train.objective == "grpo" else credit.mode,
        rewards=rewards, values=values, durations=durations,
        terminated=terminated, truncated=torch.zeros_like(terminated), gamma=credit.gamma, lam=credit.lam,
        milestones=milestones, mask=mask, episode_index=seg.episode,
        outcomes=episode_outcome, groups=groups,
        success=torch.tensor([t.counted_success for t in trajectories], dtype=torch.bool),
        w_max=credit.blend_weight, w_length=credit.outcome_weight_succeeded, std_ref=0.5,
        outcome_credit=credit.outcome_credit, anchor_prior=credit.anchor_prior,
        step_weight=credit.gigpo_step_weight, **anchors,
    )
    # critic targets: Monte-Carlo SMDP returns (every row ends its episode)
    returns = smdp_returns(rewards=rewards, durations=durations, terminated=terminated,
                           truncated=torch.zeros_like(terminated), gamma=credit.gamma,
                           bootstrap_value=torch.zeros(R), mask=mask)
    extra = {}
    if config.imitation_weight > 0 and config.train.self_imitation_rows == "group_best":
        best = group_best(episode_outcome, groups)
        extra[B.GROUP_BEST] = best[torch.tensor([int(seg.episode[r]) for r, row in enumerate(seg.calls)
                                                 for _ in row], dtype=torch.long)]
    if state_scaler is not None:
        extra[B.STATE] = torch.from_numpy(np.stack([state_scaler(c.state) for c in flat]))
    if inputs is not None:
        extra |= inputs(flat)
    return extra | {
        B.FEATURES: torch.from_numpy(features),
        B.AGENT: torch.tensor([c.agent_index for c in flat], dtype=torch.long),
        B.MASK: torch.from_numpy(np.stack([c.mask for c in flat])),
        B.OPTION: torch.tensor([c.option for c in flat], dtype=torch.long),
        B.LOG_PROB: torch.tensor([c.log_prob for c in flat], dtype=torch.float32),
        B.VALUE: values[mask],
        B.ADVANTAGE: advantages[mask],
        B.RETURN: returns[mask],
    }


def warm_start_value(returns: torch.Tensor) -> float:
    """The critic's first value: the mean of the return targets of its first batch (the
    constant that fits them best), so its first advantages are centred on what episodes earn.

    Until session 27 it was the mean per-agent, per-step reward over 1 − γ, the value of
    earning it forever; but the returns are episodic (no bootstrap past an episode's end), so
    on a task whose episodes are short beside 1 / (1 − γ) that started the critic one to two
    orders of magnitude too high (coverage_v0: 24 against returns of 1), every advantage was
    large and negative for hundreds of iterations, and the policy gradient followed the
    critic's error: a policy fitted to the oracle fell from 0.99 to 0.86 held-out success
    within 50 iterations (``benchmarks/coverage_warmstart.py``)."""
    if returns.numel() == 0:
        raise ValueError("warm_start_value needs the returns of at least one row")
    return float(returns.float().mean())
