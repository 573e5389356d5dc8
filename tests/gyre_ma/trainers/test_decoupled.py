"""Decoupled PPO (``train.proximal: learner``): the ratio is clipped against the learner's
policy before the update, each row weighted by learner ÷ behaviour probability."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch

from gyre_ma import batch as B
from gyre_ma.agents.manager import ManagerPolicy
from gyre_ma.config import parse_config
from gyre_ma.loop import Gyre
from gyre_ma.trainers.losses import clipped_surrogate
from gyre_ma.trainers.manager import ManagerModule


def test_the_weight_scales_each_rows_clipped_term():
    log_prob = torch.log(torch.tensor([0.5, 0.5, 0.5]))
    old = torch.log(torch.tensor([0.25, 0.5, 1.0]))  # ratios 2, 1, 0.5
    advantage = torch.tensor([1.0, -2.0, -1.0])
    # min(r·A, clip(r)·A): 1.2, -2, -0.8 (the clipped term where it is lower)
    assert clipped_surrogate(log_prob=log_prob, old_log_prob=old, advantage=advantage, clip=0.2).item() == \
        pytest.approx(-(1.2 - 2.0 - 0.8) / 3)
    weight = torch.tensor([0.5, 1.0, 2.0])
    assert clipped_surrogate(log_prob=log_prob, old_log_prob=old, advantage=advantage, clip=0.2,
                             weight=weight).item() == pytest.approx(-(0.6 - 2.0 - 1.6) / 3)


def _module(importance_cap: float = 1.0) -> ManagerModule:
    torch.manual_seed(0)
    policy = ManagerPolicy(4, 3, 1, hidden=16)
    module = ManagerModule(policy, lr=1e-2, clip=0.2, entropy_coef=0.0, kl_coef=0.0, importance_cap=importance_cap)
    fabric = L.Fabric(accelerator="cpu", devices=1)
    wrapped, _ = fabric.setup(module, module.configure_optimizers())
    return wrapped


def _explorer_batch(policy: ManagerPolicy) -> B.Batch:
    """Rows an explorer chose with a third of the learner's probability, all of which paid off."""
    features = torch.rand(32, 4, generator=torch.Generator().manual_seed(1))
    agent = torch.zeros(32, dtype=torch.long)
    mask = torch.ones(32, 3, dtype=torch.bool)
    option = torch.arange(32) % 3
    with torch.no_grad():
        learner = torch.distributions.Categorical(logits=policy(features, agent, mask)).log_prob(option)
    advantage = torch.linspace(0.5, 2.0, 32)
    return {B.FEATURES: features, B.AGENT: agent, B.MASK: mask, B.OPTION: option, B.ADVANTAGE: advantage,
            B.LOG_PROB: learner - torch.log(torch.tensor(3.0)), B.PROXIMAL_LOG_PROB: learner}


def test_against_a_perturbed_behaviour_good_rows_get_no_gradient_and_bad_rows_three_times_theirs():
    # an explorer chose both rows with a third of the learner's probability: the behaviour
    # ratio starts at 3, past 1 + ε, so PPO clipped against the behaviour ignores the row that
    # paid off and pushes the one that did not down three times as hard; decoupled PPO starts
    # at ratio 1 and weighs both alike (the weight 3 capped at 1)
    learner = torch.log(torch.tensor([0.6, 0.6]))
    behaviour = learner - torch.log(torch.tensor(3.0))
    advantage = torch.tensor([1.0, -1.0])
    grads = {}
    for name, old, weight in (("coupled", behaviour, None), ("decoupled", learner, torch.ones(2))):
        log_prob = learner.clone().requires_grad_()
        clipped_surrogate(log_prob=log_prob, old_log_prob=old, advantage=advantage, clip=0.2, weight=weight).backward()
        grads[name] = log_prob.grad.tolist()
    assert grads["coupled"] == pytest.approx([0.0, 1.5])  # d(loss)/d(log π): minimising lowers the second
    assert grads["decoupled"] == pytest.approx([-0.5, 0.5])


