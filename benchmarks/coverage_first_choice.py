"""Where coverage's plateau sits: the first agent's choice, and the credit each mode gives it.

Trains the DEFAULT learner on coverage_v0 as ``generalisation.py`` does (one run seed), then,
on layouts nearest-first loses (only the bottleneck-optimal assignment wins):

- **forced first choice** — on ``--layouts`` held-out layouts, agent 0's step-0 choice (the
  first decision of the episode) is forced to the oracle's landmark or to the policy's own
  most likely one, every other decision is the learned policy's (sampled, noise-free, as
  held-out evaluation plays), ``--rollouts`` episodes each: success under the learned
  partners. Also: agents 0 and 1 both forced to the oracle's choice, and the policy's
  probability of the oracle's choice. If the oracle's first choice wins *less* often than
  the policy's under the learned partners, the partners have not learned to follow it
  (relative overgeneralisation) and the gradient points away from it; if it wins more,
  the first agent's choice is where success is lost, and the question is the signal;
- **credit of the first choice** — ``--credit-batches`` training batches (the run's own
  tasks: explorers and executors with their noise, on training-range seeds it never
  played), each scored and turned into advantages under each credit mode, as an update
  would: per mode, agent 0's first call's advantage on the layouts nearest-first loses,
  split by whether it took the oracle's landmark, and the separation
  (mean difference ÷ pooled std; the signal the update gets per decision).

    python benchmarks/coverage_first_choice.py --seed 0

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from coverage_failures import ENV, nearest_first_wins
from generalisation import candidate_argument, parsed_overrides, trained

CREDIT_MODES = {"default": {}, "outcome_episode": {"outcome_credit": "episode"}, "gigpo": {"mode": "gigpo"},
                "grpo": {"mode": "grpo"}, "plain_gae": {"mode": "plain"}}


class _Forced:
    """A manager that gives each listed agent's first decision the listed option, and asks
    ``base`` for every other (one per episode)."""

    def __init__(self, base: Any, forced: dict[str, int]) -> None:
        self.base, self.forced, self.used = base, forced, set()

    def decide(self, decisions: Sequence[Any]) -> list[Any]:
        from gyre_ma.options.decision import Choice

        out = []
        for d in decisions:
            if d.agent in self.forced and d.agent not in self.used:
                self.used.add(d.agent)
                out.append(Choice(self.forced[d.agent]))
            else:
                out.extend(self.base.decide([d]))
        return out


def oracle_first(env: Any, library: Any, seed: int) -> dict[str, Any]:
    """Per agent, its first call in the coverage oracle's episode on layout ``seed``. Agent
    0's is the episode's first decision, the same whoever decides (nothing runs before it)."""
    from gyre_ma.envs.coverage.oracle import OracleManager
    from gyre_ma.rollout import run_episode

    first: dict[str, Any] = {}
    for call in run_episode(env, library, OracleManager(library), seed=seed).calls:
        first.setdefault(call.agent, call)
    return first


def forced_choices(gyre: Any, seeds: list[int], rollouts: int) -> dict[str, Any]:
    import torch

    from gyre_ma.agents.noise import NoisyManager
    from gyre_ma.rollout import run_episode

    env, library = gyre.backend.worker.kit.env_for(0), gyre.library
    first, second = env.possible_agents[:2]

    def success(seed: int, forced: dict[str, int]) -> float:
        return float(np.mean([run_episode(env, library, _Forced(NoisyManager(
            gyre.policy, gyre.featurizer, None, critic=gyre.critic, seed=1_000_003 * j + seed), forced),
            seed=seed).success for j in range(rollouts)]))

    rows = []
    for s in seeds:
        oracle = oracle_first(env, library, s)
        call = oracle[first]
        with torch.no_grad():
            logits = gyre.policy(torch.from_numpy(gyre.featurizer.many([call])), torch.tensor([call.agent_index]),
                                 torch.from_numpy(call.mask[None]))
        probs = torch.softmax(logits, -1)[0].numpy()
        top = int(probs.argmax())
        rows.append({"seed": s, "oracle": call.option, "top": top, "p_oracle": float(probs[call.option]),
                     "free": success(s, {}), "first_oracle": success(s, {first: call.option}),
                     "first_top": success(s, {first: top}),
                     "first_two_oracle": success(s, {first: call.option, second: oracle[second].option})})

    def mean(key: str, among: list[dict[str, Any]]) -> float | None:
        return float(np.mean([r[key] for r in among])) if among else None

    differ = [r for r in rows if r["oracle"] != r["top"]]
    keys = ("free", "first_oracle", "first_top", "first_two_oracle", "p_oracle")
    return {"layouts": len(rows), "rollouts_each": rollouts, "all": {k: mean(k, rows) for k in keys},
            "top_differs": {"layouts": len(differ)} | {k: mean(k, differ) for k in keys}, "rows": rows}


def first_choice_credit(gyre: Any, batches: int) -> dict[str, Any]:
    from gyre_ma import batch as B
    from gyre_ma.training_batch import build_batch, segment

    env, library = gyre.backend.worker.kit.env_for(0), gyre.library
    first = env.possible_agents[0]
    seeds, options = [], []
    advantages: dict[str, list[float]] = {m: [] for m in CREDIT_MODES}
    """Per mode, each episode's advantage of agent 0's first call, in the order of ``seeds``."""
    for k in range(batches):
        trajectories = gyre.backend.collect(gyre.weights(), gyre.version, gyre.tasks(100_000 + k))
        gyre.arbitrate(trajectories)
        seg = segment(trajectories, env.possible_agents)
        rows = {id(c): r for r, c in enumerate(c for row in seg.calls for c in row)}
        calls = [next(c for c in t.calls if c.agent == first) for t in trajectories]
        seeds += [t.task_seed for t in trajectories]
        options += [c.option for c in calls]
        for name, change in CREDIT_MODES.items():
            config = gyre.config.model_copy(update={"credit": gyre.config.credit.model_copy(update=change)})
            batch = build_batch(trajectories, seg, config=config, featurizer=gyre.featurizer,
                                state_scaler=gyre.state_scaler, names=library.graph.names)
            advantages[name] += batch[B.ADVANTAGE][[rows[id(c)] for c in calls]].tolist()
    wins = nearest_first_wins(sorted(set(seeds)))
    oracle = {s: oracle_first(env, library, s)[first].option for s in wins}
    hard = np.array([not wins[s] for s in seeds])
    took = np.array([o == oracle[s] for s, o in zip(seeds, options, strict=True)])
    out: dict[str, Any] = {"batches": batches, "episodes": len(seeds)}
    for name, values in advantages.items():
        a = np.array(values)
        summary = {}
        for kind, where in (("nearest_first_loses", hard), ("nearest_first_wins", ~hard)):
            right, other = a[where & took], a[where & ~took]
            pooled = (float(np.sqrt((right.var() * len(right) + other.var() * len(other)) / (len(right) + len(other))))
                      if len(right) and len(other) else 0.0)
            summary[kind] = {"took_oracle": len(right), "took_other": len(other),
                             "mean_advantage_oracle": float(right.mean()) if len(right) else None,
                             "mean_advantage_other": float(other.mean()) if len(other) else None,
                             "separation": float((right.mean() - other.mean()) / pooled)
                             if len(right) and len(other) and pooled > 0 else None}
        out[name] = summary
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0, help="run seed")
    p.add_argument("--iterations", type=int, default=None, help="default: the benchmark's coverage budget")
    p.add_argument("--layouts", type=int, default=40, help="held-out layouts nearest-first loses")
    p.add_argument("--rollouts", type=int, default=20, help="episodes per layout and forced choice")
    p.add_argument("--credit-batches", type=int, default=200)
    p.add_argument("--eval-seed", type=int, default=2_000_000)
    candidate_argument(p)
    args = p.parse_args()
    overrides = parsed_overrides(args)
    start = time.perf_counter()
    with trained(ENV, args.seed, args.iterations, overrides) as (gyre, train_seconds):
        candidates = list(range(args.eval_seed, args.eval_seed + 20 * args.layouts))
        wins = nearest_first_wins(candidates)
        layouts = [s for s in candidates if not wins[s]][:args.layouts]
        out = {"benchmark": "coverage_first_choice", "seed": args.seed, "overrides": overrides,
               "env_steps": gyre.env_steps, "train_seconds": round(train_seconds, 1),
               "forced": forced_choices(gyre, layouts, args.rollouts),
               "credit": first_choice_credit(gyre, args.credit_batches)}
    out["wall_seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
