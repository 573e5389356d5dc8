"""``gyre-ma report EXP_DIR``: an experiment folder → Markdown, PNGs, a CSV of every run.

Per variant: held-out evaluation (sampled and greedy), steps to each threshold, the final
value of each reported metric — each as mean and interquartile mean with 95 %
stratified-bootstrap intervals (:mod:`gyre_ma.stats`) — the probability that one variant
improves on another, and learning curves (IQM over runs against env steps, with an
interval band). Only runs that finished their held-out evaluation enter the tables; the
others are counted as missing, so a report of a half-run experiment says so.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from gyre_ma import stats
from gyre_ma.experiment import EVAL_FILE, ExperimentSpec, counted, flatten_overrides, grid, run_state
from gyre_ma.files import write_json, write_text
from gyre_ma.monitor import read_metrics

STEPS = "env_steps"
_SMOOTHED = " (centred mean of {})"
"""The suffix of a threshold read off the smoothed curve (``report.smooth``)."""
_CURVE_POINTS = 60
_CURVE_REPS = 300


@dataclass
class RunResult:
    variant: str
    seed: int
    state: str
    metrics: dict[str, np.ndarray]
    evaluation: dict[str, Any] | None

    @property
    def name(self) -> str:
        return f"{self.variant}-s{self.seed}"

    def measured(self, key: str) -> bool:
        """Whether the run logged ``key`` at least once (a manager that learns nothing plays
        no validation episodes: its ``validation/*`` columns are empty or absent)."""
        values = self.metrics.get(key)
        return values is not None and not np.isnan(values).all()

    def final(self, key: str) -> float:
        """The last measured value of ``key`` (NaN if never measured)."""
        values = self.metrics.get(key)
        if values is None:
            return math.nan
        seen = values[~np.isnan(values)]
        return float(seen[-1]) if seen.size else math.nan

    def first_step(self, key: str) -> float:
        """Env steps at the first measurement of ``key`` (NaN if never measured)."""
        if key not in self.metrics or STEPS not in self.metrics:
            return math.nan
        seen = np.flatnonzero(~np.isnan(self.metrics[key]))
        return float(self.metrics[STEPS][seen[0]]) if seen.size else math.nan

    def steps_to(self, key: str, level: float, window: int = 1, at_most: bool = False) -> float:
        """Env steps at which ``key`` first reached ``level`` (rose to it, or with ``at_most``
        fell to it), on the curve smoothed over ``window`` measured iterations (1: as
        logged); ``inf`` if it never did; NaN if the run never measured ``key`` (a manager
        that learns nothing plays no validation episodes), so that it is left out rather
        than counted as never reaching the level."""
        if STEPS not in self.metrics or not self.measured(key):
            return math.nan
        return stats.steps_to_threshold(self.metrics[STEPS], stats.centred_mean(self.metrics[key], window), level,
                                        at_most=at_most)


def thresholds(spec: ExperimentSpec) -> list[tuple[str, str, float, int, bool]]:
    """Each steps-to-threshold the report gives, as (label, metric, level, window, at_most):
    every threshold on the logged curve and, with ``report.smooth`` > 1, on the smoothed one."""
    windows = [1] + ([spec.report.smooth] if spec.report.smooth > 1 else [])
    out = []
    for key, bound in spec.report.thresholds.items():
        at_most = not isinstance(bound, (int, float))
        level = float(bound.at_most if at_most else bound)
        out += [(f"{key}{'<=' if at_most else '>='}{level:g}" + (_SMOOTHED.format(w) if w > 1 else ""), key, level,
                 w, at_most) for w in windows]
    return out


def load_spec(folder: Path) -> ExperimentSpec:
    path = folder / "experiment.yaml"
    if not path.is_file():
        raise ValueError(f"{str(folder)!r} is not an experiment folder (no experiment.yaml); pass the folder "
                         "gyre-ma experiment wrote (<root>/<name>)")
    try:
        return ExperimentSpec.model_validate(yaml.safe_load(path.read_text()))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ValueError(f"{str(path)!r} is damaged: not the YAML gyre-ma experiment wrote ("
                         f"{' '.join(str(exc).split())[:200]})") from None


def collect(folder: Path, spec: ExperimentSpec) -> list[RunResult]:
    """Every (variant, seed) of the spec, with what its run directory holds so far."""
    import json

    out = []
    for variant in spec.variants:
        for seed in spec.seed_list:
            run_dir = folder / "runs" / f"{variant}-s{seed}"
            metrics = read_metrics(run_dir / "metrics.csv") if (run_dir / "metrics.csv").is_file() else {}
            evaluation = None
            if (run_dir / EVAL_FILE).is_file():
                try:
                    evaluation = json.loads((run_dir / EVAL_FILE).read_text())
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    raise ValueError(f"{str(run_dir / EVAL_FILE)!r} is damaged ({exc}); delete it and rerun the "
                                     "experiment to evaluate that run again") from None
            out.append(RunResult(variant, seed, run_state(run_dir), metrics, evaluation))
    return out


def _interval(values: Sequence[float], reps: int, seed: int) -> dict[str, Any]:
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return {"n": 0}
    m = stats.stratified_bootstrap(x, stats.mean, reps=reps, seed=seed)
    q = stats.stratified_bootstrap(x, stats.iqm, reps=reps, seed=seed)
    return {"n": int(x.size), "mean": m.as_dict(), "iqm": q.as_dict()}


def summarize(spec: ExperimentSpec, runs: list[RunResult], *, reps: int) -> dict[str, Any]:
    """The report's numbers (also written as ``report.json``) for the ``runs`` of ``spec``
    (:func:`collect`)."""
    done = [r for r in runs if r.state == "done"]
    marks = thresholds(spec)
    # per run, the env steps at each threshold (in ``marks`` order), read off its curves once
    reached = {r.name: [r.steps_to(key, level, window, at_most) for _, key, level, window, at_most in marks]
               for r in runs}
    by_variant = {v: [r for r in done if r.variant == v] for v in spec.variants}

    def measured(rs: list[RunResult], k: int) -> list[tuple[float, RunResult]]:
        """The runs of ``rs`` that measured threshold ``k``'s metric, with their steps to it."""
        return [(reached[r.name][k], r) for r in rs if not math.isnan(reached[r.name][k])]

    out: dict[str, Any] = {"name": spec.name, "runs": len(runs), "done": len(done), "reps": reps,
                           "variants": {}, "improvement": {}}
    for i, (variant, rs) in enumerate(by_variant.items()):
        entry: dict[str, Any] = {"runs": len(rs), "missing": [r.name for r in runs
                                                              if r.variant == variant and r.state != "done"]}
        for mode in ("sampled", "greedy"):
            entry[f"heldout_{mode}"] = _interval([r.evaluation[mode]["success"] for r in rs if r.evaluation.get(mode)],
                                                 reps, i)
            entry[f"heldout_{mode}_steps_to_goal"] = _interval(_steps_to_goal(rs, mode), reps, i)
        entry["learns"] = not rs or any(r.evaluation.get("learns", True) for r in rs)
        entry["env_steps"] = _interval([r.final(STEPS) for r in rs], reps, i)
        entry["final"] = {key: _interval([v for r in rs if not math.isnan(v := r.final(key))], reps, i)
                          for key in spec.report.metrics}
        entry["steps_to"] = {}
        for k, (label, key, *_) in enumerate(marks):
            pairs = measured(rs, k)
            steps = [x for x, _ in pairs]
            entry["steps_to"][label] = _interval(steps, reps, i) | {
                "reached": int(sum(math.isfinite(s) for s in steps)), "median": _finite(np.median(steps))
                if steps else None, "unmeasured": len(rs) - len(pairs),
                "at_first": int(sum(x == r.first_step(key) for x, r in pairs))}
        out["variants"][variant] = entry
    names = [v for v, rs in by_variant.items() if rs]
    for a in names:
        for b in names:
            if a == b:
                continue
            xa = [r.evaluation["sampled"]["success"] for r in by_variant[a]]
            xb = [r.evaluation["sampled"]["success"] for r in by_variant[b]]
            pair: dict[str, Any] = {"heldout_sampled": stats.improvement_interval(xa, xb, reps=reps).as_dict()}
            la, lb = _steps_to_goal(by_variant[a], "sampled"), _steps_to_goal(by_variant[b], "sampled")
            if la and lb:  # shorter held-out paths are better: compare negated
                pair["heldout_sampled steps_to_goal"] = stats.improvement_interval(
                    [-x for x in la], [-x for x in lb], reps=reps).as_dict()
            for k, (label, *_) in enumerate(marks):  # fewer steps is better: compare negated
                sa = [-x for x, _ in measured(by_variant[a], k)]
                sb = [-x for x, _ in measured(by_variant[b], k)]
                if sa and sb:  # a variant whose runs never measure the metric is compared on nothing
                    pair[f"steps_to {label}"] = stats.improvement_interval(sa, sb, reps=reps).as_dict()
            out["improvement"][f"{a} > {b}"] = pair
    out["table"] = [_row(r, spec, dict(zip((label for label, *_ in marks), reached[r.name]))) for r in runs]
    return out


def _steps_to_goal(runs: Sequence[RunResult], mode: str) -> list[float]:
    """Each run's held-out mean length of its successful episodes (runs with none left out)."""
    return [float(v) for r in runs if (v := (r.evaluation.get(mode) or {}).get("steps_to_goal")) is not None]


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _row(r: RunResult, spec: ExperimentSpec, steps_to: dict[str, float]) -> dict[str, Any]:
    row: dict[str, Any] = {"variant": r.variant, "seed": r.seed, "state": r.state,
                           "iterations": int(len(r.metrics.get(STEPS, []))), "env_steps": _finite(r.final(STEPS))}
    for key in spec.report.metrics:
        row[f"final {key}"] = None if math.isnan(v := r.final(key)) else v
    for label, steps in steps_to.items():
        row[f"steps_to {label}"] = _finite(steps)
    for mode in ("sampled", "greedy"):
        ev = (r.evaluation or {}).get(mode) or {}
        row[f"heldout {mode} success"] = ev.get("success")
        row[f"heldout {mode} steps_to_goal"] = ev.get("steps_to_goal")
    return row


# ---------------------------------------------------------------------------- writing
def write_report(folder: str | Path, *, reps: int | None = None) -> Path:
    """``report/report.md`` (+ ``report.json``, ``runs.csv``, PNGs) in the experiment folder."""
    folder = Path(folder)
    spec = load_spec(folder)
    runs = collect(folder, spec)  # every run's files, read once
    _check_metric_names(spec, runs)
    summary = summarize(spec, runs, reps=reps or spec.report.reps)
    named = {r.name for r in runs}
    summary["foreign"] = sorted(d.name for d in (folder / "runs").iterdir()
                                if d.is_dir() and d.name not in named) if (folder / "runs").is_dir() else []
    out = folder / "report"
    out.mkdir(exist_ok=True)
    write_json(out / "report.json", summary)
    write_text(out / "runs.csv", _csv(summary["table"]))
    figures = _plots(spec, runs, out)
    write_text(out / "report.md", _markdown(spec, summary, figures))
    return out / "report.md"


def _check_metric_names(spec: ExperimentSpec, runs: list[RunResult]) -> None:
    """A reported metric or threshold no run logged is a misspelt name: one error listing
    what the runs log (it read "0/2 reached, ∞", as if the runs had failed)."""
    logged = set().union(*(r.metrics for r in runs))
    if not logged:
        return  # nothing run yet: nothing to judge the names by
    unknown = [k for k in (*spec.report.metrics, *spec.report.thresholds) if k not in logged]
    if unknown:
        known, key = sorted(logged), unknown[0]
        where = "metrics" if key in spec.report.metrics else "thresholds"
        raise ValueError(f"report.{where}: metric {key!r} is not logged by any run; the runs log "
                         f"{known[:60]}{' …' if len(known) > 60 else ''}")


def _csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    if rows:
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in rows)
    return buf.getvalue()


def _fmt(cell: dict[str, Any] | None, kind: str, digits: int = 3, scale: str = "") -> str:
    if not cell or not cell.get("n"):
        return "—"
    c = cell[kind]

    def num(v: float | None) -> str:
        if v is None:
            return "∞"
        return _steps(v) if scale == "k" else f"{v:.{digits}g}"

    return f"{num(c['estimate'])} [{num(c['low'])}, {num(c['high'])}]"


def _steps(v: float) -> str:
    """An env-step count, short: 950, 12.3k, 1.25M."""
    return f"{v / 1e6:.3g}M" if v >= 1e6 else f"{v / 1e3:.3g}k" if v >= 1e4 else f"{v:.0f}"


def _budget(spec: ExperimentSpec) -> str:
    """The runs' budget: the experiment's iterations, and each variant's own where it sets one."""
    own = []
    for name, overrides in spec.variants.items():
        sets = flatten_overrides(overrides, f"variants.{name}")
        if "sb3.env_steps" in sets:
            own.append(f"{name}: {_steps(float(sets['sb3.env_steps']))} SB3 env steps")
        elif "train.iterations" in sets:
            own.append(f"{name}: {sets['train.iterations']} iterations")
    return f"{spec.budget.iterations} iterations each" + (f" ({'; '.join(own)})" if own else "")


FEW_RUNS = 5
"""Fewest runs per variant whose intervals the report presents without a warning."""


def _markdown(spec: ExperimentSpec, s: dict[str, Any], figures: list[str]) -> str:
    e = spec.evaluation
    lines = [f"# Experiment `{spec.name}`", "",
             f"Base config `{spec.base}`; {grid(spec)}, {_budget(spec)}. {s['done']} of {s['runs']} runs finished and "
             "evaluated.",
             "Every interval is a 95 % stratified-bootstrap interval over runs "
             f"({s['reps']} resamples; Agarwal et al. 2021). IQM: interquartile mean over runs"
             + (" (with fewer than 4 runs a variant's IQM is its mean)." if len(spec.seed_list) < 4 else "."), ""]
    fewest = min((d["runs"] for d in s["variants"].values() if d["runs"]), default=0)
    if 0 < fewest < FEW_RUNS:
        lines += [f"**Few runs: {fewest} in the smallest variant.** A bootstrap interval over so few runs is no wider "
                  "than their own scatter, so it looks precise without being so (with 2 runs a side, a probability "
                  "of improvement of 1.00 [1.00, 1.00] says only that both runs of one variant beat both of the "
                  f"other's). Read these figures as anecdotes; for intervals, run {FEW_RUNS} or more seeds a variant "
                  "(Agarwal et al. use 10 or more).", ""]
    if s.get("foreign"):
        lines += [f"**Runs in this folder that `experiment.yaml` does not name (left out; another experiment file of "
                  f"the same name wrote them):** {', '.join(s['foreign'])}", ""]
    missing = {v: d["missing"] for v, d in s["variants"].items() if d["missing"]}
    if missing:
        lines += ["**Not finished (left out of every table):** "
                  + "; ".join(f"{v}: {', '.join(m)}" for v, m in missing.items()), ""]
    lines += [f"## Held-out evaluation ({e.episodes} episodes per run, task seeds from {e.seed}, "
              f"{e.checkpoint} policy)", "",
              "| variant | runs | sampled success: mean | IQM | greedy success: mean | IQM "
              "| training env steps (mean) |",
              "|---|---|---|---|---|---|---|"]
    for v, d in s["variants"].items():
        lines.append(f"| {v} | {d['runs']} | {_fmt(d['heldout_sampled'], 'mean')} | {_fmt(d['heldout_sampled'], 'iqm')}"
                     f" | {_fmt(d['heldout_greedy'], 'mean')} | {_fmt(d['heldout_greedy'], 'iqm')}"
                     f" | {_fmt(d['env_steps'], 'mean', scale='k')} |")
    fixed = [v for v, d in s["variants"].items() if not d["learns"]]
    if fixed:
        lines += ["", f"{', '.join(f'`{v}`' for v in fixed)}: the manager learns nothing, so each run plays the same "
                  "held-out task seeds the same way (in a deterministic env, the same episodes: an interval of no "
                  "width says so, not precision), sampled only: it has no greedy choice."]
    lines += ["", "Held-out steps to the goal (each run's mean over its successful episodes; fewer is better):", "",
              "| variant | runs | sampled: mean | IQM | greedy: mean | IQM |", "|---|---|---|---|---|---|"]
    for v, d in s["variants"].items():
        sampled, greedy = d["heldout_sampled_steps_to_goal"], d["heldout_greedy_steps_to_goal"]
        lines.append(f"| {v} | {sampled.get('n', 0)} | {_fmt(sampled, 'mean', 4)} | {_fmt(sampled, 'iqm', 4)}"
                     f" | {_fmt(greedy, 'mean', 4)} | {_fmt(greedy, 'iqm', 4)} |")
    if spec.report.thresholds:
        lines += ["", "## Env steps to threshold", "",
                  "A run that never reached the level counts as ∞ steps (so an IQM that includes it is ∞)."
                  + (f" A level marked \"{_SMOOTHED.format(spec.report.smooth).strip()}\" is read off each run's "
                     f"curve averaged over {spec.report.smooth} measured iterations centred on each point, so that a "
                     "few lucky held-out episodes do not count as reaching it." if spec.report.smooth > 1 else ""), "",
                  "| threshold | variant | reached | at the first measurement | IQM | mean | median |",
                  "|---|---|---|---|---|---|---|"]
        for key in s["variants"][next(iter(s["variants"]))]["steps_to"]:
            for v, d in s["variants"].items():
                c = d["steps_to"][key]
                med = "—" if not c.get("n") else ("∞" if c["median"] is None else _steps(c["median"]))
                reached = (f"{c.get('reached', 0)}/{c.get('n', 0)}" if c.get("n") or not c.get("unmeasured")
                           else f"not measured by its {counted(c['unmeasured'], 'run')}")
                lines.append(f"| `{key}` | {v} | {reached} | {c.get('at_first', 0)} | "
                             f"{_fmt(c, 'iqm', scale='k')} | {_fmt(c, 'mean', scale='k')} | {med} |")
        if any(d["steps_to"][key].get("at_first") for d in s["variants"].values() for key in d["steps_to"]):
            lines += ["", "A run counted \"at the first measurement\" reached the level before learning could show: "
                      "its steps say how long the first iteration was, not how fast it learned."]
    lines += ["", "## Final value of each reported metric (last measured iteration)", "",
              "`validation/*` metrics are measured on held-out validation seeds; the others on training episodes.",
              "", "| metric | variant | runs | mean | IQM |", "|---|---|---|---|---|"]
    for key in spec.report.metrics:
        for v, d in s["variants"].items():
            c = d["final"][key]
            lines.append(f"| `{key}` | {v} | {c.get('n', 0)} | {_fmt(c, 'mean')} | {_fmt(c, 'iqm')} |")
    if s["improvement"]:
        keys = list(dict.fromkeys(k for d in s["improvement"].values() for k in d))
        lines += ["", "## Probability of improvement", "",
                  "P(a run of X beats a run of Y), ties half; on steps to the goal or to a threshold fewer steps is "
                  "better.", "", "| X > Y | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
        for pair, d in s["improvement"].items():
            cells = [f"{c['estimate']:.2f} [{c['low']:.2f}, {c['high']:.2f}]" if (c := d.get(k)) else "—"
                     for k in keys]
            lines.append(f"| {pair} | " + " | ".join(cells) + " |")
    if figures:
        lines += ["", "## Learning curves", "", "IQM over runs against env steps; the band is its 95 % interval.", ""]
        lines += [f"![{f}]({f})" for f in figures]
    lines += ["", "Every run: `runs.csv`; every number above: `report.json`.", ""]
    return "\n".join(lines)


def _plots(spec: ExperimentSpec, runs: list[RunResult], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in runs if r.state == "done" and STEPS in r.metrics and len(r.metrics[STEPS])]
    if not runs:
        return []
    end = max(float(np.nanmax(r.metrics[STEPS])) for r in runs)
    grid = np.linspace(0.0, end, _CURVE_POINTS)
    names = []
    for key in spec.report.metrics:
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        drawn, absent = False, []
        for i, variant in enumerate(spec.variants):
            curves = []
            for r in (r for r in runs if r.variant == variant and r.measured(key)):
                c = stats.step_curve(r.metrics[STEPS], r.metrics[key], grid)
                c[grid > np.nanmax(r.metrics[STEPS])] = np.nan  # not beyond the run's own end
                curves.append(c)
            if not curves:
                absent.append(variant)
                continue
            mid, low, high = stats.curve_band(np.array(curves), reps=_CURVE_REPS)
            line, = ax.plot(grid, mid, label=f"{variant} ({len(curves)} runs)", color=f"C{i}")
            ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
            drawn = True
        if drawn:
            ax.set_title(key, fontsize=10)
            ax.set_xlabel("env steps" + (f" (not measured by {', '.join(absent)})" if absent else ""))
            ax.set_ylabel("mean over runs" if len(spec.seed_list) < 4 else "IQM over runs")
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
            fig.tight_layout()
            name = "curve_" + key.replace("/", "_") + ".png"
            fig.savefig(out / name, dpi=110)
            names.append(name)
        plt.close(fig)
    return names
