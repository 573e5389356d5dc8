"""LLM-backed options (issue #21, part 2): declared in YAML beside scripted ones, acting by
constrained scoring or by generation with retries and a fallback, and batched across the
agents and envs of a worker into one engine call per round."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="the llm extra (transformers) is not installed")

from gyre_ma.agents.baselines import RandomManager  # noqa: E402
from gyre_ma.backends.local import LocalBackend  # noqa: E402
from gyre_ma.backends.worker import RolloutWorker, policy_weights  # noqa: E402
from gyre_ma.config import parse_config  # noqa: E402
from gyre_ma.envs.coverage.coverage import task_graph  # noqa: E402
from gyre_ma.envs.registry import make_env  # noqa: E402
from gyre_ma.llm.hf import TransformersEngine  # noqa: E402
from gyre_ma.llm.option import LLMPolicy  # noqa: E402
from gyre_ma.llm.tiny import build_tiny_model  # noqa: E402
from gyre_ma.options.library import OptionLibrary  # noqa: E402
from gyre_ma.options.option import Option  # noqa: E402
from gyre_ma.roles import RolloutTask  # noqa: E402
from gyre_ma.rollout import run_episode  # noqa: E402

MOVES = ["stay", "up", "down", "left", "right"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    words = MOVES + "task observation admissible actions action walk to landmark and claim it wander".split()
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), words + [":", ",", "."], layers=2, width=32)


def _library(policy) -> OptionLibrary:
    library = OptionLibrary("llm", task_graph(3, 9))
    library.add(Option("wander", policy, None, done=lambda ctx: ctx.steps >= 2, max_steps=2))
    return library


def _render(ctx) -> str:
    return " ".join(f"{x:.1f}" for x in np.asarray(ctx.observation).ravel()[:4])


def test_a_scoring_option_acts_within_the_action_space_and_is_counted(model_dir):
    engine = TransformersEngine(model_dir)
    policy = LLMPolicy(engine, actions=MOVES, description="wander", render=_render, name="wander")
    traj = run_episode(make_env("coverage_v0"), _library(policy), RandomManager(0), seed=3)
    steps = sum(c.duration for c in traj.calls)
    assert traj.length > 0 and traj.llm_requests == steps  # one scored request per agent and step
    assert traj.llm_invalid == traj.llm_fallbacks == 0  # constrained: nothing to reject
    again = run_episode(make_env("coverage_v0"), _library(policy), RandomManager(0), seed=3)
    assert [(c.agent, c.start_step, c.duration) for c in again.calls] == [
        (c.agent, c.start_step, c.duration) for c in traj.calls]


def test_a_generating_option_retries_unusable_output_then_falls_back(model_dir):
    engine = TransformersEngine(model_dir)
    policy = LLMPolicy(engine, actions=MOVES, mode="generate", fallback=0, retries=2, render=_render,
                       max_new_tokens=3, name="wander")  # an untrained model writes mostly nonsense
    traj = run_episode(make_env("coverage_v0"), _library(policy), RandomManager(0), seed=3)
    steps = sum(c.duration for c in traj.calls)
    assert traj.llm_invalid > 0 and traj.llm_fallbacks > 0
    # each step: its attempts are its requests; all but the last invalid, or all when it fell back
    assert traj.llm_requests == traj.llm_invalid + steps - traj.llm_fallbacks
    assert traj.llm_invalid >= 3 * traj.llm_fallbacks
    from gyre_ma.metrics import episode_metrics  # they reach metrics.csv, the summary and gyre-ma eval

    metrics = episode_metrics([traj, traj], ())
    assert metrics["llm/requests"] == traj.llm_requests
    assert metrics["llm/invalid_share"] == traj.llm_invalid / traj.llm_requests
    assert metrics["llm/fallback_share"] == traj.llm_fallbacks / traj.llm_requests
    assert "llm/requests" not in episode_metrics([run_episode(make_env("coverage_v0"), _library(lambda ctx: 0),
                                                              RandomManager(0), seed=3)], ())
    with pytest.raises(ValueError, match="mode 'generate' needs a fallback"):
        LLMPolicy(engine, actions=MOVES, mode="generate")
    with pytest.raises(ValueError, match="unknown field"):
        LLMPolicy(engine, actions=MOVES, template="{nope}")


def _yaml_library(tmp_path, model_dir) -> str:
    path = tmp_path / "library.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: mixed
        graph: gyre_ma.envs.coverage.coverage:task_graph
        options:
          - {{name: go_to_0, milestone: covered_0, policy: gyre_ma.envs.coverage.options:go_to_0,
             initiation: gyre_ma.envs.coverage.options:can_move, max_steps: 18}}
          - {{name: go_to_1, milestone: covered_1, policy: gyre_ma.envs.coverage.options:go_to_1,
             initiation: gyre_ma.envs.coverage.options:can_move, max_steps: 18}}
          - {{name: go_to_2, milestone: covered_2, policy: gyre_ma.envs.coverage.options:go_to_2,
             initiation: gyre_ma.envs.coverage.options:can_move, max_steps: 18}}
          - name: wander
            kind: llm
            done: gyre_ma.envs.coverage.options:stay_done
            max_steps: 1
            llm: {{model: '{model_dir}', actions: [stay, up, down, left, right], mode: score}}
        """))
    return str(path)


