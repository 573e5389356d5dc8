"""The tail average of the manager's weights: the policy a run ends with.

A fixed step size keeps a policy-gradient learner moving around an optimum it has found:
on a task it has nearly solved, each update follows the noise of a few dozen decisions,
and the last update's weights are one sample of that walk. The uniform average of the
weights over the run's last iterations (Polyak and Juditsky 1992; stochastic weight
averaging, Izmailov et al. 2018) is the walk's centre, without the step size cut that
would slow the learning before it (``benchmarks/results/README.md``, session 30).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn


def _accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """Twice a float parameter's precision, so that hundreds of additions do not round away
    the small differences being averaged (float64 for float32, float32 for 16-bit floats)."""
    return torch.float64 if torch.finfo(dtype).bits >= 32 else torch.float32


class TailAverage:
    """The running sum of a module's floating-point weights over the iterations it is shown;
    :meth:`load_into` replaces the module's weights by their mean. Integer buffers are not
    averaged (the module's own are kept)."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.count = 0

    def restart(self) -> None:
        self.sums, self.count = {}, 0

    def add(self, module: nn.Module) -> None:
        """Add ``module``'s current floating-point weights to the sum."""
        with torch.no_grad():
            for name, value in module.state_dict().items():
                if not value.is_floating_point():
                    continue
                if name in self.sums:
                    self.sums[name] += value.detach().to(self.sums[name].dtype)
                else:
                    self.sums[name] = value.detach().to(_accumulator_dtype(value.dtype), copy=True)
        self.count += 1

    def load_into(self, module: nn.Module) -> None:
        """Set ``module``'s floating-point weights to the mean of those added."""
        if self.count == 0:
            raise ValueError("the tail average has no weights yet: add() at least once before load_into()")
        state = module.state_dict()
        missing = sorted(name for name, value in state.items() if value.is_floating_point() and name not in self.sums)
        if missing:
            raise ValueError(f"the tail average lacks the module's weights {missing[:5]}: it was summed over "
                             "another module")
        with torch.no_grad():
            for name, total in self.sums.items():
                state[name].copy_((total / self.count).to(state[name].dtype))

    def state_dict(self) -> dict[str, Any]:
        return {"sums": {k: v.clone() for k, v in self.sums.items()}, "count": self.count}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.sums = {k: v.clone() for k, v in state["sums"].items()}
        self.count = int(state["count"])


__all__ = ["TailAverage"]
