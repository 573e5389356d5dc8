"""RowReplay: the newest rows of earlier updates, kept for the learner to fit on again.

Two users: self-imitation keeps the decisions that had a choice
(:mod:`gyre_ma.trainers.self_imitation`), and the critic keeps every row's inputs and return
(``train.critic_replay``): a value regressed on one iteration's few dozen decisions sees
each kind of state too rarely to learn which of them win.
"""

from __future__ import annotations

from typing import Any

import torch

from gyre_ma import batch as B


class RowReplay:
    """The last ``capacity`` rows of the batches added, their ``keys`` only, as tensors (a
    ring, oldest overwritten; the rows are in ring order, not in the order they came)."""

    def __init__(self, capacity: int, keys: tuple[str, ...]) -> None:
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
            raise ValueError(f"replay: a batch with keys {sorted(new)} and shapes "
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
