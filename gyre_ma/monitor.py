"""Monitor: per-iteration metrics to CSV and TensorBoard in the run directory."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.tensorboard import SummaryWriter


class Monitor:
    """Appends one row per iteration to ``metrics.csv`` and scalars to TensorBoard.

    The CSV header is fixed by the first row; keys that appear later are written to
    TensorBoard only, so the file stays rectangular and readable with pandas.
    """

    def __init__(self, run_dir: str | Path, *, resume_at: int | None = None) -> None:
        """``resume_at``: keep the rows of iterations before it (a resumed run rewrites
        those it is about to repeat) and append."""
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.run_dir / "metrics.csv"
        kept: list[dict[str, str]] = []
        if resume_at is not None and self.csv_path.exists():
            with self.csv_path.open(newline="") as f:
                kept = [row for row in csv.DictReader(f) if float(row["iteration"]) < resume_at]
        self._file = self.csv_path.open("w", newline="")
        self._writer: csv.DictWriter | None = None
        if kept:
            self._writer = csv.DictWriter(self._file, fieldnames=list(kept[0]), extrasaction="ignore")
            self._writer.writeheader()
            self._writer.writerows(kept)
        self.tensorboard = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
        self.history: list[dict[str, float]] = []

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.history.append(dict(metrics))
        if self._writer is None:
            self._writer = csv.DictWriter(self._file, fieldnames=list(metrics), extrasaction="ignore")
            self._writer.writeheader()
        self._writer.writerow(metrics)
        self._file.flush()
        for key, value in metrics.items():
            self.tensorboard.add_scalar(key, value, step)

    def spot_check(self, iteration: int, trajectories: list, library: Any, n: int,
                   rng: np.random.Generator) -> Path | None:
        """Dump ``n`` random trajectories as readable Markdown: per agent, the options in
        order with their length, reward, milestones and why they ended."""
        if n <= 0 or not trajectories:
            return None
        folder = self.run_dir / "spot_checks"
        folder.mkdir(exist_ok=True)
        picks = rng.choice(len(trajectories), size=min(n, len(trajectories)), replace=False)
        lines = [f"# Iteration {iteration}: {len(picks)} of {len(trajectories)} trajectories", ""]
        for k in sorted(int(p) for p in picks):
            t = trajectories[k]
            verdict = "**verified success**" if t.success else "not completed"
            lines += [f"## Trajectory {k} — task seed {t.task_seed}, policy v{t.policy_version}",
                      f"{verdict}; {t.length} steps; reward {t.total_reward:.3g}; "
                      f"milestones: {', '.join(f'{m}@{s}' for m, s in t.milestone_steps.items()) or 'none'}", "",
                      "| agent | step | option | steps | reward | milestones | ended by |",
                      "|---|---|---|---|---|---|---|"]
            for c in t.calls:
                ended = c.termination.value if c.termination else "—"
                lines.append(f"| {c.agent} | {c.start_step} | {library[c.option].name} | {c.duration} | "
                             f"{c.raw_reward:.3g} | {', '.join(c.milestones) or ''} | {ended} |")
            lines.append("")
        path = folder / f"iteration_{iteration:05d}.md"
        path.write_text("\n".join(lines))
        return path

    def close(self) -> None:
        self._file.close()
        self.tensorboard.close()


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Learning curves (success, episode length, reward) and per-milestone rates vs env
    steps, from a run directory's ``metrics.csv``, to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    run_dir = Path(run_dir)
    csv_path = run_dir / "metrics.csv"
    if not csv_path.is_file():
        raise ValueError(f"{str(run_dir)!r} is not a run directory: no metrics.csv in it")
    df = pd.read_csv(csv_path)
    if df.empty or "env_steps" not in df:
        raise ValueError(f"{csv_path}: no iterations logged yet")
    x = df["env_steps"]
    milestones = [c for c in df.columns if c.startswith("milestone/")]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for ax, key, label in ((axes[0, 0], "success_rate", "verified success rate"),
                           (axes[0, 1], "episode_length", "episode length (primitive steps)"),
                           (axes[1, 0], "episode_reward", "episode reward")):
        if key in df:
            ax.plot(x, df[key])
        ax.set_title(label)
        ax.set_xlabel("env steps")
    for m in milestones:
        axes[1, 1].plot(x, df[m], label=m.split("/", 1)[1])
    axes[1, 1].set_title("milestone rates")
    axes[1, 1].set_xlabel("env steps")
    if milestones:
        axes[1, 1].legend(fontsize=7, ncol=2)
    if "curriculum_phase" in df:
        for ax in axes.flat:
            for step in x[df["curriculum_phase"].diff().fillna(0) != 0]:
                ax.axvline(step, color="grey", linestyle=":", linewidth=1)
    fig.suptitle(run_dir.name)
    fig.tight_layout()
    out = Path(out) if out is not None else run_dir / "curves.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
