"""The Learner: the manager and its critic as they are trained, through one Fabric.

It owns what an update changes — the Fabric-wrapped :class:`ManagerModule` and
:class:`CriticModule`, their optimisers, the minibatch generator, whether the critic has
been warm-started — and nothing of the rollout side (the loop hands it batches).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from gyre_ma import batch as B
from gyre_ma.checkpoints import apply_lr_scale, load_weights, parameter_step_size
from gyre_ma.trainers import self_imitation
from gyre_ma.trainers.critic import CriticModule
from gyre_ma.trainers.fit import Fitter
from gyre_ma.trainers.manager import ManagerModule
from gyre_ma.trainers.replay import RowReplay
from gyre_ma.training_batch import warm_start_value

if TYPE_CHECKING:
    from gyre_ma.agents.manager import Critic, ManagerPolicy
    from gyre_ma.config import ExperimentConfig
    from gyre_ma.rollout import Trajectory

CRITIC_KEYS = (B.FEATURES, B.STATE, B.AGENT, B.OPTION, B.RETURN)
"""What the critic's replay keeps of a row: both critics' inputs, the agent, the return
(and the option, which only sizes the batch)."""


class Learner:
    """PPO on the manager and value regression on the critic, ``train.epochs`` passes of
    ``train.minibatch_size`` each, on the device and in the precision of ``config.trainer``."""

    def __init__(self, config: ExperimentConfig, policy: ManagerPolicy, critic: Critic, *, agents: int) -> None:
        """``agents``: the environment's possible agents (the critic's warm start is per agent)."""
        t = config.train
        self.agents = agents
        self.policy, self.critic = policy, critic
        self.epochs, self.minibatch_size, self.gamma = t.epochs, t.minibatch_size, config.credit.gamma
        self.fitter = Fitter.from_config(config.trainer)
        llm = config.manager.llm if config.manager.kind == "llm" else None
        self.manager_module = self.fitter.setup(ManagerModule(
            policy, lr=t.lr, clip=t.clip, entropy_coef=t.entropy_coef, kl_coef=t.kl_coef,
            reference=policy.frozen_copy() if llm is not None else None,
            ref_kl_coef=llm.ref_kl_coef if llm is not None else 0.0, importance_cap=t.importance_cap))
        self.decoupled = t.proximal == "learner"
        self.critic_module = self.fitter.setup(
            CriticModule(critic, lr=t.critic_lr, centralised=config.manager.centralised_critic))
        self.lrs = (t.lr, t.critic_lr)
        """The configured learning rates of the manager and the critic, before any rollback's cut."""
        self.generator = torch.Generator().manual_seed(config.seed)
        """Shuffles minibatches; part of the learner's state, so a resumed run draws the same."""
        self.imitation = config.imitation_weight  # 0 for the LLM manager (the config says so)
        self.imitates = t.self_imitation_rows
        """Which replayed decisions are imitated: ``group_best`` or ``beat_critic``."""
        self.trusts = t.self_imitation_trust
        """Whether a group-best row is drawn by min(1, π_now / π_then) of its choice."""
        self.replay = (RowReplay(t.self_imitation_capacity, self_imitation.KEYS, updates=t.self_imitation_updates)
                       if self.imitation > 0 else None)
        """Decisions kept for self-imitation (the MLP manager's; None when it is off)."""
        self.centralised = config.manager.centralised_critic
        self.critic_replay = RowReplay(t.critic_replay, CRITIC_KEYS) if t.critic_replay > 0 else None
        """Earlier updates' critic rows the critic also fits on (None: ``train.critic_replay`` is 0)."""
        self.critic_initialised = False
        """Whether the critic has been warm-started (first :meth:`fit`); until then its values
        are not used to bootstrap."""

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The manager's and the critic's optimisers (the ones Fabric steps)."""
        return [self.manager_module.optimizers().optimizer, self.critic_module.optimizers().optimizer]

    def set_lr_scale(self, scale: float) -> None:
        """Both learning rates at ``scale`` × their configured values."""
        apply_lr_scale(self.optimizers, scale)

    def set_entropy_coef(self, coef: float) -> None:
        """The manager's entropy bonus weight from the next update on."""
        self.manager_module.module.entropy_coef = coef

    def fit(self, batch: B.Batch, trajectories: list[Trajectory]) -> dict[str, float]:
        """One update of the manager, then of the critic, on ``batch`` (built from
        ``trajectories``); their mean metrics and ``update_step_size``, the policy's relative
        parameter change. The first update warm-starts the critic (:func:`warm_start_value`)."""
        if not self.critic_initialised:
            self.critic.initialise(warm_start_value(batch[B.RETURN]))
            self.critic_initialised = True
        before = {k: v.detach().clone() for k, v in self.policy.state_dict().items()}
        options = dict(epochs=self.epochs, minibatch_size=self.minibatch_size, generator=self.generator)
        # a decision with one eligible option chose nothing: no gradient, but its advantage
        # would enter the normalisation and its zero entropy the mean; the critic learns from it
        choices = batch[B.MASK].sum(-1) > 1
        metrics = {"forced_decisions": float(1.0 - choices.float().mean())} if len(choices) else {}
        if bool(choices.any()):
            decided = batch if bool(choices.all()) else {k: v[choices] for k, v in batch.items()}
            module = self.manager_module.module
            if module.reference is not None:  # once per update, before the epochs: the reference does not move
                decided = decided | {B.REF_LOGITS: self._by_minibatch(decided, module.reference.batch_logits)}
            if self.decoupled:
                decided = decided | {B.PROXIMAL_LOG_PROB: self._by_minibatch(decided, self._log_probs)}
            metrics |= self.fitter.fit(self.manager_module, decided, **options)
        metrics |= self.fitter.fit(self.critic_module, self._critic_rows(batch), **options)
        if self.replay is not None and bool(choices.any()):
            self.replay.add(decided)
            metrics |= self._imitate(decided[B.ADVANTAGE])
        return metrics | {"update_step_size": parameter_step_size(before, self.policy.state_dict())}

    def _critic_rows(self, batch: B.Batch) -> B.Batch:
        """``batch``'s critic inputs and returns, after the replayed rows of earlier updates;
        ``batch`` then joins the replay."""
        if self.critic_replay is None:
            return batch
        keys = self.critic_replay.keys
        rows = {k: v for k, v in batch.items() if k in keys}
        old = self.critic_replay.rows
        fit = {k: torch.cat([old[k], v.detach().cpu()]) for k, v in rows.items()} if old else rows
        self.critic_replay.add(rows)  # after the copy: a full ring is overwritten in place
        return fit

    def _imitate(self, advantages: torch.Tensor) -> dict[str, float]:
        """``epochs`` self-imitation steps on the replay's recent decisions (module
        :mod:`~gyre_ma.trainers.self_imitation`): those of groups' best episodes, drawn by
        their trust (uniformly where ``train.self_imitation_trust`` is off), the term scaled by
        its mean; or those whose return beat the critic as it is after this
        update, drawn by how far, the excess divided by the spread of the update's
        ``advantages``, which the PPO step normalised by (a replayed decision weighs as an
        on-policy one of the same excess)."""
        size = self.minibatch_size * self.epochs
        if self.imitates == "group_best":
            rows = self.replay.recent()
            drawn = self_imitation.group_best_sample(rows, size=size, generator=self.generator,
                                                     trust=self._trust(rows) if self.trusts else None)
        else:
            drawn = self._beat_critic_sample(size, advantages)
        if drawn is None:
            return {"imitation_weight": 0.0}
        sample, scale = drawn
        out: list[float] = []
        self.manager_module.train()
        with self.fitter.fabric.autocast():
            for at in range(0, size, self.minibatch_size):
                mb = self.fitter.to_learner({k: v[at:at + self.minibatch_size] for k, v in sample.items()})
                out.append(self.manager_module.imitation_step(mb, weight=self.imitation * scale)["imitation_loss"])
        return {"imitation_weight": scale, "imitation_loss": float(sum(out) / len(out))}

    def _trust(self, rows: B.Batch) -> torch.Tensor:
        """Per replayed row, min(1, π_now(a | s) / π_then(a | s)) where it is a group's best
        (0 elsewhere): how far the policy still stands behind the choice it made then."""
        trust = torch.zeros(rows[B.OPTION].shape[0])
        best = rows[B.GROUP_BEST] > 0
        if bool(best.any()):
            winners = {k: v[best] for k, v in rows.items()}
            now = self._by_minibatch(winners, self._log_probs)
            trust[best] = (now - winners[B.LOG_PROB].float()).exp().clamp(max=1.0)
        return trust

    def _beat_critic_sample(self, size: int, advantages: torch.Tensor) -> tuple[B.Batch, float] | None:
        rows = self.replay.recent()
        critic = self.critic_module.module.critic
        inputs = B.STATE if self.centralised else B.FEATURES
        with torch.no_grad(), self.fitter.fabric.autocast():  # at most train.self_imitation_capacity rows
            x = self.fitter.to_learner({inputs: rows[inputs], B.AGENT: rows[B.AGENT]})
            values = critic(x[inputs], x[B.AGENT]).float().cpu()
        drawn = self_imitation.imitation_sample(rows, values, size=size, generator=self.generator)
        if drawn is None:
            return None
        sample, scale = drawn
        spread = float(advantages.float().std()) if len(advantages) > 1 else 0.0
        if spread > 1e-6:  # else the advantages were all alike (PPO did not rescale them)
            scale /= spread
        return sample, scale

    def _by_minibatch(self, batch: B.Batch, forward: Callable[[B.Batch], torch.Tensor]) -> torch.Tensor:
        """``forward`` (no gradient) of every row of ``batch``, a minibatch's worth at a time, on the CPU."""
        n = batch[B.OPTION].shape[0]
        with torch.no_grad(), self.fitter.fabric.autocast():
            return torch.cat([forward(self.fitter.to_learner(
                {k: v[at:at + self.minibatch_size] for k, v in batch.items()})).float().cpu()
                for at in range(0, n, self.minibatch_size)])

    def _log_probs(self, batch: B.Batch) -> torch.Tensor:
        """The policy's log-probability of each row's chosen option, as it is now."""
        logits = self.manager_module.module.policy.batch_logits(batch)
        return torch.distributions.Categorical(logits=logits).log_prob(batch[B.OPTION])

    def state_dict(self) -> dict[str, Any]:
        manager_opt, critic_opt = self.optimizers
        return {"policy": self.policy.state_dict(), "critic": self.critic.state_dict(),
                "manager_optimizer": manager_opt.state_dict(), "critic_optimizer": critic_opt.state_dict(),
                "critic_initialised": self.critic_initialised} | (
                    {"self_imitation": self.replay.state_dict()} if self.replay is not None else {}) | (
                    {"critic_replay": self.critic_replay.state_dict()} if self.critic_replay is not None else {})

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        load_weights(self.policy, state["policy"], "policy")
        load_weights(self.critic, state["critic"], "critic")
        for optimizer, key, lr in zip(self.optimizers, ("manager_optimizer", "critic_optimizer"), self.lrs,
                                      strict=True):
            optimizer.load_state_dict(state[key])
            for group in optimizer.param_groups:  # the config's LR (a forced resume may change it), same cut
                scale = group["lr"] / group.get("base_lr", group["lr"])
                group["base_lr"], group["lr"] = lr, lr * scale
        self.critic_initialised = state["critic_initialised"]
        saved = state.get("self_imitation")
        if self.replay is not None and saved is not None:
            if saved["rows"] and B.LOG_PROB not in saved["rows"]:
                warnings.warn("the checkpoint's self-imitation replay was written before it kept each decision's "
                              "log-probability (session 43); the replay starts empty", stacklevel=2)
                self.replay.load_state_dict({"rows": {}, "next": 0, "added": 0})  # rows this learner held go too
            else:
                self.replay.load_state_dict(saved)
        if self.critic_replay is not None and "critic_replay" in state:
            self.critic_replay.load_state_dict(state["critic_replay"])
