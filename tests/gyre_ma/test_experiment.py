"""`gyre-ma experiment` and `gyre-ma report` end to end on a tiny grid (issue #20).

Real runs: each is a `gyre-ma train` process on a run directory, evaluated on held-out
task seeds; the experiment is killed and rerun; the report is built from the folder.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gyre_ma.cli import main
from gyre_ma.config import ConfigError
from gyre_ma.experiment import load_experiment, run_state, train_command

BASE = """\
name: tiny
env: {id: coverage_v0}
train: {episodes_per_iteration: 4, minibatch_size: 32, epochs: 1}
roles: {explorers: 1, executors: 1, evaluators: 2}
checkpoints: {validation_window: 1, min_validation_episodes: 1}
monitor: {spot_checks: 0}
"""


def _experiment(tmp_path: Path, *, seeds: int = 2, iterations: int = 2, extra: str = "") -> Path:
    (tmp_path / "base.yaml").write_text(BASE)
    path = tmp_path / "tiny.yaml"
    path.write_text(f"""\
name: tiny_grid
base: base.yaml
root: {tmp_path / 'root'}
overrides: {{train.lr: 0.001}}
variants:
  anchored: {{}}
  plain_gae: {{credit: {{mode: plain}}}}
seeds: {seeds}
budget: {{iterations: {iterations}}}
report:
  metrics: [validation/sampled_success, success_rate]
  thresholds: {{success_rate: 0.5}}
  reps: 200
