"""ManagerModule: the manager's PPO / GRPO update as a LightningModule, manual optimisation.

Rollout storage lives outside the module: it is handed ready tensor minibatches
(see :mod:`gyre_ma.batch`) by :class:`gyre_ma.trainers.fit.Fitter`.
"""

from __future__ import annotations

import math

import lightning as L
import torch
from torch import nn

from gyre_ma import batch as B
from gyre_ma.agents.manager import ManagerPolicy
from gyre_ma.agents.noise import masked_kl
from gyre_ma.trainers.losses import approx_kl, clipped_surrogate


class ManagerModule(L.LightningModule):
    """The clipped surrogate on any policy with ``batch_logits(batch)`` → masked logits:
    the MLP manager (features) or the LLM manager (prompts). With a ``reference`` policy
    (the LLM manager's frozen initial model), ``ref_kl_coef`` · KL(π ‖ π_ref) over the
    eligible options joins the loss.

    A batch carrying :data:`~gyre_ma.batch.PROXIMAL_LOG_PROB` gets decoupled PPO (Hilton et
    al. 2021, arXiv 2110.00641): the ratio is clipped against that proximal policy (the
    learner's before the update), not against the behaviour policy that chose (perturbed by
    its episode's parameter noise, tempered, or a version behind), and each row's term is
    weighted by proximal ÷ behaviour probability, capped at ``importance_cap``."""

    def __init__(self, policy: ManagerPolicy | nn.Module, *, lr: float, clip: float, entropy_coef: float,
                 kl_coef: float, max_grad_norm: float = 0.5, normalize_advantage: bool = True,
                 reference: nn.Module | None = None, ref_kl_coef: float = 0.0,
                 importance_cap: float = 1.0) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.policy = policy
        self.reference, self.ref_kl_coef = reference, ref_kl_coef
        self.lr, self.clip = lr, clip
        self.entropy_coef, self.kl_coef = entropy_coef, kl_coef
        self.max_grad_norm = max_grad_norm
        self.normalize_advantage = normalize_advantage
        self.importance_cap = importance_cap

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.policy.parameters(), lr=self.lr, eps=1e-5)

    def training_step(self, batch: B.Batch, batch_idx: int = 0) -> dict[str, float]:
        """One clipped-surrogate step on a minibatch; returns float metrics.

        A non-finite loss skips the step (parameters unchanged) and reports ``skipped``.
        """
        opt = self.optimizers()
        logits = self.policy.batch_logits(batch)
        dist = torch.distributions.Categorical(logits=logits)
        log_prob = dist.log_prob(batch[B.OPTION])
        advantage = batch[B.ADVANTAGE]
        if self.normalize_advantage and advantage.numel() > 1:
            advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
        anchor, weight, extra = batch[B.LOG_PROB], None, {}
        if B.PROXIMAL_LOG_PROB in batch:  # decoupled: clip against the learner's policy, weight by it ÷ behaviour
            anchor = batch[B.PROXIMAL_LOG_PROB]
            extra["behaviour_kl"] = approx_kl(log_prob=anchor, old_log_prob=batch[B.LOG_PROB]).item()
            weight = (anchor - batch[B.LOG_PROB]).exp().clamp(max=self.importance_cap)
        surrogate = clipped_surrogate(log_prob=log_prob, old_log_prob=anchor, advantage=advantage, clip=self.clip,
                                      weight=weight)
        entropy = dist.entropy().mean()
        kl = approx_kl(log_prob=log_prob, old_log_prob=anchor)
        loss = surrogate - self.entropy_coef * entropy + self.kl_coef * kl
        if self.reference is not None:
            ref_kl = masked_kl(logits_p=logits, logits_q=batch[B.REF_LOGITS], mask=batch[B.MASK]).mean()
            loss = loss + self.ref_kl_coef * ref_kl
            extra["ref_kl"] = ref_kl.item()
        if not torch.isfinite(loss):
            return {"policy_loss": math.nan, "skipped": 1.0}
        opt.zero_grad()
        self.manual_backward(loss)
        self.fabric.clip_gradients(self, opt, max_norm=self.max_grad_norm, error_if_nonfinite=False)
        opt.step()
        clip_frac = ((log_prob - anchor).exp().sub(1.0).abs() > self.clip).float().mean()
        return {
            "policy_loss": surrogate.item(), "entropy": entropy.item(), "kl": kl.item(),
            "clip_fraction": clip_frac.item(), "skipped": 0.0,
        } | extra

    def imitation_step(self, batch: B.Batch, *, weight: float) -> dict[str, float]:
        """One self-imitation step (:mod:`gyre_ma.trainers.self_imitation`): raise the
        log-probability of ``batch``'s choices, rows drawn ∝ (R − V)⁺, by ``weight`` (the
        coefficient times the mean (R − V)⁺ they were drawn by)."""
        opt = self.optimizers()
        logits = self.policy.batch_logits(batch)
        log_prob = torch.distributions.Categorical(logits=logits).log_prob(batch[B.OPTION])
        loss = -weight * log_prob.mean()
        if not torch.isfinite(loss):
            return {"imitation_loss": math.nan}
        opt.zero_grad()
        self.manual_backward(loss)
        self.fabric.clip_gradients(self, opt, max_norm=self.max_grad_norm, error_if_nonfinite=False)
        opt.step()
        return {"imitation_loss": loss.item()}
