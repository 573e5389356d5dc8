from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from gyre_ma.cli import main

EXAMPLE = "gyre_ma.options.examples:breakfast"
ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gyre_ma.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_graph_command_writes_png_and_dot(tmp_path):
    out = run_cli("graph", EXAMPLE, "--out", str(tmp_path / "g.png"), "--dot", str(tmp_path / "g.dot"),
                  "--achieved", "get_eggs")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"
    dot = (tmp_path / "g.dot").read_text()
    assert '"get_eggs" [fillcolor="#8fd18f"]' in dot and '"fry_eggs" [fillcolor="#ffd166"]' in dot


def test_check_prints_library_summary(capsys):
    assert main(["check", EXAMPLE]) == 0
    out = capsys.readouterr().out
    assert "breakfast" in out and "critical path 61 steps by the milestones' durations" in out and "ok" in out


def broken_library(tmp_path, mutate) -> str:
    from gyre_ma.options.examples import library

    spec = library.to_spec()
    mutate(spec)
    path = tmp_path / "lib.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda s: s["graph"]["milestones"]["get_eggs"].update(requires=["serve"]), "cycle"),
        (lambda s: s["graph"]["milestones"]["serve"].update(requires=["ghost"]), "requires 'ghost'"),
        (lambda s: s["options"].append(dict(s["options"][0])), "duplicate option name 'fetch_get_eggs'"),
        (lambda s: s["options"][0].update(milestone="moon"), "milestone 'moon', which is not a node"),
        (lambda s: s["options"][0].update(policy="gyre_ma.options.examples:nothing"), "options[0].policy"),
        (lambda s: s["options"][0].update(policy="shutil:copy"),
         "options[0]: option 'fetch_get_eggs': policy must take exactly one"),
        (lambda s: s["options"].pop(7), "goal 'serve' is unreachable"),
        (lambda s: s["graph"].update(goals=["breakfast"]), "goal 'breakfast' is not a milestone"),
        (lambda s: s["options"][2].update(max_steps=0), "max_steps must be an int >= 1"),
    ],
)
def test_check_catches_broken_libraries(tmp_path, capsys, mutate, expected):
    path = broken_library(tmp_path, mutate)
    assert main(["check", path]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    assert err.count("\n") == 1


def test_user_errors_exit_2_without_traceback_and_debug_shows_it(tmp_path):
    out = run_cli("check", "no_such_module:thing")
    assert out.returncode == 2 and "cannot import module 'no_such_module'" in out.stderr
    assert "Traceback" not in out.stderr
    debug = run_cli("--debug", "check", "no_such_module:thing")
    assert debug.returncode != 0 and "Traceback" in debug.stderr
    bad_yaml = tmp_path / "c.yaml"
    bad_yaml.write_text("train: [unclosed")
    out = run_cli("check", str(bad_yaml))
    assert out.returncode == 2 and "not valid YAML" in out.stderr
    out = run_cli("graph", EXAMPLE, "--out", str(tmp_path / "g.svg"))
    assert out.returncode == 2 and "expected a .png or .dot" in out.stderr
    out = run_cli("graph", EXAMPLE, "--achieved", "pancakes", "--out", str(tmp_path / "g.png"))
    assert out.returncode == 2 and "'pancakes' is not a milestone" in out.stderr


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          check=False)


def test_help_and_check_import_neither_torch_lightning_nor_ray():
    # what --help and check need (config, env, library) must not drag in the learner's stack
    out = run_python(
        "import sys\n"
        "from gyre_ma.cli import main\n"
        "codes = [main(['--help']), main(['train', '--help']), main(['check', 'configs/quickstart.yaml'])]\n"
        "print('codes', codes, 'heavy', [m for m in ('torch', 'lightning', 'ray') if m in sys.modules])\n"
    )
    assert out.returncode == 0, out.stderr
    assert "codes [0, 0, 0] heavy []" in out.stdout, out.stdout[-500:]


