"""Neural options against the scripted ones they replace: pre-train, freeze, play held-out.

For coverage_v0 with ``--agents`` agents: ``go_to_0`` is pre-trained from scratch on its own
milestone (``gyre_ma.pretrain.pretrain_option``) in a drill variant of the task
(``max_cycles`` 40: time to wander while it learns; the other choices a random eligible
option, or the env's oracle with ``--guide oracle``), frozen, and put in the library in place
of the scripted ``go_to_0``. Both libraries then play ``--eval-episodes`` held-out layouts of
the real task (its own step cap) under two reference managers: the fixed assignment (agent k
→ landmark k) and the oracle. Reported: the drill's last batches (share of calls that verify
the landmark), training seconds, and held-out success and mean length per library and
manager. Prints one JSON object.

    python benchmarks/neural_options.py --agents 1 --episodes 800
    python benchmarks/neural_options.py --agents 3 --episodes 6000 [--guide oracle] [--out go_to_0.pt]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np
import torch

from gyre_ma.envs.coverage.options import make_library
from gyre_ma.envs.coverage.oracle import FixedAssignment, OracleManager
from gyre_ma.envs.registry import make_env
from gyre_ma.options.library import OptionLibrary
from gyre_ma.pretrain import pretrain_option
from gyre_ma.rollout import run_episode

EVAL_SEED = 10_000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, default=1)
    p.add_argument("--episodes", type=int, default=800, help="drill episodes")
    p.add_argument("--guide", choices=["random", "oracle"], default="random")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-episodes", type=int, default=300)
    p.add_argument("--out", help="also save the trained sub-policy here (.pt)")
    args = p.parse_args()
    torch.set_num_threads(1)
    drill = make_env("coverage_v0", n_agents=args.agents, max_cycles=40)
    library = make_library(env=drill)
    guide = OracleManager(library) if args.guide == "oracle" else None
    start = time.perf_counter()
    result = pretrain_option(drill, library, "go_to_0", episodes=args.episodes, lr=args.lr, guide=guide,
                             seed=args.seed)
    seconds = time.perf_counter() - start
    if args.out:
        result.policy.save(args.out)
    task = make_env("coverage_v0", n_agents=args.agents)
    scripted = make_library(env=task)
    neural = OptionLibrary(scripted.name, scripted.graph, [dataclasses.replace(o, policy=result.policy)
                                                           if o.name == "go_to_0" else o for o in scripted])
    held_out: dict[str, dict[str, float]] = {}
    for name, lib in (("neural", neural), ("scripted", scripted)):
        for manager_name, manager in (("fixed", FixedAssignment), ("oracle", OracleManager)):
            played = [run_episode(task, lib, manager(lib), seed=s)
                      for s in range(EVAL_SEED, EVAL_SEED + args.eval_episodes)]
            held_out[f"{name}_{manager_name}"] = {"success": float(np.mean([t.success for t in played])),
                                                  "mean_length": float(np.mean([t.length for t in played]))}
    print(json.dumps({"benchmark": "neural_options", "env": "coverage_v0", "agents": args.agents,
                      "option": "go_to_0", "drill_episodes": args.episodes, "guide": args.guide, "lr": args.lr,
                      "seed": args.seed, "train_seconds": round(seconds, 1),
                      "drill_success_first_batch": result.history[0]["success"],
                      "drill_success_last_5_batches": [round(h["success"], 3) for h in result.history[-5:]],
                      "eval_seeds": [EVAL_SEED, EVAL_SEED + args.eval_episodes - 1], "held_out": held_out}))


if __name__ == "__main__":
    main()
