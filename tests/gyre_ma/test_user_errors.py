"""A user's broken code is named in one line; gyre-ma's own bugs keep their traceback.

Measurement 4 of issue #18: a sub-policy returning None gave "int() argument must be a
string ... not 'NoneType'" naming nothing; action 99 for Discrete(5) trained silently;
every TypeError, gyre-ma's own bugs included, exited 2 without a traceback.
"""

from __future__ import annotations

import csv
import json
import pickle
import re
import textwrap

import numpy as np
import pytest
import torch
import yaml

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.cli import main
from gyre_ma.envs.coverage.coverage import task_graph
from gyre_ma.envs.registry import make_env
from gyre_ma.metrics import episode_metrics
from gyre_ma.options.errors import UserCodeError
from gyre_ma.options.library import OptionLibrary
from gyre_ma.options.option import Option
from gyre_ma.rollout import action_check, run_episode


def _library(policy, **option) -> OptionLibrary:
    library = OptionLibrary("broken", task_graph(3, 9))
    library.add(Option("wander", policy, None, done=lambda ctx: ctx.steps >= 3, max_steps=3, **option))
    return library


@pytest.mark.parametrize("action, expected", [
    (None, "an integer in [0, 5)"), (99, "an integer in [0, 5)"), (True, "an integer"),
    (float("nan"), "an integer"), (np.array([1, 2]), "an integer"), ("up", "an integer"),
])
def test_a_bad_action_names_the_option_the_agent_and_the_space(action, expected):
    env = make_env("coverage_v0")
    with pytest.raises(ValueError) as info:
        run_episode(env, _library(lambda ctx: action), RandomManager(0), seed=1)
    message = str(info.value)
    assert "option 'wander'" in message and "agent 'agent_0'" in message and expected in message
    # the sub-policy by name and where it is defined (one callable may serve several options)
    assert isinstance(info.value, UserCodeError)
    assert message.startswith("sub-policy tests.gyre_ma.test_user_errors.test_a_bad_action_names_the_option_the_agent"
                              "_and_the_space.<locals>.<lambda> of option 'wander'"), message
    assert re.search(rf"\(defined at {re.escape(__file__)}:\d+\)$", message), message
    assert run_episode(env, _library(lambda ctx: np.int64(2)), RandomManager(0), seed=1).length > 0  # fine
    assert ("CANNOT_PROCEED" in message) == (action is None)  # "nothing to do" has its own return value


class _Decorated:
    """A callable instance whose ``__call__`` is wrapped by a decorator defined in torch."""

    @torch.inference_mode()
    def __call__(self, ctx):
        return 99


def test_a_bad_action_from_a_decorated_call_names_where_the_call_is_written_not_the_decorator():
    with pytest.raises(UserCodeError) as info:
        run_episode(make_env("coverage_v0"), _library(_Decorated()), RandomManager(0), seed=1)
    line = _Decorated.__call__.__wrapped__.__code__.co_firstlineno
    assert str(info.value).endswith(f"(defined at {__file__}:{line})"), str(info.value)


def test_other_action_spaces_are_checked_by_their_own_contains():
    from gymnasium import spaces

    check = action_check(spaces.Box(-1.0, 1.0, shape=(2,)), "a")
    assert check(np.zeros(2, dtype=np.float32), "move") is not None
    for bad in (np.array([np.nan, 0.0], dtype=np.float32), np.ones(3, dtype=np.float32), None):
        with pytest.raises(ValueError, match="option 'move' .*agent 'a'"):
            check(bad, "move")
    # a session-55 user's controller returned np.array([a]), float64: "expected an element of Box(...)", no why
    for good in (np.array([0.5, -1.0]), [0.5, -1], (np.float64(0.5), -1.0)):
        got = check(good, "move")
        assert got.dtype == np.float32 and got.tolist() == [0.5, -1.0]
    with pytest.raises(ValueError, match=r"expected an array of shape \(2,\) and dtype float32 within Box.*\(element "
                                         r"1, np.float32\(3.0\), lies outside \[np.float32\(-1.0\), "
                                         r"np.float32\(1.0\)\]; clip it\)"):
        check(np.array([0.0, 3.0]), "move")
    with pytest.raises(ValueError, match=r"\(shape \(\), dtype float64\)"):
        check(0.5, "move")
    one = action_check(spaces.Box(-1.0, 1.0, shape=(1,)), "a")
    assert one(0.25, "push").tolist() == [0.25] and one(np.float64(-1), "push").shape == (1,)
    with pytest.raises(ValueError, match=r"a single number stands for shape \(1,\)\) \(shape \(\), dtype <U4\)"):
        one("left", "push")
    check = action_check(spaces.MultiDiscrete([3, 4], start=[1, 0]), "a")
    for good in (np.array([1, 3]), np.array([3, 0], dtype=np.int8), [2, 1], (1, np.int64(2))):
        assert check(good, "call") is good
    for bad in (np.array([0, 0]), np.array([1, 4]), np.array([1.0, 2.0]), np.array([1, 2, 0]), [1, True], None, 5):
        with pytest.raises(ValueError, match=r"option 'call' .*agent 'a'.*integers within MultiDiscrete"):
            check(bad, "call")


def test_an_exception_in_a_sub_policy_or_predicate_names_it_and_the_users_line():
    env = make_env("coverage_v0")

    def broken_policy(ctx):
        raise RuntimeError("my bug")

    with pytest.raises(UserCodeError) as info:
        run_episode(env, _library(broken_policy), RandomManager(0), seed=1)
    message = str(info.value)
    assert "broken_policy" in message and "option 'wander'" in message and "agent 'agent_0'" in message
    assert "RuntimeError: my bug" in message and f"{__file__}:" in message
    assert isinstance(info.value.__cause__, RuntimeError)

    def broken_initiation(ctx):
        return 1 / 0

    with pytest.raises(UserCodeError, match="initiation predicate .*broken_initiation of option 'wander'"):
        run_episode(env, _library(lambda ctx: 0, initiation=broken_initiation), RandomManager(0), seed=1)