def test_a_yaml_library_with_an_llm_option_dumps_back_to_the_same_entry(tmp_path, model_dir):
    library = OptionLibrary.load(_yaml_library(tmp_path, model_dir))
    spec = library.to_spec()
    assert spec["options"][3] == {"name": "wander", "kind": "llm",
                                  "llm": {"model": str(model_dir), "actions": ["stay", "up", "down", "left", "right"],
                                          "mode": "score"},
                                  "done": "gyre_ma.envs.coverage.options:stay_done", "max_steps": 1}
    library.dump(tmp_path / "again.yaml")
    again = OptionLibrary.load(tmp_path / "again.yaml")
    assert isinstance(again["wander"].policy, LLMPolicy) and again.to_spec() == spec


def _fingerprint(t) -> tuple:
    return (t.task_seed, t.length, t.success, t.llm_requests,
            tuple((c.agent, c.option, c.start_step, c.duration) for c in t.calls))


def test_a_yaml_library_mixes_scripted_and_llm_options_and_batches_them_across_envs(tmp_path, model_dir,
                                                                                     monkeypatch):
    library = _yaml_library(tmp_path, model_dir)

    def config(num_envs: int):
        return parse_config({"seed": 0, "env": {"id": "coverage_v0"}, "library": library,
                             "manager": {"hidden": 16}, "rollout": {"num_envs": num_envs}})

    worker = RolloutWorker(config(1))
    torch.manual_seed(0)
    weights = policy_weights(worker.kit.policy, worker.kit.critic)
    tasks = [RolloutTask("executor", seed) for seed in range(6)]
    calls: list[int] = []
    real = TransformersEngine.score

    def spy(self, prompts, candidates):
        calls.append(len(prompts))
        return real(self, prompts, candidates)

    monkeypatch.setattr(TransformersEngine, "score", spy)
    alone = [_fingerprint(t) for t in LocalBackend(config(1)).collect(weights, 0, tasks)]
    alone_calls, calls[:] = list(calls), []
    batched = [_fingerprint(t) for t in LocalBackend(config(4)).collect(weights, 0, tasks)]
    assert sum(f[3] for f in alone) > 0  # the manager chose the LLM option
    assert batched == alone  # the same episodes however many are in flight
    assert sum(calls) == sum(alone_calls) and max(calls) > max(alone_calls)  # wider calls...
    assert len(calls) < len(alone_calls)  # ...and fewer of them: one per round, for every env in flight


def test_check_says_which_options_an_llm_acts_for(tmp_path, model_dir, capsys):
    from gyre_ma.cli import main

    assert main(["check", str(_yaml_library(tmp_path, model_dir))]) == 0
    rows = {line.split("│")[1].strip(): line for line in capsys.readouterr().out.splitlines() if line.count("│") > 3}
    llm = [name for name, row in rows.items() if "│ llm " in row]
    assert llm and all("│ scripted " in row for name, row in rows.items() if name not in llm and name != "option")


