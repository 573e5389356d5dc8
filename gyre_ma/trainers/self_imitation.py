"""Self-imitation: replay the decisions whose episodes did better than the critic expected.

Oh et al. 2018 (arXiv 1806.05635). A learner on a sparse outcome sees a rare success on a
hard task seed once, in one minibatch, as one advantage among many; the policy gradient
moves it a little and the next groups, sampled from the barely changed policy, mostly fail
again. Self-imitation keeps every decision with its Monte-Carlo return ``R`` (the critic's
target) and, at each update, imitates the stored decisions that beat the *current* critic:

    L = −coef · E_rows[ (R − V(s))⁺ · log π(a | s) ]

A decision its critic already expects to return ``R`` weighs nothing (so on a learned task
the term fades by itself); a success on a seed where the critic predicts failure weighs
most, and is replayed at every update until the critic (trained on-policy only) has
learned that the policy now wins there. Rows are drawn with probability ∝ (R − V)⁺ and the
loss scaled by the mean weight, an unbiased estimate of the expectation above.
"""

from __future__ import annotations

from typing import Any

import torch

from gyre_ma import batch as B

KEYS = (B.FEATURES, B.STATE, B.AGENT, B.MASK, B.OPTION, B.RETURN)
"""What a stored decision keeps: the policy's and the critic's inputs, the choice, its return."""


class SelfImitationReplay:
    """The last ``capacity`` rows of the batches added, their ``keys`` only, as tensors (a
    ring, oldest overwritten). Self-imitation keeps the decisions that had a choice; the
    critic's replay keeps every row's critic inputs and return."""

    def __init__(self, capacity: int, keys: tuple[str, ...] = KEYS) -> None:
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.keys = keys
        self.rows: B.Batch = {}
        self.next = 0
        """Where the next row goes once the ring is full."""

    def __len__(self) -> int:
        return int(self.rows[B.RETURN].shape[0]) if self.rows else 0

    def add(self, batch: B.Batch) -> None:
        new = {k: v.detach().cpu() for k, v in batch.items() if k in self.keys}
        n = int(new[B.RETURN].shape[0])
        if n == 0:
            return
        if n >= self.capacity:
            self.rows = {k: v[-self.capacity:].clone() for k, v in new.items()}
            self.next = 0
            return
        if not self.rows:
            self.rows = {k: v.clone() for k, v in new.items()}
            return
        if set(new) != set(self.rows) or any(new[k].shape[1:] != self.rows[k].shape[1:] for k in new):
            raise ValueError(f"self-imitation: a batch with keys {sorted(new)} and shapes "
                             f"{ {k: tuple(v.shape[1:]) for k, v in new.items()} } does not match the stored rows' "
                             f"{ {k: tuple(v.shape[1:]) for k, v in self.rows.items()} }")
        room = self.capacity - len(self)
        if room > 0:
            take = min(room, n)
            self.rows = {k: torch.cat([v, new[k][:take]]) for k, v in self.rows.items()}
            new = {k: v[take:] for k, v in new.items()}
            n -= take
        if n:
            at = (self.next + torch.arange(n)) % self.capacity
            for k, v in self.rows.items():
                v[at] = new[k]
            self.next = int((self.next + n) % self.capacity)

    def state_dict(self) -> dict[str, Any]:
        return {"rows": {k: v.clone() for k, v in self.rows.items()}, "next": self.next}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows = {k: v.clone() for k, v in state["rows"].items()}
        self.next = int(state["next"])


def imitation_sample(rows: B.Batch, values: torch.Tensor, *, size: int,
                     generator: torch.Generator) -> tuple[B.Batch, float] | None:
    """``size`` rows drawn with probability ∝ (R − V)⁺, and the mean of (R − V)⁺ over all
    rows (the loss's scale); None where no row beat its value."""
    weight = (rows[B.RETURN].float() - values.float()).clamp(min=0.0)
    total = float(weight.sum())
    if not total > 0.0:
        return None
    picked = torch.multinomial(weight / total, size, replacement=True, generator=generator)
    return {k: v[picked] for k, v in rows.items() if k != B.RETURN}, total / len(weight)
