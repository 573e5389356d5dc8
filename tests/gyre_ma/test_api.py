"""``gyre_ma.api``: the commands as Python functions. A session-55 user who works in Python
found no documented way to train: they drove the internal ``Gyre`` loop by hand, which wrote
no ``metrics.csv``, spot checks, ``summary.json`` or ``final.pt`` hash, and silently
overwrote an earlier run that the command would have refused."""

from __future__ import annotations

import json

import pytest

from gyre_ma import api
from gyre_ma.roles import evaluation_tasks


def test_train_resume_and_evaluate_do_what_the_commands_do(tmp_path, capsys):
    config = tmp_path / "cov.yaml"
    config.write_text(f"name: cov\nenv: {{id: coverage_v0}}\nrun_root: {tmp_path / 'runs'}\n"
                      "train: {iterations: 2, episodes_per_iteration: 4}\n")
    api.check(config, play=1)
    capsys.readouterr()
    summary = api.train(config, overrides={"monitor": {"spot_checks": 1}})
    out = capsys.readouterr().out  # a line an iteration and the summary, as the command prints them
    assert "iter 1/2" in out and "iter 2/2" in out and "summary" in out
    run = tmp_path / "runs" / "cov"
    assert summary["run_dir"] == str(run) and summary["iteration"] == 1 and 0 <= summary["success_rate"] <= 1
    assert summary == json.loads((run / "summary.json").read_text()) | {"run_dir": str(run)}
    for made in ("metrics.csv", "config.yaml", "checkpoints/initial.pt", "checkpoints/final.pt",
                 "spot_checks/iteration_00001.md"):
        assert (run / made).is_file(), made
    assert "final.pt" in json.loads((run / "checkpoints" / "manifest.json").read_text())["files"]
    with pytest.raises(ValueError, match="already has checkpoints; pass resume=True to continue it"):
        api.train(config, overrides={"monitor": {"spot_checks": 1}})  # an earlier run is not overwritten
    assert api.train(config, overrides={"monitor": {"spot_checks": 1}}, iterations=3, resume=True,
                     quiet=True)["iteration"] == 2
    assert capsys.readouterr().out == ""
    assert len((run / "metrics.csv").read_text().splitlines()) == 1 + 3

    figures = api.evaluate(run, episodes=6, trust_config=True, quiet=True)
    assert len(figures["episodes"]) == 6 and figures["episodes"][0]["task_seed"] == 1_000_000
    assert figures["success_ci95_low"] <= figures["success_rate"] <= figures["success_ci95_high"]
    again = api.evaluate(run / "checkpoints" / "final.pt", episodes=6, trust_config=True)
    assert capsys.readouterr().out.count("verified completion") == 1  # the quiet one printed no table
    assert again["success_rate"] == figures["success_rate"]  # the same seeds and stream: the same episodes
    own_code = {"name": "cov_code", "env": {"id": "gyre_ma.envs.coverage.coverage:CoverageEnv"},
                "library": "gyre_ma.envs.coverage.options:make_library"}
    coded = api.train(config, overrides=own_code, iterations=1, quiet=True)  # it imports code: eval asks for trust
    with pytest.raises(ValueError, match=r"If you trust this file, pass trust_config=True; or pass your own config "
                                         r"with config='FILE.yaml'"):  # its words, not the command's (a user's)
        api.evaluate(coded["run_dir"], episodes=6)
    with pytest.raises(ValueError, match=r"--seed: held-out task seeds 1073741824\.\.1073741829 must lie in "
                                         r"\[0, 2\^30"):
        api.evaluate(run, episodes=6, seed=2**30, trust_config=True)


def test_evaluation_tasks_refuse_seeds_training_or_validation_draws_from():
    """The user's ``evaluation_tasks([2**31 + 5])`` was accepted: a figure on a training seed."""
    assert [t.task_seed for t in evaluation_tasks(range(3))] == [0, 1, 2]
    with pytest.raises(ValueError, match=r"evaluation_tasks: held-out task seeds must lie in \[0, 2\^30 = "
                                         r"1073741824\); got \[2147483653\]"):
        evaluation_tasks([2**31 + 5])


def test_an_experiment_and_its_report_from_python(tmp_path):
    (tmp_path / "base.yaml").write_text("name: base\nenv: {id: coverage_v0}\ntrain: {episodes_per_iteration: 4}\n")
    file = tmp_path / "exp.yaml"
    file.write_text(f"name: tiny\nbase: base.yaml\nroot: {tmp_path / 'exps'}\nseeds: 1\nbudget: {{iterations: 1}}\n"
                    "variants: {default: {}}\nevaluation: {episodes: 4}\n")
    folder = api.experiment(file)
    assert folder == tmp_path / "exps" / "tiny" and (folder / "runs" / "default-s0" / "eval.json").is_file()
    figures = api.report(folder)
    assert (folder / "report" / "report.md").is_file() and figures
