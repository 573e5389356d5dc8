"""CriticModule: value regression as a LightningModule with manual optimisation."""

from __future__ import annotations

import math

import lightning as L
import torch

from gyre_ma import batch as B
from gyre_ma.agents.manager import Critic
from gyre_ma.trainers.losses import value_loss


class CriticModule(L.LightningModule):
    """Regresses the critic on ``batch[RETURN]`` from ``batch[STATE]`` (centralised) or
    ``batch[FEATURES]`` (local)."""

    def __init__(self, critic: Critic, *, lr: float, centralised: bool = False,
                 max_grad_norm: float = 1.0) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.critic = critic
        self.lr = lr
        self.centralised = centralised
        self.max_grad_norm = max_grad_norm

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.critic.parameters(), lr=self.lr)

    def training_step(self, batch: B.Batch, batch_idx: int = 0) -> dict[str, float]:
        opt = self.optimizers()
        x = batch[B.STATE] if self.centralised else batch[B.FEATURES]
        loss = value_loss(value=self.critic(x, batch[B.AGENT]), target=batch[B.RETURN])
        if not torch.isfinite(loss):
            return {"value_loss": math.nan, "skipped": 1.0}
        opt.zero_grad()
        self.manual_backward(loss)
        self.fabric.clip_gradients(self, opt, max_norm=self.max_grad_norm, error_if_nonfinite=False)
        opt.step()
        return {"value_loss": loss.item(), "skipped": 0.0}
