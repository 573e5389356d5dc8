"""The manager's decision cost: NumPy inference (what rollouts use) vs the torch modules.

A rollout asks the manager for one decision per agent whose option ended: a batch of one
or two. At that size torch's per-op call overhead dominates a small MLP's forward, so
:class:`~gyre_ma.agents.noise.NoisyManager` runs the policy and critic through
:class:`~gyre_ma.agents.manager.NumpyForward`. This script times, side by side in one
process, on decision states of the real techtree env (2 agents, its flat primitive
library — the baseline where every step is a decision):

* ``numpy`` — ``NoisyManager.decide`` as the rollout calls it (featurize, forward, sample);
* ``torch`` — the same decisions through the torch modules: the policy's masked logits,
  a categorical sample and the critic's value, under ``torch.no_grad`` with one thread
  (what ``decide`` did before the NumPy path);
* ``flat_rollout`` vs ``raw`` — flat episodes through the framework's rollout vs the raw
  env stepping with random actions (steps/s), alternating, over the same seeds.

Each ratio is the median of per-round paired ratios. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from gyre_ma.agents.noise import NoisyManager
from gyre_ma.backends.worker import RolloutKit
from gyre_ma.config import parse_config
from gyre_ma.options.decision import Decision
from gyre_ma.roles import RolloutTask


def kit(hidden: int) -> RolloutKit:
    cfg = parse_config({"seed": 0, "env": {"id": "techtree_v0", "kwargs": {"milestone_rewards": True}},
                        "manager": {"kind": "flat", "hidden": hidden}})
    return RolloutKit.from_config(cfg)


def decisions(k: RolloutKit, seed: int) -> list[list[Decision]]:
    """Every agent's decision state along a random-action episode, one batch per step."""
    env, rng = k.env, np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    out = []
    while env.agents:
        out.append([Decision(a, i, obs[a], np.ones(len(k.library), dtype=bool), env.verified_milestones(), -1,
                             0.0, env) for i, a in enumerate(env.agents)])
        obs, *_ = env.step({a: int(rng.integers(env.action_space(a).n)) for a in env.agents})
    return out


@torch.no_grad()
def torch_decide(k: RolloutKit, generator: torch.Generator, batch: list[Decision]) -> list[int]:
    features = torch.from_numpy(np.stack([k.featurizer(d) for d in batch]))
    agent = torch.tensor([d.agent_index for d in batch], dtype=torch.long)
    mask = torch.from_numpy(np.stack([d.mask for d in batch]))
    dist = k.policy.distribution(features, agent, mask)
    options = torch.multinomial(dist.probs, 1, generator=generator).squeeze(1)
    dist.log_prob(options), k.critic(features, agent)
    return options.tolist()


def raw_steps(env, seed: int) -> int:
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    steps = 0
    while env.agents:
        env.step({a: int(rng.integers(env.action_space(a).n)) for a in env.agents})
        steps += 1
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    k = kit(args.hidden)
    rows: dict[str, list[float]] = {"numpy_us": [], "torch_us": [], "flat_steps_per_s": [], "raw_steps_per_s": []}
    for r in range(args.rounds):
        batches = decisions(k, seed=100 + r)
        manager = NoisyManager(k.policy, k.featurizer, critic=k.critic, seed=r)
        generator = torch.Generator().manual_seed(r)
        start = time.perf_counter()
        for b in batches:
            manager.decide(b)
        rows["numpy_us"].append((time.perf_counter() - start) / len(batches) * 1e6)
        start = time.perf_counter()
        for b in batches:
            torch_decide(k, generator, b)
        rows["torch_us"].append((time.perf_counter() - start) / len(batches) * 1e6)
        start = time.perf_counter()
        steps = sum(k.play(RolloutTask("executor", 200 + 10 * r + e), version=0).length for e in range(4))
        rows["flat_steps_per_s"].append(steps / (time.perf_counter() - start))
        start = time.perf_counter()
        steps = sum(raw_steps(k.env, 200 + 10 * r + e) for e in range(4))
        rows["raw_steps_per_s"].append(steps / (time.perf_counter() - start))
    torch_over_numpy = [t / n for t, n in zip(rows["torch_us"], rows["numpy_us"], strict=True)]
    flat_over_raw = [f / w for f, w in zip(rows["flat_steps_per_s"], rows["raw_steps_per_s"], strict=True)]
    print(json.dumps({
        "benchmark": "decide_overhead", "env": "techtree_v0 (2 agents), flat primitive library",
        "hidden": args.hidden, "rounds": args.rounds,
        "decide_us_numpy_median": float(np.median(rows["numpy_us"])),
        "decide_us_torch_median": float(np.median(rows["torch_us"])),
        "torch_over_numpy_median": float(np.median(torch_over_numpy)),
        "flat_rollout_steps_per_s_median": float(np.median(rows["flat_steps_per_s"])),
        "raw_steps_per_s_median": float(np.median(rows["raw_steps_per_s"])),
        "flat_rollout_over_raw_median": float(np.median(flat_over_raw)),
        "rounds_detail": rows,
    }))


if __name__ == "__main__":
    main()
