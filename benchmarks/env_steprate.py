"""Raw env steps/s (random actions) vs option-driven steps/s (oracle manager), per env.

Both are measured in the same process, alternating, over the same seeds; the ratio is
the cost of the option layer (scripted sub-policies, termination checks, records).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from gyre_ma.envs.registry import ENVIRONMENTS, make_env, make_library, make_oracle
from gyre_ma.rollout import run_episode


def raw_steps(env_id: str, seeds: list[int]) -> tuple[int, float]:
    env = make_env(env_id)
    steps, elapsed = 0, 0.0
    for seed in seeds:
        env.reset(seed=seed)
        spaces = {a: env.action_space(a) for a in env.possible_agents}
        for a, s in spaces.items():
            s.seed(seed)
        start = time.perf_counter()
        while env.agents:
            env.step({a: spaces[a].sample() for a in env.agents})
            steps += 1
        elapsed += time.perf_counter() - start
    return steps, elapsed


def option_steps(env_id: str, seeds: list[int]) -> tuple[int, float, float]:
    env = make_env(env_id)
    library = make_library(env_id, env)
    oracle = make_oracle(env_id, env, library)
    steps, elapsed, successes = 0, 0.0, 0
    for seed in seeds:
        start = time.perf_counter()
        traj = run_episode(env, library, oracle, seed=seed)
        elapsed += time.perf_counter() - start
        steps += traj.length
        successes += traj.success
    return steps, elapsed, successes / len(seeds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    out: dict[str, object] = {"benchmark": "env_steprate", "episodes_per_round": args.episodes}
    for env_id in ENVIRONMENTS:
        totals = np.zeros(4)
        success = 0.0
        for r in range(args.rounds):
            seeds = list(range(r * args.episodes, (r + 1) * args.episodes))
            rs, rt = raw_steps(env_id, seeds)
            os_, ot, success = option_steps(env_id, seeds)
            totals += (rs, rt, os_, ot)
        raw_sps, opt_sps = totals[0] / totals[1], totals[2] / totals[3]
        out[env_id] = {
            "raw_steps_per_s": round(raw_sps, 1),
            "option_steps_per_s": round(opt_sps, 1),
            "option_over_raw": round(opt_sps / raw_sps, 3),
            "raw_steps": int(totals[0]), "option_steps": int(totals[2]),
            "oracle_success_last_round": success,
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
