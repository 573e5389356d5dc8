"""Env steps to verified success: manager (milestone-anchored credit) vs manager (plain
GAE) vs flat PPO in the framework vs Stable-Baselines3 PPO, with random and oracle bounds.

On the default tech-tree task (2 agents, oracle path ≥ 1,000 primitive steps) and on its
one-agent variant (where SB3, a single-agent library, runs through ``to_gymnasium``).
Every learner sees the same environment and the same verified milestone rewards.
Prints one JSON object; writes a PNG of the learning curves (``--png``).

    python benchmarks/sample_efficiency.py --seeds 3 --iterations 30 --variants milestone,plain --jobs 2
    python benchmarks/sample_efficiency.py --seeds 3 --iterations 30 --variants one_agent,sb3 --jobs 2
    python benchmarks/sample_efficiency.py --seeds 3 --variants flat --flat-budget 1.1e7 --jobs 2 --progress-dir runs/se
    python benchmarks/sample_efficiency.py --seeds 20 --first-seed 10 --iterations 30 --variants milestone,plain \
        --stop-at 0.9 --eval-episodes 0 --jobs 2

Flat PPO plays ~2.4k env steps/s per core here (every agent decides every step), SB3 on 16
envs ~10k: 10x a 1M-step manager budget is about 75 minutes per flat seed.

Managers train with the framework's defaults for the roles but without exploration noise
(parameter noise slowed learning on this task; see ``benchmarks/noise_ablation.py``), with
checkpoints and rollback on. The milestone-credit managers judge outcomes with
``credit.outcome_length_weight`` = ``--outcome-length-weight`` (0.5: a faster verified
success is the better outcome) and spread them with ``credit.outcome_credit`` =
``--outcome-credit`` (anchored at milestones by default) at the blend weight
``credit.outcome_weight`` = ``--outcome-weight`` (the config's default when not given: 1
for anchored, 0.5 for episode); plain GAE uses no outcome. Each learned manager is finally
evaluated on ``--eval-episodes`` held-out task seeds. The oracle's path length, the
reference for the "learned length ≤ 1.2× oracle" target, is the oracle's on the library
without danger interrupts or the danger gate on jobs (its fastest: they only make it stop
for upkeep earlier); the oracle on the managers' own library is reported beside it
(``oracle_library``).
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

from gyre_ma.config import parse_config
from gyre_ma.envs.registry import make_env, make_library, make_oracle
from gyre_ma.loop import Gyre
from gyre_ma.rollout import run_episode

ENV = {"id": "techtree_v0", "kwargs": {"milestone_rewards": True}}
TRAIN = {"episodes_per_iteration": 16, "minibatch_size": 256, "epochs": 4, "lr": 1e-3,
         "lr_schedule": "linear", "lr_final": 0.1, "entropy_coef": 0.003}


FLAT_TRAIN = {"minibatch_size": 2048, "entropy_coef": 0.01}
"""Flat PPO: one sample per agent per step, so larger minibatches (the same 4 epochs), and
more entropy for exploration over primitive actions."""


def config(name: str, seed: int, iterations: int, n_agents: int, **sections: Any) -> Any:
    env = {"id": ENV["id"], "kwargs": {**ENV["kwargs"], "n_agents": n_agents}}
    return parse_config({
        "name": name, "seed": seed, "env": env, "manager": {"hidden": 64},
        "credit": {"gamma": 0.995, "lam": 0.95, **sections.pop("credit", {})},
        "train": {**TRAIN, "iterations": iterations, **sections.pop("train", {})},
        "roles": {"explorers": 0, "executors": 4, "evaluators": 0, "executor_noise": {"kind": "none"}},
        "checkpoints": {"enabled": True}, "monitor": {"spot_checks": 0},
        "run_root": tempfile.mkdtemp(prefix="gyre-sample-efficiency-"), **sections,
    })


def steps_to(curve: list[tuple[float, float]], level: float) -> float | None:
    return next((steps for steps, rate in curve if rate >= level), None)


def run_gyre(cfg: Any, budget_steps: float | None = None, eval_episodes: int = 0,
             progress: str | None = None, stop_at: float | None = None) -> dict[str, Any]:
    """Train ``cfg`` for its iterations (or until ``budget_steps``, or until a batch's success
    rate reaches ``stop_at``); ``progress``: a JSON file rewritten every 10 iterations with the
    curves so far (a long run killed early keeps them)."""
    import torch

    from gyre_ma.roles import RolloutTask

    torch.set_num_threads(1)  # one process per core: --jobs runs side by side without oversubscribing
    gyre = Gyre(cfg)
    curve, lengths, rewards = [], [], []
    start = time.perf_counter()
    for i in range(cfg.train.iterations):
        m = gyre.iteration(i)
        curve.append((m["env_steps"], m["success_rate"]))
        lengths.append(m["episode_length"])
        rewards.append(m["episode_reward"])
        done = ((budget_steps is not None and m["env_steps"] >= budget_steps)
                or (stop_at is not None and m["success_rate"] >= stop_at))
        if progress and (i % 10 == 9 or done):
            with open(progress, "w") as f:
                json.dump({"name": cfg.name, "seed": cfg.seed, "curve": curve, "episode_reward": rewards,
                           "seconds": round(time.perf_counter() - start, 1)}, f)
        if done:
            break
    tail = [r for _, r in curve[-5:]]
    out = {"curve": curve, "episode_reward": rewards, "final_success": float(np.mean(tail)),
           "steps_to_90": steps_to(curve, 0.9),
           "steps_to_95": steps_to(curve, 0.95), "env_steps": curve[-1][0],
           "episode_length_last": float(np.mean(lengths[-5:])), "seconds": round(time.perf_counter() - start, 1)}
    if eval_episodes:  # the final policy on held-out task seeds: sampled (no noise), and greedy
        for key, greedy in (("eval", False), ("eval_greedy", True)):
            tasks = [RolloutTask("executor", 900_000 + k, greedy=greedy) for k in range(eval_episodes)]
            trajs = gyre.backend.collect(gyre.weights(), gyre.version, tasks)
            out[f"{key}_success"] = float(np.mean([t.success for t in trajs]))
            won = [t.length for t in trajs if t.success]
            out[f"{key}_success_length"] = float(np.mean(won)) if won else None
    gyre.close()
    return out


def run_fixed(kind: str, n_agents: int, episodes: int) -> dict[str, Any]:
    """``oracle``: the oracle on the library without danger interrupts or gate (its fastest,
    the length target's reference); ``oracle_library``: the oracle on the library the managers
    learn on; ``random``: a random eligible order."""
    from gyre_ma.agents.baselines import RandomManager
    from gyre_ma.envs.techtree import make_library as techtree_library

    env = make_env(ENV["id"], **ENV["kwargs"], n_agents=n_agents)
    library = (techtree_library(env=env, yield_in_danger=False, jobs_in_danger=True) if kind == "oracle"
               else make_library(ENV["id"], env))
    manager = RandomManager(0) if kind == "random" else make_oracle(ENV["id"], env, library)
    trajs = [run_episode(env, library, manager, seed=10_000 + s) for s in range(episodes)]
    return {"success": float(np.mean([t.success for t in trajs])),
            "episode_length": float(np.mean([t.length for t in trajs]))}


SB3 = {"n_envs": 16, "n_steps": 256, "batch_size": 512, "n_epochs": 4, "gamma": 0.995, "ent_coef": 0.01}
"""Stable-Baselines3 PPO: 16 envs × 256 steps per update (SB3's default 2048-step update, 1 env,
batch 64 × 10 epochs, plays ~0.9k steps/s here, 16 envs ~13k), the managers' γ, and an
entropy bonus (SB3's default is none) to give flat exploration its best chance."""


def run_sb3(seed: int, budget_steps: int, n_eval: int = 20) -> dict[str, Any]:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    from gyre_ma.envs.adapters import to_gymnasium

    torch.set_num_threads(1)  # one process per core, as the framework's runs

    def view() -> Any:
        return to_gymnasium(make_env(ENV["id"], **ENV["kwargs"], n_agents=1))

    class Curve(BaseCallback):
        """Verified success and return (``Monitor``'s) of the episodes that ended in each rollout."""

        def __init__(self) -> None:
            super().__init__()
            self.points: list[tuple[float, float]] = []
            self.rewards: list[float] = []
            self.ended: list[tuple[bool, float]] = []

        def _on_step(self) -> bool:
            for done, info in zip(self.locals["dones"], self.locals["infos"], strict=True):
                if done:
                    self.ended.append((bool(info["success"]), float(info["episode"]["r"])))
            return True

        def _on_rollout_end(self) -> None:
            if self.ended:
                success, reward = zip(*self.ended, strict=True)
                self.points.append((float(self.num_timesteps), float(np.mean(success))))
                self.rewards.append(float(np.mean(reward)))
                self.ended = []

    hyper = dict(SB3)
    env = make_vec_env(view, n_envs=hyper.pop("n_envs"), seed=seed)
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **hyper)
    curve = Curve()
    start = time.perf_counter()
    model.learn(total_timesteps=budget_steps, callback=curve)
    single = view()
    successes = 0
    for k in range(n_eval):  # held-out task seeds, sampled actions
        obs, info = single.reset(seed=20_000 + k)
        done = False
        while not done:
            action, _ = model.predict(obs, deterministic=False)
            obs, _, terminated, truncated, info = single.step(int(action))
            done = terminated or truncated
        successes += info["success"]
    tail = [rate for _, rate in curve.points[-5:]]
    return {"curve": curve.points, "episode_reward": curve.rewards,
            "final_success": float(np.mean(tail)) if tail else 0.0,
            "eval_success": successes / n_eval, "steps_to_90": steps_to(curve.points, 0.9),
            "env_steps": float(model.num_timesteps), "hyperparameters": SB3,
            "seconds": round(time.perf_counter() - start, 1)}


VARIANTS = ("milestone", "plain", "flat", "one_agent", "sb3")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="runs per learner")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="the runs use seeds first-seed .. first-seed + seeds - 1 (to finish one seed alone)")
    parser.add_argument("--iterations", type=int, default=200, help="manager iterations per run")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="which learners, of: milestone, plain (the two-agent managers), flat (flat PPO in "
                             "the framework), one_agent (the one-agent manager), sb3 (Stable-Baselines3 PPO "
                             "on the one-agent task)")
    parser.add_argument("--flat-multiplier", type=float, default=10.0,
                        help="flat-PPO (SB3) budget ÷ the two-agent (one-agent) milestone manager's env steps")
    parser.add_argument("--flat-budget", type=float, default=None,
                        help="flat-PPO and SB3 env steps per run, instead of the multiplier "
                             "(where 10x is out of reach)")
    parser.add_argument("--outcome-length-weight", type=float, default=0.5,
                        help="credit.outcome_length_weight of the milestone-credit managers (0: success alone)")
    parser.add_argument("--outcome-credit", choices=("anchored", "episode"), default="anchored",
                        help="credit.outcome_credit of the milestone-credit managers: the outcome anchored at "
                             "milestones, or every call its episode's group-normalised advantage")
    parser.add_argument("--outcome-weight", type=float, default=None,
                        help="credit.outcome_weight of the milestone-credit managers (default: the config's, "
                             "1 for anchored credit, 0.5 for episode)")
    parser.add_argument("--stop-at", type=float, default=None,
                        help="stop each manager run at its first batch with this success rate (steps to it "
                             "only; use with --eval-episodes 0)")
    parser.add_argument("--png", default="sample_efficiency.png")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes)")
    parser.add_argument("--eval-episodes", type=int, default=40)
    parser.add_argument("--progress-dir", default=None,
                        help="each framework run rewrites <dir>/<name>_seed<k>.json every 10 iterations")
    args = parser.parse_args()
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {unknown}; expected some of {list(VARIANTS)}")
    if args.flat_budget is None and "flat" in chosen and "milestone" not in chosen:
        parser.error("--variants: flat takes its budget from the milestone manager; add it or give --flat-budget")
    if args.flat_budget is None and "sb3" in chosen and "one_agent" not in chosen:
        parser.error("--variants: sb3 takes its budget from the one-agent manager; add one_agent or give --flat-budget")
    if args.progress_dir:
        os.makedirs(args.progress_dir, exist_ok=True)
    pool = ProcessPoolExecutor(args.jobs)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    out: dict[str, Any] = {"benchmark": "sample_efficiency", "env": ENV, "seeds": list(seeds),
                           "iterations": args.iterations, "variants": chosen,
                           "outcome_length_weight": args.outcome_length_weight,
                           "outcome_credit": args.outcome_credit, "outcome_weight": args.outcome_weight,
                           "stop_at": args.stop_at, "runs": {}}
    out["oracle"] = run_fixed("oracle", 2, 20)
    out["oracle_library"] = run_fixed("oracle_library", 2, 20)
    out["random"] = run_fixed("random", 2, 20)
    if "one_agent" in chosen or "sb3" in chosen:
        out["oracle_one_agent"] = run_fixed("oracle", 1, 20)
        out["random_one_agent"] = run_fixed("random", 1, 20)
    managers = {"milestone": ("manager_milestone", 2, "blend"), "plain": ("manager_plain_gae", 2, "plain"),
                "one_agent": ("one_agent_manager_milestone", 1, "blend")}

    def progress(name: str, seed: int) -> str | None:
        return f"{args.progress_dir}/{name}_seed{seed}.json" if args.progress_dir else None

    def credit(mode: str) -> dict[str, Any]:
        blend = {"outcome_length_weight": args.outcome_length_weight, "outcome_credit": args.outcome_credit,
                 "outcome_weight": args.outcome_weight}
        return {"mode": mode} | (blend if mode == "blend" else {})

    futures = {name: [pool.submit(run_gyre, config(name, s, args.iterations, n_agents, credit=credit(mode)),
                                  eval_episodes=args.eval_episodes, progress=progress(name, s),
                                  stop_at=args.stop_at)
                      for s in seeds]
               for variant, (name, n_agents, mode) in managers.items() if variant in chosen}

    def budget(runs_of: str) -> float:
        if args.flat_budget is not None:
            return float(args.flat_budget)
        return args.flat_multiplier * float(np.mean([f.result()["env_steps"] for f in futures[runs_of]]))

    if "flat" in chosen:
        flat_budget = budget("manager_milestone")
        out["flat_budget"] = flat_budget
        futures["flat_ppo"] = [
            pool.submit(run_gyre, config("flat", s, 10**6, 2, manager={"kind": "flat", "hidden": 64},
                                         credit={"mode": "plain"}, train=FLAT_TRAIN), flat_budget,
                        progress=progress("flat_ppo", s))
            for s in seeds]
    if "sb3" in chosen:
        sb3_budget = int(budget("one_agent_manager_milestone"))
        out["sb3_budget"] = sb3_budget
        futures["one_agent_sb3_ppo"] = [pool.submit(run_sb3, s, sb3_budget) for s in seeds]
    for name, runs in futures.items():
        out["runs"][name] = [f.result() for f in runs]
    out["summary"] = {
        name: {"final_success_mean": float(np.mean([r["final_success"] for r in runs])),
               "eval_success": [r.get("eval_success") for r in runs],
               "eval_greedy_success": [r.get("eval_greedy_success") for r in runs],
               "steps_to_90": [r.get("steps_to_90") for r in runs],
               "steps_to_95": [r.get("steps_to_95") for r in runs],
               "env_steps_mean": float(np.mean([r["env_steps"] for r in runs]))}
        for name, runs in out["runs"].items()}
    if "manager_milestone" in out["runs"]:
        _compare(out)
    pool.shutdown()
    plot(out, args.png)
    print(json.dumps(out))


