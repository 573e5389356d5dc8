"""Samples/s of the Lightning manager update ÷ a plain torch loop, same model and loss.

Both paths run the same PPO minibatch step (clipped surrogate, entropy, KL, grad clip,
Adam) on the same synthetic batch, interleaved in rounds so machine noise hits both.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from gyre_ma import batch as B
from gyre_ma.agents.manager import ManagerPolicy
from gyre_ma.trainers.fit import Fitter
from gyre_ma.trainers.losses import approx_kl, clipped_surrogate
from gyre_ma.trainers.manager import ManagerModule

FEATURES, OPTIONS, AGENTS = 160, 24, 2


def synthetic_batch(n: int, seed: int = 0) -> B.Batch:
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(n, OPTIONS, generator=g) < 0.5
    mask[:, 0] = True
    option = torch.multinomial(mask.float(), 1, generator=g).squeeze(1)
    return {
        B.FEATURES: torch.randn(n, FEATURES, generator=g), B.AGENT: torch.randint(0, AGENTS, (n,), generator=g),
        B.MASK: mask, B.OPTION: option, B.LOG_PROB: torch.full((n,), -1.5),
        B.ADVANTAGE: torch.randn(n, generator=g),
    }


def plain_step(policy: ManagerPolicy, opt: torch.optim.Optimizer, mb: B.Batch, clip=0.2, ent=0.01, kl_coef=0.0):
    dist = policy.distribution(mb[B.FEATURES], mb[B.AGENT], mb[B.MASK])
    log_prob = dist.log_prob(mb[B.OPTION])
    adv = mb[B.ADVANTAGE]
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    surrogate = clipped_surrogate(log_prob=log_prob, old_log_prob=mb[B.LOG_PROB], advantage=adv, clip=clip)
    entropy = dist.entropy().mean()
    kl = approx_kl(log_prob=log_prob, old_log_prob=mb[B.LOG_PROB])
    loss = surrogate - ent * entropy + kl_coef * kl
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 0.5)
    opt.step()
    clip_frac = ((log_prob - mb[B.LOG_PROB]).exp().sub(1.0).abs() > clip).float().mean()
    return {"policy_loss": surrogate.item(), "entropy": entropy.item(), "kl": kl.item(),
            "clip_fraction": clip_frac.item(), "skipped": 0.0}


def measure(batch_size: int, steps: int, rounds: int) -> dict[str, float]:
    torch.manual_seed(0)
    data = synthetic_batch(batch_size * steps)
    minibatch_gen = torch.Generator()
    lightning_policy = ManagerPolicy(FEATURES, OPTIONS, AGENTS)
    plain_policy = ManagerPolicy(FEATURES, OPTIONS, AGENTS)
    plain_policy.load_state_dict(lightning_policy.state_dict())
    fitter = Fitter()
    module = fitter.setup(ManagerModule(lightning_policy, lr=3e-4, clip=0.2, entropy_coef=0.01, kl_coef=0.0))
    plain_opt = torch.optim.Adam(plain_policy.parameters(), lr=3e-4, eps=1e-5)
    times = {"lightning": 0.0, "plain": 0.0}
    for r in range(rounds + 1):  # round 0 warms up both paths and is not counted
        for name in (("lightning", "plain") if r % 2 else ("plain", "lightning")):
            minibatch_gen.manual_seed(r)
            start = time.perf_counter()
            if name == "lightning":
                fitter.fit(module, data, epochs=1, minibatch_size=batch_size, generator=minibatch_gen)
            else:
                for mb in B.minibatches(data, batch_size, minibatch_gen):
                    plain_step(plain_policy, plain_opt, mb)
            if r:
                times[name] += time.perf_counter() - start
    samples = batch_size * steps * rounds
    lightning_sps, plain_sps = samples / times["lightning"], samples / times["plain"]
    return {"lightning_samples_per_s": lightning_sps, "plain_samples_per_s": plain_sps,
            "ratio": lightning_sps / plain_sps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = {"benchmark": "trainer_overhead", "target_ratio": 0.9, "threads": 1}
    for batch_size, steps in ((32, 200), (2048, 12)):
        out[f"batch_{batch_size}"] = measure(batch_size, steps, args.rounds)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
