"""The policy's replay (``train.policy_replay``): the manager's PPO step also trains on
decisions of earlier updates, decoupled (clipped against the learner's policy, weighted by
it ÷ the behaviour that chose)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gyre_ma import batch as B
from gyre_ma.config import load_config, parse_config
from gyre_ma.loop import Gyre

ROOT = Path(__file__).resolve().parents[3]


def _key(mb: B.Batch, i: int) -> tuple:
    return mb[B.FEATURES][i].numpy().tobytes(), int(mb[B.AGENT][i]), int(mb[B.OPTION][i])


def _decided(batch: B.Batch) -> B.Batch:
    choices = batch[B.MASK].sum(-1) > 1
    return {k: v[choices] for k, v in batch.items()}


def _updates(tmp_path, replay: int, n: int, **train) -> tuple[Gyre, list[B.Batch], list[list[B.Batch]]]:
    """``n`` iterations' batches, each fitted; the minibatches each fit's PPO step saw."""
    cfg = parse_config({"env": {"id": "coverage_v0"}, "run_root": str(tmp_path), "roles": {"evaluators": 0},
                        "train": {"policy_replay": replay, **train}})
    gyre = Gyre(cfg)
    seen: list[list[B.Batch]] = []
    step = gyre.learner.manager_module.module.training_step
    gyre.learner.manager_module.module.training_step = lambda mb, i=0: seen[-1].append(dict(mb)) or step(mb, i)
    batches = []
    for iteration in range(n):
        trajectories, _ = gyre.rollout(iteration)
        gyre.arbitrate(trajectories)
        batches.append(gyre.batch(trajectories))
        seen.append([])
        gyre.learner.fit(batches[-1], trajectories)
    return gyre, batches, seen


def _rows(mb: B.Batch) -> list[tuple]:
    """Each decision as its key, behaviour log-probability and advantage (a group's episodes
    share their first state, so the key alone does not tell two decisions apart)."""
    return sorted((*_key(mb, i), float(mb[B.LOG_PROB][i]), float(mb[B.ADVANTAGE][i]))
                  for i in range(len(mb[B.OPTION])))


def test_the_next_update_trains_on_the_last_ones_decisions_as_they_were_chosen(tmp_path):
    gyre, batches, seen = _updates(tmp_path, replay=1, n=3)
    try:
        first, second, third = (_decided(b) for b in batches)
        assert _rows(seen[0][0]) == _rows(first)  # nothing to replay at the first update
        assert _rows(seen[1][0]) == sorted(_rows(first) + _rows(second))  # one minibatch holds both (< 256)
        assert _rows(seen[2][0]) == sorted(_rows(second) + _rows(third))  # one update back only
        assert all(B.PROXIMAL_LOG_PROB in mb for fit in seen for mb in fit)  # replayed rows need the decoupled step
        state = gyre.learner.state_dict()
        assert _rows(state["policy_replay"][0]) == _rows(third)
        gyre.learner.policy_replay.clear()
        gyre.learner.load_state_dict(state)
        assert _rows(gyre.learner.policy_replay[0]) == _rows(third)
    finally:
        gyre.close()


def test_an_update_with_replayed_decisions_takes_as_many_steps_as_without(tmp_path):
    gyre, batches, seen = _updates(tmp_path, replay=3, n=3, minibatch_size=16, epochs=2)
    try:
        decided = [len(_decided(b)[B.OPTION]) for b in batches]
        for n, fit in zip(decided, seen, strict=True):
            assert len(fit) == 2 * math.ceil(n / 16)
        assert sum(len(mb[B.OPTION]) for mb in seen[2]) == 2 * sum(decided)  # two passes over all three batches
    finally:
        gyre.close()


def test_the_llm_manager_has_no_features_to_replay():
    with pytest.raises(ValueError, match=r"`train.policy_replay` is 64.*set it to 0"):
        load_config(ROOT / "configs" / "llm_quickstart.yaml", {"train.policy_replay": 64})