def _compare(out: dict[str, Any]) -> None:
    """The targets: the learned length over the oracle's; milestone over plain steps to
    90 %; the flat learners' budgets over their manager's env steps."""
    summary = out["summary"]
    for name, manager in (("flat_ppo", "manager_milestone"), ("one_agent_sb3_ppo", "one_agent_manager_milestone")):
        if name in summary and manager in summary:
            summary[name]["budget_over_manager_env_steps"] = (
                summary[name]["env_steps_mean"] / summary[manager]["env_steps_mean"])
    for key in ("eval", "eval_greedy"):  # mean length of the learned manager's successful episodes
        learned = [r[f"{key}_success_length"] for r in out["runs"]["manager_milestone"]
                   if r.get(f"{key}_success_length")]
        for ref in ("oracle", "oracle_library"):
            summary[f"learned_length_over_{ref}_{key}"] = (
                float(np.mean(learned)) / out[ref]["episode_length"] if learned and ref in out else None)
    if "manager_plain_gae" not in out["runs"]:
        return
    milestone = [r.get("steps_to_90") for r in out["runs"]["manager_milestone"]]
    plain = [r.get("steps_to_90") for r in out["runs"]["manager_plain_gae"]]
    if None not in milestone:  # a plain-GAE run that never got there counts as its whole budget (a bound)
        plain_bound = [p if p is not None else r["env_steps"]
                       for p, r in zip(plain, out["runs"]["manager_plain_gae"], strict=True)]
        summary["milestone_over_plain_steps_to_90"] = float(np.median(milestone) / np.median(plain_bound))
        summary["plain_runs_not_reaching_90"] = plain.count(None)


def plot(out: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for (name, runs), colour in zip(out["runs"].items(), plt.cm.tab10.colors, strict=False):
        for k, run in enumerate(runs):
            if "curve" in run:
                steps, rates = zip(*run["curve"], strict=True)
                ax.plot(steps, rates, color=colour, alpha=0.8, label=name if k == 0 else None)
    ax.axhline(out["oracle"]["success"], color="black", linestyle="--", label="oracle")
    ax.axhline(0.95, color="red", linestyle=":", linewidth=0.8, label="target 95 %")
    ax.axhline(out["random"]["success"], color="grey", linestyle=":", label="random eligible order, 2 agents")
    if "random_one_agent" in out:
        ax.axhline(out["random_one_agent"]["success"], color="grey", linestyle="-.",
                   label="random eligible order, 1 agent")
    ax.set_xlabel("env steps")
    ax.set_ylabel("verified success rate")
    ax.set_xscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
