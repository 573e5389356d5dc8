"""The policy's replay (``train.policy_replay``): the manager's PPO step also trains on
decisions of earlier updates, decoupled (clipped against the learner's policy, weighted by
it ÷ the behaviour that chose)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gyre_ma import batch as B
from gyre_ma.config import load_config, parse_config
from gyre_ma.loop import Gyre

ROOT = Path(__file__).resolve().parents[3]


def _key(mb: B.Batch, i: int) -> tuple:
    return mb[B.FEATURES][i].numpy().tobytes(), int(mb[B.AGENT][i]), int(mb[B.OPTION][i])


def _decided(batch: B.Batch) -> B.Batch:
    choices = batch[B.MASK].sum(-1) > 1
    return {k: v[choices] for k, v in batch.items()}


def _two_updates(tmp_path, replay: int) -> tuple[Gyre, list[B.Batch], list[list[B.Batch]]]:
    """Two iterations' batches, each fitted; the minibatches each fit's PPO step saw."""
    cfg = parse_config({"env": {"id": "coverage_v0"}, "run_root": str(tmp_path), "roles": {"evaluators": 0},
                        "train": {"policy_replay": replay}})
    gyre = Gyre(cfg)
    seen: list[list[B.Batch]] = []
    step = gyre.learner.manager_module.module.training_step
    gyre.learner.manager_module.module.training_step = lambda mb, i=0: seen[-1].append(dict(mb)) or step(mb, i)
    batches = []
    for iteration in range(2):
        trajectories, _ = gyre.rollout(iteration)
        gyre.arbitrate(trajectories)
        batches.append(gyre.batch(trajectories))
        seen.append([])
        gyre.learner.fit(batches[-1], trajectories)
    return gyre, batches, seen


def test_the_second_update_trains_on_the_first_ones_decisions_as_they_were_chosen(tmp_path):
    gyre, batches, seen = _two_updates(tmp_path, replay=10_000)
    try:
        first, second = (_decided(b) for b in batches)
        epoch = seen[1][0]  # one minibatch holds both iterations' decisions (fewer than 256)
        assert len(epoch[B.OPTION]) == len(first[B.OPTION]) + len(second[B.OPTION])
        # every decision of both, each with the log-probability of the policy that chose it (a
        # group's episodes share their first state, so a row is its key and that log-probability)
        def rows(mb: B.Batch) -> list[tuple]:
            return sorted((*_key(mb, i), float(mb[B.LOG_PROB][i]), float(mb[B.ADVANTAGE][i]))
                          for i in range(len(mb[B.OPTION])))

        assert rows(epoch) == sorted(rows(first) + rows(second))
        assert B.PROXIMAL_LOG_PROB in epoch  # replayed rows need the decoupled step, so every row gets it
        assert len(seen[0][0][B.OPTION]) == len(first[B.OPTION])  # nothing to replay at the first update
    finally:
        gyre.close()


def test_the_replay_keeps_the_newest_decisions_and_travels_in_the_checkpoint(tmp_path):
    gyre, batches, seen = _two_updates(tmp_path, replay=10)
    try:
        second = _decided(batches[1])
        assert len(seen[1][0][B.OPTION]) == 10 + len(second[B.OPTION])
        kept = gyre.learner.policy_replay.rows
        assert len(kept[B.OPTION]) == 10
        assert {_key(kept, i) for i in range(10)} <= {_key(second, i) for i in range(len(second[B.OPTION]))}
        state = gyre.learner.state_dict()
        assert torch.equal(state["policy_replay"]["rows"][B.OPTION], kept[B.OPTION])
        gyre.learner.policy_replay.rows = {}
        gyre.learner.load_state_dict(state)
        assert torch.equal(gyre.learner.policy_replay.rows[B.ADVANTAGE], kept[B.ADVANTAGE])
    finally:
        gyre.close()


def test_the_llm_manager_has_no_features_to_replay():
    with pytest.raises(ValueError, match=r"`train.policy_replay` is 64.*set it to 0"):
        load_config(ROOT / "configs" / "llm_quickstart.yaml", {"train.policy_replay": 64})
