from __future__ import annotations

import pytest
import torch
from lightning.fabric import is_wrapped

from gyre_ma import batch as B
from gyre_ma.agents.manager import Critic
from gyre_ma.config import TrainerConfig, parse_config
from gyre_ma.rewards.prm import ProcessRewardModel
from gyre_ma.trainers.critic import CriticModule
from gyre_ma.trainers.fit import Fitter
from gyre_ma.trainers.losses import value_loss
from gyre_ma.trainers.prm import PRMModule


def critic_batch(n: int, seed: int = 0) -> B.Batch:
    g = torch.Generator().manual_seed(seed)
    return {B.FEATURES: torch.randn(n, 5, generator=g), B.AGENT: torch.randint(0, 2, (n,), generator=g),
            B.OPTION: torch.zeros(n, dtype=torch.long), B.RETURN: torch.randn(n, generator=g)}


def prm_batch(n: int, seed: int = 0) -> B.Batch:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    return {B.FEATURES: x, B.OPTION: torch.randint(0, 3, (n,), generator=g),
            B.PROGRESS: (x[:, 0] > 0).float(), B.SUCCESS: (x[:, 1] > 0).float()}


def test_the_trained_module_and_optimizer_are_the_ones_fabric_set_up(monkeypatch):
    fitter = Fitter()
    model = ProcessRewardModel(6, 3, hidden=16)
    inner = PRMModule(model, lr=1e-2)
    module = fitter.setup(inner)
    assert is_wrapped(module) and module.module is inner
    optimizer = module.optimizers()
    assert is_wrapped(optimizer) and optimizer is inner.optimizers()
    backward = []
    fabric_backward = fitter.fabric.backward
    monkeypatch.setattr(fitter.fabric, "backward", lambda loss, *a, **k: (backward.append(loss),
                                                                           fabric_backward(loss, *a, **k)))
    before = [p.clone() for p in model.parameters()]
    metrics = fitter.fit(module, prm_batch(64), epochs=2, minibatch_size=16, generator=torch.Generator())
    assert len(backward) == 8 and metrics["prm_skipped"] == 0.0  # manual_backward is fabric.backward
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(TypeError, match="expected a module returned by Fitter.setup, got PRMModule"):
        fitter.fit(inner, prm_batch(8), epochs=1, minibatch_size=8, generator=torch.Generator())


def test_on_the_cpu_in_float32_fabric_updates_like_a_plain_torch_loop_bit_for_bit():
    torch.manual_seed(0)
    critic, plain = Critic(5, 2), Critic(5, 2)
    plain.load_state_dict(critic.state_dict())
    fitter = Fitter()
    module = fitter.setup(CriticModule(critic, lr=1e-2, max_grad_norm=0.1))
    batch = critic_batch(96)
    fitter.fit(module, batch, epochs=3, minibatch_size=32, generator=torch.Generator().manual_seed(1))
    opt = torch.optim.Adam(plain.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        for mb in B.minibatches(batch, 32, g):
            loss = value_loss(value=plain(mb[B.FEATURES], mb[B.AGENT]), target=mb[B.RETURN])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(plain.parameters(), 0.1)
            opt.step()
    for key, value in plain.state_dict().items():
        assert torch.equal(critic.state_dict()[key], value), key


@pytest.mark.parametrize(("precision", "weights", "activations"), [
    ("32-true", torch.float32, torch.float32),
    ("64-true", torch.float64, torch.float64),
    ("bf16-mixed", torch.float32, torch.bfloat16),
])
def test_the_configured_precision_sets_the_dtypes_the_update_runs_in(precision, weights, activations):
    config = parse_config({"trainer": {"precision": precision}})
    fitter = Fitter.from_config(config.trainer)
    model = ProcessRewardModel(6, 3, hidden=16)
    module = fitter.setup(PRMModule(model, lr=1e-3))
    seen: list[torch.dtype] = []
    model.net[0].register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    metrics = fitter.fit(module, prm_batch(32), epochs=1, minibatch_size=16, generator=torch.Generator())
    assert seen == [activations, activations] and metrics["prm_skipped"] == 0.0
    assert {p.dtype for p in model.parameters()} == {weights}
    assert fitter.to_learner(prm_batch(4))[B.FEATURES].dtype == (torch.float64 if precision == "64-true"
                                                                 else torch.float32)


def test_threads_are_set_for_the_learner_and_a_missing_accelerator_is_a_value_error():
    before = torch.get_num_threads()
    try:
        Fitter.from_config(TrainerConfig(threads=1))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    Fitter.from_config(TrainerConfig())
    assert torch.get_num_threads() == before  # None leaves torch's setting
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"trainer \(accelerator='cuda'.*not available"):
            Fitter(accelerator="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_learner_trains_on_the_gpu_from_cpu_batches():
    fitter = Fitter.from_config(TrainerConfig(accelerator="cuda"))
    model = ProcessRewardModel(6, 3, hidden=16)
    module = fitter.setup(PRMModule(model, lr=1e-2))
    assert next(model.parameters()).device.type == "cuda"
    metrics = fitter.fit(module, prm_batch(64), epochs=2, minibatch_size=16, generator=torch.Generator())
    assert metrics["prm_skipped"] == 0.0 and torch.isfinite(torch.tensor(metrics["prm_loss"]))