def test_a_users_manager_detector_or_rule_snapshot_that_raises_is_named():
    from gyre_ma.envs.adapters import from_gymnasium
    from gyre_ma.rewards.rules import RuleEngine, load_rules

    class MyManager(RandomManager):
        def decide(self, decisions):
            raise KeyError("lost my table")

    MyManager.__module__ = __name__  # a user's manager, not one of gyre-ma's
    env = make_env("coverage_v0")
    with pytest.raises(UserCodeError,
                       match=r"manager .*MyManager.decide \(agent 'agent_0', task seed 1\) raised KeyError"):
        run_episode(env, _library(lambda ctx: 0), MyManager(0), seed=1)

    def no_such_state(env):
        return env.unwrapped.no_such_attribute

    env = from_gymnasium("CartPole-v1", milestones={"up": no_such_state},
                         graph={"goals": ["up"], "milestones": {"up": {}}})
    with pytest.raises(UserCodeError, match=r"detector .*no_such_state for milestone 'up'.*AttributeError"):
        env.reset(seed=0)

    def broken_snapshot(env):
        raise RuntimeError("snapshot bug")

    engine = RuleEngine(load_rules([{"name": "r", "kind": "guard", "when": "episode_end", "require": {"x": 1}}]),
                        snapshot=broken_snapshot)
    traj = run_episode(make_env("coverage_v0"), _library(lambda ctx: 0), RandomManager(0), seed=1, max_steps=3)
    with pytest.raises(UserCodeError, match=r"rule state snapshot .*broken_snapshot raised RuntimeError: snapshot bug"):
        engine.end_episode(traj, make_env("coverage_v0"))


def _write_user_module(tmp_path, body: str) -> None:
    (tmp_path / "userlib.py").write_text(textwrap.dedent(body))


def _config(tmp_path) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(f"name: broken\nenv: {{id: coverage_v0}}\nlibrary: 'userlib:make'\nrun_root: '{tmp_path}'\n"
                    "train: {iterations: 1}\n")
    return str(path)


LIBRARY = """
    from gyre_ma.envs.coverage.coverage import milestone, task_graph
    from gyre_ma.options.library import OptionLibrary
    from gyre_ma.options.option import Option

    def wander(ctx):
        {body}

    def make():
        library = OptionLibrary("broken", task_graph(3, 9))
        for k in range(3):
            library.add(Option(f"go_to_{k}", wander, milestone(k), max_steps=3))
        return library
"""


