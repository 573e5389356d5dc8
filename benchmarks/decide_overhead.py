"""The manager's decision cost per decision, by batch size: what batching the decisions of
many episodes buys, and why rollouts no longer need a NumPy copy of the MLP.

:class:`~gyre_ma.agents.noise.PolicyActor` decides a round of decisions in one torch
forward pass (featurize, masked logits, behaviour log-probabilities, sampling, critic).
At batch 1 torch's per-op overhead dominates a small MLP, which is why rollouts once ran
a hand-written NumPy twin of it; at the batch a worker with ``rollout.num_envs`` episodes
in flight decides, that overhead is spread over the batch. This script times ``decide``
per decision at batch sizes 1, 4, 16, 64 on decision states of the real techtree env
(its flat primitive library: every step a decision), each row's episode with its own
parameter noise (the gathered-rows path) and without noise (the shared-weights path),
and the cost of starting an episode in a slot (with noise: drawing its perturbed weights).

Each figure is the median over rounds. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from gyre_ma.agents.noise import NoiseSetting, PolicyActor
from gyre_ma.backends.worker import RolloutKit
from gyre_ma.config import parse_config
from gyre_ma.options.decision import Decision

NOISES = {"noise": NoiseSetting("param", 0.1), "plain": NoiseSetting()}
"""Each row's episode with its own parameter noise (the gathered-rows path), or none."""


def kit(hidden: int) -> RolloutKit:
    cfg = parse_config({"seed": 0, "env": {"id": "techtree_v0", "kwargs": {"milestone_rewards": True}},
                        "manager": {"kind": "flat", "hidden": hidden}})
    return RolloutKit.from_config(cfg)


def decisions(k: RolloutKit, seed: int) -> list[Decision]:
    """Every agent's decision state along a random-action episode."""
    env, rng = k.env, np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    out = []
    while env.agents:
        out += [Decision(a, i, obs[a], np.ones(len(k.library), dtype=bool), env.verified_milestones(), -1, 0.0, env)
                for i, a in enumerate(env.agents)]
        obs, *_ = env.step({a: int(rng.integers(env.action_space(a).n)) for a in env.agents})
    return out


def per_decision_us(actor: PolicyActor, states: list[Decision], batch: int) -> float:
    rounds = len(states) // batch
    slots = list(range(batch))
    start = time.perf_counter()
    for r in range(rounds):
        actor.decide(slots, states[r * batch:(r + 1) * batch])
    return (time.perf_counter() - start) / (rounds * batch) * 1e6


def episode_start_us(actor: PolicyActor, noise: NoiseSetting, starts: int) -> float:
    """Per episode: :meth:`PolicyActor.begin` (reseed; under parameter noise, draw and write
    the slot's perturbed weights), which every episode of a worker pays once."""
    start = time.perf_counter()
    for i in range(starts):
        actor.begin(i % len(actor.slots), noise, i)
    return (time.perf_counter() - start) / starts * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batches", default="1,4,16,64")
    args = parser.parse_args()
    torch.set_num_threads(1)
    batches = [int(b) for b in args.batches.split(",")]
    k = kit(args.hidden)
    rows: dict[str, list[float]] = {f"{mode}_{b}": [] for mode in NOISES for b in batches}
    for r in range(args.rounds):
        states = decisions(k, seed=100 + r)
        for b in batches:
            for mode in NOISES:
                actor = PolicyActor(k.policy, k.featurizer, critic=k.critic, slots=b)
                for slot in range(b):
                    actor.begin(slot, NOISES[mode], r * 100 + slot)
                rows[f"{mode}_{b}"].append(per_decision_us(actor, states, b))
    begins: dict[str, list[float]] = {mode: [] for mode in NOISES}
    for _ in range(args.rounds):
        actor = PolicyActor(k.policy, k.featurizer, critic=k.critic, slots=16)
        for mode, noise in NOISES.items():
            begins[mode].append(episode_start_us(actor, noise, 500))
    medians = {key: round(float(np.median(v)), 1) for key, v in rows.items()}
    print(json.dumps({
        "benchmark": "decide_overhead", "env": "techtree_v0 (2 agents), flat primitive library",
        "hidden": args.hidden, "rounds": args.rounds, "decisions_per_round": len(decisions(k, 100)),
        "us_per_decision_median": medians,
        "us_per_episode_start_median": {mode: round(float(np.median(v)), 1) for mode, v in begins.items()},
        "batch1_over_batch16": {mode: round(medians[f"{mode}_1"] / medians[f"{mode}_16"], 2)
                                for mode in NOISES if 1 in batches and 16 in batches},
        "rounds_detail": rows,
    }))


if __name__ == "__main__":
    main()
