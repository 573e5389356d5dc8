from __future__ import annotations

import math

import pytest
import torch

from gyre_ma import batch as B
from gyre_ma.agents.baselines import RandomManager
from gyre_ma.envs.workflow.options import make_library
from gyre_ma.envs.workflow.oracle import OracleManager
from gyre_ma.envs.workflow.workflow import parallel_env
from gyre_ma.rewards.drift import auc
from gyre_ma.rewards.milestones import first_verified
from gyre_ma.rewards.prm import PRMConfig, ProcessRewardModel, prm_labels, prm_rewards
from gyre_ma.rollout import run_episode
from gyre_ma.trainers.fit import Fitter
from gyre_ma.trainers.prm import PRMModule


def synthetic(n: int, seed: int) -> B.Batch:
    """progress ⇔ feature 0 > 0; success ⇔ option 1 was chosen."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    option = torch.randint(0, 3, (n,), generator=g)
    return {B.FEATURES: x, B.OPTION: option, B.PROGRESS: (x[:, 0] > 0).float(),
            B.SUCCESS: (option == 1).float()}


def test_labels_come_from_verified_milestones_and_outcome():
    env, lib = parallel_env(), make_library()
    for manager, seed in ((OracleManager(library=lib), 0), (RandomManager(seed=3), 3)):
        traj = run_episode(env, lib, manager, seed=seed)
        progress, success = prm_labels(traj)
        assert progress.tolist() == [float(bool(m)) for m in first_verified(traj)]
        assert success.tolist() == [float(traj.success)] * len(traj.calls)
    assert traj.success is False and progress.sum() > 0  # a failed episode still labels the calls that made progress


def test_online_training_through_fabric_learns_both_heads():
    torch.manual_seed(0)
    model = ProcessRewardModel(6, 3, hidden=32)
    fitter = Fitter()
    module = fitter.setup(PRMModule(model, lr=3e-3))
    test = synthetic(512, seed=1)
    before = auc(scores=model.probabilities(test[B.FEATURES], test[B.OPTION])[:, 0], labels=test[B.PROGRESS])
    losses = []
    for it in range(8):  # a few "iterations" of online data
        m = fitter.fit(module, synthetic(256, seed=10 + it), epochs=3, minibatch_size=64,
                       generator=torch.Generator().manual_seed(it))
        losses.append(m["prm_loss"])
    assert losses[-1] < 0.5 * losses[0]
    probs = model.probabilities(test[B.FEATURES], test[B.OPTION])
    assert auc(scores=probs[:, 0], labels=test[B.PROGRESS]) > max(0.9, before)
    assert auc(scores=probs[:, 1], labels=test[B.SUCCESS]) > 0.95
    score = model.score(test[B.FEATURES], test[B.OPTION])
    assert torch.allclose(score, probs.mean(-1))


def test_a_non_finite_batch_skips_the_step():
    model = ProcessRewardModel(6, 3)
    module = Fitter().setup(PRMModule(model, lr=1e-3))
    batch = synthetic(8, 0)
    batch[B.FEATURES][0, 0] = math.nan
    before = [p.clone() for p in model.parameters()]
    assert module.training_step(batch)["prm_skipped"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_prm_rewards_rank_calls_without_adding_net_reward():
    scores = torch.tensor([0.9, 0.1, 0.5, 0.5])
    r = prm_rewards(scores, weight=0.2)
    assert r.sum().abs() < 1e-6 and r.abs().max() <= 0.2
    assert r.argmax() == 0 and r.argmin() == 1
    assert torch.equal(prm_rewards(scores, weight=0.0), torch.zeros(4))
    with pytest.raises(ValueError, match=r"scores must have shape \[N\]"):
        prm_rewards(scores[None], weight=0.1)


def test_shape_contract_and_config():
    model = ProcessRewardModel(6, 3)
    with pytest.raises(ValueError, match=r"expected features \[N, F\] and option \[N\]"):
        model(torch.zeros(4, 6), torch.zeros(3, dtype=torch.long))
    assert PRMConfig().holdout_fraction == 0.25
    with pytest.raises(ValueError):
        PRMConfig(holdout_fraction=1.0)
