"""A run directory has one owner, a resume keeps the run's config, and edge cases say what
happened (issue #18, measurements 4 and 7)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from gyre_ma.checkpoints import CheckpointManager
from gyre_ma.cli import _lock_run, main
from gyre_ma.config import ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]
DOORKEY = ROOT / "configs" / "minigrid_doorkey.yaml"


def train(tmp_path, *extra: str) -> int:
    return main(["train", str(DOORKEY), "--run-root", str(tmp_path), "--quiet", *extra])


def test_resume_of_a_run_that_never_existed_leaves_nothing_behind(tmp_path, capsys):
    assert train(tmp_path, "--resume") == 2
    assert "nothing to resume" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_second_trainer_of_the_same_run_is_refused(tmp_path, capsys):
    held = _lock_run(tmp_path / "minigrid_doorkey")
    try:
        assert train(tmp_path, "--iterations", "1") == 2
        assert "in use by another gyre-ma train" in capsys.readouterr().err
    finally:
        held.close()
    assert train(tmp_path, "--iterations", "1") == 0  # released: the run can be trained
    held = _lock_run(tmp_path / "minigrid_doorkey")
    try:  # a run with checkpoints, held by its trainer: the lock is named, not "pass --resume" (which it refuses)
        assert train(tmp_path, "--iterations", "1") == 2
        err = capsys.readouterr().err
        assert "in use by another gyre-ma train" in err and "--resume" not in err
    finally:
        held.close()


def test_a_fresh_run_keeps_its_untrained_policy_as_initial_pt(tmp_path, capsys):
    """A user wanting the untrained manager's figures (what training added) had no way to get
    them: --iterations 0 is refused, and after one iteration the policy has been updated."""
    from gyre_ma.checkpoints import load_checkpoint

    run_dir = tmp_path / "minigrid_doorkey"
    checkpoints = run_dir / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "initial.pt").write_bytes(b"left by a run killed before its first checkpoint")
    assert train(tmp_path, "--iterations", "1") == 0  # initial.pt alone is not a run to resume: it starts afresh
    initial, final = load_checkpoint(checkpoints / "initial.pt"), load_checkpoint(checkpoints / "final.pt")
    assert initial["next_iteration"] == 0 and final["next_iteration"] == 1
    assert initial["config"] == final["config"]
    changed = [k for k, w in initial["policy"].items() if not (w == final["policy"][k]).all()]
    assert changed  # the update moved the weights initial.pt keeps
    capsys.readouterr()
    assert main(["eval", str(checkpoints / "initial.pt"), "--episodes", "3", "--trust-config"]) == 0
    assert "verified completion" in capsys.readouterr().out
    data = bytearray((checkpoints / "initial.pt").read_bytes())  # recorded in the manifest as final.pt is
    data[len(data) // 2] ^= 0xFF
    (checkpoints / "initial.pt").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="is the run's initial.pt, but its SHA-256 is not the one"):
        load_checkpoint(checkpoints / "initial.pt")
    assert train(tmp_path, "--iterations", "1") == 2  # now the run has checkpoints of its own
    assert "already has checkpoints" in capsys.readouterr().err


def test_a_resume_keeps_the_runs_config_unless_forced_and_says_when_it_is_finished(tmp_path, capsys):
    assert train(tmp_path, "--iterations", "1") == 0
    run_dir = tmp_path / "minigrid_doorkey"
    original = (run_dir / "config.yaml").read_text()
    capsys.readouterr()
    assert train(tmp_path, "--resume", "--iterations", "1") == 0
    assert "already done its 1 iterations" in capsys.readouterr().out
    assert train(tmp_path, "--resume", "--iterations", "2", "--set", "seed=1", "--set", "train.lr=0.01") == 2
    err = capsys.readouterr().err
    assert "seed: 0 -> 1" in err and "train.lr" in err and "--force-config" in err
    assert train(tmp_path, "--resume", "--iterations", "2", "--set", "train.lr=0.01", "--force-config") == 0
    with (run_dir / "metrics.csv").open() as f:
        steps = float(next(csv.DictReader(f))["env_steps"])  # after iteration 0, where the resume goes on
    said = "resuming run 'minigrid_doorkey' after iteration 1 of 2, from its latest checkpoint"
    assert f"{said} ({steps:,.0f} env steps so far)\n" in capsys.readouterr().out  # where a resumed run goes on
    assert (run_dir / "config.yaml").read_text() == original  # the run's own config is not overwritten
    history = yaml.safe_load((run_dir / "config_history.yaml").read_text())
    trained_with = yaml.safe_load(original)["train"]["lr"]  # the run's own LR, from its config.yaml
    assert trained_with != 0.01 and trained_with == load_config(DOORKEY).train.lr
    assert history == [{"resumed_at_iteration": 1, "changed": {"train.iterations": [1, 2],
                                                                "train.lr": [trained_with, 0.01]}}]
    latest = CheckpointManager(run_dir / "checkpoints").load("latest")  # the forced LR is the one trained with
    assert [g["lr"] for g in latest["manager_optimizer"]["param_groups"]] == [0.01]


def test_a_resume_may_change_where_episodes_are_played(tmp_path, capsys):
    """A run trained on Ray goes on without the cluster (a session-53 user was refused
    "backend.name: 'ray' -> 'local'"): the backend's placement keys, which a synchronous
    run's figures do not depend on, may change on a resume and are recorded; what changes
    the figures (async rollouts) is still refused."""
    assert train(tmp_path, "--iterations", "1", "--set", "backend.workers=3") == 0
    capsys.readouterr()
    assert train(tmp_path, "--resume", "--iterations", "2", "--set", "backend.async_rollouts=true") == 2
    assert "backend.async_rollouts: False -> True" in capsys.readouterr().err
    assert train(tmp_path, "--resume", "--iterations", "2", "--set", "backend.episodes_per_call=8") == 0
    history = yaml.safe_load((tmp_path / "minigrid_doorkey" / "config_history.yaml").read_text())
    assert history == [{"resumed_at_iteration": 1, "changed": {"backend.episodes_per_call": [32, 8],
                                                                "backend.workers": [3, 2],
                                                                "train.iterations": [1, 2]}}]


def test_run_names_cannot_escape_the_run_root():
    for name in ("../../x", "/abs/path", "a/b", ".hidden", ""):
        try:
            parse_config({"name": name})
        except ConfigError as exc:
            assert "name" in str(exc)
        else:
            raise AssertionError(f"name {name!r} was accepted")
    assert parse_config({"name": "coverage-3_seed=1.v2"}).name == "coverage-3_seed=1.v2"


def test_a_set_value_that_is_not_yaml_names_the_key(tmp_path, capsys):
    assert train(tmp_path, "--set", "seed=[1") == 2
    err = capsys.readouterr().err
    assert "--set seed" in err and "not valid YAML" in err and "Traceback" not in err


def test_a_run_killed_after_its_last_iteration_but_before_final_pt_finishes_on_resume(tmp_path, capsys):
    assert train(tmp_path, "--iterations", "1") == 0
    final = tmp_path / "minigrid_doorkey" / "checkpoints" / "final.pt"
    final.unlink()  # as if killed between the last latest slot and final.pt
    assert train(tmp_path, "--resume", "--iterations", "1") == 0
    assert final.is_file()


def test_a_stop_between_the_checkpoint_and_its_metrics_row_loses_no_row(tmp_path, capsys):
    """Session 58's CI: SIGTERM came after iteration 3's checkpoint, before its row; the resume
    went on from iteration 3 and metrics.csv never had that row."""
    assert train(tmp_path, "--iterations", "2") == 0
    metrics = tmp_path / "minigrid_doorkey" / "metrics.csv"
    full = metrics.read_text()
    rows = csv.DictReader(full.splitlines())
    shares = [[float(v) for k, v in row.items() if k.startswith("option/")] for row in rows]
    assert all(len(row) > 1 and sum(row) == pytest.approx(1.0) for row in shares)  # each option's share of the calls
    metrics.write_text(full[: full.rstrip("\n").rfind("\n") + 1])  # the last row, as a stop there leaves it
    (tmp_path / "minigrid_doorkey" / "checkpoints" / "final.pt").unlink()
    capsys.readouterr()
    assert train(tmp_path, "--resume", "--iterations", "2") == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "iteration 2's row of metrics.csv, which the stop cut, written from the checkpoint" in said
    assert metrics.read_text() == full  # the same row, bit for bit


def test_eval_of_a_run_directory_takes_its_final_policy_then_its_best_then_its_latest(tmp_path, capsys):
    """``gyre-ma eval RUN_DIR`` evaluates the policy the run ended with (``final.pt``), else its
    best validation, else its latest slot, and names ``best.pt`` beside ``final.pt``: judged on
    few episodes and on success alone, it is often an early, slower policy (session 47)."""
    import argparse

    from gyre_ma.cli import _eval_target

    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    for slot in ("latest.pt", "final.pt", "best.pt"):
        (folder / slot).write_bytes(b"x")
    picked = []
    for gone in ("final.pt", "best.pt"):
        picked.append(_eval_target(argparse.Namespace(checkpoint=str(tmp_path / "run"), config=None, set=None))[0].name)
        (folder / gone).unlink()
    picked.append(_eval_target(argparse.Namespace(checkpoint=str(tmp_path / "run"), config=None, set=None))[0].name)
    assert picked == ["final.pt", "best.pt", "latest.pt"]
    out = capsys.readouterr().out
    assert f"evaluating {folder / 'final.pt'}" in out
    assert f"its best validation, judged on fewer episodes: {folder / 'best.pt'}" in out
    assert out.count("judged on fewer episodes") == 1  # only while both exist


def test_the_summary_says_what_best_pt_was_judged_on(tmp_path, capsys):
    """Validation's best window chose best.pt, so its figure is called optimistic; without
    evaluators it was measured on training episodes, and the summary says so."""
    for evaluators, judged_on in ((4, "held-out validation episodes, sampled and greedy together, the window that "
                                      "chose it"),
                                  (0, "training episodes (roles.evaluators is 0: no held-out validation)")):
        root = tmp_path / str(evaluators)
        assert main(["train", str(DOORKEY), "--iterations", "5", "--run-root", str(root),
                     "--set", f"roles.evaluators={evaluators}"]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert "best.pt: validation success" in out and judged_on in out
        # not a terminal: a whole line an iteration, not a live bar cut to 80 columns
        assert all(f"iter {i}/5 · " in out for i in range(1, 6)) and "iter 5/5 · " in out
    assert out.startswith(f"run 'minigrid_doorkey' in {root / 'minigrid_doorkey'}: building the learner (env, options, "
                          "manager) for 5 iterations …")  # a session-59 user saw nothing for its first 23 s
    # a session-58 user's slow env: how long the run takes, from its first iteration on
    assert out.count(" left at this rate") == 5 and "0 s left at this rate" in out


def test_a_run_stopped_by_sigterm_says_what_it_kept_and_resumes(tmp_path):
    """A session-57 user stopped a run with kill: the log ended with the shell's "terminated
    by signal 15", nothing of gyre-ma's."""
    import signal
    import subprocess
    import sys
    import time

    config = tmp_path / "long.yaml"
    config.write_text(f"name: long\nrun_root: {tmp_path}\nenv: {{id: coverage_v0}}\n")
    proc = subprocess.Popen([sys.executable, "-m", "gyre_ma", "train", str(config), "--iterations", "500", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "long" / "metrics.csv"
    deadline = time.monotonic() + 240
    while (not metrics.is_file() or metrics.read_text().count("\n") < 3) and time.monotonic() < deadline:
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert err.strip().endswith("gyre-ma train: terminated (SIGTERM); the run keeps every iteration it completed: "
                                "rerun with --resume to continue it"), err
    done = metrics.read_text().count("\n") - 1
    assert main(["train", str(config), "--resume", "--iterations", str(done + 1), "--quiet"]) == 0
    assert metrics.read_text().count("\n") - 1 == done + 1
