"""The gyre: A rollout → B segment → C score → D update, one iteration at a time."""

from __future__ import annotations

import copy
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gyre_ma import batch as B
from gyre_ma.agents.manager import Critic, Featurizer, ManagerPolicy
from gyre_ma.agents.noise import RoleNoise, role_exploration
from gyre_ma.backends import make_backend
from gyre_ma.backends.worker import RolloutKit, policy_weights
from gyre_ma.buffer import TrajectoryBuffer, TrajectoryStore
from gyre_ma.checkpoints import (
    CheckpointManager,
    NanGuard,
    ValidationDecision,
    apply_lr_scale,
    parameter_step_size,
    restore_rng,
    rng_snapshot,
)
from gyre_ma.config import ExperimentConfig
from gyre_ma.credit import anchor_values, episode_outcomes, group_outcome_advantages, option_advantages, smdp_returns
from gyre_ma.curriculum import PHASES, Curriculum
from gyre_ma.envs.registry import make_oracle
from gyre_ma.rewards.milestones import calls_at_end, last_calls
from gyre_ma.rewards.scorer import RewardScorer, apply_breakdowns
from gyre_ma.roles import Evaluator, RolloutTask, iteration_tasks, validation_tasks
from gyre_ma.rollout import OptionCall, Trajectory, run_episode
from gyre_ma.staleness import filter_stale
from gyre_ma.trainers.critic import CriticModule
from gyre_ma.trainers.fit import Fitter
from gyre_ma.trainers.manager import ManagerModule


@dataclass
class Segments:
    """Trajectories laid out as rows (one per episode × agent) of option calls."""

    calls: list[list[OptionCall]]
    episode: torch.Tensor  # [R] long
    bootstrap: list[tuple[Any, frozenset[str], int, Any] | None]
    """Per row, where the episode was cut rather than ended: (obs, achieved, agent, state)."""

    @property
    def width(self) -> int:
        return max((len(r) for r in self.calls), default=0)


def task_seed(seed: int, iteration: int, group: int) -> int:
    """Distinct, reproducible task seeds per (run seed, iteration, group)."""
    return int(np.random.SeedSequence([seed, iteration, group]).generate_state(1)[0])