def test_plot_reads_metrics_without_importing_the_learners_stack(tmp_path):
    # plot (and report, through the same module) read metrics.csv: no torch, Lightning or Ray
    (tmp_path / "metrics.csv").write_text("iteration,step,success_rate,env_steps\n0,100,0.5,100\n1,200,0.75,200\n")
    out = run_python(
        "import sys\n"
        "from gyre_ma.cli import main\n"
        "import gyre_ma.report\n"
        f"code = main(['plot', {str(tmp_path)!r}])\n"
        "print('code', code, 'heavy', [m for m in ('torch', 'lightning', 'ray') if m in sys.modules])\n"
    )
    assert out.returncode == 0, out.stderr
    assert "code 0 heavy []" in out.stdout, out.stdout[-500:]
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_minigrid_example_without_minigrid_names_the_extra():
    out = run_python(
        "import sys\n"
        "sys.modules['minigrid'] = None  # as if not installed\n"
        "from gyre_ma.cli import main\n"
        "sys.exit(main(['check', 'configs/minigrid_doorkey.yaml']))\n"
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("gyre-ma check: error:") and out.stderr.count("\n") == 1, out.stderr
    assert "pip install 'gyre-ma[minigrid]'" in out.stderr and "Traceback" not in out.stderr


def test_rollbacks_and_their_stop_are_printed(tmp_path):
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from gyre_ma.checkpoints import CheckpointManager
    from gyre_ma.cli import _say_rollbacks

    manager = CheckpointManager(tmp_path)
    manager.save("best", {"w": 1})
    manager.rollback(reason="validation 0.2 < best 0.9 by more than 0.25", step=4)
    out = io.StringIO()
    console = Console(file=out, width=200)
    gyre = SimpleNamespace(checkpoints=manager)
    said = _say_rollbacks(console, gyre, {"checkpoint/rolled_back": 1.0}, 4, False)
    assert not said and "iteration 4: rolled back to the 'best' checkpoint (validation 0.2 < best 0.9" in out.getvalue()
    assert "learning rate now 0.5× the configured" in out.getvalue()
    assert _say_rollbacks(console, gyre, {"checkpoint/rollbacks_stopped": 1.0}, 5, False)
    assert "no longer rolled back" in out.getvalue()
    before = out.getvalue()
    assert _say_rollbacks(console, gyre, {"checkpoint/rollbacks_stopped": 1.0}, 6, True) and out.getvalue() == before


def test_check_of_a_library_with_variables_names_the_variable_to_set(capsys):
    # a library file alone has no library_kwargs: say which variable is open, not that a path like '${x}' is missing
    assert main(["check", str(ROOT / "configs" / "libraries" / "coverage_neural.yaml")]) == 2
    err = capsys.readouterr().err
    assert "options[0].neural.weights: variable ${go_to_0} has no value; set library_kwargs.go_to_0" in err
    assert err.count("\n") == 1


def test_check_and_graph_of_a_library_take_its_variables_from_set(tmp_path, capsys):
    """``--set library_kwargs.NAME=VALUE`` gives a library file's ``${NAME}``, as the error
    asking for it says (a session-53 user's library of LLM options with ``${model}``); a key
    a library file has no use for is refused, naming it."""
    library = tmp_path / "lib.yaml"
    library.write_text("name: lib\ngraph: gyre_ma.envs.coverage.coverage:task_graph\noptions:\n"
                       "- {name: go_to_0, milestone: covered_0, policy: 'gyre_ma.envs.coverage.options:go_to_0', "
                       "max_steps: '${cap}'}\n"
                       + "".join(f"- {{name: go_to_{i}, milestone: covered_{i}, policy: "
                                 f"'gyre_ma.envs.coverage.options:go_to_{i}', max_steps: 18}}\n" for i in (1, 2)))
    assert main(["check", str(library)]) == 2
    assert "set library_kwargs.cap (in a config, or --set library_kwargs.cap=VALUE" in capsys.readouterr().err
    assert main(["check", str(library), "--set", "library_kwargs.cap=17"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "go_to_0" in line)
    assert "│ 17 " in row
    assert main(["graph", str(library), "--set", "library_kwargs.cap=17", "--out", str(tmp_path / "g.dot")]) == 0
    assert (tmp_path / "g.dot").read_text().startswith("digraph")
    assert main(["check", str(library), "--set", "library_kwargs.cap=17", "--set", "train.iterations=3"]) == 2
    assert "--set train.iterations: a library file takes only library_kwargs.NAME=VALUE" in capsys.readouterr().err


def test_graph_of_a_library_built_for_an_env_asks_for_the_config(tmp_path, capsys, monkeypatch):
    """A session-55 user's ``gyre-ma graph lbf_task:make_library`` (``def make_library(env)``)
    said the factory "rejected the arguments []"; passing the config worked."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "env_library.py").write_text("from gyre_ma.envs.coverage.options import make_library as made\n\n\n"
                                             "def make_library(env):\n    return made()\n")
    assert main(["graph", "env_library:make_library", "--out", str(tmp_path / "g.dot")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert ("library 'env_library:make_library': env_library.make_library builds the library for an env (its argument "
            "'env') and none was given; pass a config that names the env and this library instead") in err
    (tmp_path / "c.yaml").write_text("name: c\nenv: {id: coverage_v0}\nlibrary: 'env_library:make_library'\n")
    assert main(["graph", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "g.dot")]) == 0


def test_check_says_what_every_route_through_alternatives_pays(capsys):
    """A session-55 user re-testing their vault (a key route and a kick) found nothing in
    check of what the routes now pay."""
    assert main(["check", EXAMPLE]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("alternatives (any_of): every route to the goals pays 6 in default milestone rewards in total; a "
            "milestone of a route that pays more pays only what it lowers the least reward still to earn") in out


def test_check_notes_episodes_the_env_ended_with_the_goal_unseen(tmp_path, capsys, monkeypatch):
    """A session-55 user's MiniHack goal detector never held: the env ended both of check's
    episodes at the stairs, and check said "goals ['on_stairs'] not reached" and ok. A
    session-56 user's Crafter agent died, and the note sent them looking at the detector: it
    says how the env ended the episode."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "door.py").write_text(textwrap.dedent("""
        import gymnasium as gym
        import numpy as np

        from gyre_ma.envs.adapters import from_gymnasium
        from gyre_ma.options import OptionLibrary, TaskGraph

        SPEC = {"goals": ["out"], "milestones": {"walked": {}, "out": {"requires": ["walked"]}}}


        class Door(gym.Env):
            observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
            action_space = gym.spaces.Discrete(2)

            def __init__(self, truncate=False):
                self.truncate = truncate

            def reset(self, seed=None, options=None):
                self.t = 0
                return np.zeros(1, np.float32), {}

            def step(self, action):
                self.t += 1
                end = self.t >= 3  # out of the door at step 3, or out of time
                return np.zeros(1, np.float32), 0.0, end and not self.truncate, end and self.truncate, {}


        def make(truncate=False):
            return from_gymnasium(Door(truncate), milestones={"walked": lambda e: e.t >= 1, "out": lambda e: False},
                                  graph=SPEC)


        def library():
            lib = OptionLibrary("door", TaskGraph.from_spec(SPEC))
            lib.option("walk", milestone="walked", max_steps=2)(lambda ctx: 0)
            lib.option("leave", milestone="out", max_steps=5)(lambda ctx: 1)
            return lib.validate()
    """))
    (tmp_path / "door.yaml").write_text("name: door\nenv: {id: 'door:make'}\nlibrary: 'door:library'\n")
    assert main(["check", str(tmp_path / "door.yaml")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("note: the env ended 2 of 2 episodes before the goals were verified (task seed 0, terminated at step 3: "
            "verified ['walked'], not ['out']). A loss (a death, a failed task) ends an episode so, and an untrained "
            "order meets many; where the env ended them at a goal instead, the detector of ['out'] does not see "
            "it") in out
    assert main(["check", str(tmp_path / "door.yaml"), "--set", "env.kwargs.truncate=true"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("(task seed 0, truncated at step 3: verified ['walked'], not ['out']). The env's own time limit came "
            "first (its truncation, not max_cycles): raise it, or the goals are out of reach in that many steps") in out
    # two trains: the first arrived (terminated), the env's time limit cut the second: a truncation, not a loss
    (tmp_path / "pair.py").write_text(textwrap.dedent("""
        import gymnasium as gym
        import numpy as np
        from pettingzoo import ParallelEnv

        from door import SPEC
        from gyre_ma.envs.adapters import from_pettingzoo


        class Pair(ParallelEnv):
            metadata = {"name": "pair"}
            possible_agents = ["a", "b"]

            def observation_space(self, agent):
                return gym.spaces.Box(0.0, 1.0, (1,), np.float32)

            def action_space(self, agent):
                return gym.spaces.Discrete(2)

            def reset(self, seed=None, options=None):
                self.t, self.agents = 0, ["a", "b"]
                return {a: np.zeros(1, np.float32) for a in self.agents}, {a: {} for a in self.agents}

            def step(self, actions):
                self.t += 1
                terms = {a: a == "a" and self.t >= 2 for a in self.agents}  # a arrives at step 2
                truncs = {a: a == "b" and self.t >= 3 for a in self.agents}  # b's time runs out at step 3
                obs = {a: np.zeros(1, np.float32) for a in self.agents}
                rewards, infos = {a: 0.0 for a in self.agents}, {a: {} for a in self.agents}
                self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
                return obs, rewards, terms, truncs, infos


        def make():
            return from_pettingzoo(Pair(), milestones={"walked": lambda e: e.t >= 1, "out": lambda e: False},
                                   graph=SPEC, milestone_agent=lambda e, m: None)
    """))
    (tmp_path / "pair.yaml").write_text("name: pair\nenv: {id: 'pair:make'}\nlibrary: 'door:library'\n")
    assert main(["check", str(tmp_path / "pair.yaml")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "(task seed 0, truncated at step 3: verified ['walked'], not ['out']). The env's own time limit" in out


def test_the_program_imports_a_configs_modules_from_the_folder_it_runs_in(tmp_path):
    """``gyre-ma check keycorridor.yaml`` beside keycorridor.py said "No module named
    'keycorridor'" (a console script's path holds its own folder, not the current one);
    ``python -m gyre_ma.cli``, an experiment's runs and Ray's workers found it."""
    import os
    import shutil

    program = shutil.which("gyre-ma", path=str(Path(sys.executable).parent)) or shutil.which("gyre-ma")
    assert program is not None, "the gyre-ma console script is installed with the package"
    (tmp_path / "my_tasks.py").write_text("from gyre_ma.envs.coverage.coverage import CoverageEnv\n\n\n"
                                          "def make():\n    return CoverageEnv()\n")
    (tmp_path / "my.yaml").write_text("name: mine\nenv: {id: 'my_tasks:make'}\n"
                                      "library: gyre_ma.envs.coverage.options:make_library\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    here = subprocess.run([sys.executable, program, "check", "my.yaml", "--play", "1"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert here.returncode == 0 and "played 1 episode" in here.stdout, here.stderr[-2000:]
    # python -m gyre_ma: the command in whichever interpreter runs it (a venv's, with the user's packages)
    module = subprocess.run([sys.executable, "-m", "gyre_ma", "check", "my.yaml", "--play", "1"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=300)
    assert module.returncode == 0 and "played 1 episode" in module.stdout, module.stderr[-2000:]
    elsewhere = subprocess.run([sys.executable, program, "check", str(tmp_path / "my.yaml")], cwd=tmp_path.parent,
                               env=env, capture_output=True, text=True, timeout=300)
    assert elsewhere.returncode == 2
    assert ("env.id: cannot import module 'my_tasks' (No module named 'my_tasks'); gyre-ma imports your modules "
            "from the folder it runs in and from PYTHONPATH") in " ".join(elsewhere.stderr.split())


def test_eval_plays_a_config_whose_manager_does_not_learn_without_a_run(tmp_path, capsys):
    """An oracle's held-out figures, beside a learned run's on the same seeds, needed a
    run of one iteration first: "checkpoint ... does not exist" for the config given."""
    import json

    oracle = tmp_path / "oracle.yaml"
    oracle.write_text(f"name: oracle\nenv: {{id: coverage_v0}}\nmanager: {{kind: oracle}}\nrun_root: {tmp_path}\n")
    assert main(["eval", str(oracle), "--episodes", "20", "--json", str(tmp_path / "o.json")]) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "(manager oracle, nothing learned)" in out
    result = json.loads((tmp_path / "o.json").read_text())
    # which reward each row is (a session-55 user read 'reward env 0' against the JSON's episode_reward 0.97)
    assert f"env reward per episode (the env's own, summed: episode_reward) {result['episode_reward']:.4g}" in out
    assert "paid to the learner per episode (the arbitrated reward it backs up: reward/…)" in out
    assert f"env (the env's own × rewards.env_reward) {result['reward/env']:.4g}" in out
    assert f"total {result['reward/total']:.4g}" in out
    assert result["success_rate"] > 0.9 and [e["task_seed"] for e in result["episodes"]][:2] == [1_000_000, 1_000_001]
    # each episode's milestones with the step each was verified at, and its option calls in order (a session-56
    # user of a 2,000-step task wanted to see when the learned order reached each milestone)
    for episode in result["episodes"]:
        calls, stamped = episode["calls"], episode["milestone_steps"]
        assert len(calls) == episode["option_calls"] and calls
        assert [c["start_step"] for c in calls] == sorted(c["start_step"] for c in calls)
        for c in calls:
            assert set(c) == {"agent", "option", "start_step", "steps", "termination", "milestones"}
            for m in c["milestones"]:
                assert c["start_step"] < stamped[m] <= c["start_step"] + c["steps"]
        assert max(stamped.values()) <= episode["length"]
        if episode["success"]:
            assert {m for c in calls for m in c["milestones"]} <= set(stamped)
            assert all(c["termination"] in ("milestone", "done", "failure", "max_steps", "episode", "blocked")
                       for c in calls)
    learned = tmp_path / "learned.yaml"
    learned.write_text(oracle.read_text().replace("manager: {kind: oracle}\n", "").replace("oracle", "learned"))
    assert main(["eval", str(learned)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"its run directory '{tmp_path / 'learned'}' does not exist; train it first (gyre-ma train {learned})" in err


def test_eval_says_how_far_it_is_and_its_rounds_change_no_figure(tmp_path, capsys, monkeypatch):
    """A session-57 user's 200-episode eval ran three minutes without a word."""
    import json

    from gyre_ma import cli

    oracle = tmp_path / "oracle.yaml"
    oracle.write_text(f"name: oracle\nenv: {{id: coverage_v0}}\nmanager: {{kind: random}}\nrun_root: {tmp_path}\n")
    assert main(["eval", str(oracle), "--episodes", "40", "--json", str(tmp_path / "one.json")]) == 0
    assert "eval: " not in capsys.readouterr().out  # one round, within the time: no progress line
    monkeypatch.setattr(cli, "EVAL_PROGRESS_SECONDS", 0.0)
    assert main(["eval", str(oracle), "--episodes", "40", "--set", "rollout.num_envs=2",  # rounds of 32 episodes
                 "--json", str(tmp_path / "rounds.json")]) == 0
    out = capsys.readouterr().out
    assert "eval: 32 of 40 episodes played in " in out and " s left" in out
    one, rounds = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("one", "rounds"))
    assert one["episodes"] == rounds["episodes"] and one["success_rate"] == rounds["success_rate"]


def test_eval_without_a_success_says_so_rather_than_nan(tmp_path, capsys):
    """A session-57 user's untrained baseline showed "nan" steps to the goal."""
    import json

    cut = tmp_path / "cut.yaml"
    cut.write_text(f"name: cut\nenv: {{id: coverage_v0}}\nmanager: {{kind: random}}\nrun_root: {tmp_path}\n"
                   "train: {max_steps: 1}\n")  # one step: no episode can cover every target
    assert main(["eval", str(cut), "--episodes", "4", "--json", str(tmp_path / "cut.json")]) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "steps to the goal (successes) — (no episode reached it)" in out and "nan" not in out
    assert json.loads((tmp_path / "cut.json").read_text())["success_rate"] == 0.0


def test_eval_plays_what_the_config_says_on_the_local_backend(tmp_path, capsys):
    """A session-53 user's ``eval base.yaml --set manager.kind=random`` evaluated the run's
    learned checkpoint (the config's run existed), and a Ray-trained run's eval started Ray
    for figures the local backend gives as well."""
    import json

    config = tmp_path / "mine.yaml"
    config.write_text(f"name: mine\nenv: {{id: coverage_v0}}\nrun_root: {tmp_path}\nbackend: {{name: ray}}\n")
    assert main(["train", str(config), "--iterations", "1", "--quiet", "--set", "backend.name=local"]) == 0
    capsys.readouterr()
    assert main(["eval", str(config), "--episodes", "4", "--set", "manager.kind=random",
                 "--json", str(tmp_path / "random.json")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "(manager random, nothing learned)" in out and "checkpoints" not in out
    assert "playing on the local backend (the config's is 'ray'; the figures are the same" in out
    assert "option calls: how each ended" in out  # which option is the weak one, per option
    options = json.loads((tmp_path / "random.json").read_text())["options"]
    assert set(options) == {"go_to_0", "go_to_1", "go_to_2", "stay"}  # every option, called or not
    for row in options.values():
        if row["calls_per_episode"] == 0:
            assert row["mean_steps"] is row["achieved"] is None
            continue
        assert row["calls_per_episode"] > 0 and row["mean_steps"] >= 1
        assert abs(row["achieved"] + row["failed"] + row["cut_short"] - 1) < 1e-9
        assert abs(row["failure"] + row["step_cap"] + row["blocked"] - row["failed"]) < 1e-9
    episodes = json.loads((tmp_path / "random.json").read_text())["episodes"]
    for name, row in options.items():  # the share of its calls that verified a milestone, from the calls listed
        listed = [c for e in episodes for c in e["calls"] if c["option"] == name]
        if listed:
            assert row["verified_milestone"] == sum(bool(c["milestones"]) for c in listed) / len(listed)
    assert "verified a milestone" in out
    calls = sum(e["option_calls"] for e in episodes) / len(episodes)
    assert abs(sum(row["calls_per_episode"] for row in options.values()) - calls) < 1e-9
    assert main(["eval", str(config), "--episodes", "4", "--json", str(tmp_path / "learned.json")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"evaluating {tmp_path / 'mine' / 'checkpoints' / 'final.pt'}" in out and "playing on the local" in out
    assert json.loads((tmp_path / "learned.json").read_text())["episodes"][0]["task_seed"] == 1_000_000
    ray = sys.modules.get("ray")
    assert ray is None or not ray.is_initialized()


def test_gyre_mas_own_warnings_are_one_line_on_the_command_line(capsys):
    import warnings

    from gyre_ma.backends import local
    from gyre_ma.cli import _warnings_in_one_line

    with _warnings_in_one_line("train"), warnings.catch_warnings():
        warnings.simplefilter("always")
        shown = warnings.formatwarning("workers\n  wait", RuntimeWarning, local.__file__, 1)
        other = warnings.formatwarning("theirs", RuntimeWarning, "/usr/lib/python3/x.py", 3)
    assert shown == "gyre-ma train: warning: workers wait\n"
    assert other.startswith("/usr/lib/python3/x.py:3: RuntimeWarning: theirs")


def test_eval_of_a_config_takes_set_and_refuses_greedy_where_nothing_is_learned(tmp_path, capsys):
    """Baselines of an env variant needed a copy of the YAML (eval had no --set), and --greedy
    on a random order quietly played another random stream."""
    import json

    oracle = tmp_path / "oracle.yaml"
    oracle.write_text(f"name: oracle\nenv: {{id: coverage_v0}}\nmanager: {{kind: oracle}}\nrun_root: {tmp_path}\n")
    assert main(["eval", str(oracle), "--episodes", "5", "--set", "env.kwargs.n_agents=2",
                 "--json", str(tmp_path / "two.json")]) == 0
    assert main(["eval", str(oracle), "--episodes", "5", "--json", str(tmp_path / "three.json")]) == 0
    two, three = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("two", "three"))
    assert two["episodes"] != three["episodes"]  # the override reached the env
    capsys.readouterr()
    assert main(["eval", str(oracle), "--set", "manager.kind=random", "--greedy"]) == 2
    assert "--greedy: the random manager has no greedy choice" in capsys.readouterr().err
    assert main(["eval", str(oracle), "--set", "trian.iterations=3"]) == 2
    assert "--set trian.iterations (on oracle.yaml): unknown key 'trian'" in capsys.readouterr().err
    (tmp_path / "oracle" / "checkpoints").mkdir(parents=True)
    (tmp_path / "oracle" / "checkpoints" / "final.pt").write_bytes(b"")
    assert main(["eval", str(tmp_path / "oracle"), "--set", "seed=1"]) == 2
    assert "--set changes a config, and none was given" in capsys.readouterr().err


def test_check_takes_set_overrides_as_train_does(capsys):
    """README's Configuration presents --set as every command's; check refused it."""
    quickstart = str(Path(__file__).parents[2] / "configs" / "quickstart.yaml")
    assert main(["check", quickstart, "--play", "0", "--set", "train.lr=-1"]) == 2
    assert "'train.lr': Input should be greater than 0 (got -1)" in capsys.readouterr().err
    assert main(["check", quickstart, "--play", "1", "--set", "env.kwargs.goal=make_wood_pickaxe"]) == 0
    assert "goals ['make_wood_pickaxe'] reached, all of them in 1 of 1 episodes" in " ".join(
        capsys.readouterr().out.split())  # in how many (a session-58 user's check did not say)


def test_check_names_milestones_no_goal_needs_and_a_library_graph_unlike_the_envs(tmp_path, capsys, monkeypatch):
    """A new user's Crafter library paid four side milestones by default, and its graph (given
    twice: to the adapter and to the library) differed from the env's in rewards; ``check``
    said "ok" to both."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "two_graphs", raising=False)
    (tmp_path / "two_graphs.py").write_text(
        "from gyre_ma.envs.coverage.options import make_library as coverage_library\n"
        "from gyre_ma.options import OptionLibrary, TaskGraph\n\n"
        "def make(env):\n"
        "    library = coverage_library(env=env)\n"
        "    spec = library.graph.to_spec()\n"
        "    spec['goals'] = ['covered_2']\n"
        "    spec['milestones']['covered_2']['reward'] = 3\n"
        "    spec['milestones']['covered_0'].pop('reward')\n"
        "    spec['milestones']['covered_1']['reward'] = 0.5\n"
        "    mine = OptionLibrary(library.name, TaskGraph.from_spec(spec))\n"
        "    for option in library:\n"
        "        mine.add(option)\n"
        "    return mine\n")
    config = tmp_path / "c.yaml"
    config.write_text("name: c\nenv: {id: coverage_v0}\nlibrary: 'two_graphs:make'\n")
    assert main(["check", str(config), "--play", "0"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("milestones no goal needs, with the reward each pays when first verified: covered_0 (0, not given), "
            "covered_1 (0.5) (covered_1 pays the learner to reach it, though no goal needs it: give reward 0 to one "
            "that should not)") in out, out  # covered_0 already pays 0: no advice for it
    assert ("note: the library's task graph is not env.task_graph(): goals ['covered_2'] (the env's ['covered_0', "
            "'covered_1', 'covered_2']); rewards of covered_0 0 (the env's 0.333333), covered_1 0.5 (the env's "
            "0.333333), covered_2 3 (the env's 0.333333); the learner's rewards, and which options are eligible, "
            "follow the library's") in out, out
    quickstart = str(Path(__file__).parents[2] / "configs" / "quickstart.yaml")
    assert main(["check", quickstart, "--play", "0"]) == 0  # explicit rewards: listed, no note
    out = " ".join(capsys.readouterr().out.split())
    assert "collect_diamond (1)," in out and "note:" not in out
    assert "eat_food (0.02) (each pays the learner to reach it, though no goal needs it: give reward 0" in out
    assert "gather_stone collect_stone repeatable scripted 250 — after make_wood_pickaxe + safe_with_wood_pickaxe" \
        in " ".join(out.replace("│", " ").split())  # "starts when": the graph's prerequisites, then the predicate


def test_the_summarys_validation_window_pools_the_last_validations():
    from gyre_ma.cli import VALIDATION_WINDOW, _validation_window
    from gyre_ma.metrics import wilson_interval

    nan = float("nan")
    history = [{"validation/sampled_success": 0.0, "validation/greedy_success": 0.0}] * 5 + [
        {"validation/sampled_success": 0.25 * (k % 5), "validation/greedy_success": 1.0} if k % 3 else
        {"validation/sampled_success": nan, "validation/greedy_success": nan} for k in range(15)]
    window = _validation_window(history, per_mode=4)
    kept = [row for row in history if row["validation/sampled_success"] == row["validation/sampled_success"]]
    kept = kept[-VALIDATION_WINDOW:]
    wins = sum(round(4 * row["validation/sampled_success"]) for row in kept)
    assert window["validation/window_iterations"] == VALIDATION_WINDOW == len(kept)
    assert window["validation/window_episodes"] == 4 * VALIDATION_WINDOW
    assert window["validation/window_sampled_success"] == wins / (4 * VALIDATION_WINDOW)
    assert (window["validation/window_sampled_success_ci95_low"],
            window["validation/window_sampled_success_ci95_high"]) == wilson_interval(wins, 4 * VALIDATION_WINDOW)
    assert window["validation/window_greedy_success"] == 1.0
    assert _validation_window([{"success_rate": 1.0}], per_mode=4) == {}  # no validation: nothing claimed


def test_train_says_why_greedy_validation_falls_far_short_of_sampled():
    """A session-58 user's Overcooked library (no option with a milestone, a soup needing three
    onions potted) validated at 0 % greedy against 94-96 % sampled on every progress line, and
    nothing said why: greedy sets aside an option tried since the milestones last changed."""
    from gyre_ma.cli import VALIDATION_WINDOW, _greedy_gap, _validation_window

    def gap(sampled, greedy, iterations=VALIDATION_WINDOW):
        rows = [{"validation/sampled_success": sampled, "validation/greedy_success": greedy}] * iterations
        return _greedy_gap(_validation_window(rows, per_mode=4))

    said = gap(0.75, 0.0)
    assert said is not None and said.startswith("held-out greedy success 0% against sampled 75% over the last 10 "
                                                "validations (40 episodes of each)")
    assert "one onion of the three a soup needs" in said and "--greedy --json" in said
    assert gap(0.75, 0.0, iterations=VALIDATION_WINDOW - 1) is None  # a window not yet full
    assert gap(0.75, 0.5) is None  # greedy more than half of sampled
    assert gap(0.25, 0.0) is None  # sampled below one half: no policy to compare with yet
    assert gap(0.5, 0.25) is None  # 20 of 40 against 10 of 40: the intervals overlap


def test_train_with_jobs_points_to_experiment(capsys):
    """Both session-57 users passed --jobs to train, which has none."""
    assert main(["train", "any.yaml", "--jobs", "1"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "unrecognized arguments: --jobs 1" in err
    assert err.endswith("--jobs is gyre-ma experiment's, which trains several runs (seeds, variants) at once")


def test_training_says_its_env_steps_per_second(tmp_path, capsys):
    """A session-53 user found no throughput anywhere and worked it out from metrics.csv."""
    import re

    config = tmp_path / "q.yaml"
    config.write_text(f"name: q\nenv: {{id: coverage_v0}}\nrun_root: {tmp_path}\n")
    assert main(["train", str(config), "--iterations", "2"]) == 0
    out = capsys.readouterr().out
    rates = [float(r.replace(",", "")) for r in re.findall(r"iter \d/2 · \d+ env steps \(([\d,]+)/s\) · ", out)]
    assert len(rates) == 2 and all(r > 0 for r in rates)
    row = next(line for line in out.splitlines() if "env steps per second of training (this session)" in line)
    assert float(row.split("│")[2].strip().replace(",", "")) > 0
    # a session-57 user's summary headlined the last iteration's 4 validation episodes (25 %; eval gave 77.5 %)
    import json

    import numpy as np

    from gyre_ma.monitor import read_metrics

    summary = json.loads((tmp_path / "q" / "summary.json").read_text())
    columns = read_metrics(tmp_path / "q" / "metrics.csv")
    sampled = columns["validation/sampled_success"][np.isfinite(columns["validation/sampled_success"])]
    assert summary["validation/window_iterations"] == len(sampled) == 2
    assert summary["validation/window_episodes"] == 2 * 4  # roles.evaluators episodes a validation, each mode
    assert summary["validation/window_sampled_success"] == sampled.mean()
    assert summary["validation/window_sampled_success_ci95_low"] <= sampled.mean() \
        <= summary["validation/window_sampled_success_ci95_high"]
    flat = " ".join(out.replace("│", " ").split())
    assert "held-out validation, sampled: the last 2 validations' 8 episodes" in flat
    assert "validation/sampled_success (its 4 episodes)" in flat
    assert f"gyre-ma eval {tmp_path / 'q'} --episodes 200 (and again with --greedy)" in flat
    # a session-55 user extended a finished run and its exploration rose again, unannounced
    assert main(["train", str(config), "--resume", "--iterations", "4", "--quiet"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("note: train.iterations 2 -> 4: the schedules that span the run (entropy, explorer noise, temperature, "
            "lr, the average of the last weights) stretch over 4 iterations, so iteration 2 stands at 67% of them, "
            "not at 100% where the run left them: exploration rises again") in out


def test_a_curriculum_without_an_oracle_is_named_by_check_and_train(tmp_path, capsys):
    """A session-53 user's curriculum passed check, then train blamed manager.kind (never set)
    and pointed to kind 'scripted', which would have stopped the learning."""
    config = tmp_path / "c.yaml"
    config.write_text(f"name: c\nenv: {{id: 'gyre_ma.envs.coverage.coverage:CoverageEnv'}}\nrun_root: {tmp_path}\n"
                      "library: gyre_ma.envs.coverage.options:make_library\ncurriculum: {enabled: true}\n")
    for command in (["check", str(config), "--play", "0"], ["train", str(config), "--iterations", "1", "--quiet"]):
        assert main(command) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert "curriculum.enabled: the horizon curriculum sets its step caps from the path length of oracle " \
               "episodes, and environment 'gyre_ma.envs.coverage.coverage:CoverageEnv' has no built-in oracle" in err
        assert "the manager still learns" in err and "manager.kind" not in err


def test_another_packages_coloured_warning_reaches_a_log_without_its_colour_codes(capsys):
    """A session-55 user's check output held gymnasium's ``\\x1b[33mWARN: Casting input x to numpy
    array.\\x1b[0m`` raw."""
    import warnings

    from gyre_ma.cli import _warnings_in_one_line

    with _warnings_in_one_line("check"):
        text = warnings.formatwarning("\x1b[33mWARN: Casting input x to numpy array.\x1b[0m", UserWarning,
                                      "/site-packages/gymnasium/logger.py", 1)
    assert "UserWarning: WARN: Casting input x to numpy array." in text and "\x1b" not in text


def test_check_computes_every_options_features_on_the_decisions_it_played(tmp_path, capsys, monkeypatch):
    """A session-56 user's features broke only in train: check played by a random order, which
    never asks them."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "feats.py").write_text(textwrap.dedent("""
        import dataclasses

        import numpy as np

        from gyre_ma.envs.minigrid_doorkey import make_library
        from gyre_ma.options.library import OptionLibrary


        def library(env=None, broken=False):
            def near(observation):
                seen = int(np.asarray(observation["image"]).sum())
                return [np.nan if broken and seen % 2 else 1.0, 0.0]

            base = make_library()
            return OptionLibrary(base.name, base.graph, [dataclasses.replace(o, features=near) for o in base])
    """))
    (tmp_path / "feats.yaml").write_text("name: feats\nenv: {id: 'gyre_ma.envs.minigrid_doorkey:make_env'}\n"
                                         "library: 'feats:library'\n")
    assert main(["check", str(tmp_path / "feats.yaml")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "features of 4 options computed on the" in out and "decisions played: 2 finite values each" in out
    assert main(["check", str(tmp_path / "feats.yaml"), "--set", "library_kwargs.broken=true"]) == 2
    assert "option 'get_key': features returned a value that is not finite for agent" in capsys.readouterr().err


def test_evals_option_table_shows_whole_option_names(tmp_path, capsys, monkeypatch):
    """A session-56 user's build_assembler_mk1 and _mk2 both read build_assembl… in eval's table."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "longnames.py").write_text(textwrap.dedent("""
        import dataclasses

        from gyre_ma.envs.coverage.options import make_library
        from gyre_ma.options.library import OptionLibrary


        def library():
            base = make_library()
            return OptionLibrary(base.name, base.graph, [dataclasses.replace(o, name=f"build_assembler_mark_{i}")
                                                         for i, o in enumerate(base)])
    """))
    (tmp_path / "long.yaml").write_text("name: long\nenv: {id: coverage_v0}\nlibrary: 'longnames:library'\n"
                                        "manager: {kind: random}\n")
    assert main(["eval", str(tmp_path / "long.yaml"), "--episodes", "1"]) == 0
    out = capsys.readouterr().out
    assert all(f"build_assembler_mark_{i}" in out for i in range(4)), out


def test_the_program_prints_a_line_at_a_time_into_a_file_or_pipe(tmp_path):
    """A session-58 user's evals, redirected to a file, showed their progress lines only when
    they ended: Python buffers standard output in blocks where it is no terminal."""
    code = ("import sys; from gyre_ma.cli import _lines_as_printed; _lines_as_printed(); "
            "print(sys.stdout.line_buffering, sys.stderr.line_buffering)")
    with (tmp_path / "log").open("w") as log:
        subprocess.run([sys.executable, "-c", code], stdout=log, stderr=subprocess.PIPE, check=True)
    assert (tmp_path / "log").read_text().split() == ["True", "True"]


def test_a_package_that_fails_to_import_is_called_a_conflict_not_a_bug(tmp_path, capsys, monkeypatch):
    """A session-60 user's Flatland pinned numpy<2; pyarrow 20 refused it as train began, and
    the message called that a bug in gyre-ma."""
    import gyre_ma.cli as cli

    (tmp_path / "stiffpkg").mkdir()
    (tmp_path / "stiffpkg" / "__init__.py").write_text(
        "raise ImportError('stiffpkg requires NumPy 2.0 or newer, found 1.26.4')\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def command(args):
        import stiffpkg  # noqa: F401  (as train imports its storage stack)

    monkeypatch.setitem(cli.COMMANDS, "plot", command)
    assert main(["plot", str(tmp_path)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert ("gyre-ma plot: a package failed to import (stiffpkg requires NumPy 2.0 or newer, found 1.26.4) in "
            f"{tmp_path / 'stiffpkg' / '__init__.py'}: the installed packages conflict (pip check lists what does not "
            "fit), not your input, nor gyre-ma") in err
    assert "this is a bug in gyre-ma" not in err

    def ours(args):  # an ImportError raised in gyre-ma's own code: a bug
        exec(compile("raise ImportError('cannot import name nothing')", cli.__file__, "exec"))

    monkeypatch.setitem(cli.COMMANDS, "plot", ours)
    assert main(["plot", str(tmp_path)]) == 1
    assert "a package failed to import" not in " ".join(capsys.readouterr().err.split())