evaluation: {{episodes: 6}}
{extra}""")
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_tiny_grid_runs_end_to_end_and_reports(tmp_path, capsys):
    path = _experiment(tmp_path)
    assert main(["experiment", str(path), "--jobs", "2"]) == 0
    log = capsys.readouterr().out  # not a terminal: a line per change of a run's state, not a live table
    for name in ("anchored-s0", "anchored-s1", "plain_gae-s0", "plain_gae-s1"):
        assert f"run {name}: training (0/2 iterations" in log and f"run {name}: done (2/2 iterations, " in log, log
    assert "┃" not in log
    folder = tmp_path / "root" / "tiny_grid"
    exp = load_experiment(path)
    assert [r.name for r in exp.runs] == ["anchored-s0", "anchored-s1", "plain_gae-s0", "plain_gae-s1"]
    for run in exp.runs:
        run_dir = folder / "runs" / run.name
        assert run_state(run_dir) == "done"
        with (run_dir / "metrics.csv").open() as f:
            assert [int(float(r["iteration"])) for r in csv.DictReader(f)] == [0, 1]
        config = (run_dir / "config.yaml").read_text()
        assert f"seed: {run.seed}" in config and "lr: 0.001" in config  # the common override
        assert ("mode: plain" in config) == (run.variant == "plain_gae")  # the variant's
        ev = json.loads((run_dir / "eval.json").read_text())
        assert ev["episodes"] == 6 and 0 <= ev["sampled"]["success"] <= 1 and 0 <= ev["greedy"]["success"] <= 1
    first = {run.name: _digest(folder / "runs" / run.name / "checkpoints" / "final.pt") for run in exp.runs}
    assert first["anchored-s0"] != first["anchored-s1"]  # seeds differ

    assert main(["report", str(folder), "--reps", "200"]) == 0
    report = (folder / "report" / "report.md").read_text()
    assert "4 of 4 runs finished" in report and "| anchored | 2 |" in report and "| plain_gae | 2 |" in report
    assert "Probability of improvement" in report and "anchored > plain_gae" in report
    assert (folder / "report" / "curve_validation_sampled_success.png").read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((folder / "report" / "report.json").read_text())
    sampled = summary["variants"]["anchored"]["heldout_sampled"]
    values = [json.loads((folder / "runs" / f"anchored-s{s}" / "eval.json").read_text())["sampled"]["success"]
              for s in (0, 1)]
    assert sampled["n"] == 2 and sampled["mean"]["estimate"] == pytest.approx(sum(values) / 2)
    assert sampled["mean"]["low"] <= sampled["mean"]["estimate"] <= sampled["mean"]["high"]
    with (folder / "report" / "runs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["variant"], r["seed"], r["state"]) for r in rows] == [
        ("anchored", "0", "done"), ("anchored", "1", "done"), ("plain_gae", "0", "done"), ("plain_gae", "1", "done")]

    # a rerun trains nothing: every run is done, every file as it was
    capsys.readouterr()
    assert main(["experiment", str(path), "--quiet"]) == 0
    assert "4 already done" in capsys.readouterr().out
    assert first == {run.name: _digest(folder / "runs" / run.name / "checkpoints" / "final.pt") for run in exp.runs}


def test_a_killed_experiment_loses_no_finished_run_and_resumes_the_others(tmp_path):
    path = _experiment(tmp_path, seeds=1, iterations=4)
    folder = tmp_path / "root" / "tiny_grid"
    proc = subprocess.Popen([sys.executable, "-m", "gyre_ma.cli", "experiment", str(path), "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first, second = folder / "runs" / "anchored-s0", folder / "runs" / "plain_gae-s0"
    deadline = time.time() + 240
    while time.time() < deadline and not (run_state(first) == "done" and (second / "metrics.csv").is_file()):
        time.sleep(0.05)
    assert run_state(first) == "done", proc.stderr.read().decode() if proc.poll() is not None else "timed out"
    proc.send_signal(signal.SIGKILL)  # mid-way through the second run's training
    proc.wait()
    kept = {p.name: _digest(p) for p in (first / "checkpoints").iterdir() if p.is_file()}
    kept_eval = _digest(first / "eval.json")
    time.sleep(1.0)
    assert run_state(second) != "done"
    out = subprocess.run(["pgrep", "-f", str(second)], capture_output=True, text=True)
    assert out.stdout.strip() == "", "a run outlived its experiment"

    assert main(["experiment", str(path), "--quiet"]) == 0  # not refused: the killed run holds no lock
    assert run_state(second) == "done"
    with (second / "metrics.csv").open() as f:
        assert [int(float(r["iteration"])) for r in csv.DictReader(f)] == [0, 1, 2, 3]  # each iteration once
    assert kept == {p.name: _digest(p) for p in (first / "checkpoints").iterdir() if p.is_file()}
    assert kept_eval == _digest(first / "eval.json")


def test_ctrl_c_stops_the_running_runs_says_what_was_kept_and_a_rerun_resumes(tmp_path):
    """SIGINT to the experiment alone let its running runs play to their ends; Ctrl-C (the
    whole group) ended in a traceback, with the interrupted runs shown as failed."""
    path = _experiment(tmp_path, seeds=1, iterations=60)
    folder = tmp_path / "root" / "tiny_grid"
    proc = subprocess.Popen([sys.executable, "-m", "gyre_ma.cli", "experiment", str(path), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = folder / "runs" / "anchored-s0"
    deadline = time.time() + 240
    while time.time() < deadline and run_state(first) != "partial":
        time.sleep(0.05)
    assert run_state(first) == "partial", proc.stderr.read() if proc.poll() is not None else "timed out"
    proc.send_signal(signal.SIGINT)  # the experiment's process only, not its runs'
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().endswith("gyre-ma experiment: interrupted; finished runs are kept, and a rerun resumes the "
                                "others from their checkpoints") and "Traceback" not in err, err
    assert subprocess.run(["pgrep", "-f", str(first)], capture_output=True, text=True).stdout.strip() == ""
    assert run_state(first) == "partial"  # stopped mid-way: nowhere near its 60 iterations
    log = (folder / "logs" / "anchored-s0.log").read_text()
    assert "gyre-ma train: interrupted; the run keeps every iteration it completed" in log and "Traceback" not in log


def test_a_run_killed_before_its_first_latest_checkpoint_starts_over(tmp_path):
    """gyre-ma resumes from the ``latest`` slot only. A run killed after it saved its first
    ``best`` (validation) but before its first ``latest`` used to count as resumable, and the
    rerun failed ("has no latest checkpoint"); it starts over, and each iteration is logged once."""
    path = _experiment(tmp_path, seeds=1, iterations=1)
    run = tmp_path / "root" / "tiny_grid" / "runs" / "plain_gae-s0"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.csv").write_text("iteration,success_rate\n0,0.5\n")
    manifest = run / "checkpoints" / "manifest.json"
    best_only = json.dumps({"format": 1, "slots": {"best": {"file": "best-0.pt"}}})
    manifest.write_text(best_only)
    assert run_state(run) == "new"
    manifest.write_text(json.dumps({"format": 1, "slots": {"latest": {"file": "latest-0.pt"}}}))
    assert run_state(run) == "partial"
    manifest.write_text("{not json")
    assert run_state(run) == "partial"  # the resume names the manifest; nothing is removed
    manifest.write_text(best_only)  # the state the kill left

    assert main(["experiment", str(path), "--quiet"]) == 0
    assert run_state(run) == "done"
    with (run / "metrics.csv").open() as f:
        assert [int(float(r["iteration"])) for r in csv.DictReader(f)] == [0]


def test_runs_play_as_ray_tasks(tmp_path):
    """``--jobs`` caps the runs on the cluster at once (a session-53 user on 2 CPUs had no way
    to play one run at a time but a cluster of one CPU): with 1, the second run starts after
    the first has written its final checkpoint."""
    path = _experiment(tmp_path, seeds=1, iterations=1)
    out = subprocess.run([sys.executable, "-m", "gyre_ma.cli", "experiment", str(path), "--ray", "--jobs", "1",
                          "--quiet"],
                         capture_output=True, text=True, timeout=600,
                         env=os.environ | {"RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"})
    assert out.returncode == 0, out.stderr[-2000:]
    folder = tmp_path / "root" / "tiny_grid"
    assert [run_state(folder / "runs" / n) for n in ("anchored-s0", "plain_gae-s0")] == ["done", "done"]
    assert "all 2 runs done" in out.stdout
    assert not list((folder / "logs").glob("*.ray-started"))  # each task's start marker, read and removed
    runs = sorted((folder / "runs").iterdir(), key=lambda run: (run / "config.yaml").stat().st_mtime)
    first_ended = (runs[0] / "checkpoints" / "final.pt").stat().st_mtime
    assert (runs[1] / "config.yaml").stat().st_mtime >= first_ended


def test_a_run_plays_from_the_folder_the_experiment_started_in_wherever_its_process_starts(tmp_path, monkeypatch):
    """A Ray task on an existing cluster starts in the folder the cluster was started in: the
    base config, given relative to the experiment file, was resolved there ("config file
    '/tmp/warehouse/mywarehouse.yaml' does not exist"), and the user's modules, imported
    from the folder gyre-ma runs in, would not be found."""
    from gyre_ma.experiment import play_run

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "my_grid.py").write_text("from gyre_ma.envs.registry import make_env\n\n"
                                         "def make():\n    return make_env('coverage_v0')\n")
    _experiment(project, seeds=1, iterations=1)
    base = project / "base.yaml"
    base.write_text(base.read_text().replace("env: {id: coverage_v0}", "env: {id: 'my_grid:make'}\n"
                                             "library: gyre_ma.envs.coverage.options:make_library"))
    monkeypatch.chdir(project)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    exp = load_experiment("tiny.yaml")  # relative, as a user types it
    monkeypatch.chdir(elsewhere)  # where a cluster's worker would run the task
    play_run(exp, exp.runs[0])
    assert run_state(exp.run_dir(exp.runs[0])) == "done"
    assert not any(elsewhere.iterdir())


def test_experiment_files_are_validated_like_configs_naming_the_key(tmp_path, capsys):
    assert main(["check", str(_experiment(tmp_path))]) == 0
    assert "experiment 'tiny_grid': valid — 4 runs (anchored, plain_gae × 2 seeds)" in capsys.readouterr().out
    path = _experiment(tmp_path, extra="budgett: 3\n")
    assert main(["experiment", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'budgett'" in err and "accepted keys here" in err and len(err.strip().splitlines()) == 1
    path = _experiment(tmp_path)
    path.write_text(path.read_text().replace("credit: {mode: plain}", "credit: {mood: plain}"))
    with pytest.raises(ConfigError, match=r"variant 'plain_gae': .*unknown key 'credit.mood'"):
        load_experiment(path)
    path = _experiment(tmp_path)
    path.write_text(path.read_text().replace("overrides: {train.lr: 0.001}", "overrides: {seed: 4}"))
    with pytest.raises(ConfigError, match="'seed' is set by the experiment itself"):
        load_experiment(path)
    path.write_text(path.read_text().replace("base: base.yaml", "base: nope.yaml"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_experiment(path)
    path = _experiment(tmp_path)
    path.write_text(path.read_text().replace("{episodes: 6}", "{episodes: 6, seed: 1073741820}"))
    with pytest.raises(ConfigError, match=r"'evaluation': seed: held-out task seeds 1073741820..1073741825 must lie"):
        load_experiment(path)  # from 2^30 on, the seeds are the runs' validation and training seeds
    assert not (tmp_path / "root").exists()  # nothing ran


def test_a_changed_variant_is_refused_in_an_existing_folder(tmp_path):
    path = _experiment(tmp_path, seeds=1, iterations=1)
    exp = load_experiment(path)
    from gyre_ma.experiment import _record_spec

    exp.folder.mkdir(parents=True)
    _record_spec(exp)
    path.write_text(path.read_text().replace("credit: {mode: plain}", "credit: {mode: segmented}"))
    with pytest.raises(ConfigError, match="variant 'plain_gae' changed"):
        _record_spec(load_experiment(path))
    path.write_text(path.read_text().replace("seeds: 1", "seeds: 3").replace("{mode: segmented}", "{mode: plain}"))
    _record_spec(load_experiment(path))  # more seeds: fine


def test_a_second_experiment_on_the_same_folder_is_refused(tmp_path, capsys):
    from gyre_ma.files import lock_folder

    path = _experiment(tmp_path, seeds=1, iterations=1)
    with lock_folder(load_experiment(path).folder, "gyre-ma experiment", "wait"):
        assert main(["experiment", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "is in use by another gyre-ma experiment (pid" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "root" / "tiny_grid" / "runs").exists()  # nothing ran, nothing was removed


def test_train_commands_pass_each_override_as_yaml(tmp_path):
    exp = load_experiment(_experiment(tmp_path))
    cmd = train_command(exp, exp.runs[2], resume=False)
    sets = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]
    assert sets == ["train.iterations=2", "train.lr=0.001", "credit.mode=plain", "seed=0", "name=plain_gae-s0"]
    assert "--resume" in train_command(exp, exp.runs[2], resume=True)
    assert os.path.isabs(cmd[cmd.index("--run-root") + 1])


def test_a_stable_baselines3_variant_trains_beside_the_manager_and_reports(tmp_path):
    """A variant with an ``sb3`` mapping trains SB3's PPO on the run's one-agent env (the
    flat single-agent learner from outside the framework): its run directory gets a config,
    a metrics row per rollout and a held-out evaluation, its training episodes draw training
    task seeds only, and the report lists it beside the manager. Bad SB3 keys name the
    variant and the key."""
    import gymnasium

    from gyre_ma.experiment_sb3 import TrainingSeeds
    from gyre_ma.monitor import read_metrics
    from gyre_ma.roles import TRAINING_SEEDS

    (tmp_path / "base.yaml").write_text(
        "name: one\nenv: {id: techtree_v0, kwargs: {n_agents: 1, size: 16, goal: make_stone_pickaxe, "
        "max_cycles: 150}}\n"
        "train: {episodes_per_iteration: 4, minibatch_size: 32, epochs: 1}\nmonitor: {spot_checks: 0}\n")
    path = tmp_path / "sb3.yaml"
    path.write_text(f"""\
name: sb3_grid
base: base.yaml
root: {tmp_path / 'root'}
variants:
  manager: {{}}
  sb3_ppo: {{sb3: {{env_steps: 512, n_envs: 2, n_steps: 128, batch_size: 64, n_epochs: 1}}}}
seeds: 1
budget: {{iterations: 1}}
report: {{metrics: [success_rate], reps: 200}}
evaluation: {{episodes: 3}}
""")
    assert main(["experiment", str(path), "--quiet"]) == 0
    run = tmp_path / "root" / "sb3_grid" / "runs" / "sb3_ppo-s0"
    evaluation = json.loads((run / "eval.json").read_text())
    assert evaluation["episodes"] == 3 and set(evaluation["greedy"]) >= {"success", "ci95", "episode_length"}
    assert list(read_metrics(run / "metrics.csv")["env_steps"]) == [256, 512]
    assert main(["report", str(tmp_path / "root" / "sb3_grid")]) == 0
    table = (tmp_path / "root" / "sb3_grid" / "report" / "report.md").read_text()
    assert "| sb3_ppo | 1 |" in table and "| manager | 1 |" in table
    assert "1 iterations each (sb3_ppo: 512 SB3 env steps)." in table

    class Seeds(gymnasium.Env):
        observation_space = action_space = gymnasium.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            self.seen = seed
            return 0, {}

    env = TrainingSeeds(Seeds(), seed=3, index=1)
    firsts = []
    for _ in range(3):
        env.reset()  # SB3 resets without a seed
        firsts.append(env.unwrapped.seen)
    assert len(set(firsts)) == 3 and all(s >= TRAINING_SEEDS for s in firsts)

    path.write_text(path.read_text().replace("env_steps: 512", "env_step: 512"))
    with pytest.raises(ConfigError, match=r"variants.sb3_ppo.sb3: unknown key 'env_step'"):
        load_experiment(path)
    (tmp_path / "three.yaml").write_text(BASE)  # coverage_v0: three agents
    from gyre_ma.config import load_config
    from gyre_ma.experiment_sb3 import _single_agent

    with pytest.raises(ValueError, match=r"needs a one-agent env; env 'coverage_v0' has agents \['agent_0'"):
        _single_agent(load_config(tmp_path / "three.yaml"))


def test_progress_counts_each_run_against_its_own_budget(tmp_path):
    """The progress table's total is the run's own: a variant's ``train.iterations`` (flat PPO
    at 10x), or an SB3 run's PPO iterations (env steps ÷ steps a rollout, rounded up)."""
    from gyre_ma.experiment import run_progress

    path = _experiment(tmp_path)
    text = path.read_text().replace("  plain_gae: {credit: {mode: plain}}\n", "  long: {train.iterations: 7}\n"
                                    "  sb3: {sb3: {env_steps: 1000, n_envs: 2, n_steps: 128}}\n")
    path.write_text(text)
    exp = load_experiment(path)
    totals = {run.variant: run_progress(exp, run) for run in exp.runs}
    assert totals == {"anchored": (0, 2), "long": (0, 7), "sb3": (0, 4)}


