"""RewardScorer: the evaluator's reward pipeline for one run, iteration by iteration.

    rollout:  engine hook on every option end  →  end_episode(traj, env) per episode
    score:    PRM scores → drift check on held-out episodes → arbitration per call
              → PRM trained on the other episodes → metrics
    after:    alarms(metrics) with the loop's episode metrics merged in

It owns the rule engine, the PRM and its trainer, the drift monitor and the hacking
monitor, and checkpoints them together (``state_dict``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from gyre_ma import batch as B
from gyre_ma.options.graph import TaskGraph
from gyre_ma.options.library import resolve
from gyre_ma.rewards.alarms import Alarm, HackingMonitor
from gyre_ma.rewards.arbiter import RewardConfig, check_prm_cap, score_trajectory
from gyre_ma.rewards.breakdown import RewardBreakdown, summarize
from gyre_ma.rewards.drift import DriftMonitor
from gyre_ma.rewards.milestones import milestone_weights
from gyre_ma.rewards.prm import ProcessRewardModel, prm_labels, prm_rewards
from gyre_ma.rewards.rules import (
    Rule,
    RuleEngine,
    RuleResults,
    Snapshot,
    default_snapshot,
    extended_snapshot,
    load_rules,
    rule_metrics,
)
from gyre_ma.rollout import OptionCall, Trajectory

if TYPE_CHECKING:  # Lightning is imported only where a PRM is trained
    from gyre_ma.trainers.fit import Fitter
    from gyre_ma.trainers.prm import PRMModule


@dataclass
class Scored:
    breakdowns: list[list[RewardBreakdown]]
    """One list per trajectory, aligned with its calls."""
    metrics: dict[str, float]


def apply_breakdowns(trajectories: Sequence[Trajectory], breakdowns: Sequence[Sequence[RewardBreakdown]],
                     *, gamma: float, graph: TaskGraph | None = None) -> None:
    """Keep each breakdown on its call (``call.breakdown``, so the reward stays traceable)
    and make the call's option reward its total, discounted inside the option as the SMDP
    backup expects (``reward = Σ_k γ^k r_{t+k}``): the milestone part at the steps its
    milestones were verified (weighted by their graph reward), every other part at the
    call's last step. ``gamma`` is ``credit.gamma``; 1 gives the plain total."""
    for traj, bds in zip(trajectories, breakdowns, strict=True):
        traj.vetoed = any(b.guard for b in bds)
        paying = milestone_weights(traj, graph) if graph is not None else {}
        for call, b in zip(traj.calls, bds, strict=True):
            call.breakdown = b  # type: ignore[attr-defined]
            if gamma == 1.0:
                call.reward = b.total
                continue
            at_end = gamma ** max(call.duration - 1, 0)
            at_milestones = at_end
            steps = {m: traj.milestone_steps[m] for m in call.milestones if m in traj.milestone_steps}
            weights = {m: paying.get(m, 0.0) if graph is not None and m in graph else 1.0 for m in steps}
            if b.milestone and sum(weights.values()) > 0:
                at_milestones = sum(w * gamma ** max(steps[m] - call.start_step - 1, 0)
                                    for m, w in weights.items()) / sum(weights.values())
            call.reward = b.milestone * at_milestones + (b.total - b.milestone) * at_end


