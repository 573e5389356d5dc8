"""Learning curves of the generalisation benchmark, per env, from its JSON files.

Reads one or more outputs of ``benchmarks/generalisation.py`` (runs of one env in several
files are pooled, e.g. run seeds 0–3 and 4–7; a run seed twice is refused) and, per env,
reads every run's curve at the same env-step points: the held-out validation success,
sampled and greedy (each iteration's validation episodes, on task seeds the run never
trains on), and the training episodes' mean length ÷ the oracle's held-out mean length.
At each point: the IQM over runs and its 95 % stratified-bootstrap interval
(:func:`gyre_ma.stats.curve_band`). Also per env: the env steps at which each run's
validation first reached 90 % sampled success, and each run's final held-out evaluation
(the benchmark's own ``--eval-episodes`` seeds). Prints one JSON object; ``--png`` draws
one panel per env.

    python benchmarks/generalisation_curves.py benchmarks/results/generalisation_outside_5seeds_trust_session43.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from gyre_ma import stats

SAMPLED, GREEDY = "validation/sampled_success", "validation/greedy_success"
FRACTIONS = (0.1, 0.25, 0.5, 0.75, 1.0)
"""Where the printed table reads the curves: these fractions of the shortest run's env steps."""


def pooled(paths: list[str]) -> dict[str, dict[str, Any]]:
    """Per env: its runs from every file (with their run seeds) and the reference policies."""
    envs: dict[str, dict[str, Any]] = {}
    for path in paths:
        result = json.loads(Path(path).read_text())
        for name, env in result["envs"].items():
            if len(env["runs"]) != len(result["seeds"]):
                raise ValueError(f"{path}: env {name!r} has {len(env['runs'])} runs for run seeds "
                                 f"{result['seeds']}; expected one run per seed")
            into = envs.setdefault(name, {"reference": env["reference"], "runs": {}, "files": []})
            into["files"].append(path)
            for seed, run in zip(result["seeds"], env["runs"], strict=True):
                if seed in into["runs"]:
                    raise ValueError(f"env {name!r}: run seed {seed} is in {path} and in an earlier file; "
                                     "pass each run once")
                into["runs"][seed] = run
    return envs


def curves(env: dict[str, Any], grid: np.ndarray) -> dict[str, np.ndarray]:
    """Each run read at ``grid`` [runs, points]: sampled and greedy validation success, and
    the training episodes' length ÷ the oracle's."""
    oracle = env["reference"]["oracle"]["mean_length"]
    out: dict[str, list[np.ndarray]] = {"sampled_success": [], "greedy_success": [], "length_ratio": []}
    for run in env["runs"].values():
        steps = np.array([p["env_steps"] for p in run["curve"]], dtype=np.float64)
        for key, metric, scale in (("sampled_success", SAMPLED, 1.0), ("greedy_success", GREEDY, 1.0),
                                   ("length_ratio", "episode_length", oracle)):
            read = stats.step_curve(steps, _values(run, metric) / scale, grid)
            read[grid > steps[-1]] = np.nan  # not beyond the run's own end
            out[key].append(read)
    return {k: np.array(v) for k, v in out.items()}


def _values(run: dict[str, Any], metric: str) -> np.ndarray:
    """``metric`` at each point of ``run``'s curve, NaN where it was not measured."""
    return np.array([math.nan if p.get(metric) is None else p[metric] for p in run["curve"]], dtype=np.float64)


