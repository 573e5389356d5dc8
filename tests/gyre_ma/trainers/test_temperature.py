"""The manager policy's temperature schedule (``train.temperature_final``): the logits it
scales, the weights it travels with, and the policy a run samples at each iteration."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from gyre_ma.agents.manager import ManagerPolicy
from gyre_ma.checkpoints import ValidationDecision
from gyre_ma.config import TrainConfig, load_config
from gyre_ma.loop import Gyre
from gyre_ma.roles import evaluation_tasks

ROOT = Path(__file__).resolve().parents[3]
DOORKEY = ROOT / "configs" / "minigrid_doorkey.yaml"


def test_the_temperature_runs_linearly_from_one_to_its_final_value():
    t = TrainConfig(iterations=5, temperature_final=0.5)
    assert [t.temperature_at(i) for i in range(5)] == pytest.approx([1.0, 0.875, 0.75, 0.625, 0.5])
    assert t.temperature_at(9) == pytest.approx(0.5)  # a resumed run past its budget stays at the end
    assert {TrainConfig(iterations=5).temperature_at(i) for i in range(5)} == {1.0}  # the default: none
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="temperature_final"):
            TrainConfig(temperature_final=bad)


def test_a_policys_logits_are_divided_by_its_temperature_and_old_weights_sample_at_one():
    torch.manual_seed(0)
    policy = ManagerPolicy(6, 4, 2, hidden=16)
    features, agent = torch.rand(5, 6), torch.tensor([0, 1, 0, 1, 0])
    mask = torch.ones(5, 4, dtype=torch.bool)
    mask[0, 1] = False
    with torch.no_grad():
        cold = policy(features, agent, mask)
        policy.set_temperature(0.5)
        hot = policy(features, agent, mask)
    assert torch.allclose(hot[mask], 2 * cold[mask])
    assert hot[0, 1] == torch.finfo(hot.dtype).min  # an ineligible option stays impossible
    with pytest.raises(ValueError, match="temperature must be > 0"):
        policy.set_temperature(0.0)
    saved = policy.state_dict()
    assert float(saved["inverse_temperature"]) == 2.0  # it travels with the weights
    old = {k: v for k, v in saved.items() if k != "inverse_temperature"}  # saved before the temperature existed
    policy.load_state_dict(old)
    assert float(policy.inverse_temperature) == 1.0


@pytest.mark.parametrize("average_last", [0.0, 0.67])  # 0.67: iterations 1 and 2 averaged
def test_each_iteration_samples_at_its_temperature_and_the_run_ends_at_the_final_one(average_last):
    """The learner sets the temperature before an iteration's rollouts; the workers' copy of
    the policy samples at it, and the policy a run ends with (a tail average's too) holds
    the last iteration's temperature, in the checkpoint as well."""
    config = load_config(DOORKEY, {"train.iterations": 3, "train.temperature_final": 0.5,
                                   "train.average_last": average_last})
    gyre = Gyre(config)
    worker = gyre.backend.worker.kit.policy  # the local backend's rollout copy
    assert worker is not gyre.policy
    seen = []
    for i in range(3):
        gyre.iteration(i)
        seen += [float(gyre.policy.inverse_temperature), float(worker.inverse_temperature)]
    assert seen == pytest.approx([1.0, 1.0, 1 / 0.75, 1 / 0.75, 2.0, 2.0])
    assert float(gyre.state_dict()["policy"]["inverse_temperature"]) == 2.0
    fresh = Gyre(config)
    fresh.load_state_dict(gyre.state_dict())
    assert float(fresh.policy.inverse_temperature) == 2.0


def test_the_llm_manager_has_no_temperature_schedule():
    with pytest.raises(ValueError, match="temperature_final"):
        load_config(ROOT / "configs" / "llm_quickstart.yaml", {"train.temperature_final": 0.5})


def test_a_temperature_change_without_an_update_or_after_a_rollback_reaches_the_workers(tmp_path):
    """Workers load a version's weights once: when the temperature changes but no update
    moved the version on (an update skipped), the version moves on by itself; weights
    restored by a rollback, saved at an earlier temperature, get this iteration's."""
    gyre = Gyre(load_config(DOORKEY, {"train.iterations": 3, "train.temperature_final": 0.5}), tmp_path / "run")
    gyre._temper(0)
    early, version = copy.deepcopy(gyre.state_dict()), gyre.version
    gyre._temper(0)  # the same temperature: nothing to reload
    assert gyre.version == version
    gyre._temper(1)  # no update since: the workers would keep the old temperature
    assert gyre.version == version + 1 and float(gyre.policy.inverse_temperature) == pytest.approx(1 / 0.75)
    gyre.next_iteration = 2
    gyre._restore(ValidationDecision("rollback", 0.0, 1.0, 0.5, state=early))
    assert float(early["policy"]["inverse_temperature"]) == 1.0
    assert float(gyre.policy.inverse_temperature) == pytest.approx(2.0)
    worker = gyre.backend.worker.kit
    gyre.backend.collect(gyre.weights(), gyre.version, evaluation_tasks([5], greedy=False))
    assert float(worker.policy.inverse_temperature) == pytest.approx(2.0)


def test_the_default_temperature_leaves_versions_as_they_were():
    gyre = Gyre(load_config(DOORKEY, {"train.iterations": 3}))
    for i in range(3):
        gyre._temper(i)
    assert gyre.version == 0 and float(gyre.policy.inverse_temperature) == 1.0