def test_yaml_mistakes_in_an_llm_option_are_named(tmp_path, model_dir):
    from gyre_ma.options.library import OptionLibrary as Lib

    base = {"name": "x", "graph": "gyre_ma.envs.coverage.coverage:task_graph"}
    with pytest.raises(ValueError, match=r"options\[0\]: an option of kind 'llm' needs 'name' and 'llm'"):
        Lib.from_spec(base | {"options": [{"name": "w", "kind": "llm", "policy": "a:b"}]})
    with pytest.raises(ValueError, match=r"options\[0\].llm: unknown key\(s\) \['modle'\]"):
        Lib.from_spec(base | {"options": [{"name": "w", "kind": "llm", "llm": {"modle": "x", "actions": ["a"]}}]})
    with pytest.raises(ValueError, match=r"options\[0\].llm: model: .* is not a local directory"):
        Lib.from_spec(base | {"options": [{"name": "w", "kind": "llm", "llm": {"model": "gpt2", "actions": ["a"]}}]})
    with pytest.raises(ValueError, match=r"options\[0\]: 'llm' is for options of kind 'llm'"):
        Lib.from_spec(base | {"options": [{"name": "w", "policy": "a:b", "llm": {}}]})
    llm = {"model": str(model_dir), "actions": ["a", "b"], "mode": "generate"}
    with pytest.raises(ValueError) as info:  # named once, not "...llm: ...llm.render: ..."
        Lib.from_spec(base | {"options": [{"name": "w", "kind": "llm",
                                           "done": "gyre_ma.envs.coverage.options:stay_done",
                                           "llm": llm | {"render": "math:no_such", "fallback": "a"}}]})
    assert str(info.value).count("options[0].llm") == 1 and "llm.render: module 'math' has no attribute" in str(
        info.value)
    from gyre_ma.llm.option import policy_from_spec

    policy = policy_from_spec(llm | {"actions": ["note: key", "b"], "fallback": "note: key"}, name="w", milestone=None,
                              graph=None, where="w.llm")
    assert policy.fallback == "note: key"  # an action text with a colon, not an import
    with pytest.raises(ValueError, match=r"w.llm: LLM option 'w': the fallback 'c' is not one of its actions "
                                         r"\['a', 'b'\], and the option has no to_action"):
        policy_from_spec(llm | {"fallback": "c"}, name="w", milestone=None, graph=None, where="w.llm")


def _one_argument(text):  # to_action written as the user of session 53 first wrote it
    return 0


def test_an_llm_options_callables_are_checked_when_the_library_loads(model_dir):
    """A to_action, render, actions or fallback callable that takes the wrong arguments is
    refused when the library loads, naming the option, what it must take and where it is
    defined; not when the option first acts."""
    from gyre_ma.llm.option import policy_from_spec

    llm = {"model": str(model_dir), "actions": ["a", "b"]}
    with pytest.raises(ValueError, match=r"w.llm: option 'w': llm.to_action must take exactly 2 arguments \(an "
                                         r"OptionContext and one admissible action's text\), got signature \(text\) "
                                         r"\(defined at .*test_option.py:\d+\)"):
        policy_from_spec(llm | {"to_action": f"{__name__}:_one_argument"}, name="w", milestone=None, graph=None,
                         where="w.llm")
    with pytest.raises(ValueError, match=r"option 'w': llm.render must take exactly one argument \(an OptionContext\)"):
        policy_from_spec(llm | {"render": f"{__name__}:_reference_pair"}, name="w", milestone=None, graph=None,
                         where="w.llm")


def _reference_pair(ctx, text):
    return text


def _context():
    from types import SimpleNamespace

    return SimpleNamespace(memory={}, rng=np.random.default_rng(0), agent="agent_0", observation=np.zeros(4))


def test_a_fallback_given_as_action_text_acts_as_the_models_choice_would(model_dir):
    """After the retries run out, a fallback written as an action's text becomes the env
    action the model's choice of that text would: its index, or ``to_action``'s answer."""
    engine = TransformersEngine(model_dir)
    policy = LLMPolicy(engine, actions=MOVES, mode="generate", fallback=" left ", retries=0, render=_render,
                       max_new_tokens=2, name="wander")  # an untrained model: mostly nonsense, so fallbacks
    traj = run_episode(make_env("coverage_v0"), _library(policy), RandomManager(0), seed=3)
    assert traj.llm_fallbacks > 0
    for to_action, expected in ((None, MOVES.index("left")), (lambda ctx, text: f"<{text}>", "<left>")):
        policy = LLMPolicy(engine, actions=MOVES, mode="generate", fallback=" left ", retries=0, render=_render,
                           to_action=to_action, name="wander")
        ctx = _context()
        got = policy.resolve(ctx, policy.request(ctx), "no such move")
        assert got.fallback and got.action == expected
    moving = LLMPolicy(engine, actions=lambda ctx: ["up", "down"], mode="generate", fallback="left", retries=0,
                       render=_render, name="wander")
    ctx = _context()
    with pytest.raises(ValueError, match=r"LLM option 'wander': the fallback 'left' is not one of this step's "
                                         r"admissible actions \['up', 'down'\]"):
        moving.resolve(ctx, moving.request(ctx), "sideways")
