"""PRM drift monitor: does the learned process reward still agree with verified outcomes?

Every iteration the PRM scores calls from held-out episodes (never trained on) and the
agreement between its predicted probabilities and the verified labels is measured — AUC
(0.5 is chance) or Spearman rank correlation (0 is chance), averaged over the heads whose
labels are not all equal. Below ``threshold`` the PRM's weight is cut (multiplied by
``cut``) and an alarm is logged; it is restored once agreement reaches ``recover``
(hysteresis, so the weight does not flicker). The PRM starts untrusted: its weight is
cut until agreement has first been shown.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from torch import Tensor

log = logging.getLogger("gyre_ma.rewards")

Metric = Literal["auc", "spearman"]


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (1-based), ties sharing their mean rank."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    xs = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and xs[j + 1] == xs[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def auc(*, scores: Tensor | np.ndarray, labels: Tensor | np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` [N] for binary ``labels`` [N] (Mann–Whitney,
    ties count half). NaN when only one class is present."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels, dtype=np.float64).ravel() > 0.5
    if s.shape != y.shape:
        raise ValueError(f"auc: scores {s.shape} and labels {y.shape} must have the same shape [N]")
    pos, neg = int(y.sum()), int((~y).sum())
    if pos == 0 or neg == 0:
        return math.nan
    r = _ranks(s)
    return float((r[y].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def spearman(x: Tensor | np.ndarray, y: Tensor | np.ndarray) -> float:
    """Spearman rank correlation of two [N] arrays; NaN when either is constant or N < 2."""
    a = np.asarray(x, dtype=np.float64).ravel()
    b = np.asarray(y, dtype=np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"spearman: inputs {a.shape} and {b.shape} must have the same shape [N]")
    if len(a) < 2:
        return math.nan
    ra, rb = _ranks(a), _ranks(b)
    sa, sb = ra.std(), rb.std()
    if sa == 0 or sb == 0:
        return math.nan
    return float(((ra - ra.mean()) * (rb - rb.mean())).mean() / (sa * sb))


def agreement(*, probabilities: Tensor, labels: Tensor, metric: Metric = "auc") -> float:
    """Mean agreement over heads: ``probabilities`` and ``labels`` are [N, H]; heads whose
    labels are all equal are skipped; NaN when none can be measured."""
    if probabilities.shape != labels.shape or probabilities.ndim != 2:
        raise ValueError(
            f"agreement: probabilities {tuple(probabilities.shape)} and labels {tuple(labels.shape)} "
            "must both be [N, H]"
        )
    values = []
    for h in range(probabilities.shape[1]):
        p, y = probabilities[:, h].numpy(), labels[:, h].numpy()
        v = auc(scores=p, labels=y) if metric == "auc" else spearman(p, y)
        if not math.isnan(v):
            values.append(v)
    return float(np.mean(values)) if values else math.nan


class DriftConfig(BaseModel):
    """The PRM drift monitor (``rewards.drift``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    metric: Metric = "auc"
    """``auc`` (0.5 = chance) or ``spearman`` (0 = chance)."""
    threshold: float = Field(0.65, ge=-1.0, le=1.0)
    """Agreement below which the PRM weight is cut and an alarm logged."""
    recover: float = Field(0.7, ge=-1.0, le=1.0)
    """Agreement at or above which a cut weight is restored (>= threshold)."""
    cut: float = Field(0.0, ge=0.0, le=1.0)
    """Multiplier on the PRM weight while cut (0 switches it off)."""
    min_samples: int = Field(16, ge=2)
    """Held-out calls needed before agreement is trusted either way."""

    @model_validator(mode="after")
    def _hysteresis(self) -> DriftConfig:
        if self.recover < self.threshold:
            raise ValueError(f"`recover` ({self.recover}) must be >= `threshold` ({self.threshold})")
        return self


@dataclass(frozen=True)
class DriftStatus:
    agreement: float
    samples: int
    trusted: bool
    scale: float
    """Multiplier on the PRM weight from now on."""
    event: str | None = None
    """``cut`` or ``restore`` when the state changed at this update."""
    message: str = ""


class DriftMonitor:
    """Hysteresis on PRM/outcome agreement; ``scale`` multiplies the PRM weight."""

    def __init__(self, config: DriftConfig | None = None, *, trusted: bool = False) -> None:
        self.config = config or DriftConfig()
        self.trusted = trusted
        self.history: list[float] = []
        self.events: list[DriftStatus] = []

    @property
    def scale(self) -> float:
        return 1.0 if self.trusted else self.config.cut

    def update(self, value: float, *, samples: int, iteration: int | None = None) -> DriftStatus:
        """Feed one iteration's agreement; NaN or too few samples change nothing."""
        c = self.config
        self.history.append(value)
        event, message = None, ""
        if not math.isnan(value) and samples >= c.min_samples:
            at = "" if iteration is None else f" at iteration {iteration}"
            if self.trusted and value < c.threshold:
                self.trusted, event = False, "cut"
                message = (f"PRM drift{at}: agreement {c.metric}={value:.3f} < threshold {c.threshold}; "
                           f"PRM weight cut to {c.cut:g}x")
                log.warning(message)
            elif not self.trusted and value >= c.recover:
                self.trusted, event = True, "restore"
                message = (f"PRM agreement{at}: {c.metric}={value:.3f} >= {c.recover}; "
                           "PRM weight restored")
                log.info(message)
        status = DriftStatus(value, samples, self.trusted, self.scale, event, message)
        if event is not None:
            self.events.append(status)
        return status

    def check(self, *, probabilities: Tensor, labels: Tensor, iteration: int | None = None) -> DriftStatus:
        """Measure agreement on held-out calls ([N, H] each) and update."""
        value = agreement(probabilities=probabilities, labels=labels, metric=self.config.metric)
        return self.update(value, samples=int(probabilities.shape[0]), iteration=iteration)

    def state_dict(self) -> dict[str, Any]:
        return {"trusted": self.trusted, "history": list(self.history),
                "events": [asdict(e) for e in self.events]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trusted = bool(state["trusted"])
        self.history = list(state["history"])
        self.events = [DriftStatus(**e) for e in state["events"]]

