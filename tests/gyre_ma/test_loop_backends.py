"""The same config trains on the local and the Ray backend, sync and async."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from gyre_ma.config import load_config
from gyre_ma.loop import Gyre

ROOT = Path(__file__).resolve().parents[2]
DOORKEY = ROOT / "configs" / "minigrid_doorkey.yaml"


def test_async_rollouts_lag_one_version_and_drop_nothing_within_the_bound():
    cfg = load_config(DOORKEY, {"backend.async_rollouts": True, "train.iterations": 4, "roles.evaluators": 0})
    gyre = Gyre(cfg)
    history = [gyre.iteration(i) for i in range(4)]
    assert "staleness/lag" not in history[0]  # the first batch is collected synchronously
    assert all(h["staleness/lag"] == 1.0 and h["staleness/dropped"] == 0.0 for h in history[1:])
    assert all(h["success_rate"] >= 0.75 for h in history)


def test_async_drops_data_staler_than_the_bound():
    cfg = load_config(DOORKEY, {"backend.async_rollouts": True, "backend.max_staleness": 0,
                                "roles.evaluators": 0})
    gyre = Gyre(cfg)
    gyre.iteration(0)
    second = gyre.iteration(1)
    assert second["staleness/dropped"] == cfg.train.episodes_per_iteration


def test_noise_is_adapted_and_logged_every_iteration():
    gyre = Gyre(load_config(DOORKEY, {"roles.evaluators": 0}))
    m = [gyre.iteration(i) for i in range(2)]
    for role in ("explorer", "executor"):
        assert all(f"noise/{role}/sigma" in h and f"noise/{role}/delta" in h for h in m)
    assert m[1]["noise/explorer/delta"] < m[0]["noise/explorer/delta"]  # annealing


def test_a_role_without_episodes_has_no_noise_to_adapt():
    gyre = Gyre(load_config(DOORKEY, {"roles.evaluators": 0, "roles.explorers": 0, "roles.executors": 4}))
    m = gyre.iteration(0)
    assert "noise/executor/sigma" in m and not any(k.startswith("noise/explorer/") for k in m)


@pytest.mark.timeout(600)
def test_train_cli_runs_the_same_config_on_ray(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "gyre_ma.cli", "train", str(DOORKEY), "--iterations", "2", "--run-root",
         str(tmp_path), "--quiet", "--set", "backend.name=ray", "--set", "backend.workers=2",
         "--set", "backend.ray_init={num_cpus: 2, include_dashboard: false}"],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = pd.read_csv(tmp_path / "minigrid_doorkey" / "metrics.csv")
    assert len(metrics) == 2 and metrics["env_steps"].iloc[-1] > 0
    assert metrics["success_rate"].iloc[-1] >= 0.75


def test_faults_survived_on_ray_are_metrics_in_the_csv_and_the_summary(tmp_path):
    """Measurement 9 of #18: five SIGKILLed actors were survived but recorded nowhere. Now
    they are per-iteration metrics in the CSV, in TensorBoard and summed in the summary."""
    import json

    from gyre_ma.backends.faults import arm_faults

    faults = tmp_path / "faults"
    # One token per actor: Ray may give every episode to whichever actor starts first (an
    # actor still starting has no episodes to fail), so a fault armed for one actor alone
    # fired in one CI run and not in the next.
    for worker in (0, 1):
        arm_faults(faults, 1, mode="raise", worker=worker)
    config = tmp_path / "faulty.yaml"
    config.write_text(
        "name: faulty\nenv: {id: 'gyre_ma.backends.faults:faulty_env', kwargs: {base: coverage_v0, "
        f"fault_dir: '{faults}', at_step: 2}}}}\nlibrary: 'gyre_ma.envs.coverage.options:make_library'\n"
        "train: {iterations: 2}\nroles: {evaluators: 0}\n"
        "backend: {name: ray, workers: 2, ray_init: {num_cpus: 2, include_dashboard: false}}\n")
    out = subprocess.run([sys.executable, "-m", "gyre_ma.cli", "train", str(config), "--run-root", str(tmp_path),
                          "--quiet"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = pd.read_csv(tmp_path / "faulty" / "metrics.csv")
    restarts = metrics["backend/restarts"].sum()
    assert restarts >= 1 and metrics["backend/reissued"].sum() >= restarts  # per iteration, not cumulative
    summary = json.loads((tmp_path / "faulty" / "summary.json").read_text())
    assert summary["backend/restarts_total"] == restarts
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(tmp_path / "faulty" / "tensorboard"))
    board.Reload()
    assert sum(e.value for e in board.Scalars("backend/restarts")) == restarts
    assert sum(e.value for e in board.Scalars("backend/reissued")) == metrics["backend/reissued"].sum()
    assert "backend/restarts (this session)" in out.stdout