def summary(env: dict[str, Any], points: int) -> tuple[dict[str, Any], np.ndarray, dict[str, tuple]]:
    """One env's printed summary, and its curves for the figure: the env-step points and,
    per curve, its (IQM, low, high) there."""
    runs = env["runs"]
    ends = [run["curve"][-1]["env_steps"] for run in runs.values()]
    grid = np.linspace(0.0, max(ends), points)
    read = curves(env, grid)
    bands = {k: stats.curve_band(v) for k, v in read.items()}
    points_at = np.array(FRACTIONS) * min(ends)
    read_at = curves(env, points_at)
    at = []
    for i, steps in enumerate(points_at):  # each point its own band (seed 0), as if read alone
        row: dict[str, Any] = {"env_steps": round(float(steps))}
        for key, m in read_at.items():
            mid, low, high = stats.curve_band(m[:, i:i + 1])
            row[key] = [round(float(x), 3) for x in (mid[0], low[0], high[0])]
        at.append(row)
    reached = [stats.steps_to_threshold([p["env_steps"] for p in run["curve"]], _values(run, SAMPLED), 0.9)
               for run in runs.values()]
    oracle = env["reference"]["oracle"]
    return {
        "files": env["files"], "run_seeds": sorted(runs), "runs": len(runs),
        "oracle": {"success": oracle["success"], "mean_length": oracle["mean_length"]},
        "random": {"success": env["reference"]["random"]["success"],
                   "length_ratio": round(env["reference"]["random"]["mean_length"] / oracle["mean_length"], 3)},
        "env_steps_per_run": [round(e) for e in ends],
        "at": at,
        "steps_to_sampled_0.9": {"per_run": [None if math.isinf(s) else round(s) for s in reached],
                                 "iqm": _interval(reached)},
        "final_heldout": {mode: {"success": [run[mode]["success"] for run in runs.values()],
                                 "length_ratio": [round(run[mode]["mean_length"] / oracle["mean_length"], 3)
                                                  for run in runs.values()]}
                          for mode in ("sampled", "greedy")},
    }, grid, bands


def _interval(values: list[float]) -> list[float | None]:
    got = stats.stratified_bootstrap(np.array(values), stats.iqm, reps=2000, seed=0)
    return [None if math.isinf(x) else round(x) for x in (got.estimate, got.low, got.high)]


def plot(summaries: dict[str, tuple[dict[str, Any], np.ndarray, dict[str, tuple]]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    names = list(summaries)
    fig, axes = plt.subplots(2, len(names), figsize=(3.6 * len(names), 5.6), squeeze=False, sharex="col")
    for col, name in enumerate(names):
        s, grid, bands = summaries[name]
        top, bottom = axes[0][col], axes[1][col]
        for key, label, color in (("sampled_success", "sampled", "C0"), ("greedy_success", "greedy", "C1")):
            mid, low, high = bands[key]
            top.plot(grid, mid, color=color, label=label)
            top.fill_between(grid, low, high, color=color, alpha=0.2, linewidth=0)
        top.axhline(s["oracle"]["success"], color="black", lw=0.8, label="oracle")
        top.axhline(s["random"]["success"], color="grey", lw=0.8, ls=":", label="random order")
        top.set_title(f"{name} ({s['runs']} runs)", fontsize=9)
        top.set_ylim(-0.05, 1.05)
        mid, low, high = bands["length_ratio"]
        bottom.plot(grid, mid, color="C2", label="training episodes")
        bottom.fill_between(grid, low, high, color="C2", alpha=0.2, linewidth=0)
        bottom.axhline(1.2, color="black", lw=0.8, ls="--", label="target (sampled)")
        bottom.axhline(s["random"]["length_ratio"], color="grey", lw=0.8, ls=":", label="random order")
        bottom.set_xlabel("env steps")
        bottom.xaxis.set_major_locator(MaxNLocator(4))
        bottom.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1000:g}k"))
        bottom.set_ylim(0.9, max(2.0, s["random"]["length_ratio"] + 0.1))
    axes[0][0].set_ylabel("held-out validation success (IQM)")
    axes[1][0].set_ylabel("episode length ÷ oracle's (IQM)")
    axes[0][0].legend(fontsize=6)
    axes[1][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="generalisation.py outputs (JSON)")
    parser.add_argument("--points", type=int, default=60, help="env-step points per curve (the figure's)")
    parser.add_argument("--png", default=None, help="draw the curves here, one column per env")
    args = parser.parse_args()
    summaries = {name: summary(env, args.points) for name, env in pooled(args.files).items()}
    if args.png:
        plot(summaries, args.png)
    print(json.dumps({"benchmark": "generalisation_curves", "fractions": FRACTIONS, "png": args.png,
                      "envs": {name: s for name, (s, _, _) in summaries.items()}}))


if __name__ == "__main__":
    main()