def test_a_decoupled_step_starts_unclipped_and_raises_the_options_that_paid_off():
    module = _module()
    policy = module.module.policy
    batch = _explorer_batch(policy)
    coupled = _module()
    assert coupled.training_step({k: v for k, v in batch.items() if k != B.PROXIMAL_LOG_PROB})["clip_fraction"] == 1.0
    decoupled = module.training_step(batch)
    assert decoupled["clip_fraction"] == 0.0
    # KL(behaviour ‖ learner) by the k3 estimator at a ratio of 3: 3 − 1 − log 3
    assert decoupled["behaviour_kl"] == pytest.approx(2.0 - math.log(3.0))
    with torch.no_grad():
        after = torch.distributions.Categorical(
            logits=policy(batch[B.FEATURES], batch[B.AGENT], batch[B.MASK])).log_prob(batch[B.OPTION])
    # the advantages rise along the rows: the chosen options of the best ones gained
    assert float(after[-8:].sum()) > float(batch[B.PROXIMAL_LOG_PROB][-8:].sum())


@pytest.mark.parametrize("cap", [1.0, 2.0, 10.0])
def test_each_rows_weight_is_learner_over_behaviour_capped(monkeypatch, cap):
    from gyre_ma.trainers import manager

    module = _module(importance_cap=cap)
    batch = _explorer_batch(module.module.policy)
    batch[B.LOG_PROB] = batch[B.PROXIMAL_LOG_PROB] + torch.linspace(-2.0, 2.0, 32)  # weights e² .. e⁻²
    seen = {}
    monkeypatch.setattr(manager, "clipped_surrogate", lambda **kw: seen.update(kw) or clipped_surrogate(**kw))
    module.training_step(batch)
    expected = torch.exp(-torch.linspace(-2.0, 2.0, 32)).clamp(max=cap)
    assert torch.allclose(seen["weight"], expected, rtol=1e-5)
    assert torch.equal(seen["old_log_prob"], batch[B.PROXIMAL_LOG_PROB])


@pytest.mark.parametrize("proximal", ["behaviour", "learner"])
def test_the_learner_adds_the_proximal_log_probs_only_when_decoupled(tmp_path, proximal):
    cfg = parse_config({"env": {"id": "coverage_v0"}, "run_root": str(tmp_path), "roles": {"evaluators": 0},
                        "train": {"proximal": proximal}})
    gyre = Gyre(cfg)
    try:
        trajectories, _ = gyre.rollout(0)
        gyre.arbitrate(trajectories)
        batch = gyre.batch(trajectories)
        seen = []
        step = gyre.learner.manager_module.module.training_step
        gyre.learner.manager_module.module.training_step = lambda mb, i=0: seen.append(dict(mb)) or step(mb, i)
        choices = batch[B.MASK].sum(-1) > 1
        decided = {k: v[choices] for k, v in batch.items()}
        with torch.no_grad():
            expected = torch.distributions.Categorical(logits=gyre.policy.batch_logits(decided)).log_prob(
                decided[B.OPTION])
        metrics = gyre.learner.fit(batch, trajectories)
        first = seen[0]
        assert (B.PROXIMAL_LOG_PROB in first) == (proximal == "learner")
        assert ("behaviour_kl" in metrics) == (proximal == "learner")
        if proximal == "learner":
            # the policy before the update, row for row (the first minibatch is a shuffle of them)
            def key(mb: B.Batch, i: int) -> tuple:
                return mb[B.FEATURES][i].numpy().tobytes(), int(mb[B.AGENT][i]), int(mb[B.OPTION][i])

            rows = {key(decided, i): float(p) for i, p in enumerate(expected)}
            for i, p in enumerate(first[B.PROXIMAL_LOG_PROB]):
                assert float(p) == pytest.approx(rows[key(first, i)], abs=1e-5)
    finally:
        gyre.close()
