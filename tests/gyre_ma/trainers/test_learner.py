"""Learner: decisions with one eligible option take no part in the policy update."""

from __future__ import annotations

import torch

from gyre_ma import batch as B
from gyre_ma.config import parse_config
from gyre_ma.loop import Gyre


def test_forced_decisions_leave_the_policy_update_unchanged(tmp_path):
    # coverage_v0: an agent that claimed a landmark can only stay, so most calls are forced
    cfg = parse_config({"env": {"id": "coverage_v0"}, "run_root": str(tmp_path), "roles": {"evaluators": 0}})
    learners = [Gyre(cfg), Gyre(cfg)]
    try:
        trajectories, _ = learners[0].rollout(0)
        learners[0].arbitrate(trajectories)
        batch = learners[0].batch(trajectories)
        choices = batch[B.MASK].sum(-1) > 1
        assert 0 < int(choices.sum()) < len(choices)
        metrics = learners[0].learner.fit(batch, trajectories)
        assert metrics["forced_decisions"] == 1.0 - choices.float().mean().item()
        learners[1].learner.fit({k: v[choices] for k, v in batch.items()}, trajectories)
        for (name, a), b in zip(learners[0].policy.state_dict().items(), learners[1].policy.state_dict().values(),
                                strict=True):
            assert torch.equal(a, b), name
        assert learners[0].policy.state_dict() != {}
    finally:
        for gyre in learners:
            gyre.close()
