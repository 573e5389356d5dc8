"""Fitter: drives LightningModules through Lightning Fabric on ready tensor batches.

Fabric keeps Lightning's accelerator/precision handling (``manual_backward`` goes through
it) without a per-sample DataLoader or the Trainer's per-fit start-up cost, which
matters when an update runs every few seconds.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from typing import Any

import lightning as L
import numpy as np
import torch

from gyre_ma import batch as B


class Fitter:
    def __init__(self, accelerator: str = "cpu") -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.fabric = L.Fabric(accelerator=accelerator, devices=1, precision="32-true")

    def setup(self, module: L.LightningModule) -> L.LightningModule:
        """Attach ``module`` and its optimiser to Fabric; returns the module itself."""
        optimizer = module.configure_optimizers()
        self.fabric.setup(module, optimizer)
        return module

    def fit(self, module: Any, batch: B.Batch, *, epochs: int, minibatch_size: int,
            generator: torch.Generator) -> dict[str, float]:
        """``epochs`` shuffled passes of ``module.training_step``; mean of each metric."""
        totals: dict[str, list[float]] = defaultdict(list)
        module.train()
        step = 0
        for _ in range(epochs):
            for mb in B.minibatches(batch, minibatch_size, generator):
                for k, v in module.training_step(mb, step).items():
                    totals[k].append(v)
                step += 1
        return {k: float(np.nanmean(v)) if not np.all(np.isnan(v)) else float("nan") for k, v in totals.items()}
