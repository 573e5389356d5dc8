"""Monitor: per-iteration metrics to ``metrics.csv`` (one durable append per row) and,
through Lightning Fabric's ``TensorBoardLogger``, to TensorBoard in the run directory."""

from __future__ import annotations

import csv
import errno
import io
import os
from pathlib import Path
from typing import Any

import numpy as np

from gyre_ma.files import atomic_write, named
from gyre_ma.stats import centred_mean


class Monitor:
    """Logs one row per iteration to ``metrics.csv`` in the run directory and to Fabric's
    ``TensorBoardLogger`` (``tensorboard/``). The x-axis is the step given to :meth:`log`,
    env steps in ``gyre-ma train`` (the CSV's ``step`` column).

    A row is appended in one ``write`` and fsynced, so logging costs O(row), not O(file).
    The file is rewritten whole (atomically: temp file, fsync, rename) only when a key
    first appears later and widens the header (earlier rows left empty) and when the
    monitor opens an existing file; a kill at any moment leaves every complete row."""

    def __init__(self, run_dir: str | Path, *, resume_at: int | None = None) -> None:
        """``resume_at``: keep the rows of iterations before it (a resumed run rewrites
        those it is about to repeat) and append."""
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.run_dir / "metrics.csv"
        self.rows: list[dict[str, str]] = []
        """Every row of ``metrics.csv`` as text, in iteration order."""
        self.columns: list[str] = []
        """The header: every key logged so far, in order of first appearance."""
        self.replaced = 0
        """Rows of the iterations at or after ``resume_at`` that the file held: a resumed run
        plays them again and logs them anew."""
        if resume_at is not None and self.csv_path.exists():
            names, rows = _read_csv(self.csv_path)
            self.rows = [row for row in rows if float(row["iteration"]) < resume_at]
            self.replaced = len(rows) - len(self.rows)
            self.columns = names if self.rows else []
        self._rewrite_csv()
        # imported here: importing Lightning costs seconds, which `gyre-ma plot` and `report`
        # (readers of metrics.csv, through this module) need not pay
        from lightning.fabric.loggers import TensorBoardLogger

        self.tensorboard = TensorBoardLogger(self.run_dir, name="tensorboard", version="", default_hp_metric=False)
        self.history: list[dict[str, float]] = []

    def lacks(self, iteration: int) -> bool:
        """Whether ``metrics.csv`` has no row of ``iteration`` (0-based; False below 0)."""
        return iteration >= 0 and not any(float(row["iteration"]) == iteration for row in self.rows)

    def log(self, metrics: dict[str, float], step: int) -> None:
        """One iteration's metrics to every logger at ``step``; ``metrics.csv`` is written now."""
        self.history.append(dict(metrics))
        row = {"step": str(step)} | {k: repr(float(v)) for k, v in metrics.items()}
        self.rows.append(row)
        if row.keys() - set(self.columns):
            self.columns += [k for k in row if k not in self.columns]
            self._rewrite_csv()
        else:
            self._append_csv(row)
        self.tensorboard.log_metrics(metrics, step=step)

    def _csv_text(self, rows: list[dict[str, str]], *, header: bool) -> bytes:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=self.columns, lineterminator="\n")
        if header:
            writer.writeheader()
        writer.writerows(rows)
        return out.getvalue().encode()

    def _rewrite_csv(self) -> None:
        """Every row, whole and atomically: a kill leaves the previous complete file."""
        atomic_write(self.csv_path, self._csv_text(self.rows, header=bool(self.columns)))

    def _append_csv(self, row: dict[str, str]) -> None:
        """One row in one ``write`` on an ``O_APPEND`` descriptor, then fsync. A write cut
        short (power loss, full disk) leaves a last line without its newline, which
        :func:`_read_csv` drops."""
        data = self._csv_text([row], header=False)
        fd = os.open(self.csv_path, os.O_WRONLY | os.O_APPEND)
        try:
            if os.write(fd, data) != len(data):
                raise OSError(errno.ENOSPC, "short write appending a metrics row", str(self.csv_path))
            os.fsync(fd)
        except OSError as exc:
            if exc.filename is None:  # a write's error names no file: name it
                raise named(exc, self.csv_path) from exc
            raise
        finally:
            os.close(fd)

    def spot_check(self, iteration: int, trajectories: list, library: Any, n: int,
                   rng: np.random.Generator, gamma: float = 0.99) -> Path | None:
        """Dump ``n`` random trajectories as readable Markdown: per agent, the options in
        order with their length, the env's own reward over the call, what the learner was
        paid for it (the arbitrated reward it backs up: milestones, rules, outcome; the env's
        only as ``rewards.env_reward`` weighs it; ``gamma``: the run's ``credit.gamma``), the
        milestones and why it ended."""
        if n <= 0 or not trajectories:
            return None
        folder = self.run_dir / "spot_checks"
        folder.mkdir(exist_ok=True)
        picks = rng.choice(len(trajectories), size=min(n, len(trajectories)), replace=False)
        lines = [f"# Iteration {iteration}: {len(picks)} of {len(trajectories)} trajectories", "",
                 "*paid*: the arbitrated reward the call backs up (milestones, rules, outcome; the env's own only as "
                 "`rewards.env_reward` weighs it), discounted inside the call by `credit.gamma` a step: a milestone's "
                 "part to the step it was verified at, the rest to the call's last step (a milestone worth 1 verified "
                 f"at the call's 21st step pays {gamma ** 20:.3f} with this run's gamma {gamma:g}); *env reward*: the "
                 "env's own, summed over the call.", ""]
        for k in sorted(int(p) for p in picks):
            t = trajectories[k]
            verdict = ("**verified success, vetoed by a guard rule** (the learner counts it a failure)"
                       if t.success and t.vetoed else "**verified success**" if t.success else
                       "not completed: **cut by a fault of the env (its reset or a step)**" if t.cut_by_fault
                       else "not completed")
            paid = sum(c.reward for c in t.calls)
            goals = f", goals {', '.join(t.goals)}" if t.goals else ""  # where each episode has its own
            lines += [f"## Trajectory {k} — task seed {t.task_seed}{goals}, policy v{t.policy_version}",
                      f"{verdict}; {t.length} steps; env reward {t.total_reward:.3g}; paid to the learner "
                      f"{paid:.3g}; milestones: "
                      f"{', '.join(f'{m}@{s}' for m, s in t.milestone_steps.items()) or 'none'}",
                      "", "| agent | step | option | steps | env reward | paid | milestones | ended by |",
                      "|---|---|---|---|---|---|---|---|"]
            for run in _repeats(t.calls):
                c, ended = run[0], run[0].termination.value if run[0].termination else "—"
                if len(run) == 1:
                    lines.append(f"| {c.agent} | {c.start_step} | {library[c.option].name} | {c.duration} | "
                                 f"{c.raw_reward:.3g} | {c.reward:.3g} | {', '.join(c.milestones) or ''} | {ended} |")
                else:  # the agent's calls of one option in a row, none verifying a milestone: one row
                    lines.append(f"| {c.agent} | {c.start_step}–{run[-1].start_step} | {library[c.option].name} "
                                 f"×{len(run)} | {sum(r.duration for r in run)} | "
                                 f"{sum(r.raw_reward for r in run):.3g} | {sum(r.reward for r in run):.3g} |  | "
                                 f"{ended} |")
            lines.append("")
        path = folder / f"iteration_{iteration:05d}.md"
        atomic_write(path, "\n".join(lines).encode(), sync_dir=False)
        return path

    def close(self) -> None:
        self.tensorboard.finalize("success")


