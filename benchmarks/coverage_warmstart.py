"""Does the default learner keep an optimal coverage policy? RL started from imitation of the oracle.

On coverage_v0 the default learner plateaus at 0.86–0.90 held-out success, near the
nearest-first heuristic (0.858), while the same manager network trained by cross-entropy on
the oracle's choices verifies nearly every held-out layout (session 21). Two explanations
predict different things when RL *starts* from that imitation policy:

- the default objective (credit, entropy bonus, parameter noise, PPO step) has the optimum
  as a fixed point, and the gap is in *finding* it from scratch: held-out success stays near
  the imitation policy's;
- the objective itself pulls a policy away from the optimum: success drifts down towards the
  from-scratch plateau.

Per run seed: the default config and budget of ``generalisation.py``; before iteration 0 the
manager is fitted to the oracle's choices on ``--imitation-episodes`` task seeds from
5,000,000 (disjoint from the training and held-out seeds; only decisions with more than one
eligible option), then trained by the default learner, unchanged. The critic starts
untrained, as it does from scratch, unless ``--freeze-policy N``: then for the first N
iterations only the critic learns (the policy's weights are put back after each).
Held-out success, sampled and greedy, is measured on ``--eval-episodes`` seeds from
2,000,000 after the imitation and at ``--checkpoints`` iterations.

    python benchmarks/coverage_warmstart.py --seeds 3 --jobs 2

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
from generalisation import ENVS, config, parsed_overrides, run_arguments, run_seeds

ENV = "coverage"
IMITATION_SEED = 5_000_000


def imitate(gyre: Any, episodes: int, *, epochs: int, lr: float, seed: int) -> dict[str, Any]:
    """Fit ``gyre``'s manager to the oracle's choices (cross-entropy on masked logits)."""
    import torch

    from gyre_ma.envs.registry import make_oracle
    from gyre_ma.rollout import run_episode

    oracle = make_oracle(gyre.config.env.id, gyre.env, gyre.library, ENVS[ENV]["oracle"])
    calls = [c for s in range(IMITATION_SEED, IMITATION_SEED + episodes)
             for c in run_episode(gyre.env, gyre.library, oracle, seed=s).calls if int(c.mask.sum()) > 1]
    x = torch.from_numpy(gyre.featurizer.many(calls))
    agent = torch.tensor([c.agent_index for c in calls], dtype=torch.long)
    mask = torch.from_numpy(np.stack([c.mask for c in calls]))
    target = torch.tensor([c.option for c in calls], dtype=torch.long)
    policy = gyre.policy
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(calls), generator=generator).split(256):
            loss = torch.nn.functional.cross_entropy(policy(x[idx], agent[idx], mask[idx]), target[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        accuracy = float((policy(x, agent, mask).argmax(-1) == target).float().mean())
    return {"decisions": len(calls), "train_accuracy": accuracy, "final_loss": float(loss.detach())}


def heldout(gyre: Any, seeds: list[int]) -> dict[str, float]:
    from gyre_ma.roles import RolloutTask

    out = {}
    for mode, greedy in (("sampled", False), ("greedy", True)):
        trajectories = gyre.backend.collect(gyre.weights(), gyre.version,
                                            [RolloutTask("executor", s, greedy=greedy) for s in seeds])
        out[mode] = float(np.mean([t.success for t in trajectories]))
        out[f"{mode}_length"] = float(np.mean([t.length for t in trajectories]))
    return out


def run(seed: int, iterations: int | None, eval_seeds: list[int], overrides: dict[str, Any],
        imitation_episodes: int, checkpoints: list[int], freeze: int, stop: int | None) -> dict[str, Any]:
    import torch

    from gyre_ma.loop import Gyre

    torch.set_num_threads(1)
    out: dict[str, Any] = {"seed": seed, "heldout": []}
    with tempfile.TemporaryDirectory(prefix="gyre-warmstart-") as root:
        cfg = config(ENV, seed, iterations, overrides, run_root=root)
        gyre = Gyre(cfg, os.path.join(cfg.run_root, cfg.name))
        try:
            out["imitation"] = imitate(gyre, imitation_episodes, epochs=60, lr=1e-3, seed=seed)
            out["heldout"].append({"iteration": 0, "env_steps": 0} | heldout(gyre, eval_seeds))
            curve, kls = [], []
            last = cfg.train.iterations if stop is None else min(stop, cfg.train.iterations)
            for i in range(last):
                kept = {k: v.detach().clone() for k, v in gyre.policy.state_dict().items()} if i < freeze else None
                m = gyre.iteration(i)
                if kept is not None:  # the critic learns; the policy is put back as it was
                    gyre.policy.load_state_dict(kept)
                curve.append(m.get("success_rate"))
                kls.append(m.get("kl", float("nan")))
                if i + 1 in checkpoints or i + 1 == last:
                    out["heldout"].append({"iteration": i + 1, "env_steps": gyre.env_steps}
                                          | heldout(gyre, eval_seeds))
            out["training_success_per_100"] = [float(np.mean(curve[k:k + 100])) for k in range(0, len(curve), 100)]
            out["kl_per_25"] = [float(np.nanmean(kls[k:k + 25])) for k in range(0, len(kls), 25)]
        finally:
            gyre.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    run_arguments(p, seeds=3, eval_episodes=500, iterations="the benchmark's coverage budget")
    p.add_argument("--imitation-episodes", type=int, default=3000)
    p.add_argument("--checkpoints", default="50,100,200,400,800", help="iterations at which to measure held-out")
    p.add_argument("--freeze-policy", type=int, default=0,
                   help="iterations at the start in which only the critic learns (the policy is restored after each)")
    p.add_argument("--stop", type=int, default=None,
                   help="stop after this many iterations (the schedules still span the budget's)")
    args = p.parse_args()
    overrides = parsed_overrides(args)
    eval_seeds, seeds = run_seeds(args)
    checkpoints = [int(c) for c in args.checkpoints.split(",") if c]
    start = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        runs = list(pool.map(run, seeds, [args.iterations] * len(seeds), [eval_seeds] * len(seeds),
                             [overrides] * len(seeds), [args.imitation_episodes] * len(seeds),
                             [checkpoints] * len(seeds), [args.freeze_policy] * len(seeds), [args.stop] * len(seeds)))
    print(json.dumps({"benchmark": "coverage_warmstart",
                      "config": f"defaults with {overrides}" if overrides else "defaults (env, library, seed only)",
                      "eval_seeds": [eval_seeds[0], eval_seeds[-1]], "imitation_seeds": IMITATION_SEED,
                      "freeze_policy": args.freeze_policy, "stop": args.stop,
                      "runs": runs, "wall_seconds": time.perf_counter() - start}))


if __name__ == "__main__":
    main()