class RewardScorer:
    def __init__(self, config: RewardConfig, graph: TaskGraph, *,
                 featurizer: Callable[[OptionCall], np.ndarray] | None = None, feature_dim: int | None = None,
                 n_options: int | None = None, option_names: Sequence[str] | None = None,
                 rules: Sequence[Rule] | None = None, snapshot: Snapshot | None = None,
                 fitter: Fitter | None = None, seed: int = 0) -> None:
        """``featurizer`` maps an OptionCall to the manager's feature vector (the loop's
        :class:`~gyre_ma.agents.manager.Featurizer`); without it (or ``prm.enabled`` false, or
        a zero PRM weight) there is no PRM. ``rules`` and ``snapshot`` override
        ``config.rules`` and ``config.snapshot`` from Python."""
        self.config, self.graph = config, graph
        check_prm_cap(graph, config)
        if rules is None:
            rules = load_rules(config.rules)
            if config.rules_file is not None:
                rules += load_rules(config.rules_file)
        if snapshot is None and config.snapshot is not None:
            snapshot = extended_snapshot(resolve(config.snapshot, "rewards.snapshot"))
        snapshot = snapshot or default_snapshot
        self.engine = RuleEngine(rules, graph=graph, snapshot=snapshot, option_names=option_names)
        self.drift = DriftMonitor(config.drift)
        self.monitor = HackingMonitor(config.alarms)
        self.generator = torch.Generator().manual_seed(seed)
        self.featurizer = featurizer
        self.prm: ProcessRewardModel | None = None
        self.prm_module: PRMModule | None = None
        self.prm_updates = 0
        """Iterations the PRM has been trained on."""
        if config.prm.enabled and config.effective_prm_weight > 0 and featurizer is not None:
            if feature_dim is None:
                feature_dim = int(featurizer.dim)
            if n_options is None:
                raise ValueError("RewardScorer: n_options is needed to build the PRM")
            with torch.random.fork_rng(devices=[]):  # seeded init, global RNG stream untouched
                torch.manual_seed(seed)
                self.prm = ProcessRewardModel(feature_dim, n_options, hidden=config.prm.hidden)
            from gyre_ma.trainers.fit import Fitter
            from gyre_ma.trainers.prm import PRMModule

            self.fitter = fitter or Fitter()
            self.prm_module = self.fitter.setup(PRMModule(self.prm, lr=config.prm.lr))

    # ------------------------------------------------------------------ rollout side
    def on_option_end(self, call: OptionCall, env: Any) -> None:
        """The rollout hook ``on_option_end(call, env)``."""
        self.engine.on_option_end(call, env)

    def end_episode(self, trajectory: Trajectory, env: Any) -> RuleResults:
        """Evaluate the rules on a finished episode while ``env`` still holds its final state."""
        return self.engine.end_episode(trajectory, env)

    # ------------------------------------------------------------------ scoring
    @property
    def prm_weight(self) -> float:
        """The PRM weight in force: capped, times the drift monitor's scale."""
        return 0.0 if self.prm is None else self.config.effective_prm_weight * self.drift.scale

    def score(self, trajectories: Sequence[Trajectory], rule_results: Sequence[RuleResults] | None = None,
              *, iteration: int | None = None, train: bool = True) -> Scored:
        """Breakdowns for every call and the iteration's reward metrics.

        ``rule_results`` aligns with ``trajectories``; by default each trajectory's
        ``rule_results`` attribute is used. ``train`` fits the PRM on this batch's
        non-held-out episodes after scoring (the scores use the PRM from before).
        """
        if rule_results is None:
            rule_results = [getattr(t, "rule_results", None) for t in trajectories]
        if len(rule_results) != len(trajectories):
            raise ValueError(
                f"RewardScorer.score: {len(rule_results)} rule results for {len(trajectories)} trajectories"
            )
        results = []
        for i, (t, r) in enumerate(zip(trajectories, rule_results)):
            if r is None:
                if self.engine.rules:
                    raise ValueError(
                        f"RewardScorer.score: trajectory {i} has no rule results; call "
                        "end_episode(trajectory, env) right after each episode"
                    )
                r = RuleResults.empty(len(t.calls))
            results.append(r)
        metrics: dict[str, float] = {}
        prm_parts: list[list[float] | None] = [None] * len(trajectories)
        if self.prm is not None:
            prm_parts, prm_metrics = self._prm(trajectories, iteration, train)
            metrics |= prm_metrics
        breakdowns = [score_trajectory(t, self.graph, self.config, rules=r, prm=p)
                      for t, r, p in zip(trajectories, results, prm_parts)]
        metrics |= summarize(breakdowns, success=[t.success for t in trajectories])
        metrics |= rule_metrics(self.engine.rules, results)
        return Scored(breakdowns, metrics)

    def _prm(self, trajectories: Sequence[Trajectory], iteration: int | None,
             train: bool) -> tuple[list[list[float] | None], dict[str, float]]:
        sizes = [len(t.calls) for t in trajectories]
        calls = [c for t in trajectories for c in t.calls]
        if not calls:
            return [[] for _ in trajectories], {"prm/weight": self.prm_weight}
        features = torch.from_numpy(self.featurizer.many(calls)).float()
        options = torch.tensor([c.option for c in calls], dtype=torch.long)
        labels = [prm_labels(t) for t in trajectories]
        progress = torch.cat([p for p, _ in labels])
        success = torch.cat([s for _, s in labels])
        episode = torch.repeat_interleave(torch.arange(len(trajectories)), torch.tensor(sizes))
        held = self._holdout(len(trajectories))
        held_calls = held[episode]
        probs = self.prm.probabilities(features, options)
        if self.prm_updates:
            status = self.drift.check(probabilities=probs[held_calls],
                                      labels=torch.stack([progress, success], -1)[held_calls], iteration=iteration)
        else:  # an untrained model agrees only by chance: nothing to trust or cut yet
            status = self.drift.update(math.nan, samples=0, iteration=iteration)
        rewards = prm_rewards(probs.mean(-1), weight=self.prm_weight)
        metrics = {"prm/agreement": status.agreement, "prm/trusted": float(status.trusted),
                   "prm/weight": self.prm_weight, "prm/heldout_calls": float(held_calls.sum())}
        if status.event is not None:
            metrics[f"prm/drift_{status.event}"] = 1.0
        train_calls = ~held_calls
        if train and train_calls.any():
            cfg = self.config.prm
            batch = {B.FEATURES: features[train_calls], B.OPTION: options[train_calls],
                     B.PROGRESS: progress[train_calls], B.SUCCESS: success[train_calls]}
            metrics |= self.fitter.fit(self.prm_module, batch, epochs=cfg.epochs,
                                       minibatch_size=cfg.minibatch_size, generator=self.generator)
            self.prm_updates += 1
        return [r.tolist() for r in rewards.split(sizes)], metrics

    def _holdout(self, n: int) -> torch.Tensor:
        """Episodes kept out of PRM training this iteration (at least one when n ≥ 2)."""
        frac = self.config.prm.holdout_fraction
        k = 0 if frac == 0 or n < 2 else min(n - 1, max(1, round(frac * n)))
        mask = torch.zeros(n, dtype=torch.bool)
        mask[torch.randperm(n, generator=self.generator)[:k]] = True
        return mask

    # ------------------------------------------------------------------ alarms
    def alarms(self, metrics: dict[str, float], iteration: int | None = None) -> list[Alarm]:
        """Feed one iteration's merged metrics (the loop's and :meth:`score`'s) to the hacking
        monitor; returns the alarms holding now."""
        return self.monitor.update(metrics, iteration)

    # ------------------------------------------------------------------ checkpoints
    def arbitrate(self, trajectories: Sequence[Trajectory], *, iteration: int | None = None, gamma: float,
                  train: bool = True) -> dict[str, float]:
        """:meth:`score`, then each call's reward set to its arbitrated total
        (:func:`apply_breakdowns` with ``credit.gamma``); returns the reward metrics."""
        scored = self.score(trajectories, iteration=iteration, train=train)
        apply_breakdowns(trajectories, scored.breakdowns, gamma=gamma, graph=self.graph)
        return scored.metrics

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"rules": self.engine.state_dict(), "drift": self.drift.state_dict(),
                                 "alarms": self.monitor.state_dict(), "prm_updates": self.prm_updates}
        if self.prm is not None:
            state["prm"] = self.prm.state_dict()
            state["prm_optimizer"] = self.prm_module.optimizers().optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.engine.load_state_dict(state["rules"])
        self.drift.load_state_dict(state["drift"])
        self.monitor.load_state_dict(state["alarms"])
        self.prm_updates = int(state["prm_updates"])
        if self.prm is not None and "prm" in state:
            self.prm.load_state_dict(state["prm"])
            self.prm_module.optimizers().optimizer.load_state_dict(state["prm_optimizer"])