def smoothing_window(iterations: int) -> int:
    """The centred window ``gyre-ma plot`` smooths a run's curves over by default: an odd
    number of iterations near a tenth of them (1, no smoothing, for runs under 20), since a
    point of 4 validation episodes is 0, 25, 50, 75 or 100 % (a session-60 user's curves.png
    was unreadable at the defaults)."""
    return max(1, (iterations // 10) | 1) if iterations >= 20 else 1


def plot_run(run_dir: str | Path, out: str | Path | None = None, *, smooth: int | None = None) -> Path:
    """Learning curves (success, episode length, reward: the env's own and what the learner
    was paid) and per-milestone rates vs env steps, from a run directory's ``metrics.csv``,
    to a PNG: the training episodes' and,
    where the run validated, the held-out validation's success and length, sampled and
    greedy. ``smooth`` (odd): the success and length curves as centred means over that many
    measured iterations, each drawn over its raw points in a paler line; None:
    :func:`smoothing_window`; 1: raw only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    csv_path = run_dir / "metrics.csv"
    if not csv_path.is_file():
        raise ValueError(f"{str(run_dir)!r} is not a run directory: no metrics.csv in it")
    columns = read_metrics(csv_path)
    if "env_steps" not in columns or not len(columns["env_steps"]):
        raise ValueError(f"{csv_path}: no iterations logged yet")
    x = columns["env_steps"]
    window = smoothing_window(len(x)) if smooth is None else smooth
    if isinstance(window, bool) or not isinstance(window, int) or window < 1 or window % 2 == 0:
        raise ValueError(f"smooth must be an odd int >= 1 (iterations a centred mean pools), got {smooth!r}")

    def curve(ax: Any, xs: np.ndarray, ys: np.ndarray, style: str, label: str, **kwargs: Any) -> None:
        if window == 1:
            ax.plot(xs, ys, style, label=label, **kwargs)
            return
        line = ax.plot(xs, centred_mean(ys, window), style, label=f"{label} (mean of {window} iterations)")[0]
        ax.plot(xs, ys, style, color=line.get_color(), alpha=0.25, linewidth=0.8, **kwargs)

    milestones = [c for c in columns if c.startswith("milestone/")]
    fig, axes = plt.subplots(2, 2, figsize=(12 + 2 * _legend_columns(len(milestones)), 8))
    for ax, key, label in ((axes[0, 0], "success_rate", "verified success rate"),
                           (axes[0, 1], "episode_length", "episode length (primitive steps)"),
                           (axes[1, 0], "episode_reward", "reward per training episode")):
        if key in columns:
            curve(ax, x, columns[key], "-", "training episodes" if key != "episode_reward" else "the env's own")
        ax.set_title(label)
        ax.set_xlabel("env steps")
    if "reward/total" in columns:  # what the learner was paid (milestones, rules, PRM): the env's may be all zeros
        paid = axes[1, 0].twinx()  # its own scale: an env's -1,200 a step penalty flattened 0-18 of milestones
        paid.plot(x, columns["reward/total"], "--", color="tab:orange", label="paid to the learner (reward/total)")
        paid.set_ylabel("paid to the learner", color="tab:orange")
        axes[1, 0].set_ylabel("the env's own")
        lines = [line for line in axes[1, 0].get_lines() + paid.get_lines() if not line.get_label().startswith("_")]
        axes[1, 0].legend(lines, [line.get_label() for line in lines], fontsize=7)
    held_out = False  # the held-out validation the progress line shows, where the run ran one
    for mode, style in (("sampled", "-"), ("greedy", "--")):
        for ax, key in ((axes[0, 0], f"validation/{mode}_success"), (axes[0, 1], f"validation/{mode}_length")):
            if key in columns and np.isfinite(columns[key]).any():
                seen = np.isfinite(columns[key])  # validated iterations only
                curve(ax, x[seen], columns[key][seen], style, f"held-out validation, {mode}", marker=".")
                held_out = True
    if held_out:
        axes[0, 0].legend(fontsize=7)
        axes[0, 1].legend(fontsize=7)
    _milestone_rates(axes[1, 1], x, {m.split("/", 1)[1]: columns[m] for m in milestones})
    if "curriculum_phase" in columns:
        changed = np.nan_to_num(np.diff(columns["curriculum_phase"])) != 0
        for ax in axes.flat:
            for step in x[1:][changed]:
                ax.axvline(step, color="grey", linestyle=":", linewidth=1)
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    out = Path(out) if out is not None else run_dir / "curves.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


REPEATS_FROM = 3
"""Calls in a row from which a spot check shows an agent's repeats as one row."""


def _repeats(calls: list) -> list[list]:
    """``calls`` as a spot check lists them, in order, an agent's run of :data:`REPEATS_FROM`
    or more calls of the same option in a row that verified no milestone and ended alike
    (an upkeep ``wait`` of a 2,000-step episode, called hundreds of times) gathered into one
    entry, at its first call's place; every other call an entry of its own."""
    runs: dict[str, list[int]] = {}  # per agent, its current run: indices into calls
    members: list[list[int]] = []
    for i, c in enumerate(calls):
        run = runs.get(c.agent)
        if run is not None and _repeated(calls[run[0]], c):
            run.append(i)
        else:
            runs[c.agent] = [i]
            members.append(runs[c.agent])
    entries: list[list[int]] = []
    for run in members:  # a long run one entry, a short one a call an entry
        entries += [run] if len(run) >= REPEATS_FROM else [[i] for i in run]
    return [[calls[i] for i in entry] for entry in sorted(entries)]


def _repeated(first: Any, call: Any) -> bool:
    """Whether ``call`` repeats ``first``: the same option, ended alike, neither verifying a milestone."""
    return (not first.milestones and not call.milestones and first.option == call.option
            and first.termination == call.termination)


MILESTONES_INSIDE = 8
"""Most milestones whose legend sits inside the milestone panel; more go beside it."""


def _legend_columns(n: int) -> int:
    """Columns of the milestone legend beside its panel: none where it fits inside."""
    return 0 if n <= MILESTONES_INSIDE else -(-n // 16)


def _milestone_rates(ax: Any, x: np.ndarray, rates: dict[str, np.ndarray]) -> Any:
    """Each milestone's rate against env steps, one colour each (the default cycle repeats
    after ten), and their legend: inside the panel for a few, beside it for more, where it
    covers no curve. Returns the legend (None without milestones)."""
    import matplotlib

    palette = matplotlib.colormaps["tab20" if len(rates) <= 20 else "turbo"]
    for k, (name, rate) in enumerate(rates.items()):
        ax.plot(x, rate, label=name, color=palette(k if len(rates) <= 20 else k / max(len(rates) - 1, 1)))
    ax.set_title("milestone rates")
    ax.set_xlabel("env steps")
    if not rates:
        return None
    columns = _legend_columns(len(rates))
    if not columns:
        return ax.legend(fontsize=7, ncol=2)
    return ax.legend(fontsize=6, ncol=columns, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def _read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """The header and complete rows of a ``metrics.csv``: a last line without its newline
    (a write that was cut short) is dropped, not read as a row with missing values."""
    with Path(path).open(newline="") as f:
        text = f.read()
    if not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    reader = csv.DictReader(io.StringIO(text, newline=""))
    rows = list(reader)
    return list(reader.fieldnames or []), rows


def read_metrics(path: str | Path) -> dict[str, np.ndarray]:
    """``metrics.csv`` as one float array per column (NaN where a row has no value); a file
    that is not one (damaged, not text, a value not a number) is one error naming it."""
    try:
        names, rows = _read_csv(Path(path))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"{str(path)!r} is damaged or not a metrics.csv ({exc})") from None
    return {name: np.array([_number(r.get(name), path, k, name) for k, r in enumerate(rows)]) for name in names}


def _number(value: Any, path: str | Path, row: int, name: str) -> float:
    """One cell of ``metrics.csv`` as a float (NaN where empty); anything else names the file,
    the row and the column."""
    if value in (None, ""):
        return np.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{str(path)!r} is damaged: row {row + 1}'s {name!r} is {value!r}, not a number") from None