@pytest.mark.parametrize("name", sorted(p.name for p in (Path(__file__).parents[2] / "experiments").glob("*.yaml")))
def test_every_shipped_experiment_file_is_valid(name, tmp_path):
    """The experiment files the README quotes load, with every run's config checked."""
    exp = load_experiment(Path(__file__).parents[2] / "experiments" / name, root=str(tmp_path))
    assert exp.runs and not (tmp_path / exp.spec.name).exists()  # checking runs nothing


def test_a_killed_sb3_run_resumes_from_its_checkpoint(tmp_path):
    """An SB3 run checkpoints every ``checkpoint_every`` PPO iterations; killed after writing
    metrics rows past its last checkpoint, it resumes from that checkpoint: the rows after
    it are dropped and played again, the env steps go on from the checkpoint's, and each
    env's training seeds go on from its episode count."""
    import shutil

    from gyre_ma.experiment_sb3 import CHECKPOINT, STATE, SB3Spec, train
    from gyre_ma.monitor import read_metrics

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("name: one\nenv: {id: techtree_v0, kwargs: {n_agents: 1, size: 16, "
                                     "goal: make_stone_pickaxe, max_cycles: 150}}\n")
    spec = {"n_envs": 2, "n_steps": 64, "batch_size": 64, "n_epochs": 1, "checkpoint_every": 2}
    train(run, SB3Spec(env_steps=256, **spec), seed=0)  # iterations 0-1, checkpoint at 2
    assert run_state(run) == "partial"
    at_two = json.loads((run / STATE).read_text())
    assert at_two["iteration"] == 2 and at_two["env_steps"] == 256 and min(at_two["episodes"]) >= 1
    kept = tmp_path / "kept"
    kept.mkdir()
    for part in (CHECKPOINT, STATE):
        shutil.copy(run / part, kept / part.name)
    train(run, SB3Spec(env_steps=512, **spec), seed=0)  # resumes: iterations 2-3, checkpoint at 4
    assert json.loads((run / STATE).read_text())["iteration"] == 4
    for part in (CHECKPOINT, STATE):  # killed after rows 2-3 but before the checkpoint at 4
        shutil.copy(kept / part.name, run / part)
    model = train(run, SB3Spec(env_steps=512, **spec), seed=0)
    metrics = read_metrics(run / "metrics.csv")
    assert list(metrics["iteration"]) == [0, 1, 2, 3] and list(metrics["env_steps"]) == [128, 256, 384, 512]
    assert model.num_timesteps == 512
    state = json.loads((run / STATE).read_text())
    assert state["iteration"] == 4 and all(e > s for e, s in zip(state["episodes"], at_two["episodes"]))