class Gyre:
    """One experiment's learner; its rollouts run on the configured backend (local or Ray)."""

    def __init__(self, config: ExperimentConfig, run_dir: str | Path | None = None) -> None:
        """``run_dir`` holds checkpoints and the trajectory store; without it the learner
        keeps nothing on disk (no rollback, no store)."""
        self.config = config
        self.run_dir = Path(run_dir) if run_dir is not None else None
        torch.manual_seed(config.seed)
        kit = RolloutKit.from_config(config)  # the same construction every rollout worker uses
        self.env, self.library = kit.env, kit.library
        self.featurizer, self.state_scaler = kit.featurizer, kit.state_scaler
        if self.learns:
            self.policy, self.critic = kit.policy, kit.critic
        else:  # untrained stand-ins keep checkpoints and eval uniform
            self.featurizer = Featurizer(self.env.observation_space(self.env.possible_agents[0]), self.library)
            self.policy = ManagerPolicy(self.featurizer.dim, len(self.library), len(self.env.possible_agents))
            self.critic = Critic(self.featurizer.dim, len(self.env.possible_agents))
        t, r = config.train, config.roles
        self.fitter = Fitter()
        self.manager_module = self.fitter.setup(ManagerModule(
            self.policy, lr=t.lr, clip=t.clip, entropy_coef=t.entropy_coef, kl_coef=t.kl_coef))
        self.critic_module = self.fitter.setup(
            CriticModule(self.critic, lr=t.critic_lr, centralised=config.manager.centralised_critic))
        self.generator = torch.Generator().manual_seed(config.seed)
        noises = {}  # only for roles that play episodes: param noise measures its distance every iteration
        if r.explorers:
            noises["explorer"] = role_exploration(r.explorer_noise, iterations=t.iterations, seed=config.seed)
        if r.executors:
            noises["executor"] = role_exploration(r.executor_noise, iterations=t.iterations, seed=config.seed + 1)
        self.noise = RoleNoise(noises)
        self.backend = _backend(config)
        self.verifier = kit if r.verify_elite and r.explorers else None
        self.rewards = RewardScorer(config.rewards, self.library.graph, featurizer=self.featurizer,
                                    n_options=len(self.library), option_names=self.library.names,
                                    fitter=self.fitter, seed=config.seed)
        self.version = 0
        self.env_steps = 0
        self.next_iteration = 0
        self.critic_initialised = False
        self._init_stability()

    def _init_stability(self) -> None:
        """Buffer, checkpoint slots with rollback and NaN guard, horizon curriculum."""
        c = self.config
        self.buffer = None
        if c.buffer.enabled:
            b = c.buffer
            store = None
            if b.store and self.run_dir is not None:
                store = TrajectoryStore(self.run_dir / "buffer" / "trajectories.log")
            self.buffer = TrajectoryBuffer(
                b.capacity, eviction=b.eviction, eviction_window=b.eviction_window, dedup=b.dedup,
                elite_size=b.elite_size, max_turning_points=b.max_turning_points,
                elite_ratio=b.elite_ratio, max_staleness=b.max_staleness, seed=c.seed, store=store)
        self.checkpoints = None
        if c.checkpoints.enabled and self.run_dir is not None:
            k = c.checkpoints
            self.checkpoints = CheckpointManager(
                self.run_dir / "checkpoints", rollback_threshold=k.rollback_threshold, lr_cut=k.lr_cut,
                min_lr_scale=k.min_lr_scale, large_update_kl=k.large_update_kl)
        self.nan_guard = NanGuard(c.checkpoints.nan_max_consecutive)
        self._recent_scores: deque[float] = deque(maxlen=c.checkpoints.validation_window)
        self.curriculum = None
        if c.curriculum.enabled:
            cur = c.curriculum
            if cur.warmup_goal is not None and cur.warmup_goal not in self.library.graph:
                raise ValueError(f"curriculum.warmup_goal: {cur.warmup_goal!r} is not a milestone; "
                                 f"known: {list(self.library.graph.names)}")
            oracle = make_oracle(c.env.id, self.env, self.library)
            runs = [run_episode(self.env, self.library, oracle, seed=10**9 + s, gamma=c.credit.gamma)
                    for s in range(cur.oracle_episodes)]
            self.curriculum = Curriculum.from_oracle(
                runs, warmup_goal=cur.warmup_goal, k=cur.k, warmup_k=cur.warmup_k, refine_k=cur.refine_k,
                threshold=cur.threshold, window=cur.window)

    @property
    def learns(self) -> bool:
        return self.config.manager.kind in ("learned", "flat")

    # ---------------------------------------------------------------- A: rollout
    def weights(self) -> Any:
        return policy_weights(self.policy, self.critic) if self.learns else None

    def tasks(self, iteration: int) -> list[RolloutTask]:
        """One group per task seed: executors (small noise) and explorers (large noise)."""
        t, r = self.config.train, self.config.roles
        cap = self.curriculum.step_cap if self.curriculum is not None else t.max_steps
        seeds = [task_seed(self.config.seed, iteration, g) for g in range(t.groups_per_iteration)]
        noise = self.noise.settings() if self.learns else {}
        return iteration_tasks(seeds=seeds, explorers=r.explorers, executors=r.executors, noise=noise,
                               max_steps=cap)

    def rollout(self, iteration: int) -> tuple[list[Trajectory], dict[str, float]]:
        """A: this iteration's episodes — played now, or (async) collected from those
        submitted during the last update, minus any staler than ``max_staleness``."""
        b = self.config.backend
        metrics: dict[str, float] = {}
        if b.async_rollouts and self.backend.pending:
            trajectories, dropped = filter_stale(self.backend.poll(timeout=None), current_version=self.version,
                                                 max_staleness=b.max_staleness)
            metrics["staleness/dropped"] = float(dropped)
            metrics["staleness/lag"] = float(np.mean([self.version - t.policy_version for t in trajectories])
                                             if trajectories else 0.0)
        else:
            trajectories = self.backend.collect(self.weights(), self.version, self.tasks(iteration))
        if self.verifier is not None:
            metrics |= Evaluator().check(self.verifier, trajectories)
        for traj in trajectories:
            self.env_steps += traj.length
            if self.buffer is not None:
                self.buffer.add(traj)
        return trajectories, metrics

    def training_batch(self, trajectories: list[Trajectory]) -> tuple[list[Trajectory], dict[str, float]]:
        """This iteration's trajectories, or — with the buffer — its fresh, deduplicated
        ones plus the configured share of elites; stale data is dropped and counted."""
        if self.buffer is None:
            return trajectories, {}
        sample = self.buffer.sample(len(trajectories), version=self.version, newest=True)
        return sample.trajectories, self.buffer.metrics() | {"buffer/stale_dropped_now": float(sample.stale_dropped)}

    # ---------------------------------------------------------------- B: segment
    def segment(self, trajectories: list[Trajectory]) -> Segments:
        calls, episode, bootstrap = [], [], []
        for e, traj in enumerate(trajectories):
            for i, agent in enumerate(self.env.possible_agents):
                row = traj.agent_calls(agent)
                if not row:
                    continue
                calls.append(row)
                episode.append(e)
                final = traj.final.get(agent)
                cut = final is not None and not row[-1].terminated
                bootstrap.append((*final, i, traj.final_state) if cut else None)
        return Segments(calls, torch.tensor(episode, dtype=torch.long), bootstrap)

    # ---------------------------------------------------------------- C: score
    def arbitrate(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """C, first half: every call's reward becomes its arbitrated, verified total
        (guard veto > outcome > milestones and rules > PRM), its breakdown kept on it."""
        scored = self.rewards.score(trajectories, iteration=self.next_iteration)
        apply_breakdowns(trajectories, scored.breakdowns, gamma=self.config.credit.gamma, graph=self.library.graph)
        return scored.metrics

    def score(self, trajectories: list[Trajectory], seg: Segments) -> B.Batch:
        """C: option-level advantages (milestone-anchored, blended with the outcome) and
        critic targets, as one tensor batch."""
        R, T = len(seg.calls), seg.width
        f32 = dict(dtype=torch.float32)
        rewards, values = torch.zeros(R, T, **f32), torch.zeros(R, T, **f32)
        durations = torch.ones(R, T, dtype=torch.long)
        terminated, truncated, milestones, mask = (torch.zeros(R, T, dtype=torch.bool) for _ in range(4))
        for r, row in enumerate(seg.calls):
            n = len(row)
            rewards[r, :n] = torch.tensor([c.reward for c in row])
            values[r, :n] = torch.tensor([c.value for c in row])
            durations[r, :n] = torch.tensor([max(c.duration, 1) for c in row])
            terminated[r, :n] = torch.tensor([c.terminated for c in row])
            truncated[r, :n] = torch.tensor([c.truncated for c in row])
            milestones[r, :n] = torch.tensor([bool(c.milestones) for c in row])
            mask[r, :n] = True
        bootstrap = self._bootstrap_values(seg)
        credit = self.config.credit
        outcomes = self._outcomes(trajectories)
        groups = torch.tensor([t.task_seed for t in trajectories], dtype=torch.long)
        anchors = self._anchor_inputs(trajectories, seg) if credit.anchored else {}
        advantages, returns = option_advantages(
            mode=credit.mode, rewards=rewards, values=values, durations=durations,
            terminated=terminated, truncated=truncated, gamma=credit.gamma, lam=credit.lam,
            milestones=milestones, bootstrap_value=bootstrap, mask=mask, outcomes=outcomes,
            groups=groups, episode_index=seg.episode, w_max=credit.blend_weight, std_ref=0.5,
            outcome_credit=credit.outcome_credit, anchor_prior=credit.anchor_prior,
            success=torch.tensor([t.success for t in trajectories], dtype=torch.bool),
            w_length=credit.outcome_weight_succeeded, **anchors,
        )
        if self.config.train.objective == "grpo":
            per_episode = group_outcome_advantages(outcomes=outcomes, groups=groups)
            advantages = per_episode[seg.episode].unsqueeze(-1).expand(R, T) * mask
        # critic targets: Monte-Carlo SMDP returns on rows the env ended, λ-returns elsewhere
        monte_carlo = smdp_returns(rewards=rewards, durations=durations, terminated=terminated,
                                   truncated=torch.zeros_like(truncated), gamma=credit.gamma,
                                   bootstrap_value=torch.zeros(R), mask=mask)
        ended = terminated[torch.arange(R), mask.sum(1) - 1]
        returns = torch.where(ended.unsqueeze(-1), monte_carlo, returns)
        flat = [c for row in seg.calls for c in row]
        features = torch.from_numpy(self.featurizer.many(flat))
        extra = {}
        if self.state_scaler is not None:
            extra[B.STATE] = torch.from_numpy(np.stack([self.state_scaler(c.state) for c in flat]))
        return extra | {
            B.FEATURES: features,
            B.AGENT: torch.tensor([c.agent_index for c in flat], dtype=torch.long),
            B.MASK: torch.from_numpy(np.stack([c.mask for c in flat])),
            B.OPTION: torch.tensor([c.option for c in flat], dtype=torch.long),
            B.LOG_PROB: torch.tensor([c.log_prob for c in flat], dtype=torch.float32),
            B.VALUE: values[mask],
            B.ADVANTAGE: advantages[mask],
            B.RETURN: returns[mask],
        }

    def _anchor_inputs(self, trajectories: list[Trajectory], seg: Segments) -> dict[str, torch.Tensor]:
        """What milestone-anchored outcome credit reads: the step each episode verified each
        milestone ([E, M], −1 never), the milestones each call verified ([R, T, M]) and the
        calls running when their episode ended ([R, T])."""
        names = self.library.graph.names
        index = {name: m for m, name in enumerate(names)}
        verified_at = self._verified_at(trajectories)
        R, T = len(seg.calls), seg.width
        call_milestones = np.zeros((R, T, len(names)), dtype=bool)
        at_end = np.zeros((R, T), dtype=bool)
        ending = {id(traj.calls[i]) for traj in trajectories for i in calls_at_end(traj)}
        for r, row in enumerate(seg.calls):
            for t, call in enumerate(row):
                for name in call.milestones:
                    call_milestones[r, t, index[name]] = True
                at_end[r, t] = id(call) in ending
        return {"verified_at": verified_at, "call_milestones": torch.from_numpy(call_milestones),
                "at_end": torch.from_numpy(at_end)}

    def _outcomes(self, trajectories: list[Trajectory]) -> torch.Tensor:
        """Each episode's verified outcome [E] (success, less the length term)."""
        return episode_outcomes(
            success=torch.tensor([t.success for t in trajectories], dtype=torch.bool),
            length=torch.tensor([t.length for t in trajectories]),
            horizon=torch.tensor([t.horizon for t in trajectories]),
            length_weight=self.config.credit.outcome_length_weight)

    def _verified_at(self, trajectories: list[Trajectory]) -> torch.Tensor:
        """The step each episode verified each task-graph milestone, [E, M] (−1 never)."""
        names = self.library.graph.names
        index = {name: m for m, name in enumerate(names)}
        verified_at = torch.full((len(trajectories), len(names)), -1, dtype=torch.long)
        for e, traj in enumerate(trajectories):
            for name, step in traj.milestone_steps.items():
                if name not in index:
                    raise ValueError(f"episode of task seed {traj.task_seed} verified milestone {name!r}, which "
                                     f"is not in the task graph; expected one of {list(names)}")
                verified_at[e, index[name]] = step
        return verified_at

    def anchor_metrics(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """``anchor/<milestone>``: V(m) − ō over this rollout's episodes, what verifying m says
        about the outcome (negative: episodes that verify it end worse; 0: not verified or not
        telling). The values anchored credit uses, before its scaling, on the rollout alone
        (the training batch may add buffer elites)."""
        if not trajectories:
            return {}
        mean, values = anchor_values(outcomes=self._outcomes(trajectories),
                                     verified_at=self._verified_at(trajectories), prior=self.config.credit.anchor_prior)
        return {f"anchor/{name}": float(v - mean) for name, v in zip(self.library.graph.names, values, strict=True)}

    @torch.no_grad()
    def _bootstrap_values(self, seg: Segments) -> torch.Tensor:
        """Critic value of each row's last state where the episode was cut, not ended."""
        out = torch.zeros(len(seg.calls))
        if not self.critic_initialised:
            return out
        feats, agents, rows = [], [], []
        for r, final in enumerate(seg.bootstrap):
            if final is not None:
                obs, achieved, agent, state = final
                feats.append(self.state_scaler(state) if self.state_scaler else
                             self.featurizer(_FinalState(obs, achieved, seg.calls[r][-1].option)))
                agents.append(agent)
                rows.append(r)
        if rows:
            out[rows] = self.critic(torch.from_numpy(np.stack(feats)), torch.tensor(agents))
        return out

    # ---------------------------------------------------------------- D: update
    def update(self, batch: B.Batch, trajectories: list[Trajectory]) -> dict[str, float]:
        """One update; skipped (parameters unchanged) when its inputs are not finite, and
        after ``nan_max_consecutive`` skips in a row the learner rolls back."""
        t = self.config.train
        guard = self.nan_guard.check(rewards=[tr.total_reward for tr in trajectories],
                                     advantages=batch[B.ADVANTAGE], returns=batch[B.RETURN])
        if guard.skip:
            out = {"update_skipped": 1.0}
            if guard.rollback and self.checkpoints is not None:
                out |= self._apply(self.checkpoints.rollback(reason=guard.reason, step=self.next_iteration))
            return out
        if not self.critic_initialised:
            self._warm_start_critic(trajectories)
        before = copy.deepcopy(self.state_dict()) if self.checkpoints is not None else None
        rollback_cut = self.checkpoints.lr_scale if self.checkpoints is not None else 1.0
        lr_scale = t.lr_factor(self.next_iteration) * rollback_cut
        if t.lr_schedule != "constant":  # otherwise the LR changes only at a rollback (_apply)
            apply_lr_scale([self.manager_module.optimizers().optimizer,
                            self.critic_module.optimizers().optimizer], lr_scale)
        metrics = self.fitter.fit(self.manager_module, batch, epochs=t.epochs,
                                  minibatch_size=t.minibatch_size, generator=self.generator)
        metrics |= self.fitter.fit(self.critic_module, batch, epochs=t.epochs,
                                   minibatch_size=t.minibatch_size, generator=self.generator)
        self.noise.observe(batch[B.FEATURES], batch[B.AGENT], batch[B.MASK])
        metrics |= self.noise.update(self.policy)
        self.version += 1
        if before is not None:
            step = parameter_step_size(before["policy"], self.policy.state_dict())
            self.checkpoints.after_update(before, kl=metrics.get("kl"), step_size=step, step=self.next_iteration)
            metrics["update_step_size"] = step
        return metrics | {"update_skipped": 0.0, "lr_scale": lr_scale}

    def validate(self, iteration: int, trajectories: list[Trajectory] | None = None) -> dict[str, float]:
        """Judge the current policy by verified success on greedy evaluator episodes (or,
        with no evaluators, on ``trajectories``): keep it as best, or roll back to the best
        when it fell too far (LR cut, latest batch purged)."""
        if self.checkpoints is None:
            return {}
        if trajectories is None:
            seeds = [task_seed(self.config.seed + 1, iteration, k) for k in range(self.config.roles.evaluators)]
            episodes = self.backend.collect(self.weights(), self.version, validation_tasks(seeds))
            score = episode_metrics(episodes, ())["success_rate"]
        else:  # sampled training episodes are noisy: judge the mean of the last few iterations
            self._recent_scores.append(episode_metrics(trajectories, ())["success_rate"])
            score = float(np.mean(self._recent_scores))
        out = {"validation/success_rate": score}
        return out | self._apply(self.checkpoints.validate(score, self.state_dict(), step=iteration))

    def _apply(self, decision: ValidationDecision) -> dict[str, float]:
        out = {"checkpoint/rollbacks": float(len(self.checkpoints.rollbacks)),
               "checkpoint/lr_scale": float(decision.lr_scale), "checkpoint/rolled_back": 0.0}
        if decision.rolled_back:
            version, steps, iteration = self.version, self.env_steps, self.next_iteration
            self.load_state_dict(decision.state)
            # counters move on: new rollouts must not reuse the purged batch's versions
            self.version, self.env_steps, self.next_iteration = version + 1, steps, iteration
            self._recent_scores.clear()  # a new policy: its own scores from here on
            apply_lr_scale([self.manager_module.optimizers().optimizer,
                            self.critic_module.optimizers().optimizer], decision.lr_scale)
            if decision.purge_latest_batch and self.buffer is not None:
                self.buffer.purge(min_version=version)
            out["checkpoint/rolled_back"] = 1.0
        return out

    def _warm_start_critic(self, trajectories: list[Trajectory]) -> None:
        """Initialise values conservatively at mean per-step reward / (1 − γ)."""
        steps = sum(max(t.length, 1) * len(self.env.possible_agents) for t in trajectories)
        mean_reward = sum(c.reward for t in trajectories for c in t.calls) / max(steps, 1)
        gamma = self.config.credit.gamma
        self.critic.initialise(mean_reward / (1.0 - gamma) if gamma < 1 else mean_reward)
        self.critic_initialised = True

    # ---------------------------------------------------------------- one turn
    def iteration(self, i: int, *, return_trajectories: bool = False) -> Any:
        """One turn of the gyre; afterwards the whole learner is in the ``latest`` slot.
        Returns the metrics (and the iteration's trajectories if asked)."""
        start = time.perf_counter()
        self.next_iteration = i
        metrics: dict[str, float] = {"iteration": float(i)}
        evaluators = self.config.roles.evaluators
        if self.learns and evaluators:                                       # judge the policy first
            metrics |= self.validate(i)
        trajectories, rollout_metrics = self.rollout(i)                     # A
        rollout_s = time.perf_counter() - start
        metrics |= rollout_metrics | episode_metrics(trajectories, self.library.graph.names)
        metrics |= self.arbitrate(trajectories)                              # C: verified rewards
        if self.config.credit.anchored:
            metrics |= self.anchor_metrics(trajectories)
        if self.learns and not evaluators:                                   # judge it by its own episodes
            metrics |= self.validate(i, trajectories)
        if self.learns and not metrics.get("checkpoint/rolled_back"):
            if self.config.backend.async_rollouts:                            # next rollouts overlap the update
                self.backend.submit(self.weights(), self.version, self.tasks(i + 1))
            batch_trajectories, buffer_metrics = self.training_batch(trajectories)
            metrics |= buffer_metrics | {"update_skipped": 1.0}
            if batch_trajectories:                                           # all could be stale
                seg = self.segment(batch_trajectories)                       # B
                batch = self.score(batch_trajectories, seg)                  # C
                metrics |= self.update(batch, batch_trajectories)            # D
        if self.curriculum is not None:  # log the phase this iteration ran in, then promote
            metrics |= {"curriculum_phase": float(PHASES.index(self.curriculum.phase)),
                        "curriculum_step_cap": float(self.curriculum.step_cap)}
            self.curriculum.observe(self.curriculum.success_rate(trajectories))
        alarms = self.rewards.alarms(metrics, i)
        metrics |= self.rewards.monitor.metrics() | {"alarms": float(len(alarms))}
        self.next_iteration = i + 1
        metrics |= {"env_steps": float(self.env_steps), "policy_version": float(self.version),
                    "rollout_seconds": rollout_s, "iteration_seconds": time.perf_counter() - start}
        if self.checkpoints is not None:
            self.checkpoints.save("latest", self.state_dict(), step=i)
        return (metrics, trajectories) if return_trajectories else metrics

    def _generators(self) -> dict[str, torch.Generator]:
        return {"minibatch": self.generator, "rewards": self.rewards.generator}

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue bit for bit: weights, optimisers,
        counters, RNG states, noise σ and targets, reward models, buffer pools, curriculum."""
        return {
            "policy": self.policy.state_dict(), "critic": self.critic.state_dict(),
            "manager_optimizer": self.manager_module.optimizers().optimizer.state_dict(),
            "critic_optimizer": self.critic_module.optimizers().optimizer.state_dict(),
            "version": self.version, "env_steps": self.env_steps, "next_iteration": self.next_iteration,
            "critic_initialised": self.critic_initialised,
            "rng": rng_snapshot(torch_generators=self._generators()),
            "noise": self.noise.state_dict(), "rewards": self.rewards.state_dict(),
            "nan_guard": self.nan_guard.state_dict(), "recent_scores": list(self._recent_scores),
            "buffer": self.buffer.state_dict() if self.buffer is not None else None,
            "curriculum": self.curriculum.state_dict() if self.curriculum is not None else None,
            "config": self.config.model_dump(mode="json"),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.critic.load_state_dict(state["critic"])
        self.manager_module.optimizers().optimizer.load_state_dict(state["manager_optimizer"])
        self.critic_module.optimizers().optimizer.load_state_dict(state["critic_optimizer"])
        self.version, self.env_steps = state["version"], state["env_steps"]
        self.next_iteration = state.get("next_iteration", 0)
        self.critic_initialised = state["critic_initialised"]
        if "rng" in state:
            restore_rng(state["rng"], torch_generators=self._generators())
        if "noise" in state:
            self.noise.load_state_dict(state["noise"])
        if "rewards" in state:
            self.rewards.load_state_dict(state["rewards"])
        if state.get("nan_guard") is not None:
            self.nan_guard.load_state_dict(state["nan_guard"])
        self._recent_scores.clear()
        self._recent_scores.extend(state.get("recent_scores", []))
        if state.get("buffer") is not None and self.buffer is not None:
            self.buffer.load_state_dict(state["buffer"])
        if state.get("curriculum") is not None and self.curriculum is not None:
            self.curriculum.load_state_dict(state["curriculum"])

    def close(self) -> None:
        """Release what the learner holds open: rollout workers, the trajectory store."""
        self.backend.close()
        if self.buffer is not None:
            self.buffer.close()

    @classmethod
    def resume(cls, config: ExperimentConfig, run_dir: str | Path) -> Gyre:
        """A learner restored from ``run_dir``'s latest checkpoint; it continues at
        ``next_iteration``."""
        gyre = cls(config, run_dir)
        if gyre.checkpoints is None or not gyre.checkpoints.has("latest"):
            raise ValueError(f"cannot resume: {str(run_dir)!r} has no latest checkpoint")
        gyre.load_state_dict(gyre.checkpoints.load("latest"))
        return gyre


def _backend(config: ExperimentConfig) -> Any:
    b = config.backend
    if b.name == "ray":
        return make_backend("ray", config, workers=b.workers, max_restarts=b.max_restarts,
                            max_attempts=b.max_attempts, sample_timeout_s=b.sample_timeout_s,
                            cpus_per_worker=b.cpus_per_worker, init=b.ray_init,
                            pipeline_depth=b.pipeline_depth, episodes_per_call=b.episodes_per_call)
    return make_backend("local", config)


@dataclass(frozen=True)
class _FinalState:
    """A state after the last option call, shaped like a Decision for the featurizer."""

    observation: Any
    achieved: frozenset[str]
    last_option: int
    time_fraction: float = 1.0


def episode_metrics(trajectories: list[Trajectory], milestones: tuple[str, ...]) -> dict[str, float]:
    n = max(len(trajectories), 1)
    out = {
        "success_rate": sum(t.success for t in trajectories) / n,
        "episode_length": float(np.mean([t.length for t in trajectories])) if trajectories else 0.0,
        "episode_reward": float(np.mean([t.total_reward for t in trajectories])) if trajectories else 0.0,
        "option_calls": float(np.mean([len(t.calls) for t in trajectories])) if trajectories else 0.0,
        # verified progress short of completion: the calls alarms weigh calls against it
        "milestones_verified": float(np.mean([len(set(t.milestone_steps) & set(milestones)) for t in trajectories]))
        if trajectories else 0.0,
        # agents that died (or left) before the episode ended: a team that sheds members
        # while success holds is slower, and once was a reward hack (see rewards.arbiter)
        "agents_lost": float(np.mean([len(last_calls(t)) - len(calls_at_end(t)) for t in trajectories]))
        if trajectories else 0.0,
    }
    tools = [t.tool_calls for t in trajectories if t.tool_calls is not None]
    if tools:
        out["tool_calls"] = float(np.mean(tools))
    for m in milestones:
        out[f"milestone/{m}"] = sum(m in t.milestone_steps for t in trajectories) / n
    return out
