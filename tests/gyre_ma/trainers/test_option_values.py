"""The option-value head (``train.option_value_coef``): an auxiliary Q(s, ·) on the manager's
body, regressed on each decision's return at the option it chose, never read when acting."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gyre_ma import batch as B
from gyre_ma.agents.manager import ManagerPolicy
from gyre_ma.agents.noise import RowwiseForward
from gyre_ma.config import load_config, parse_config
from gyre_ma.loop import Gyre

ROOT = Path(__file__).resolve().parents[3]


def test_the_head_exists_only_when_its_weight_is_positive_and_acting_never_reads_it():
    torch.manual_seed(0)
    plain = ManagerPolicy(5, 4, 2, hidden=16)
    torch.manual_seed(0)
    with_head = ManagerPolicy(5, 4, 2, hidden=16, option_values=True)
    assert plain.option_value_head is None and "option_value_head.weight" not in plain.state_dict()
    features, agent = torch.rand(6, 5), torch.tensor([0, 1, 0, 1, 0, 1])
    mask = torch.ones(6, 4, dtype=torch.bool)
    mask[0, 2] = False
    # the same body and head (built first, from the same draws): the same logits, and the
    # row-by-row forward that rollouts use gives them too
    expected = plain(features, agent, mask)
    assert torch.equal(with_head(features, agent, mask), expected)
    assert torch.allclose(RowwiseForward(with_head)(features, agent).masked_fill(~mask, expected.min()), expected,
                          atol=1e-6)
    logits, values = with_head.batch_logits_and_option_values({"features": features, "agent": agent, "mask": mask})
    assert torch.equal(logits, expected) and values.shape == (6, 4)
    with pytest.raises(ValueError, match="no option-value head"):
        plain.batch_logits_and_option_values({"features": features, "agent": agent, "mask": mask})


def _gyre(tmp_path, coef: float) -> Gyre:
    return Gyre(parse_config({"env": {"id": "coverage_v0"}, "run_root": str(tmp_path), "roles": {"evaluators": 0},
                              "train": {"option_value_coef": coef}}))


def test_an_update_fits_the_chosen_options_value_to_the_decisions_return(tmp_path):
    gyre = _gyre(tmp_path, 1.0)
    try:
        trajectories, _ = gyre.rollout(0)
        gyre.arbitrate(trajectories)
        batch = gyre.batch(trajectories)
        batch = {k: v[batch[B.MASK].sum(-1) > 1] for k, v in batch.items()}

        def error() -> float:
            with torch.no_grad():
                _, q = gyre.policy.batch_logits_and_option_values(batch)
            chosen = q.gather(1, batch[B.OPTION].unsqueeze(1)).squeeze(1)
            return float((chosen - batch[B.RETURN]).pow(2).mean())

        before = error()
        losses = [gyre.learner.fit(batch, trajectories)["option_value_loss"] for _ in range(15)]
        assert error() < 0.5 * before
        assert losses[-1] < losses[0]
    finally:
        gyre.close()


def test_without_the_head_the_update_is_as_before(tmp_path):
    # coefficient 0 builds no head: no extra parameters, no extra metric
    gyre = _gyre(tmp_path, 0.0)
    try:
        assert gyre.policy.option_value_head is None
        trajectories, _ = gyre.rollout(0)
        gyre.arbitrate(trajectories)
        assert "option_value_loss" not in gyre.learner.fit(gyre.batch(trajectories), trajectories)
    finally:
        gyre.close()


def test_the_llm_manager_refuses_the_head():
    with pytest.raises(ValueError, match="option_value_coef"):
        load_config(ROOT / "configs" / "llm_quickstart.yaml", {"train.option_value_coef": 1.0})
