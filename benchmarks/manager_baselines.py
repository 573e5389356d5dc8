"""Manager baselines per environment: oracle vs uniform-random option ordering.

Prints ONE JSON object keyed by env id. For each env: success rate and mean episode length
(primitive team steps) of the oracle and of the random eligible-option manager over the
same seeds, the oracle's mean path length (successful episodes), and raw env throughput.

    python benchmarks/manager_baselines.py [--seeds 100] [--env techtree_v0]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.checks import manager_rates
from gyre_ma.options.decision import Choice, Decision, Manager
from gyre_ma.rollout import Trajectory, run_episode


def _summary(trajs: Sequence[Trajectory], seconds: float) -> dict[str, Any]:
    lengths = np.array([t.length for t in trajs], dtype=float)
    won = np.array([t.length for t in trajs if t.success], dtype=float)
    return {
        "success_rate": float(np.mean([t.success for t in trajs])),
        "mean_length": round(float(lengths.mean()), 1),
        "mean_success_length": round(float(won.mean()), 1) if won.size else None,
        "episodes": len(trajs),
        "seconds": round(seconds, 2),
    }


def _rollouts(env: Any, library: Any, make_manager: Callable[[int], Manager], seeds: range):
    start = time.perf_counter()
    trajs = [run_episode(env, library, make_manager(s), seed=s) for s in seeds]
    return trajs, time.perf_counter() - start


def _raw_steps_per_s(env: Any, steps: int = 20_000) -> float:
    rng = np.random.default_rng(0)
    actions = rng.integers(0, env.action_space(env.possible_agents[0]).n, size=(steps, 8))
    env.reset(seed=0)
    start = time.perf_counter()
    for k in range(steps):
        if not env.agents:
            env.reset(seed=k)
        env.step({a: int(actions[k, j]) for j, a in enumerate(env.agents)})
    return steps / (time.perf_counter() - start)


def techtree_v0(seeds: int) -> dict[str, Any]:
    from gyre_ma.envs.techtree.options import make_library
    from gyre_ma.envs.techtree.oracle import OracleManager
    from gyre_ma.envs.techtree_v0 import parallel_env

    env = parallel_env()
    library = make_library(env.goal)
    span = range(seeds)
    oracle, t_oracle = _rollouts(env, library, lambda s: OracleManager(library), span)
    rand, t_rand = _rollouts(env, library, lambda s: RandomManager(seed=s), span)
    upkeep, t_upkeep = _rollouts(env, library, lambda s: _RandomWithUpkeep(library, s), span)
    paths = [t.length for t in oracle if t.success]

    def summary(trajs: Sequence[Trajectory], seconds: float) -> dict[str, Any]:
        out = _summary(trajs, seconds)
        # an episode that ends early without the goal ended because every agent died
        out["all_dead_rate"] = float(np.mean(
            [not t.success and t.length < env.max_cycles for t in trajs]
        ))
        out["iron_sword_rate"] = float(
            np.mean(["make_iron_sword" in t.milestone_steps for t in trajs])
        )
        return out

    return {
        "config": "default",
        "n_agents": env.config.n_agents,
        "max_cycles": env.max_cycles,
        "seeds": seeds,
        "oracle": summary(oracle, t_oracle),
        "random": summary(rand, t_rand),
        "random_with_upkeep": summary(upkeep, t_upkeep),
        "oracle_path_mean": round(float(np.mean(paths)), 1) if paths else None,
        "oracle_path_min": int(min(paths)) if paths else None,
        "raw_env_steps_per_s": round(_raw_steps_per_s(parallel_env())),
    }


class _RandomWithUpkeep:
    """Diagnostic: the oracle's upkeep reflex, otherwise uniform among eligible options —
    shows that ordering matters beyond keeping agents alive (budget, the iron trap)."""

    def __init__(self, library: Any, seed: int) -> None:
        from gyre_ma.envs.techtree.oracle import OracleManager

        self.oracle = OracleManager(library)
        self.random = RandomManager(seed=seed)
        self.index = {name: k for k, name in enumerate(library.names)}

    def decide(self, decisions: Sequence[Decision]) -> list[Choice]:
        out = []
        for d in decisions:
            upkeep = self.oracle.upkeep(d, horizon=100.0)
            out.append(Choice(self.index[upkeep]) if upkeep else self.random.decide([d])[0])
        return out


def workflow_v0(seeds: int) -> dict[str, Any]:
    """Default workflow_v0 (three agents, 480 steps): oracle vs random eligible order."""
    from gyre_ma.envs.workflow.options import make_library
    from gyre_ma.envs.workflow.oracle import OracleManager
    from gyre_ma.envs.workflow.workflow import parallel_env

    start = time.perf_counter()
    library = make_library()
    rates = manager_rates(parallel_env(), library, {"oracle": lambda _: OracleManager(library=library),
                                                    "random": lambda seed: RandomManager(seed=seed)}, seeds=seeds)
    return {"config": "default", "seeds": seeds, **rates, "seconds": round(time.perf_counter() - start, 2)}


ENVS: dict[str, Callable[[int], dict[str, Any]]] = {"techtree_v0": techtree_v0, "workflow_v0": workflow_v0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100, help="episodes per manager")
    parser.add_argument(
        "--env", action="append", choices=sorted(ENVS), help="env id(s); default: all"
    )
    args = parser.parse_args()
    results = {name: ENVS[name](args.seeds) for name in (args.env or sorted(ENVS))}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
