"""Session 55's probes of two changes on user-style tasks (``probe_envs.py``), the change on
and off in one run, the default learner, 50 iterations, held-out seeds (3,000,000 on):

* ``goal_bits``: the MLP manager told each episode's goals (``with``) or not (``without``:
  ``declares_goals`` patched to False) on ``errands``, whose observation does not say them;
* ``route_pay``: milestone pay capped by the drop in ``TaskGraph.remaining_pay`` (``new``)
  against the rule before it (``old``: a filled-in reward pays while still needed) on
  ``vault``, whose key route pays two milestones and the shorter kick one.

Prints one JSON object: per arm and run seed, the held-out success and mean length, sampled
and greedy.

    python benchmarks/probes.py --probe route_pay --seeds 8 > benchmarks/results/route_pay_session55.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROBES = {"goal_bits": ("probe_envs:make_errands", "probe_envs:errands_library", ("with", "without")),
          "route_pay": ("probe_envs:make_vault", "probe_envs:vault_library", ("new", "old"))}


def _arm(probe: str, arm: str, seed: int, episodes: int) -> dict:
    sys.path[:0] = [str(HERE)]
    import heldout

    if arm == "without":
        import gyre_ma.backends.worker as worker

        worker.declares_goals = lambda env: False
    if arm == "old":
        import gyre_ma.rewards.milestones as milestones
        import gyre_ma.rewards.scorer as scorer

        def old(traj, graph):
            unpaid = milestones.declined(traj, graph)
            return {m: 0.0 if m in unpaid else graph.milestone(m).reward for m in traj.milestone_steps if m in graph}

        milestones.milestone_weights = scorer.milestone_weights = old
    env, library, _ = PROBES[probe]
    config = Path(tempfile.mkdtemp(prefix="gyre-probe-")) / "probe.yaml"
    config.write_text(f"name: {probe}\nenv: {{id: '{env}'}}\nlibrary: '{library}'\ntrain: {{iterations: 50}}\n")
    out = heldout.run(str(config), seed, list(range(3_000_000, 3_000_000 + episodes)))
    return {"arm": arm, "seed": seed, "final": out["final"], "train_seconds": round(out["train_seconds"], 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--probe", choices=sorted(PROBES), required=True)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--eval-episodes", type=int, default=200)
    p.add_argument("--jobs", type=int, default=1)
    args = p.parse_args()
    arms = PROBES[args.probe][2]
    # a fresh process per run: an arm's patch stays in its own run
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1) as pool:
        futures = [pool.submit(_arm, args.probe, arm, seed, args.eval_episodes)
                   for seed in range(args.seeds) for arm in arms]
        runs = [f.result() for f in futures]
    print(json.dumps({"probe": args.probe, "iterations": 50, "eval_seeds": [3_000_000, 3_000_000 + args.eval_episodes],
                      "runs": runs}))


if __name__ == "__main__":
    main()