def test_the_report_reads_steps_to_threshold_off_the_smoothed_curve_beside_the_raw_one(tmp_path):
    """``report.smooth``: each threshold is reported twice, on the logged curve and on its
    centred mean; a lucky iteration early on counts for the first only."""
    import numpy as np

    from gyre_ma.experiment import ExperimentSpec
    from gyre_ma.report import RunResult, summarize

    spec = ExperimentSpec.model_validate({
        "name": "s", "base": "b.yaml", "variants": {"a": {}}, "seeds": 2, "budget": {"iterations": 7},
        "report": {"metrics": ["v"], "thresholds": {"v": 0.9}, "smooth": 3, "reps": 100}})
    steps = np.array([10.0, 20, 30, 40, 50, 60, 70])
    curves = {0: [0.25, 1.0, 0.5, 0.75, 1.0, 1.0, 1.0], 1: [0.5, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0]}
    runs = [RunResult("a", seed, "done", {"env_steps": steps, "v": np.array(curve)},
                      {"sampled": {"success": 1.0}, "greedy": {"success": 1.0}}) for seed, curve in curves.items()]
    got = summarize(spec, runs, reps=100)["variants"]["a"]["steps_to"]
    assert set(got) == {"v>=0.9", "v>=0.9 (centred mean of 3)"}
    assert got["v>=0.9"]["mean"]["estimate"] == (20 + 30) / 2
    assert got["v>=0.9 (centred mean of 3)"]["mean"]["estimate"] == (50 + 30) / 2  # (.75+1+1)/3; (.75+1+1)/3
    with pytest.raises(ValueError, match="smooth"):
        ExperimentSpec.model_validate({"name": "s", "base": "b.yaml", "variants": {"a": {}},
                                       "budget": {"iterations": 1}, "report": {"smooth": 4}})


