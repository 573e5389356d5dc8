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

_ADDED = "__added__"
"""The ring's own column: which :meth:`RowReplay.add` brought each row (1 for the first)."""


class RowReplay:
    """The last ``capacity`` rows of the batches added, their ``keys`` only, as tensors (a
    ring, oldest overwritten; the rows are in ring order, not in the order they came).
    ``updates``, where given, also bounds their age: :meth:`recent` holds only the rows of
    the last ``updates`` batches added."""

    def __init__(self, capacity: int, keys: tuple[str, ...], updates: int | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        if updates is not None and updates < 1:
            raise ValueError(f"replay updates must be >= 1 (or None: no age bound), got {updates}")
        self.capacity = capacity
        self.keys = keys
        self.updates = updates
        self._ring: B.Batch = {}
        self.next = 0
        """Where the next row goes once the ring is full."""
        self.added = 0
        """Batches added so far."""

    def __len__(self) -> int:
        return int(self._ring[_ADDED].shape[0]) if self._ring else 0

    @property
    def rows(self) -> B.Batch:
        """Every row the ring holds, in ring order."""
        return {k: v for k, v in self._ring.items() if k != _ADDED}

    def recent(self) -> B.Batch:
        """The rows of the last ``updates`` batches added (all of them where ``updates`` is
        None), in ring order."""
        if self.updates is None or not self._ring:
            return self.rows
        keep = self._ring[_ADDED] > self.added - self.updates
        if bool(keep.all()):
            return self.rows
        return {k: v[keep] for k, v in self._ring.items() if k != _ADDED}

    def add(self, batch: B.Batch) -> None:
        new = {k: v.detach().cpu() for k, v in batch.items() if k in self.keys}
        n = int(new[B.RETURN].shape[0])
        if n == 0:
            return
        self.added += 1
        new[_ADDED] = torch.full((n,), self.added, dtype=torch.long)
        if n >= self.capacity:
            self._ring = {k: v[-self.capacity:].clone() for k, v in new.items()}
            self.next = 0
            return
        if not self._ring:
            self._ring = {k: v.clone() for k, v in new.items()}
            return
        ring = self._ring
        if set(new) != set(ring) or any(new[k].shape[1:] != ring[k].shape[1:] for k in new):
            shapes = {k: tuple(v.shape[1:]) for k, v in new.items() if k != _ADDED}
            stored = {k: tuple(v.shape[1:]) for k, v in ring.items() if k != _ADDED}
            raise ValueError(f"replay: a batch with keys {sorted(shapes)} and shapes {shapes} does not match the "
                             f"stored rows' {stored}")
        room = self.capacity - len(self)
        if room > 0:
            take = min(room, n)
            self._ring = {k: torch.cat([v, new[k][:take]]) for k, v in ring.items()}
            new = {k: v[take:] for k, v in new.items()}
            n -= take
        if n:
            at = (self.next + torch.arange(n)) % self.capacity
            for k, v in self._ring.items():
                v[at] = new[k]
            self.next = int((self.next + n) % self.capacity)

    def state_dict(self) -> dict[str, Any]:
        return {"rows": {k: v.clone() for k, v in self.rows.items()}, "next": self.next,
                "added": self.added, "row_added": self._ring[_ADDED].clone() if self._ring else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; a state saved before rows kept their age (session 42)
        counts them all as the newest batch's."""
        rows = {k: v.clone() for k, v in state["rows"].items()}
        self.next = int(state["next"])
        self.added = int(state.get("added", 0))
        if rows:
            stamp = state.get("row_added")
            n = int(next(iter(rows.values())).shape[0])
            rows[_ADDED] = stamp.clone() if stamp is not None else torch.full((n,), self.added, dtype=torch.long)
        self._ring = rows