def test_train_reports_a_users_error_in_one_line_with_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(tmp_path))
    _write_user_module(tmp_path, LIBRARY.replace("{body}", "raise KeyError('inventory')"))
    monkeypatch.delitem(__import__("sys").modules, "userlib", raising=False)
    assert main(["train", _config(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "userlib.wander of option 'go_to_" in err and "KeyError" in err and "userlib.py:7" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert re.search(r"\[episode of task seed \d+\]", err), err  # a rare fault can be found again
    kept = (tmp_path / "broken" / "error.txt").read_text().splitlines()  # and the run keeps the reason
    assert len(kept) == 1 and re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d iteration 1 of 1 \(as the progress line "
                                      r"counts\): UserCodeError: sub-policy userlib\.wander of option 'go_to_\d' "
                                      r".*KeyError", kept[0]), kept
    seed = re.search(r"\[episode of task seed (\d+)\]", err)[1]  # a training seed: eval refuses it
    assert err.strip().endswith(f"(to play on through a rare fault like this one, set backend.on_fault: continue); "
                                f"gyre-ma check {_config(tmp_path)} --seed {seed} --play 1 plays that task again by a "
                                "random order of the options")
    assert main(["check", _config(tmp_path), "--seed", seed, "--play", "1"]) == 2  # which a session-56 note asked for
    again = capsys.readouterr().err
    assert "userlib.wander of option 'go_to_" in again and f"task seed {seed}" in again, again
    assert main(["train", _config(tmp_path), "--quiet"]) == 2  # a fresh attempt in the same folder
    kept = (tmp_path / "broken" / "error.txt").read_text().splitlines()
    assert len(kept) == 3 and kept[1].endswith("a fresh run started here; the errors above are an earlier attempt's")
    assert (tmp_path / "broken" / "checkpoints" / "manifest.json").is_file()  # initial.pt's hash, no slot
    capsys.readouterr()
    assert main(["train", _config(tmp_path), "--quiet", "--resume"]) == 2
    assert "nothing to resume" in capsys.readouterr().err


def test_train_reports_a_users_broken_rule_in_one_line_with_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(tmp_path))
    _write_user_module(tmp_path, """
        def done_by_budget(ctx):
            return ctx.state["budget"] > 0
    """)
    monkeypatch.delitem(__import__("sys").modules, "userlib", raising=False)
    path = tmp_path / "config.yaml"
    path.write_text(f"name: rule\nenv: {{id: coverage_v0}}\nrun_root: '{tmp_path}'\ntrain: {{iterations: 1}}\n"
                    "rewards: {rules: [{name: budget_left, kind: guard, when: episode_end, "
                    "check: 'userlib:done_by_budget'}]}\n")
    assert main(["train", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "rule 'budget_left' (episode_end) check userlib.done_by_budget" in err
    assert "unknown state key 'budget'" in err and "userlib.py:3" in err
    assert "on_fault" not in err  # a rule's error is no fault to play on through
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    # the failed run let go of its lock: the same process can train the run again
    (tmp_path / "userlib.py").write_text("def done_by_budget(ctx):\n    return ctx.trajectory.calls[99]\n")
    monkeypatch.delitem(__import__("sys").modules, "userlib", raising=False)
    assert main(["train", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "rule 'budget_left' (episode_end) check userlib.done_by_budget raised IndexError" in err
    assert "userlib.py:2" in err and len(err.strip().splitlines()) == 1


def test_a_bug_in_gyre_ma_keeps_its_traceback_and_says_so(tmp_path, monkeypatch, capsys):
    import gyre_ma.loop

    def buggy_init(self, *args, **kwargs):
        return len(None)  # a TypeError inside gyre-ma, not a check of the user's input

    monkeypatch.setattr(gyre_ma.loop.Gyre, "__init__", buggy_init)
    path = tmp_path / "config.yaml"
    path.write_text(f"name: bug\nenv: {{id: coverage_v0}}\nrun_root: '{tmp_path}'\ntrain: {{iterations: 1}}\n")
    assert main(["train", str(path), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "this is a bug in gyre-ma" in err


def test_debug_after_the_command_shows_the_users_error_with_its_traceback(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    _write_user_module(tmp_path, LIBRARY.replace("{body}", "raise KeyError('inventory')"))
    monkeypatch.delitem(__import__("sys").modules, "userlib", raising=False)
    with pytest.raises(UserCodeError, match="userlib.wander") as info:
        main(["train", _config(tmp_path), "--quiet", "--debug"])
    assert isinstance(info.value.__cause__, KeyError)


def test_a_bug_of_any_exception_type_keeps_its_traceback_and_says_so(tmp_path, monkeypatch, capsys):
    """A KeyError or RuntimeError inside gyre-ma escaped without the "bug" line."""
    import gyre_ma.loop

    def buggy_init(self, *args, **kwargs):
        return {}["missing"]

    monkeypatch.setattr(gyre_ma.loop.Gyre, "__init__", buggy_init)
    path = tmp_path / "config.yaml"
    path.write_text(f"name: bug\nenv: {{id: coverage_v0}}\nrun_root: '{tmp_path}'\ntrain: {{iterations: 1}}\n")
    assert main(["train", str(path), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "KeyError" in err and "Traceback" in err and "this is a bug in gyre-ma" in err


@pytest.mark.timeout(600)
def test_a_users_error_on_a_ray_worker_is_one_line_with_exit_2(tmp_path):
    """On Ray the error was retried, then raised as a RuntimeError: a traceback, exit 1."""
    import os
    import subprocess
    import sys

    _write_user_module(tmp_path, LIBRARY.replace("{body}", "raise KeyError('inventory')"))
    config = tmp_path / "config.yaml"
    config.write_text(f"name: broken\nenv: {{id: coverage_v0}}\nlibrary: 'userlib:make'\nrun_root: '{tmp_path}'\n"
                      "train: {iterations: 1}\nroles: {evaluators: 0}\n"
                      "backend: {name: ray, workers: 1, max_attempts: 2, "
                      "ray_init: {num_cpus: 1, include_dashboard: false}}\n")
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "gyre_ma.cli", "train", str(config), "--quiet"],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-3000:]
    lines = [line for line in out.stderr.splitlines() if line.startswith("gyre-ma train:")]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert "userlib.wander of option 'go_to_" in lines[0] and "KeyError" in lines[0] and "userlib.py:7" in lines[0]
    assert "Ray worker" in lines[0] and "2 attempts" in lines[0]


class _Broken:
    """coverage_v0 with one of its outputs broken: ``verified_milestones`` or the rewards."""

    def __init__(self, fault: str) -> None:
        self.env, self.fault = make_env("coverage_v0"), fault

    def __getattr__(self, name):
        return getattr(self.__dict__["env"], name)

    def step(self, actions):
        observations, rewards, terms, truncs, infos = self.env.step(actions)
        value = {"str": "lots", "array": np.array([1.0, 2.0]), "nan": float("nan"), "none": None}.get(self.fault)
        if value is not None or self.fault == "none":
            rewards = dict.fromkeys(rewards, value)
        return observations, rewards, terms, truncs, infos

    def verified_milestones(self):
        if self.fault == "dict":
            return dict.fromkeys(self.env.verified_milestones(), True)
        if self.fault == "raises":
            raise KeyError("lost its milestones")
        return self.env.verified_milestones()


@pytest.mark.parametrize("fault, expected", [
    ("dict", r"environment CoverageEnv\.verified_milestones \(step 0\) returned .*\(dict\); expected a set of "
             r"milestone names"),
    ("raises", r"environment CoverageEnv\.verified_milestones \(step 0\) raised KeyError: 'lost its milestones'"),
    ("str", r"environment CoverageEnv\.step \(step 0\): agent 'agent_\d''s reward is 'lots' \(str\); expected a "),
    ("array", r"environment CoverageEnv\.step \(step 0\): agent 'agent_\d''s reward is .*\(ndarray\); expected a "),
    ("none", r"environment CoverageEnv\.step \(step 0\): agent 'agent_\d''s reward is 'None' \(NoneType\)"),
    ("nan", r"environment CoverageEnv\.step \(step 0\): agent 'agent_\d''s reward is nan; expected a finite number"),
])
def test_an_envs_bad_milestones_or_rewards_are_named_with_the_agent_and_step(fault, expected):
    with pytest.raises(ValueError, match=expected):
        run_episode(_Broken(fault), _library(lambda ctx: 1), RandomManager(0), seed=1)


def test_an_env_factory_that_gives_no_gyre_env_or_a_library_factory_that_raises_is_named(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    _write_user_module(tmp_path, """
        def nothing():
            return None

        def raw():  # a PettingZoo env without the adapter: no verified_milestones
            from gyre_ma.envs.registry import make_env
            env = make_env("coverage_v0")
            return type("Raw", (), {"possible_agents": env.possible_agents, "step": env.step})()

        def library():
            raise KeyError("oops")
    """)
    monkeypatch.delitem(__import__("sys").modules, "userlib", raising=False)
    with pytest.raises(ValueError, match=r"env.id: 'userlib:nothing' built NoneType, expected a PettingZoo Parallel"):
        make_env("userlib:nothing")
    with pytest.raises(ValueError, match=r"env.id: 'userlib:raw' built Raw, which has no verified_milestones\(\)"):
        make_env("userlib:raw")
    with pytest.raises(UserCodeError, match=r"library 'userlib:library' \(library_kwargs\): factory userlib.library "
                                            r"raised KeyError: 'oops' \(at .*userlib"):
        OptionLibrary.load("userlib:library")


def test_an_iteration_in_which_no_option_could_start_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(tmp_path))
    _write_user_module(tmp_path, LIBRARY.replace("{body}", "return 1").replace(
        "max_steps=3)", "max_steps=3, initiation=lambda ctx: False)"))
    monkeypatch.delitem(__import__("sys").modules, "userlib", raising=False)
    assert main(["train", _config(tmp_path), "--quiet"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "iteration 0: no episode made an option call" in err and "found no option they could start" in err


def test_damaged_run_files_and_misfit_checkpoints_are_one_error_naming_the_file(tmp_path, capsys):
    from torch import nn

    from gyre_ma.checkpoints import load_weights
    from gyre_ma.monitor import read_metrics
    from gyre_ma.report import load_spec

    with pytest.raises(ValueError, match=r"checkpoint policy: its weights do not fit the network this config builds "
                                         r"\(weight: checkpoint \(2, 4\), this config \(2, 3\)\)"):
        load_weights(nn.Linear(3, 2), nn.Linear(4, 2).state_dict(), "policy")
    with pytest.raises(ValueError, match=r"checkpoint policy: its weights do not fit the network this config builds "
                                         r"\(.*Missing key"):
        load_weights(nn.Linear(3, 2), {"weight": nn.Linear(3, 2).weight.detach()}, "policy")
    nan = nn.Linear(3, 2).state_dict()
    nan["bias"][1] = float("nan")  # a session-54 user's NaN policy was evaluated as 100 % success
    layer = nn.Linear(3, 2)
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    with pytest.raises(ValueError, match=r"checkpoint critic: weights \['bias'\] hold NaN or infinite values"):
        load_weights(layer, nan, "critic")
    assert all(torch.equal(before[k], v) for k, v in layer.state_dict().items())  # nothing was loaded
    csv = tmp_path / "metrics.csv"
    csv.write_text("iteration,success_rate\n0,0.5\nxx,0.75\n")
    with pytest.raises(ValueError, match=r"metrics.csv' is damaged: row 2's 'iteration' is 'xx', not a number"):
        read_metrics(csv)
    csv.write_bytes(bytes(range(128, 256)) * 4 + b"\n")
    with pytest.raises(ValueError, match=r"metrics.csv' is damaged or not a metrics.csv"):
        read_metrics(csv)
    (tmp_path / "experiment.yaml").write_text("name: [unclosed\n")
    with pytest.raises(ValueError, match=r"experiment.yaml' is damaged: not the YAML gyre-ma experiment wrote"):
        load_spec(tmp_path)
    misspelt = tmp_path / "exp.yaml"  # an experiment file (it has a base) whose variants are misspelt
    misspelt.write_text("name: x\nbase: base.yaml\nvarients: {a: {}}\n")
    assert main(["check", str(misspelt)]) == 2
    assert "'variants': required key is missing" in capsys.readouterr().err
    misspelt.write_text("name: x\nbase: base.yaml\nvariants: {a: {}}\n")  # a missing key says what it wants
    assert main(["check", str(misspelt)]) == 2
    assert "'budget': required key is missing (Every run's training budget, e.g. budget: {iterations: 30})" in \
        capsys.readouterr().err


@pytest.mark.parametrize("which, value", [("initiation", "yes"), ("initiation", None), ("failure", 0),
                                          ("failure", np.array([True, False]))])
def test_a_predicate_that_answers_other_than_a_bool_is_named(which, value):
    env = make_env("coverage_v0")
    with pytest.raises(UserCodeError) as info:
        run_episode(env, _library(lambda ctx: 1, **{which: lambda ctx: value}), RandomManager(0), seed=1)
    message = str(info.value)  # once, and where the user's predicate is: not "raised ValueError ... (at option.py)"
    assert re.fullmatch(rf"option 'wander' \(agent 'agent_0'\): its {which} predicate .*<lambda> returned .*; "
                        rf"expected True or False "
                        rf"\(defined at {re.escape(__file__)}:\d+\)", message, flags=re.S), message
    assert message.count("wander") == 1 and "raised" not in message
    assert run_episode(env, _library(lambda ctx: 1, **{which: lambda ctx: np.bool_(which == "initiation")}),
                       RandomManager(0), seed=1).length > 0  # NumPy's bools are bools


def test_check_and_train_refuse_a_library_on_other_milestones_than_the_envs_and_a_rule_on_an_unknown_one(
        tmp_path, capsys):
    """A misspelt goal is a node the env never verifies: every episode ran to its cap and
    training reported 0 % success, while ``check`` said ok. A rule on an unknown milestone
    passed ``check`` and failed only in ``train``."""
    (tmp_path / "lib.yaml").write_text(textwrap.dedent("""
        name: misspelt
        graph: {goals: [covered_0, covered_1, covered_two], milestones: {covered_0: {}, covered_1: {}, covered_two: {}}}
        options:
          - {name: go_to_0, milestone: covered_0, policy: gyre_ma.envs.coverage.options:go_to_0, max_steps: 18}
          - {name: go_to_1, milestone: covered_1, policy: gyre_ma.envs.coverage.options:go_to_1, max_steps: 18}
          - {name: go_to_2, milestone: covered_two, policy: gyre_ma.envs.coverage.options:go_to_2, max_steps: 18}
    """))
    base = f"seed: 0\nenv: {{id: coverage_v0}}\nrun_root: {tmp_path / 'runs'}\n" \
           "train: {iterations: 1, episodes_per_iteration: 4}\n"
    library_cfg = tmp_path / "library.yaml"
    library_cfg.write_text(f"name: misspelt\nlibrary: {tmp_path / 'lib.yaml'}\n" + base)
    (tmp_path / "rule.yaml").write_text("name: rule\nrewards: {rules: [{name: r, milestone: covered_9, "
                                        "require: {covered_0: true}}]}\n" + base)
    for command in ("check", "train"):
        assert main([command, str(library_cfg), *(["--quiet"] if command == "train" else [])]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"library '{tmp_path / 'lib.yaml'}'" in err, err
        assert "the env never verifies ['covered_two']; the library's graph lacks ['covered_2']" in err
        assert main([command, str(tmp_path / "rule.yaml"), *(["--quiet"] if command == "train" else [])]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert "rule 'r': milestone 'covered_9' is not a node of the task graph" in err, err
    assert not any((tmp_path / "runs").iterdir())  # a run whose setup failed leaves no folder behind
    lib = tmp_path / "lib.yaml"
    lib.write_text(lib.read_text().replace("covered_two", "covered_2"))
    assert main(["check", str(library_cfg)]) == 0  # named as the env does: fine


def test_a_users_error_survives_pickling_as_a_worker_would_send_it():
    from gyre_ma.options.errors import UserAnswerError

    for error in (UserCodeError("option 'x' sub-policy", KeyError("k")),
                  UserAnswerError("option 'x': its done predicate f", "returned None; expected True or False")):
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error) and back.what == error.what


def test_check_plays_a_configs_env_so_that_an_env_broken_at_its_first_step_fails_there(tmp_path, monkeypatch,
                                                                                       capsys):
    """A reward of the wrong type (and any other broken reset or step) passed ``check`` and
    failed at the first step of ``train``; ``check`` now plays the env by its options."""
    monkeypatch.syspath_prepend(str(tmp_path))
    _write_user_module(tmp_path, """
        from gyre_ma.envs.coverage.coverage import CoverageEnv

        class Stringly(CoverageEnv):
            def step(self, actions):
                observations, rewards, terms, truncs, infos = super().step(actions)
                return observations, dict.fromkeys(rewards, "lots"), terms, truncs, infos

        def make():
            return Stringly()
    """)
    monkeypatch.delitem(__import__("sys").modules, "userlib", raising=False)
    config = tmp_path / "config.yaml"
    config.write_text("name: stringly\nenv: {id: 'userlib:make'}\n"
                      "library: gyre_ma.envs.coverage.options:make_library\n")
    assert main(["check", str(config), "--play", "0"]) == 0  # validation alone cannot see it
    capsys.readouterr()
    assert main(["check", str(config)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith("gyre-ma check: error: check_env [step] (seed=0, step=1, agent='agent_0'): reward for "
                          "agent 'agent_0' after step 1 is 'lots', expected a finite number"), err
    assert main(["check", str(config), "--set", "backend.on_fault=continue"]) == 2  # a check's finding is no fault
    assert "check_env [step] (seed=0, step=1, agent='agent_0')" in capsys.readouterr().err
    config.write_text(config.read_text().replace("userlib:make", "coverage_v0"))
    assert main(["check", str(config), "--play", "3"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert re.search(r"played 3 episodes by a random order of the library's options: \d+ steps in all, each episode "
                     r"replayed with the same milestones; 3 of 3 milestones verified; goals "
                     r"\['covered_0', 'covered_1', 'covered_2'\] reached", out), out


def test_check_plays_a_fixed_managers_config_by_that_manager(tmp_path, monkeypatch, capsys):
    """A scripted manager naming an option the library lacks passed ``check`` (which played
    a random order) and failed first in ``eval``; ``check`` now plays the config's own
    oracle or scripted manager."""
    monkeypatch.syspath_prepend(str(tmp_path))
    _write_user_module(tmp_path, """
        from gyre_ma.options.decision import Choice

        class Typo:
            def __init__(self, library):
                self.library = library

            def decide(self, decisions):
                return [Choice(self.library.index("cover_the_third"), 0.0, 0.0) for d in decisions]
    """)
    monkeypatch.delitem(__import__("sys").modules, "userlib", raising=False)
    config = tmp_path / "config.yaml"
    config.write_text("name: typo\nenv: {id: coverage_v0}\nmanager: {kind: scripted, policy: 'userlib:Typo'}\n")
    assert main(["check", str(config), "--play", "0"]) == 0  # building the manager cannot see it
    capsys.readouterr()
    assert main(["check", str(config)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "manager userlib.Typo.decide (agent 'agent_0', task seed 0)" in err and "cover_the_third" in err, err
    config.write_text("name: oracle\nenv: {id: coverage_v0}\nmanager: {kind: oracle}\n")
    assert main(["check", str(config)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert re.search(r"played 2 episodes by the config's oracle manager: \d+ steps in all, .* goals "
                     r"\['covered_0', 'covered_1', 'covered_2'\] reached", out), out


class _Ghostly(_Broken):
    """coverage_v0 that lists an agent outside possible_agents, or drops a live agent's observation."""

    def reset(self, seed=None, options=None):
        observations, infos = self.env.reset(seed=seed, options=options)
        if self.fault == "ghost":
            self.env.agents = [*self.env.agents, "ghost"]
        return observations, infos

    def step(self, actions):
        observations, rewards, terms, truncs, infos = self.env.step(actions)
        if self.fault == "no_observation":
            observations.pop("agent_1")
        return observations, rewards, terms, truncs, infos


@pytest.mark.parametrize("fault, expected", [
    ("ghost", r"environment CoverageEnv\.reset \(step 0\): live agent 'ghost' \(env.agents\) is not one of "
              r"possible_agents \['agent_0', 'agent_1', 'agent_2'\]"),
    ("no_observation", r"environment CoverageEnv\.step \(step \d+\) returned no observation for live agent 'agent_1'"),
])
def test_a_live_agent_outside_possible_agents_or_without_an_observation_is_named(fault, expected):
    """Both were a KeyError that the CLI called a bug in gyre-ma."""
    with pytest.raises(ValueError, match=expected):
        run_episode(_Ghostly(fault), _library(lambda ctx: 1), RandomManager(0), seed=1)


def test_a_users_library_factory_is_given_the_env_it_is_built_for_when_it_asks(tmp_path, monkeypatch):
    """Built-in envs' factories got ``env``; a user's got library_kwargs alone and failed
    with "make_library rejected the arguments [] (missing a required argument: 'env')"."""
    from gyre_ma.envs.registry import make_library

    monkeypatch.syspath_prepend(str(tmp_path))
    _write_user_module(tmp_path, """
        from gyre_ma.envs.coverage.options import make_library as coverage_library

        def make(env, prefix="mine"):
            library = coverage_library(env=env)
            library.name = f"{prefix}:{type(env).__name__}:{len(env.possible_agents)}"
            return library

        def plain():
            return coverage_library()
    """)
    monkeypatch.delitem(__import__("sys").modules, "userlib", raising=False)
    env = make_env("coverage_v0", n_agents=2)
    assert make_library("coverage_v0", env, "userlib:make").name == "mine:CoverageEnv:2"
    assert make_library("coverage_v0", env, "userlib:make", {"prefix": "p"}).name == "p:CoverageEnv:2"
    assert make_library("coverage_v0", make_env("coverage_v0"), "userlib:plain").name  # asks for nothing: given nothing


def test_a_missing_relative_library_file_says_where_it_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"library file 'lib.yaml' does not exist \(a relative path is read from the "
                                         rf"current folder, '{re.escape(str(tmp_path))}'; a config's library"):
        OptionLibrary.load("lib.yaml")


def test_a_configs_relative_library_file_is_also_found_beside_the_config(tmp_path, monkeypatch):
    """``library: lib.yaml`` beside the config failed from any other folder ("does not
    exist"), while an experiment's ``base`` is read relative to its file."""
    from gyre_ma.config import dump_config, load_config
    from gyre_ma.envs.coverage.options import make_library

    folder = tmp_path / "task"
    folder.mkdir()
    make_library().dump(folder / "lib.yaml")
    (folder / "cfg.yaml").write_text("name: beside\nenv: {id: coverage_v0}\nlibrary: lib.yaml\n")
    monkeypatch.chdir(tmp_path)
    config = load_config(folder / "cfg.yaml")
    assert config.library == str((folder / "lib.yaml").resolve())  # absolute: the run's stored config finds it
    assert load_config(folder / "cfg.yaml", {"train.iterations": 1}).library == config.library
    assert main(["check", str(folder / "cfg.yaml"), "--play", "1"]) == 0
    monkeypatch.chdir(folder)  # found from the current folder first: left as written
    assert load_config("cfg.yaml").library == "lib.yaml"
    assert "library: lib.yaml" in dump_config(load_config("cfg.yaml"))


def test_a_library_graph_reference_that_gives_no_task_graph_lists_what_graph_may_be():
    """``graph: my_tasks:GRAPH`` (a dict spec) read "did not give a TaskGraph", and the
    README showed no library YAML."""
    spec = {"name": "x", "graph": "gyre_ma.options.examples:breakfast",
            "options": [{"name": "a", "policy": "gyre_ma.options.examples:walk"}]}
    with pytest.raises(ValueError, match=r"^library.graph: 'gyre_ma.options.examples:breakfast' gave OptionLibrary, "
                                         r"expected a TaskGraph; graph is a TaskGraph spec written inline \(goals, "
                                         r"milestones\), or a 'module:callable' returning a TaskGraph"):
        OptionLibrary.from_spec(spec)


def test_check_evaluates_a_configs_rules_on_the_episodes_it_plays(tmp_path, capsys):
    """``check`` played episodes without the config's rules, so a rule that could not read
    the env's state passed it and stopped ``train`` at its first episode; and a user could
    not see before training what their guards would veto."""
    rules = [
        {"name": "report_complete_when_written", "kind": "process", "when": "option_end",
         "milestone": "report_written", "require": {"report_submitted": False}, "weight": 0.5},
        {"name": "compliance_before_submit", "kind": "guard", "given": {"submitted": True},
         "require": {"compliance_passed": True}},
    ]
    config = tmp_path / "rules.yaml"
    config.write_text(yaml.safe_dump({
        "name": "rules", "env": {"id": "workflow_v0"}, "manager": {"kind": "oracle"},
        "rewards": {"rules": rules, "snapshot": "gyre_ma.envs.workflow.workflow:WorkflowEnv.surface_flags"}}))
    assert main(["check", str(config), "--play", "3"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("rules on those episodes: process rule 'report_complete_when_written' paid in 3 of 3 episodes (passed 9 "
            "of 9 checks); guard 'compliance_before_submit' vetoed 0 of 3 episodes (passed 3 of 3 checks)") in out, out
    assert main(["check", str(config), "--play", "6", "--set", "manager.kind=random"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert re.search(r"guard 'compliance_before_submit' vetoed [1-6] of 6 episodes", out), out  # random submits early

    ghost = {"name": "needs_ghost_key", "kind": "process", "when": "episode_end", "require": {"ghost": True}}
    assert main(["check", str(config), "--play", "1", "--set", f"rewards.rules={json.dumps(rules + [ghost])}"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert re.search(r"rule 'needs_ghost_key' \(episode_end\) .*unknown state key 'ghost'", err), err


def test_on_fault_continue_ends_a_faulty_call_and_cuts_an_episode_at_a_step_that_raised(recwarn):
    """A session-54 user's sub-policy raised on 0.2 % of its steps (a sensor glitch), and the
    first one stopped a long run; with ``backend.on_fault: continue`` the run plays on
    through it, and every fault stays on its trajectory."""
    from gyre_ma.options.option import Termination

    def glitchy(ctx):  # raises on its first step, then answers an action the space lacks, then moves
        if ctx.steps == 0 and ctx.rng.random() < 0.5:
            raise RuntimeError("sensor glitch")
        return 99 if ctx.steps == 1 and ctx.rng.random() < 0.5 else 1

    library = _library(glitchy)
    with pytest.raises(UserCodeError, match="sensor glitch|returned the action 99"):
        run_episode(make_env("coverage_v0"), library, RandomManager(0), seed=1)  # stop, the default
    traj = run_episode(make_env("coverage_v0"), library, RandomManager(0), seed=1, on_fault="continue")
    faulted = [c for c in traj.calls if c.termination is Termination.FAULT]
    assert faulted and len(traj.faults) == len(faulted) and not traj.cut_by_fault
    assert any("raised RuntimeError: sensor glitch" in f for f in traj.faults)
    assert all(re.search(r"\[episode of task seed 1, step \d+\]$", f) for f in traj.faults)
    assert all(c.duration == 0 for c in faulted)  # ended without a step, like a blocked call

    class StepFails(_Broken):  # its third step raises
        def step(self, actions):
            self.fault += "x"
            if len(self.fault) > 2:
                raise OSError("tool server gone")
            return self.env.step(actions)

    with pytest.raises(UserCodeError, match=r"environment CoverageEnv\.step \(step 2\) raised OSError: tool server"):
        run_episode(StepFails(""), _library(lambda ctx: 1), RandomManager(0), seed=1)
    traj = run_episode(StepFails(""), _library(lambda ctx: 1), RandomManager(0), seed=1, on_fault="continue")
    assert traj.cut_by_fault and traj.length == 2 and not traj.success
    assert len(traj.faults) == 1 and re.fullmatch(r"environment CoverageEnv\.step \(step 2\) raised OSError: tool "
                                                  r"server gone \(at .*test_user_errors\.py:\d+\) \[episode of task "
                                                  r"seed 1\]", traj.faults[0]), traj.faults  # its step said once
    assert all(c.termination is not None for c in traj.calls)  # every call closed, as at a truncation
    metrics = episode_metrics([traj], ())
    assert metrics["faults/episodes_cut"] == 1.0 and metrics["failed_env_ended"] == metrics["failed_step_cap"] == 0

    class ResetFails(_Broken):  # a remote env whose reset timed out
        def reset(self, seed=None, options=None):
            raise TimeoutError("reset: no answer from the simulator")

    with pytest.raises(UserCodeError, match=r"environment CoverageEnv\.reset \(task seed 1\) raised TimeoutError"):
        run_episode(ResetFails(""), _library(lambda ctx: 1), RandomManager(0), seed=1)
    traj = run_episode(ResetFails(""), _library(lambda ctx: 1), RandomManager(0), seed=1, on_fault="continue")
    assert traj.cut_by_fault and traj.length == 0 and not traj.calls and not traj.success
    assert len(traj.faults) == 1 and "reset (task seed 1) raised TimeoutError: reset: no answer" in traj.faults[0]


def test_train_plays_on_through_faults_when_told_to(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(tmp_path))
    _write_user_module(tmp_path, LIBRARY.replace("{body}", "if ctx.rng.random() < 0.05:\n"
                                                           "            raise KeyError('inventory')\n"
                                                           "        return 1"))
    monkeypatch.delitem(__import__("sys").modules, "userlib", raising=False)
    assert main(["train", _config(tmp_path), "--quiet"]) == 2  # stop, the default
    capsys.readouterr()
    import gyre_ma.rollout

    monkeypatch.setattr(gyre_ma.rollout, "_WARNED_FAULTS", set())  # warned once per option and process
    with pytest.warns(RuntimeWarning, match=r"played on \(backend.on_fault: continue\): the call ended as a failure"):
        assert main(["train", _config(tmp_path), "--quiet", "--set", "name=goes_on",
                     "--set", "backend.on_fault=continue"]) == 0
    captured = capsys.readouterr()
    out = " ".join((captured.err + captured.out).replace("│", " ").split())
    assert re.search(r"faults/count \(this session\) [1-9]", out), out  # validation's faults counted too
    logged = (tmp_path / "goes_on" / "metrics.csv").read_text().splitlines()
    assert {"faults/per_episode", "faults/count", "option_timeouts/count"} <= set(logged[0].split(","))
    summary = json.loads((tmp_path / "goes_on" / "summary.json").read_text())
    assert summary["faults/count_total"] >= 1
    assert main(["eval", str(tmp_path / "goes_on"), "--config", _config(tmp_path), "--set", "backend.on_fault=continue",
                 "--episodes", "12", "--json", str(tmp_path / "e.json")]) == 0
    episodes = json.loads((tmp_path / "e.json").read_text())["episodes"]
    assert all({"faults", "cut_by_fault"} <= set(e) for e in episodes) and sum(e["faults"] for e in episodes) >= 1

    _write_user_module(tmp_path, LIBRARY.replace("{body}", "raise KeyError('inventory')"))  # a bug, not a glitch
    monkeypatch.delitem(__import__("sys").modules, "userlib", raising=False)
    assert main(["train", _config(tmp_path), "--quiet", "--set", "name=always",
                 "--set", "backend.on_fault=continue"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert re.search(r"iteration 0: every one of option 'go_to_\d''s \d+ calls faulted, e\.g\. sub-policy "
                     r"userlib\.wander .* plays on through a flaky fault, not one on every call", err), err


def test_train_plays_on_through_a_reset_that_raises_when_told_to(tmp_path, monkeypatch, capsys):
    """A reset is a remote env's call like its step (the README said a reset fault stopped the
    run even under ``backend.on_fault: continue``): the episode is cut before its first step."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "flakyreset", raising=False)
    (tmp_path / "flakyreset.py").write_text(textwrap.dedent("""
        from gyre_ma.envs.coverage.coverage import CoverageEnv


        class FlakyReset(CoverageEnv):
            '''Every fifth reset meets a simulator that does not answer.'''

            resets = 0

            def reset(self, seed=None, options=None):
                FlakyReset.resets += 1
                if FlakyReset.resets % 5 == 0:
                    raise TimeoutError("simulator did not answer")
                return super().reset(seed=seed, options=options)


        def make():
            return FlakyReset(max_cycles=40)
    """))
    config = tmp_path / "flaky.yaml"
    config.write_text(f"name: flaky\nrun_root: '{tmp_path}'\nenv: {{id: 'flakyreset:make'}}\n"
                      "library: gyre_ma.envs.coverage.options:make_library\ntrain: {iterations: 2}\n")
    assert main(["train", str(config), "--quiet"]) == 2
    assert "FlakyReset.reset (task seed" in " ".join(capsys.readouterr().err.split())
    import gyre_ma.rollout

    monkeypatch.setattr(gyre_ma.rollout, "_WARNED_FAULTS", set())
    with pytest.warns(RuntimeWarning, match=r"FlakyReset\.reset \(task seed \d+\) raised TimeoutError: simulator "
                                            r"did not answer .*the episode was cut there"):
        assert main(["train", str(config), "--quiet", "--set", "name=played",
                     "--set", "backend.on_fault=continue"]) == 0
    logged = list(csv.DictReader((tmp_path / "played" / "metrics.csv").read_text().splitlines()))
    assert len(logged) == 2 and sum(float(row["faults/episodes_cut"]) for row in logged) > 0


def test_check_plays_on_through_faults_as_training_would_when_told_to(tmp_path, monkeypatch, capsys):
    """A session-54 user's flaky tools could never pass ``check``: it stopped at the first
    fault even with ``backend.on_fault: continue``, which train and eval honoured."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "flaky", raising=False)
    (tmp_path / "flaky.py").write_text(textwrap.dedent("""
        from gyre_ma.envs.coverage.coverage import CoverageEnv


        class Flaky(CoverageEnv):
            '''The episode of seed 1 meets a tool that is down at its second step.'''

            def reset(self, seed=None, options=None):
                self.seed_, self.n = seed, 0
                return super().reset(seed=seed, options=options)

            def step(self, actions):
                self.n += 1
                if self.seed_ == 1 and self.n == 2:
                    raise OSError("tool API timed out (HTTP 503)")
                return super().step(actions)


        def make():
            return Flaky(max_cycles=30)
    """))
    config = tmp_path / "flaky.yaml"
    config.write_text("name: flaky\nenv: {id: 'flaky:make'}\nlibrary: gyre_ma.envs.coverage.options:make_library\n")
    assert main(["check", str(config), "--play", "3"]) == 2
    assert "Flaky.step (step 1) raised OSError: tool API timed out" in " ".join(capsys.readouterr().err.split())
    assert main(["check", str(config), "--play", "3", "--set", "backend.on_fault=continue"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "each episode but the 1 a fault cut replayed with the same milestones" in out, out
    assert "faults played on through (backend.on_fault: continue): 1, e.g. environment Flaky.step (step 1) raised " \
           "OSError: tool API timed out (HTTP 503)" in out, out


def test_an_error_raised_in_generated_code_points_at_the_users_line(tmp_path, monkeypatch, capsys):
    """A session-56 user's graph with duration 0 was refused "(at <string>:5)": the innermost
    frame outside gyre-ma was a dataclass's generated __init__, not their file."""
    monkeypatch.syspath_prepend(str(tmp_path))
    _write_user_module(tmp_path, """
        from gyre_ma.options import OptionLibrary, TaskGraph


        def make():
            return OptionLibrary("dur", TaskGraph.from_spec({"goals": ["g"], "milestones": {"g": {"duration": 0}}}))
    """)
    monkeypatch.delitem(__import__("sys").modules, "userlib", raising=False)
    assert main(["check", "userlib:make"]) == 2
    err = capsys.readouterr().err
    assert "duration must be > 0, got 0.0" in err and f"(at {tmp_path / 'userlib.py'}:6)" in err, err
