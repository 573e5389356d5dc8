"""Monitor: per-iteration metrics to CSV and TensorBoard in the run directory."""

from __future__ import annotations

import csv
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter


class Monitor:
    """Appends one row per iteration to ``metrics.csv`` and scalars to TensorBoard.

    The CSV header is fixed by the first row; keys that appear later are written to
    TensorBoard only, so the file stays rectangular and readable with pandas.
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.run_dir / "metrics.csv"
        self._file = self.csv_path.open("w", newline="")
        self._writer: csv.DictWriter | None = None
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

    def close(self) -> None:
        self._file.close()
        self.tensorboard.close()