def test_a_variant_that_never_measures_a_threshold_metric_is_left_out_of_it_not_counted_as_never_reaching_it():
    """A random-order variant plays no validation episodes: its runs have no
    ``validation/*`` values. The report read "0/3 reached, ∞" and compared it with the
    learners as if it had failed to learn (P = 0.50 against a flat baseline that did fail)."""
    import numpy as np

    from gyre_ma.experiment import ExperimentSpec
    from gyre_ma.report import RunResult, _markdown, summarize

    spec = ExperimentSpec.model_validate({
        "name": "s", "base": "b.yaml", "variants": {"learned": {}, "flat": {}, "random": {}}, "seeds": 2,
        "budget": {"iterations": 3}, "report": {"metrics": ["v"], "thresholds": {"v": 0.9}, "reps": 100}})
    steps = np.array([10.0, 20, 30])
    curves = {"learned": [0.5, 1.0, 1.0], "flat": [0.0, 0.0, 0.0], "random": [np.nan, np.nan, np.nan]}
    runs = [RunResult(v, seed, "done", {"env_steps": steps, "v": np.array(c)},
                      {"sampled": {"success": 0.5}, "greedy": {"success": 0.5}} if v != "random"
                      else {"sampled": {"success": 0.2, "steps_to_goal": 90.0}, "greedy": None, "learns": False})
            for v, c in curves.items() for seed in (0, 1)]
    runs[-1].metrics.pop("v")  # a run that does not log the column at all, likewise
    s = summarize(spec, runs, reps=100)
    steps_to = {v: d["steps_to"]["v>=0.9"] for v, d in s["variants"].items()}
    assert (steps_to["learned"]["reached"], steps_to["learned"]["n"]) == (2, 2)
    assert (steps_to["flat"]["reached"], steps_to["flat"]["n"]) == (0, 2)  # measured, never reached: ∞
    assert steps_to["random"] == {"n": 0, "reached": 0, "median": None, "unmeasured": 2, "at_first": 0}
    assert "steps_to v>=0.9" in s["improvement"]["learned > flat"]
    assert "steps_to v>=0.9" not in s["improvement"]["flat > random"]
    assert "heldout_sampled" in s["improvement"]["flat > random"]  # held-out figures are still compared
    text = _markdown(spec, s, [])
    assert "| `v>=0.9` | random | not measured by its 2 runs |" in text
    assert "| `v>=0.9` | flat | 0/2 |" in text
    # a manager that learns nothing: sampled only (a session-54 user's report gave random a greedy 0.3)
    assert "| random | 2 | 0.2 [0.2, 0.2] | 0.2 [0.2, 0.2] | — | — |" in text, text
    assert "`random`: the manager learns nothing, so each run plays the same held-out task seeds" in text
    assert s["variants"]["random"]["learns"] is False and s["variants"]["flat"]["learns"] is True


