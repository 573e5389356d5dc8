"""The gyre: A rollout → B segment → C score → D update, one iteration at a time.

:class:`Gyre` only orchestrates: batches are built by :mod:`gyre_ma.training_batch`,
advantages by :mod:`gyre_ma.credit`, rewards by :mod:`gyre_ma.rewards`, updates by the
Lightning trainers, validation and rollback by :mod:`gyre_ma.stability`, metrics by
:mod:`gyre_ma.metrics`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from gyre_ma import batch as B
from gyre_ma.agents.manager import ManagerPolicy
from gyre_ma.agents.noise import RoleNoise, role_exploration
from gyre_ma.backends import make_backend
from gyre_ma.backends.worker import RolloutKit, policy_weights
from gyre_ma.buffer import TrajectoryBuffer
from gyre_ma.checkpoints import ValidationDecision, restore_rng, rng_snapshot
from gyre_ma.config import ExperimentConfig
from gyre_ma.curriculum import Curriculum
from gyre_ma.metrics import (
    anchor_metrics,
    counted_success_rate,
    episode_metrics,
    goal_metrics,
    option_shares,
    out_of_order,
)
from gyre_ma.options.option import Termination
from gyre_ma.rewards.alarms import ORDER_KEY
from gyre_ma.rewards.scorer import RewardScorer
from gyre_ma.roles import Evaluator, RolloutTask, iteration_tasks, task_seed, validation_seed, validation_tasks
from gyre_ma.rollout import Trajectory
from gyre_ma.stability import Stability
from gyre_ma.staleness import fresh_with_metrics
from gyre_ma.trainers.averaging import TailAverage
from gyre_ma.trainers.learner import Learner
from gyre_ma.training_batch import build_batch, segment


class Gyre:
    """One experiment's learner; its rollouts run on the configured backend (local or Ray)."""

    def __init__(self, config: ExperimentConfig, run_dir: str | Path | None = None) -> None:
        """``run_dir`` holds checkpoints and the trajectory store; without it the learner
        keeps nothing on disk (no rollback, no store)."""
        self.config, self.run_dir = config, Path(run_dir) if run_dir is not None else None
        torch.manual_seed(config.seed)
        kit = RolloutKit.from_config(config)  # the same construction every rollout worker uses
        self.env, self.library = kit.env, kit.library
        self.featurizer, self.policy, self.critic = kit.modules()
        self.state_scaler = kit.state_scaler
        t, r = config.train, config.roles
        self.learner = Learner(config, self.policy, self.critic, agents=len(self.env.possible_agents))
        roles = {"explorer": (r.explorers, r.explorer_noise, 0), "executor": (r.executors, r.executor_noise, 1)}
        self.noise = RoleNoise({role: role_exploration(noise, iterations=t.iterations, seed=config.seed + offset)
                                for role, (n, noise, offset) in roles.items() if n})  # roles that play episodes
        self.backend = make_backend(config.backend.name, config, **config.backend.options)
        self._backend_seen: dict[str, float] = {}
        """The backend's counters at the last iteration's end (its metrics are the increments)."""
        self.verifier = kit if r.verify_elite and r.explorers else None
        self.rewards = RewardScorer(config.rewards, self.library.graph, featurizer=self.featurizer,
                                    n_options=len(self.library), option_names=self.library.names,
                                    fitter=self.learner.fitter, seed=config.seed)
        self.version = self.env_steps = self.next_iteration = 0
        self._played: dict[str, float] = {}
        """This iteration's faults and option timeouts, in training and validation episodes."""
        self.last_metrics: dict[str, float] | None = None
        """The last iteration's metrics, kept in its checkpoint: a stop between the checkpoint and
        ``metrics.csv``'s row loses no row (a resume writes it from here)."""
        self.out_of_order: str | None = None
        """The last iteration's first milestone verified before its prerequisites, in words (None: none)."""
        self._tempered: tuple[int, float] | None = None
        """(policy version, temperature) as the temperature was last set (:meth:`_temper`)."""
        self.buffer = TrajectoryBuffer.from_config(
            config.buffer, store_dir=self.run_dir / "buffer" / "store" if self.run_dir else None,
            seed=config.seed) if config.buffer.enabled else None
        self.stability = Stability.from_config(config.checkpoints, self.run_dir,
                                               min_episodes=config.min_validation_episodes)
        self.checkpoints = self.stability.checkpoints
        self.curriculum = Curriculum.from_config(config, self.env, self.library) if config.curriculum.enabled else None
        self.average = TailAverage() if self.learns and t.average_start < t.iterations else None

    @property
    def learns(self) -> bool:
        return self.config.manager.learns

    # ---------------------------------------------------------------- A: rollout
    def weights(self) -> Any:
        return policy_weights(self.policy, self.critic) if self.learns else None

    def tasks(self, iteration: int) -> list[RolloutTask]:
        """One group per task seed: executors (small noise) and explorers (large noise)."""
        r = self.config.roles
        cap = self.curriculum.step_cap if self.curriculum is not None else self.config.train.max_steps
        seeds = [task_seed(self.config.seed, iteration, g) for g in range(self.config.groups_per_iteration)]
        noise = self.noise.settings() if self.learns else {}
        return iteration_tasks(seeds=seeds, explorers=r.explorers, executors=r.executors, noise=noise, max_steps=cap)

    def rollout(self, iteration: int) -> tuple[list[Trajectory], dict[str, float]]:
        """A: this iteration's episodes — played now, or (async) collected from those
        submitted during the last update, minus any staler than ``max_staleness``."""
        b = self.config.backend
        metrics: dict[str, float] = {}
        if b.async_rollouts and self.backend.pending:
            trajectories, metrics = fresh_with_metrics(self.backend.poll(timeout=None), current_version=self.version,
                                                       max_staleness=b.max_staleness)
        else:
            trajectories = self.backend.collect(self.weights(), self.version, self.tasks(iteration))
        self._count(trajectories)
        if self.verifier is not None:
            metrics |= Evaluator().check(self.verifier, trajectories)
        for traj in trajectories:
            self.env_steps += traj.length
            if self.buffer is not None:
                self.buffer.add(traj)
        return trajectories, metrics

    # ---------------------------------------------------------------- B, C: segment and score
    def arbitrate(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """C, first half: every call's reward becomes its arbitrated, verified total
        (guard veto > outcome > milestones and rules > PRM), its breakdown kept on it."""
        return self.rewards.arbitrate(trajectories, iteration=self.next_iteration, gamma=self.config.credit.gamma)

    def batch(self, trajectories: list[Trajectory]) -> B.Batch:
        """B and C: the trajectories segmented at verified milestones and scored into one
        tensor batch of option-level advantages and critic targets."""
        return build_batch(trajectories, segment(trajectories, self.env.possible_agents), config=self.config,
                           featurizer=self.featurizer, state_scaler=self.state_scaler, names=self.library.graph.names,
                           inputs=getattr(self.policy, "batch_inputs", None))

    # ---------------------------------------------------------------- D: update
    def update(self, batch: B.Batch, trajectories: list[Trajectory]) -> dict[str, float]:
        """One update; skipped (parameters unchanged) when its inputs are not finite, and
        after ``nan_max_consecutive`` skips in a row the learner rolls back."""
        t = self.config.train
        guard, rollback = self.stability.guard(rewards=[tr.total_reward for tr in trajectories],
                                               advantages=batch[B.ADVANTAGE], returns=batch[B.RETURN],
                                               step=self.next_iteration)
        if guard.skip:
            return {"update_skipped": 1.0} | (self._restore(rollback) if rollback is not None else {})
        lr_scale = t.lr_factor(self.next_iteration) * (self.checkpoints.lr_scale if self.checkpoints else 1.0)
        if t.lr_schedule != "constant":  # otherwise the LR changes only at a rollback (_restore)
            self.learner.set_lr_scale(lr_scale)
        entropy_coef = t.entropy_at(self.next_iteration)
        self.learner.set_entropy_coef(entropy_coef)
        metrics = self.learner.fit(batch, trajectories)
        self.noise.observe(batch[B.FEATURES], batch[B.AGENT], batch[B.MASK])
        metrics |= self.noise.update(self.policy if isinstance(self.policy, ManagerPolicy) else None)
        self.version += 1
        if self.checkpoints is not None:  # the state before this update is the one in ``latest``
            self.checkpoints.after_update(None, kl=metrics.get("kl"), step_size=metrics["update_step_size"],
                                          step=self.next_iteration)
        return metrics | {"update_skipped": 0.0, "lr_scale": lr_scale, "entropy_coef": entropy_coef}

    def validate(self, iteration: int, trajectories: list[Trajectory] | None = None) -> dict[str, float]:
        """Judge the current policy by verified success that no guard vetoed, on held-out
        episodes, sampled and greedy (or, with no evaluators, on the training
        ``trajectories``), then by their mean length: keep it as best, or roll back to the
        best when its success fell significantly (LR cut, latest batch purged)."""
        if self.checkpoints is None:
            return {}
        metrics: dict[str, float] = {}
        if trajectories is None:
            seeds = [validation_seed(self.config.seed, iteration, k) for k in range(self.config.roles.evaluators)]
            trajectories = self.backend.collect(self.weights(), self.version,
                                                validation_tasks(seeds, modes=(False, True)))
            self._count(trajectories)
            for mode, greedy in (("sampled", False), ("greedy", True)):
                played = [t for t in trajectories if t.greedy == greedy]
                metrics[f"validation/{mode}_success"] = counted_success_rate(played)
                metrics[f"validation/{mode}_length"] = episode_metrics(played, ())["episode_length"]
        score, episodes = self.stability.score(counted_success_rate(trajectories), episodes=len(trajectories),
                                               length=episode_metrics(trajectories, ())["episode_length"])
        judged = None if self.checkpoints.has("latest") else self.state_dict()  # latest holds this policy
        decision = self.stability.validate(score, episodes, judged, step=iteration)
        return metrics | {"validation/success_rate": score, "validation/episodes": float(episodes),
                          "checkpoint/rollbacks_stopped": float(self.stability.rollbacks_stopped),
                          } | self._restore(decision)

    def _restore(self, decision: ValidationDecision) -> dict[str, float]:
        """Apply a validation decision: on a rollback, load the restored state with the
        counters moving on, cut the LR and purge the latest batch."""
        out = {"checkpoint/rollbacks": float(len(self.checkpoints.rollbacks)),
               "checkpoint/lr_scale": float(decision.lr_scale), "checkpoint/rolled_back": 0.0}
        if decision.rolled_back:
            version, steps, iteration = self.version, self.env_steps, self.next_iteration
            self.load_state_dict(decision.state)
            # counters move on: new rollouts must not reuse the purged batch's versions
            self.version, self.env_steps, self.next_iteration = version + 1, steps, iteration
            self._temper(iteration)  # the restored weights were saved at an earlier temperature
            self.learner.set_lr_scale(decision.lr_scale)
            if decision.purge_latest_batch and self.buffer is not None:
                self.buffer.purge(min_version=version)
            out["checkpoint/rolled_back"] = 1.0
        return out

    # ---------------------------------------------------------------- one turn
    def iteration(self, i: int, *, return_trajectories: bool = False) -> Any:
        """One turn of the gyre; afterwards the whole learner is in the ``latest`` slot.
        Returns the metrics (and the iteration's trajectories if asked)."""
        start = time.perf_counter()
        self.next_iteration = i
        metrics: dict[str, float] = {"iteration": float(i)}
        self._temper(i)
        evaluators = self.config.roles.evaluators
        if self.learns and evaluators:                                     # judge the policy first
            metrics |= self.validate(i)
        trajectories, rollout_metrics = self.rollout(i)                    # A
        rollout_s = time.perf_counter() - start
        metrics |= self._played_counts(i, trajectories)  # first: episode_metrics' fault shares where any
        metrics |= rollout_metrics | episode_metrics(trajectories, self.library.graph.names)
        metrics |= option_shares(trajectories, self.library.names)
        metrics |= goal_metrics(trajectories, self.library.graph.goals)
        share, self.out_of_order = out_of_order(trajectories, self.library.graph)
        metrics[ORDER_KEY] = share
        metrics |= self.arbitrate(trajectories)                            # C: verified rewards
        if self.config.credit.anchored:
            metrics |= anchor_metrics(trajectories, self.config.credit, self.library.graph.names)
        if self.learns and not evaluators:                                 # judge it by its own episodes
            metrics |= self.validate(i, trajectories)
        if self.learns and not metrics.get("checkpoint/rolled_back"):
            if self.config.backend.async_rollouts:                          # next rollouts overlap the update
                self.backend.submit(self.weights(), self.version, self.tasks(i + 1))
            batch_trajectories, buffer_metrics = (trajectories, {}) if self.buffer is None else (
                self.buffer.training_sample(len(trajectories), version=self.version))  # fresh and elites
            metrics |= buffer_metrics | {"update_skipped": 1.0}
            if batch_trajectories and not any(t.calls for t in batch_trajectories):
                stuck = sorted({a for t in batch_trajectories for a in t.dead_ends})
                raise ValueError(f"iteration {i}: no episode made an option call, so there is nothing to learn from"
                                 + (f": agents {stuck} found no option they could start (check the library's "
                                    "initiation conditions against the env's first state)" if stuck else ""))
            if batch_trajectories:                                         # all could be stale
                metrics |= self.update(self.batch(batch_trajectories), batch_trajectories)  # B, C, D
        metrics |= self._average(i)
        if self.curriculum is not None:  # log the phase this iteration ran in, then promote
            metrics |= self.curriculum.metrics()
            self.curriculum.observe(self.curriculum.success_rate(trajectories))
        alarms = self.rewards.alarms(metrics, i)
        metrics |= self.rewards.monitor.metrics() | {"alarms": float(len(alarms))}
        self.next_iteration = i + 1
        metrics |= self._backend_counts()
        metrics |= {"env_steps": float(self.env_steps), "policy_version": float(self.version),
                    "rollout_seconds": rollout_s, "iteration_seconds": time.perf_counter() - start}
        self.last_metrics = metrics
        if self.checkpoints is not None:
            self.checkpoints.save("latest", self.state_dict(), step=i)
        return (metrics, trajectories) if return_trajectories else metrics

    def _count(self, trajectories: list[Trajectory]) -> None:
        """Add ``trajectories``' faults played on through and option calls cut by the
        timeout to this iteration's counts (every episode played: validation's too)."""
        for key, n in (("faults/count", sum(len(t.faults) for t in trajectories)),
                       ("option_timeouts/count", sum(len(t.option_timeouts) for t in trajectories))):
            self._played[key] = self._played.get(key, 0.0) + n

    def _played_counts(self, i: int, trajectories: list[Trajectory]) -> dict[str, float]:
        """This iteration's counts (then reset); with ``backend.on_fault: continue``, the
        fault metrics every iteration (0 where none), and a stop where the faults are no
        flaky tool's: every episode cut by the env, or an option that faulted on every call."""
        out = {"option_timeouts/count": self._played.get("option_timeouts/count", 0.0)}
        faults, self._played = self._played.get("faults/count", 0.0), {}
        if self.config.backend.on_fault != "continue":
            return out
        out |= {"faults/count": faults, "faults/per_episode": 0.0, "faults/episodes_cut": 0.0}  # shares: below
        if trajectories and all(t.cut_by_fault for t in trajectories):
            raise ValueError(f"iteration {i}: every episode was cut by a fault of the env (its reset or a step), e.g. "
                             f"{trajectories[0].faults[-1]}: backend.on_fault: continue plays on through a flaky "
                             "fault, not one in every episode; fix it (a fault drawn from the task seed recurs in "
                             "every episode of that seed: draw a flaky tool's faults from a generator of its own)")
        faulted: dict[int, list[bool]] = {}
        for t in trajectories:
            for c in t.calls:
                faulted.setdefault(c.option, []).append(c.termination is Termination.FAULT)
        for option, ends in faulted.items():
            if len(ends) >= 8 and all(ends):
                example = next((f for t in trajectories for f in t.faults if repr(self.library[option].name) in f),
                               "see the warnings")  # a fault's line names its option
                raise ValueError(f"iteration {i}: every one of option {self.library[option].name!r}'s {len(ends)} "
                                 f"calls faulted, e.g. {example}: backend.on_fault: continue plays on through a "
                                 "flaky fault, not one on every call; fix it")
        return out

    def _average(self, i: int) -> dict[str, float]:
        """From ``train.average_start`` on, the updated weights join the tail average; after
        the last iteration the policy becomes its mean, the one the run ends with."""
        t = self.config.train
        if self.average is None or not t.average_start <= i < t.iterations:
            return {}
        if i == t.average_start:  # a run extended by a resume averages its own tail
            self.average.restart()
        self.average.add(self.policy)
        if i == t.iterations - 1:
            self.average.load_into(self.policy)
            self._temper(i)  # the last iteration's temperature, not the tail's mean of them
            self.version += 1  # another policy: a worker holding the last update's weights reloads
        return {"averaged_updates": float(self.average.count)}

    def _temper(self, i: int) -> None:
        """Set the manager's sampling temperature for iteration ``i`` (``train.temperature_final``).
        Workers load a policy version's weights once; should the temperature change while the
        version stays (an update skipped), the version moves on so they load it again."""
        if not isinstance(self.policy, ManagerPolicy):
            return
        temperature = self.config.train.temperature_at(i)
        if self._tempered is not None and self._tempered[0] == self.version and self._tempered[1] != temperature:
            self.version += 1
        self.policy.set_temperature(temperature)  # whatever the weights just loaded held
        self._tempered = (self.version, temperature)

    def _backend_counts(self) -> dict[str, float]:
        """The backend's fault counters (restarts, timeouts, re-issued and requeued
        episodes, …) as this iteration's increments, so a resumed run logs what an
        uninterrupted one would; ``backend/pending`` as it stands."""
        stats, seen = self.backend.stats(), self._backend_seen
        self._backend_seen = stats
        return {k: v if k == "backend/pending" else v - seen.get(k, 0.0) for k, v in stats.items()}

    # ---------------------------------------------------------------- state
    def _generators(self) -> dict[str, torch.Generator]:
        return {"minibatch": self.learner.generator, "rewards": self.rewards.generator}

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue bit for bit: weights, optimisers,
        counters, RNG states, noise σ and targets, reward models, buffer pools, curriculum."""
        return self.learner.state_dict() | {
            "version": self.version, "env_steps": self.env_steps, "next_iteration": self.next_iteration,
            "metrics": self.last_metrics, "rng": rng_snapshot(torch_generators=self._generators()),
            "noise": self.noise.state_dict(), "rewards": self.rewards.state_dict(), **self.stability.state_dict(),
            "buffer": self.buffer.state_dict() if self.buffer is not None else None,
            "curriculum": self.curriculum.state_dict() if self.curriculum is not None else None,
            "weight_average": self.average.state_dict() if self.average is not None else None,
            "config": self.config.model_dump(mode="json"),
            "checkpoint_decisions": self.checkpoints.decisions() if self.checkpoints is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.learner.load_state_dict(state)
        self.version, self.env_steps = state["version"], state["env_steps"]
        self.next_iteration = state.get("next_iteration", 0)
        self.last_metrics = state.get("metrics")  # written since session 59
        if "rng" in state:
            restore_rng(state["rng"], torch_generators=self._generators())
        for part, key in ((self.noise, "noise"), (self.rewards, "rewards"), (self.buffer, "buffer"),
                          (self.curriculum, "curriculum"), (self.average, "weight_average")):
            if part is not None and state.get(key) is not None:
                part.load_state_dict(state[key])
        self.stability.load_state_dict(state)

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
        state = gyre.checkpoints.load("latest")
        gyre.load_state_dict(state)
        if gyre.buffer is not None and state.get("buffer") is not None:
            gyre.buffer.rewind_to(state["buffer"])  # the store forgets what the killed run wrote after it
        if state.get("checkpoint_decisions") is not None:  # written since session 10
            gyre.checkpoints.restore_decisions(state["checkpoint_decisions"])
        return gyre
