"""Fitter: drives LightningModules through Lightning Fabric on ready tensor batches.

Fabric does the accelerator and precision handling: :meth:`Fitter.setup` moves a module
to the device, converts it to the precision and wraps it and its optimiser; the module's
``self.optimizers()`` is then the Fabric optimiser and ``manual_backward`` is
``fabric.backward``. There is no per-sample DataLoader and none of the Trainer's per-fit
start-up cost, which matters when an update runs every few seconds.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

import lightning as L
import numpy as np
import torch
from lightning.fabric import is_wrapped

from gyre_ma import batch as B

if TYPE_CHECKING:
    from lightning.fabric.wrappers import _FabricModule

    from gyre_ma.config import Precision, TrainerConfig


class Fitter:
    """One Fabric for the learner; every module it trains is set up through it."""

    def __init__(self, *, accelerator: str = "cpu", devices: int | list[int] = 1, precision: Precision = "32-true",
                 strategy: str = "auto", threads: int | None = None) -> None:
        """Fabric's ``accelerator``, ``devices``, ``precision`` and ``strategy``; ``threads``
        sets torch's intra-op threads for the process now (None: left as they are)."""
        if threads is not None and threads < 1:
            raise ValueError(f"Fitter: threads must be >= 1 or None, got {threads}")
        try:
            self.fabric = L.Fabric(accelerator=accelerator, devices=devices, precision=precision, strategy=strategy)
        except (RuntimeError, TypeError, ValueError) as exc:  # e.g. accelerator="cuda" on a machine without one
            raise ValueError(f"trainer (accelerator={accelerator!r}, devices={devices!r}, precision={precision!r}, "
                             f"strategy={strategy!r}): {exc}") from None
        if self.fabric.world_size != 1:
            raise ValueError(f"trainer: the learner runs in one process, but Fabric was given "
                             f"{self.fabric.world_size} devices (devices={devices!r})")
        self.dtype = self.fabric.strategy.precision.convert_module(torch.nn.Linear(1, 1)).weight.dtype
        """The dtype Fabric gives the weights: float32 but for the ``-true`` precisions."""
        if threads is not None:
            torch.set_num_threads(threads)

    @classmethod
    def from_config(cls, config: TrainerConfig) -> Fitter:
        return cls(accelerator=config.accelerator, devices=config.devices, precision=config.precision,
                   strategy=config.strategy, threads=config.threads)

    @property
    def device(self) -> torch.device:
        return self.fabric.device

    def setup(self, module: L.LightningModule) -> _FabricModule:
        """Set ``module`` and the optimiser of its ``configure_optimizers`` up with Fabric; returns
        the Fabric-wrapped module, the one to train (``.module`` is ``module`` itself)."""
        wrapped, _ = self.fabric.setup(module, module.configure_optimizers())
        return wrapped

    def to_learner(self, batch: B.Batch) -> B.Batch:
        """``batch`` on the learner's device, floating tensors in the weights' dtype. Not
        Fabric's ``convert_input``: under ``-mixed`` that casts every input to 16 bits, the
        old log-probabilities and returns the loss compares against too."""
        batch = self.fabric.to_device(batch)
        if self.dtype == torch.float32:  # inputs as they are (under -mixed, autocast casts per op)
            return batch
        return {k: v.to(self.dtype) if v.is_floating_point() else v for k, v in batch.items()}

    def fit(self, module: _FabricModule, batch: B.Batch, *, epochs: int, minibatch_size: int,
            generator: torch.Generator) -> dict[str, float]:
        """``epochs`` shuffled passes of ``module.training_step`` under Fabric's autocast; the
        mean of each metric. ``batch`` may be on the CPU: each minibatch is moved to the device."""
        if not is_wrapped(module):
            raise TypeError(f"Fitter.fit: expected a module returned by Fitter.setup, got {type(module).__name__}")
        totals: dict[str, list[float]] = defaultdict(list)
        module.train()
        step = 0
        with self.fabric.autocast():
            for _ in range(epochs):
                for mb in B.minibatches(batch, minibatch_size, generator):
                    for k, v in module.training_step(self.to_learner(mb), step).items():
                        totals[k].append(v)
                    step += 1
        return {k: float(np.nanmean(v)) if not np.all(np.isnan(v)) else float("nan") for k, v in totals.items()}