def test_the_report_compares_held_out_path_lengths_and_names_misspelt_metrics_and_foreign_runs(tmp_path):
    """On a task every policy completes (a user's warehouse), the report showed held-out
    success alone (1.0 everywhere), a threshold reached at iteration 0 as if learned, a
    misspelt metric as "0/2 reached, ∞", and said nothing of runs another file left there."""
    import numpy as np
    import yaml

    from gyre_ma.experiment import EVAL_FILE, ExperimentSpec
    from gyre_ma.report import write_report

    spec = {"name": "paths", "base": "b.yaml", "variants": {"short": {}, "long": {}}, "seeds": 2,
            "budget": {"iterations": 3}, "report": {"metrics": ["validation/sampled_success"],
                                                     "thresholds": {"validation/sampled_success": 1.0,
                                                                    "validation/sampled_length": {"at_most": 120}},
                                                     "reps": 200}}
    folder = tmp_path / "paths"
    for variant, base in (("short", 90.0), ("long", 130.0)):
        for seed in (0, 1):
            run = folder / "runs" / f"{variant}-s{seed}"
            run.mkdir(parents=True)
            (run / "metrics.csv").write_text("iteration,env_steps,validation/sampled_success,"
                                             "validation/sampled_length\n"
                                             f"0,100,1.0,150\n1,200,1.0,{base + 30}\n2,300,1.0,{base}\n")
            evaluation = {mode: {"success": 1.0, "ci95": [0.9, 1.0], "episode_length": base + seed + shift,
                                 "steps_to_goal": base + seed + shift}
                          for mode, shift in (("sampled", 5.0), ("greedy", 0.0))}
            (run / EVAL_FILE).write_text(json.dumps(evaluation))
    (folder / "runs" / "other-s0").mkdir()
    (folder / "experiment.yaml").write_text(yaml.safe_dump(ExperimentSpec.model_validate(spec).model_dump()))
    report = write_report(folder).read_text()
    assert "| short | 2 | 95.5 [95, 96] |" in report and "| long | 2 | 135.5 [135, 136] |" in report, report
    assert "| short > long | 0.50 [0.50, 0.50] | 1.00 [1.00, 1.00] |" in report  # success ties; paths decide
    assert "| `validation/sampled_success>=1` | short | 2/2 | 2 |" in report and "before learning could show" in report
    assert "does not name (left out; another experiment file of the same name wrote them):** other-s0" in report
    assert "**Few runs: 2 in the smallest variant.**" in report  # a session-54 user read 1.00 [1.00, 1.00] as sure
    # a length is reached by falling to it: short at 200 steps (120 <= 120), long never (130 > 120)
    assert "| `validation/sampled_length<=120` | short | 2/2 | 0 | 200 [200, 200] |" in report, report
    assert "| `validation/sampled_length<=120` | long | 0/2 | 0 | ∞ [∞, ∞] |" in report
    summary = json.loads((folder / "report" / "report.json").read_text())
    assert np.isclose(summary["variants"]["long"]["heldout_greedy_steps_to_goal"]["mean"]["estimate"], 130.5)
    spec["report"]["thresholds"] = {"validation/sampled_sucess": 1.0}
    with pytest.raises(ValueError, match="at_most"):
        ExperimentSpec.model_validate(spec | {"report": spec["report"] | {"thresholds": {"x": {"at_mots": 1}}}})
    (folder / "experiment.yaml").write_text(yaml.safe_dump(ExperimentSpec.model_validate(spec).model_dump()))
    with pytest.raises(ValueError, match=r"report.thresholds: metric 'validation/sampled_sucess' is not logged by "
                                         r"any run; the runs log \['env_steps', 'iteration', "
                                         r"'validation/sampled_length', 'validation/sampled_success'\]"):
        write_report(folder)
    spec["report"]["thresholds"] = {"validation/sampled_success": 1.0}
    for variant in ("short", "long"):  # five runs a variant: no warning
        for seed in (2, 3, 4):
            shutil.copytree(folder / "runs" / f"{variant}-s{seed % 2}", folder / "runs" / f"{variant}-s{seed}")
    (folder / "experiment.yaml").write_text(yaml.safe_dump(ExperimentSpec.model_validate(spec | {"seeds": 5})
                                                           .model_dump()))
    assert "Few runs" not in write_report(folder).read_text()


