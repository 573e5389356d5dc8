"""PRMModule: the process reward model's training (:mod:`gyre_ma.rewards.prm`) as a
LightningModule with manual optimisation, like the manager's and the critic's."""

from __future__ import annotations

import math

import lightning as L
import torch
import torch.nn.functional as F

from gyre_ma import batch as B
from gyre_ma.rewards.prm import ProcessRewardModel


class PRMModule(L.LightningModule):
    """Binary cross-entropy on both heads; manual optimisation like the other trainers.

    Batch keys: ``FEATURES`` [N, F], ``OPTION`` [N], ``PROGRESS`` [N], ``SUCCESS`` [N].
    """

    def __init__(self, model: ProcessRewardModel, *, lr: float, max_grad_norm: float = 1.0) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.model = model
        self.lr = lr
        self.max_grad_norm = max_grad_norm

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.model.parameters(), lr=self.lr)

    def training_step(self, batch: B.Batch, batch_idx: int = 0) -> dict[str, float]:
        opt = self.optimizers()
        logits = self.model(batch[B.FEATURES], batch[B.OPTION])
        target = torch.stack([batch[B.PROGRESS], batch[B.SUCCESS]], dim=-1)
        loss = F.binary_cross_entropy_with_logits(logits, target)
        if not torch.isfinite(loss):
            return {"prm_loss": math.nan, "prm_skipped": 1.0}
        opt.zero_grad()
        self.manual_backward(loss)
        self.fabric.clip_gradients(self, opt, max_norm=self.max_grad_norm, error_if_nonfinite=False)
        opt.step()
        return {"prm_loss": loss.item(), "prm_skipped": 0.0}
