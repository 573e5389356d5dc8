"""Managers that do not learn: the random eligible-order lower bound."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gyre_ma.options.decision import Choice, Decision


class RandomManager:
    """Picks uniformly among the eligible options — the order-agnostic baseline."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def decide(self, decisions: Sequence[Decision]) -> list[Choice]:
        out = []
        for d in decisions:
            eligible = np.flatnonzero(d.mask)
            out.append(Choice(int(self.rng.choice(eligible)), float(-np.log(len(eligible)))))
        return out
