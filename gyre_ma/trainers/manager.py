"""ManagerModule: the manager's PPO / GRPO update as a LightningModule, manual optimisation.

Rollout storage lives outside the module: it is handed ready tensor minibatches
(see :mod:`gyre_ma.batch`) by :class:`gyre_ma.trainers.fit.Fitter`.
"""

from __future__ import annotations

import math

import lightning as L
import torch

from gyre_ma import batch as B
from gyre_ma.agents.manager import ManagerPolicy
from gyre_ma.trainers.losses import approx_kl, clipped_surrogate


class ManagerModule(L.LightningModule):
    def __init__(self, policy: ManagerPolicy, *, lr: float, clip: float, entropy_coef: float,
                 kl_coef: float, max_grad_norm: float = 0.5, normalize_advantage: bool = True) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.policy = policy
        self.lr, self.clip = lr, clip
        self.entropy_coef, self.kl_coef = entropy_coef, kl_coef
        self.max_grad_norm = max_grad_norm
        self.normalize_advantage = normalize_advantage

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.policy.parameters(), lr=self.lr, eps=1e-5)

    def training_step(self, batch: B.Batch, batch_idx: int = 0) -> dict[str, float]:
        """One clipped-surrogate step on a minibatch; returns float metrics.

        A non-finite loss skips the step (parameters unchanged) and reports ``skipped``.
        """
        opt = self.optimizers()
        dist = self.policy.distribution(batch[B.FEATURES], batch[B.AGENT], batch[B.MASK])
        log_prob = dist.log_prob(batch[B.OPTION])
        advantage = batch[B.ADVANTAGE]
        if self.normalize_advantage and advantage.numel() > 1:
            advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
        surrogate = clipped_surrogate(
            log_prob=log_prob, old_log_prob=batch[B.LOG_PROB], advantage=advantage, clip=self.clip
        )
        entropy = dist.entropy().mean()
        kl = approx_kl(log_prob=log_prob, old_log_prob=batch[B.LOG_PROB])
        loss = surrogate - self.entropy_coef * entropy + self.kl_coef * kl
        if not torch.isfinite(loss):
            return {"policy_loss": math.nan, "skipped": 1.0}
        opt.zero_grad()
        self.manual_backward(loss)
        self.fabric.clip_gradients(self, opt, max_norm=self.max_grad_norm, error_if_nonfinite=False)
        opt.step()
        clip_frac = ((log_prob - batch[B.LOG_PROB]).exp().sub(1.0).abs() > self.clip).float().mean()
        return {
            "policy_loss": surrogate.item(), "entropy": entropy.item(), "kl": kl.item(),
            "clip_fraction": clip_frac.item(), "skipped": 0.0,
        }
