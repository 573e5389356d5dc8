"""Does the trained critic know which coverage assignments win? The online critic against the
same network fitted offline on the final policy's rollouts.

Trains the DEFAULT learner on coverage_v0 as ``generalisation.py`` does (one run seed), then
fits a fresh critic of the same architecture, on the same features and the same return
targets, to ``--fit-episodes`` sampled rollouts of the final policy on training-range task
seeds (``--fit-epochs`` passes, Adam 1e-3, minibatches of 256). Both critics then judge the
held-out episodes: per agent, the value of its step-0 decision — agent 1's comes after agent
0 chose its landmark, agent 2's after both — and how well it ranks

- the layouts nearest-first loses (only the bottleneck-optimal assignment wins) below the rest,
- within those layouts, the episodes that went on to win above the ones that lost,

as ROC AUCs (0.5: no better than chance). The local credit of a decision is the change in
this value across it, so a critic that cannot rank the assignments cannot teach them.

    python benchmarks/coverage_critic.py --seed 4

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np
from coverage_failures import ENV, nearest_first_wins
from generalisation import candidate_argument, parsed_overrides, trained


def auc(positive: np.ndarray, negative: np.ndarray) -> float | None:
    """P(a positive scores above a negative), ties half; None when either side is empty."""
    if not len(positive) or not len(negative):
        return None
    p, n = positive[:, None], negative[None, :]
    return float((p > n).mean() + 0.5 * (p == n).mean())


def judge(rows: np.ndarray) -> dict[str, Any]:
    """``rows``: (nearest-first wins, success, value) per held-out episode."""
    wins, success, value = rows[:, 0] == 1, rows[:, 1] == 1, rows[:, 2]
    lose = ~wins
    return {"value_where_nearest_first_wins": float(value[wins].mean()),
            "value_where_nearest_first_loses": float(value[lose].mean()),
            "auc_layout_kind": auc(value[wins], value[lose]),
            "auc_success_where_nearest_first_loses": auc(value[lose & success], value[lose & ~success]),
            "auc_success": auc(value[success], value[~success])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=4, help="run seed")
    p.add_argument("--iterations", type=int, default=None, help="default: the benchmark's coverage budget")
    p.add_argument("--fit-episodes", type=int, default=4000)
    p.add_argument("--fit-epochs", type=int, default=40)
    p.add_argument("--eval-episodes", type=int, default=500)
    p.add_argument("--eval-seed", type=int, default=2_000_000)
    candidate_argument(p)
    args = p.parse_args()
    overrides = parsed_overrides(args)

    import torch

    from gyre_ma import batch as B
    from gyre_ma.agents.manager import Critic
    from gyre_ma.roles import RolloutTask

    torch.manual_seed(args.seed)
    start = time.perf_counter()
    with trained(ENV, args.seed, args.iterations, overrides) as (gyre, _):
        fit_seeds = range(5_000_000, 5_000_000 + args.fit_episodes)  # training range, none held out
        rollouts = gyre.backend.collect(gyre.weights(), gyre.version, [RolloutTask("executor", s) for s in fit_seeds])
        gyre.arbitrate(rollouts)
        batch = gyre.batch(rollouts)
        x, agent, target = batch[B.FEATURES], batch[B.AGENT], batch[B.RETURN]
        m = gyre.config.manager
        offline = Critic(x.shape[1], len(gyre.env.possible_agents), hidden=m.hidden, layers=m.layers,
                         agent_embedding=m.agent_embedding)
        optimiser = torch.optim.Adam(offline.parameters(), lr=1e-3)
        for _ in range(args.fit_epochs):
            order = torch.randperm(len(target))
            for at in range(0, len(target), 256):
                idx = order[at:at + 256]
                loss = 0.5 * (offline(x[idx], agent[idx]) - target[idx]).pow(2).mean()
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
        eval_seeds = list(range(args.eval_seed, args.eval_seed + args.eval_episodes))
        wins = nearest_first_wins(eval_seeds)
        held_out = gyre.backend.collect(gyre.weights(), gyre.version, [RolloutTask("executor", s) for s in eval_seeds])
        agents: dict[str, Any] = {}
        for who, name in enumerate(gyre.env.possible_agents):
            firsts = ((t, next((c for c in t.calls if c.start_step == 0 and c.agent_index == who), None))
                      for t in held_out)
            calls = [(t, c) for t, c in firsts if c is not None]
            with torch.no_grad():
                fitted = offline(torch.from_numpy(gyre.featurizer.many([c for _, c in calls])),
                                 torch.tensor([c.agent_index for _, c in calls])).numpy()
            base = [(float(wins[t.task_seed]), float(t.success)) for t, _ in calls]
            agents[name] = {"online": judge(np.array([b + (c.value,) for b, (_, c) in zip(base, calls, strict=True)])),
                            "offline": judge(np.array([b + (v,) for b, v in zip(base, fitted.tolist(), strict=True)]))}
    success = np.array([t.success for t in held_out])
    lose = np.array([not wins[t.task_seed] for t in held_out])
    print(json.dumps({"benchmark": "coverage_critic", "seed": args.seed, "overrides": overrides,
                      "env_steps": gyre.env_steps, "fit_rows": len(target), "sampled_success": float(success.mean()),
                      "sampled_success_where_nearest_first_loses": float(success[lose].mean()),
                      "agents": agents, "wall_seconds": time.perf_counter() - start}))


if __name__ == "__main__":
    main()
