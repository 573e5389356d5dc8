"""Learner: decisions with one eligible option take no part in the policy update; the critic's warm start."""

from __future__ import annotations

import pytest
import torch

from gyre_ma import batch as B
from gyre_ma.config import parse_config
from gyre_ma.loop import Gyre
from gyre_ma.training_batch import warm_start_value


@pytest.mark.parametrize("imitation", [0.0, None])
def test_forced_decisions_leave_the_policy_update_unchanged(tmp_path, imitation):
    """With self-imitation on (the default, None) the forced rows still take no part in it:
    the replay keeps the same decisions. The critic fits on every row, and its minibatch
    shuffles draw from the learner's generator, which the imitation's draw then continues,
    so with imitation on only the replay is compared, not the weights."""
    # coverage_v0: an agent that claimed a landmark can only stay, so most calls are forced
    cfg = parse_config({"env": {"id": "coverage_v0"}, "run_root": str(tmp_path), "roles": {"evaluators": 0},
                        "train": {"self_imitation": imitation}})
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
        if imitation is None:
            replays = [g.learner.replay.rows for g in learners]
            assert len(learners[0].learner.replay) == int(choices.sum())
            assert all(torch.equal(v, replays[1][k]) for k, v in replays[0].items())
            return
        for (name, a), b in zip(learners[0].policy.state_dict().items(), learners[1].policy.state_dict().values(),
                                strict=True):
            assert torch.equal(a, b), name
        assert learners[0].policy.state_dict() != {}
    finally:
        for gyre in learners:
            gyre.close()


def test_the_critic_starts_at_the_mean_return_of_its_first_batch(tmp_path):
    # coverage_v0's episodes last ~6 steps against 1 / (1 − γ) = 100: the old start, the mean
    # reward per agent and step "earned forever", put the critic at ~20 where returns are ~1,
    # and every advantage after it was large and negative for hundreds of iterations
    cfg = parse_config({"env": {"id": "coverage_v0"}, "run_root": str(tmp_path), "roles": {"evaluators": 0}})
    gyre = Gyre(cfg)
    try:
        trajectories, _ = gyre.rollout(0)
        gyre.arbitrate(trajectories)
        batch = gyre.batch(trajectories)
        assert not gyre.learner.critic_initialised
        gyre.learner.fit(batch, trajectories)
        assert gyre.learner.critic_initialised
        with torch.no_grad():
            values = gyre.critic(batch[B.FEATURES], batch[B.AGENT])
        returns = batch[B.RETURN]
        assert float(returns.abs().max()) < 5.0  # the premise: returns of order 1
        # started at their mean and fitted to them once: the values are centred on the returns
        assert abs(float(values.mean() - returns.mean())) < 0.25 * float(returns.std()) + 0.05
    finally:
        gyre.close()


def test_the_warm_start_value_is_the_mean_return():
    assert warm_start_value(torch.tensor([0.0, 1.0, 2.0, 5.0])) == 2.0
    with pytest.raises(ValueError, match="at least one row"):
        warm_start_value(torch.tensor([]))