def test_check_of_an_experiment_plays_each_variant_that_plays_otherwise(tmp_path, capsys):
    """check played the base config only: a variant whose env could not be built passed it
    and failed every run."""
    path = _experiment(tmp_path)
    text = path.read_text().replace("plain_gae: {credit: {mode: plain}}",
                                    "plain_gae: {credit: {mode: plain}}\n  two: {env: {kwargs: {n_agents: 2}}}")
    path.write_text(text)
    assert main(["check", str(path), "--play", "1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "variant 'two' (it changes ['env.kwargs.n_agents']): played 1 episode by a random order" in out, out
    assert "variant 'plain_gae'" not in out  # credit changes how it learns, not what it plays
    path.write_text(text.replace("n_agents: 2", "n_agents: 3, size: 2"))
    assert main(["check", str(path), "--play", "0"]) == 2
    assert "size" in capsys.readouterr().err


def test_a_run_whose_manager_learns_nothing_is_evaluated_sampled_only_without_a_checkpoint(tmp_path):
    from gyre_ma.experiment import EVAL_FILE, evaluate_run

    run = tmp_path / "random-s0"
    run.mkdir()
    (run / "config.yaml").write_text("name: r\nenv: {id: coverage_v0}\nmanager: {kind: random}\n")
    out = evaluate_run(run, episodes=4, seed=1_000_000)
    assert out["learns"] is False and out["greedy"] is None and out["checkpoint"] is None
    assert 0.0 <= out["sampled"]["success"] <= 1.0 and json.loads((run / EVAL_FILE).read_text())["greedy"] is None
