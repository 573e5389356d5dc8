"""The tail average of the manager's weights: the mean it computes, and the policy a run ends with."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from gyre_ma.config import load_config
from gyre_ma.loop import Gyre
from gyre_ma.trainers.averaging import TailAverage

DOORKEY = Path(__file__).resolve().parents[3] / "configs" / "minigrid_doorkey.yaml"


class WithCounter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 2)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))


def test_the_average_is_the_mean_of_the_weights_added_and_integer_buffers_are_kept():
    module, average = WithCounter(), TailAverage()
    seen = []
    for k in range(3):
        with torch.no_grad():
            module.linear.weight.add_(float(k) + 0.125)
            module.steps.add_(1)
        seen.append(module.linear.weight.detach().clone())
        average.add(module)
    copy = TailAverage()
    copy.load_state_dict(average.state_dict())  # what a checkpoint holds
    copy.load_into(module)
    assert torch.allclose(module.linear.weight, torch.stack(seen).mean(0), atol=1e-7)
    assert int(module.steps) == 3  # a counter is not averaged
    average.restart()
    with pytest.raises(ValueError, match="no weights yet"):
        average.load_into(module)


def test_averaging_over_another_module_is_refused_naming_the_weights():
    average = TailAverage()
    average.add(nn.Linear(3, 2))
    with pytest.raises(ValueError, match="lacks the module's weights"):
        average.load_into(WithCounter())


def run(iterations: int, average_last: float) -> tuple[Gyre, list[dict[str, torch.Tensor]], list[dict]]:
    config = load_config(DOORKEY, {"train.iterations": iterations, "train.average_last": average_last})
    gyre = Gyre(config)
    weights, history = [], []
    for i in range(iterations):
        history.append(gyre.iteration(i))
        weights.append({k: v.clone() for k, v in gyre.policy.state_dict().items()})
    return gyre, weights, history


def test_a_run_ends_with_the_mean_of_its_last_updates_and_trains_as_without_it():
    iterations = 4
    _, plain, plain_history = run(iterations, 0.0)
    averaged, weights, history = run(iterations, 0.5)
    assert averaged.config.train.average_start == 2
    # averaging touches only the policy the run ends with: training is the same run
    for i in range(iterations - 1):
        for key, value in plain[i].items():
            assert torch.equal(weights[i][key], value), f"iteration {i}: {key} differs"
    versions = [h["policy_version"] for h in plain_history]
    assert [h["policy_version"] for h in history] == versions[:-1] + [versions[-1] + 1]  # the mean is a version
    assert [h.get("averaged_updates") for h in history] == [None, None, 1.0, 2.0]
    for key, value in weights[-1].items():
        if value.is_floating_point():
            expected = (plain[2][key].double() + plain[3][key].double()) / 2
            assert torch.allclose(value.double(), expected, atol=1e-6), key
    assert any(not torch.equal(weights[-1][k], plain[-1][k]) for k in plain[-1])  # the updates moved it


def test_average_last_zero_keeps_the_last_updates_weights():
    gyre, _, history = run(2, 0.0)
    assert gyre.average is None and gyre.config.train.average_start == 2
    assert all("averaged_updates" not in h for h in history)
    # one policy version an update and none more: the run ends on its last update's weights
    assert [h["policy_version"] for h in history] == [1, 2] and gyre.version == 2
