"""Neural options: pre-trained on their own milestone, saved, declared in a library, frozen
under a manager that learns to order them."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from gyre_ma.agents.subpolicy import NeuralSubPolicy, for_space
from gyre_ma.envs.coverage.options import make_library
from gyre_ma.envs.coverage.oracle import FixedAssignment
from gyre_ma.envs.registry import make_env
from gyre_ma.options.library import OptionLibrary
from gyre_ma.options.option import Option, OptionContext
from gyre_ma.pretrain import pretrain_option
from gyre_ma.rollout import run_episode

DRILL = {"n_agents": 1, "max_cycles": 40}
"""One agent walking to one landmark, with time to wander while it learns."""


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, list[dict[str, float]]]:
    env = make_env("coverage_v0", **DRILL)
    result = pretrain_option(env, make_library(env=env), "go_to_0", episodes=800, seed=0)
    path = result.policy.save(tmp_path_factory.mktemp("neural") / "go_to_0.pt")
    return path, result.history


def with_policy(library: OptionLibrary, name: str, policy) -> OptionLibrary:
    return OptionLibrary(library.name, library.graph,
                         [dataclasses.replace(o, policy=policy) if o.name == name else o for o in library])


def test_pretraining_learns_the_option_and_the_frozen_one_plays_like_the_scripted_one(trained):
    path, history = trained
    assert history[0]["success"] < 0.3  # an untrained network rarely finds the landmark
    assert min(h["success"] for h in history[-3:]) >= 0.9
    task = make_env("coverage_v0", n_agents=1)  # the real step cap: the grid's side, one step of slack
    scripted = make_library(env=task)
    neural = with_policy(scripted, "go_to_0", NeuralSubPolicy.load(path))
    played = {name: [run_episode(task, lib, FixedAssignment(lib), seed=s) for s in range(10_000, 10_100)]
              for name, lib in (("neural", neural), ("scripted", scripted))}
    assert np.mean([t.success for t in played["scripted"]]) == 1.0
    assert np.mean([t.success for t in played["neural"]]) >= 0.95
    mean_length = {k: np.mean([t.length for t in v]) for k, v in played.items()}
    assert mean_length["neural"] <= 1.05 * mean_length["scripted"]


def test_pretraining_measures_the_frozen_option_greedy_and_sampling_on_held_out_seeds_and_keeps_the_better(tmp_path):
    """The check plays held-out seeds in both modes; the network then acts in the mode that
    scored higher, the file records it, and a library entry without ``sample`` follows the
    file while one with it overrides it. Seeds shared with training are refused."""
    env = make_env("coverage_v0", **DRILL)
    result = pretrain_option(env, make_library(env=env), "go_to_0", episodes=64, seed=0, check_episodes=20)
    assert set(result.check) == {"greedy", "sampled"}
    for row in result.check.values():
        assert row["calls"] >= 20 and 0.0 <= row["success"] <= 1.0 and row["score"] <= row["success"]
    better = result.check["sampled"]["score"] > result.check["greedy"]["score"]
    assert result.policy.sample is better
    again = pretrain_option(env, make_library(env=env), "go_to_0", episodes=64, seed=0, check_episodes=20)
    assert again.check == result.check  # seeded, the check too
    for mode in (True, False):  # whichever the check chose, the file keeps what the policy does
        result.policy.sample = mode
        path = result.policy.save(tmp_path / f"{mode}.pt")
        assert NeuralSubPolicy.load(path).sample is mode
        entry = {"name": "go_to_0", "milestone": "covered_0", "kind": "neural", "neural": {"weights": str(path)}}
        assert OptionLibrary.load(library_yaml(tmp_path, entry))["go_to_0"].policy.sample is mode
        entry["neural"]["sample"] = not mode
        assert OptionLibrary.load(library_yaml(tmp_path, entry))["go_to_0"].policy.sample is (not mode)
    unchecked = pretrain_option(env, make_library(env=env), "go_to_0", episodes=16, seed=0, check_episodes=0)
    assert unchecked.check == {} and unchecked.policy.sample is False
    with pytest.raises(ValueError, match=r"the check's seeds \[10, 30\) overlap training's \[0, 16\)"):
        pretrain_option(env, make_library(env=env), "go_to_0", episodes=16, seed=0, check_episodes=20, check_seed=10)


def test_a_neural_option_that_cannot_act_for_any_agent_is_refused_when_the_library_meets_the_env():
    """A network for another action count, or any network for a continuous action space,
    is named with the option, the agent and the spaces before a first step is played."""
    from gymnasium import spaces

    from gyre_ma.envs.registry import fits_agents

    env = make_env("coverage_v0")
    space = env.action_space("agent_0")
    wrong = NeuralSubPolicy(int(np.prod(env.observation_space("agent_0").shape)), int(space.n) - 1, name="go_to_0")
    with pytest.raises(ValueError, match=r"lib: option 'go_to_0' cannot act for agent 'agent_0' \(nor for any other "
                                         rf"of \['agent_0', 'agent_1', 'agent_2'\]\): its sub-policy .*neural:go_to_0 "
                                         rf"picks one of {int(space.n) - 1} actions from 0, and the agent's action "
                                         rf"space is Discrete\({int(space.n)}\)"):
        fits_agents(with_policy(make_library(env=env), "go_to_0", wrong), env, "lib")
    right = for_space(env.observation_space("agent_0"), space, name="go_to_0")
    fits_agents(with_policy(make_library(env=env), "go_to_0", right), env, "lib")  # fits: no error
    assert "Discrete action space only" in right.misfit(env.observation_space("agent_0"), spaces.Box(-1, 1, (3,)))
    assert "reads" in right.misfit(spaces.Box(0, 1, (2,)), space)


def test_pretraining_is_seeded():
    env = make_env("coverage_v0", **DRILL)

    def weights(seed: int) -> list[torch.Tensor]:
        result = pretrain_option(env, make_library(env=env), "go_to_0", episodes=32, seed=seed)
        return list(result.policy.net.state_dict().values())

    first, again, other = weights(3), weights(3), weights(4)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


def test_a_saved_sub_policy_acts_as_the_one_saved_and_bad_files_are_named(tmp_path):
    policy = NeuralSubPolicy(6, 4, start=1, hidden=8, seed=5, name="walk")
    path = policy.save(tmp_path / "walk.pt")
    loaded = NeuralSubPolicy.load(path, name="walk")
    rng = np.random.default_rng(0)
    for _ in range(20):
        ctx = OptionContext("agent_0", None, rng.normal(size=6).astype(np.float32), frozenset())
        assert loaded(ctx) == policy(ctx) and 1 <= policy(ctx) <= 4
    sampler = NeuralSubPolicy.load(path, sample=True)
    draws = {sampler(OptionContext("a", None, np.zeros(6), frozenset(), rng=np.random.default_rng(s)))
             for s in range(50)}
    assert len(draws) > 1 and draws <= {1, 2, 3, 4}
    with pytest.raises(ValueError, match=r"neural sub-policy 'walk' \(agent 'agent_3'\): expected an observation of "
                                         r"6 finite numbers \(an array\), got 5 values"):
        policy(OptionContext("agent_3", None, np.zeros(5), frozenset()))
    with pytest.raises(ValueError, match="got dict"):
        policy(OptionContext("agent_3", None, {"image": np.zeros(6)}, frozenset()))
    with pytest.raises(ValueError, match=r"weights file '.*nope.pt' does not exist"):
        NeuralSubPolicy.load(tmp_path / "nope.pt")
    torch.save({"policy": {}}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="is not a saved sub-policy"):
        NeuralSubPolicy.load(tmp_path / "other.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="cannot read"):
        NeuralSubPolicy.load(tmp_path / "junk.pt")
    state = torch.load(path, weights_only=True)
    state["hidden"] = 16
    torch.save(state, tmp_path / "reshaped.pt")
    with pytest.raises(ValueError, match="holds weights of another shape"):
        NeuralSubPolicy.load(tmp_path / "reshaped.pt")


def test_for_space_needs_an_array_observation_and_discrete_actions():
    from gymnasium import spaces

    box = spaces.Box(-1.0, 1.0, shape=(3, 4))
    policy = for_space(box, spaces.Discrete(5, start=2), name="x")
    assert (policy.observation_dim, policy.actions, policy.start) == (12, 5, 2)
    with pytest.raises(ValueError, match="needs a Box observation space"):
        for_space(spaces.Dict({"a": box}), spaces.Discrete(5), name="x")
    with pytest.raises(ValueError, match="needs a Discrete action space"):
        for_space(box, spaces.Box(-1.0, 1.0, shape=(2,)), name="x")


def library_yaml(tmp_path: Path, entry: dict) -> Path:
    spec = {"name": "one_landmark",
            "graph": {"goals": ["covered_0"],
                      "milestones": {"covered_0": {"verifier": "gyre_ma.envs.coverage.coverage:verify_covered_0"}}},
            "options": [entry, {"name": "stay", "policy": "gyre_ma.envs.coverage.options:stay",
                                "done": "gyre_ma.envs.coverage.options:stay_done", "max_steps": 1}]}
    path = tmp_path / "library.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_library_yaml_declares_a_neural_option_that_stays_frozen_while_the_manager_trains(trained, tmp_path):
    from gyre_ma.config import parse_config
    from gyre_ma.loop import Gyre

    weights, _ = trained
    entry = {"name": "go_to_0", "milestone": "covered_0", "kind": "neural", "neural": {"weights": str(weights)},
             "max_steps": 18}
    path = library_yaml(tmp_path, entry)
    library = OptionLibrary.load(path)
    assert isinstance(library["go_to_0"].policy, NeuralSubPolicy)
    config = parse_config({"name": "neural", "env": {"id": "coverage_v0", "kwargs": {"n_agents": 1}},
                           "library": str(path), "train": {"iterations": 2, "episodes_per_iteration": 8},
                           "checkpoints": {"enabled": False}})
    gyre = Gyre(config)
    before = NeuralSubPolicy.load(weights).net.state_dict()
    history = [gyre.iteration(i) for i in range(2)]
    gyre.close()
    assert history[-1]["success_rate"] > 0.5 and history[-1]["update_skipped"] == 0.0
    option = gyre.library["go_to_0"]
    after = option.policy.net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the manager's updates leave it alone
    assert not any(p is q for p in gyre.policy.parameters() for q in option.policy.net.parameters())


def test_a_neural_option_loaded_from_a_library_entry_dumps_back_and_one_built_in_python_is_named(trained, tmp_path):
    weights, _ = trained
    entry = {"name": "go_to_0", "milestone": "covered_0", "kind": "neural",
             "neural": {"weights": str(weights), "sample": True}, "max_steps": 18}
    library = OptionLibrary.load(library_yaml(tmp_path, entry))
    spec = library.to_spec()
    assert spec["options"][0] == {"name": "go_to_0", "kind": "neural", "neural": {"weights": str(weights),
                                                                                  "sample": True},
                                  "milestone": "covered_0", "max_steps": 18}
    library.dump(tmp_path / "again.yaml")
    again = OptionLibrary.load(tmp_path / "again.yaml")
    assert isinstance(again["go_to_0"].policy, NeuralSubPolicy) and again["go_to_0"].policy.sample
    assert again.to_spec() == spec
    built = OptionLibrary(library.name, library.graph)
    built.add(Option("go_to_0", NeuralSubPolicy.load(weights), milestone="covered_0"))
    with pytest.raises(ValueError, match=r"option 'go_to_0': its policy is a NeuralSubPolicy object, which has no "
                                         r"reference to import; load the option from a library entry"):
        built.to_spec()


@pytest.mark.parametrize(("entry", "expected"), [
    ({"name": "go", "kind": "neural"}, r"options\[0\]: an option of kind 'neural' needs 'name' and 'neural'"),
    ({"name": "go", "policy": "gyre_ma.envs.coverage.options:stay", "neural": {"weights": "w.pt"}},
     r"options\[0\]: 'neural' is for options of kind 'neural'; add kind: neural"),
    ({"name": "go", "kind": "neural", "neural": {"path": "w.pt"}},
     r"options\[0\]\.neural: unknown key\(s\) \['path'\]"),
    ({"name": "go", "kind": "neural", "neural": {"weights": "missing.pt"}},
     r"options\[0\]\.neural: neural sub-policy 'go': weights file 'missing.pt' does not exist"),
    ({"name": "go", "kind": "neural", "neural": {"weights": "w.pt", "sample": "yes"}},
     r"options\[0\]\.neural\.sample: expected true or false"),
    ({"name": "go", "kind": "neurall", "neural": {"weights": "w.pt"}},
     r"options\[0\]\.kind: expected 'callable' \(a policy: module:callable\), 'llm' or 'neural', got 'neurall'"),
    ({"name": "go", "kind": ["neural"], "neural": {"weights": "w.pt"}},
     r"options\[0\]\.kind: expected 'callable' \(a policy: module:callable\), 'llm' or 'neural', got \['neural'\]"),
])
def test_bad_neural_entries_are_named(tmp_path, entry, expected):
    with pytest.raises(ValueError, match=expected):
        OptionLibrary.load(library_yaml(tmp_path, entry))


def test_pretrain_option_cli_writes_weights_and_rejects_bad_arguments(tmp_path):
    config = tmp_path / "coverage.yaml"
    config.write_text(yaml.safe_dump({"name": "drill", "env": {"id": "coverage_v0", "kwargs": DRILL}}))

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gyre_ma.cli", "pretrain-option", str(config), *args],
                              capture_output=True, text=True, timeout=300)

    out = cli("--option", "go_to_0", "--out", str(tmp_path / "g.pt"), "--episodes", "32")
    assert out.returncode == 0, out.stderr
    assert "success" in out.stdout and (tmp_path / "g.pt").is_file()
    assert NeuralSubPolicy.load(tmp_path / "g.pt").observation_dim > 0
    out = cli("--option", "go_to_9", "--out", str(tmp_path / "h.pt"), "--episodes", "8")
    assert out.returncode == 2 and "has no option 'go_to_9'" in out.stderr and "Traceback" not in out.stderr
    out = cli("--option", "go_to_0", "--out", str(tmp_path / "h.npz"))
    assert out.returncode == 2 and "--out: expected a .pt file" in out.stderr


def test_the_shipped_neural_coverage_library_is_the_scripted_one_but_for_go_to_0(trained):
    weights, _ = trained
    root = Path(__file__).resolve().parents[2]
    shipped = OptionLibrary.load(root / "configs" / "libraries" / "coverage_neural.yaml", go_to_0=str(weights))
    scripted = make_library()
    assert shipped.names == scripted.names and shipped.graph.names == scripted.graph.names
    same = ("milestone", "initiation", "done", "failure", "max_steps", "repeatable", "exclusive")
    for a, b in zip(shipped, scripted, strict=True):
        assert {k: getattr(a, k) for k in same} == {k: getattr(b, k) for k in same}, a.name
        assert (a.policy is b.policy) == (a.name != "go_to_0")
    assert isinstance(shipped["go_to_0"].policy, NeuralSubPolicy)


def test_pretraining_an_option_that_is_neural_already_goes_on_from_a_copy_of_its_weights(trained):
    weights, _ = trained
    env = make_env("coverage_v0", **DRILL)
    frozen = NeuralSubPolicy.load(weights)
    library = with_policy(make_library(env=env), "go_to_0", frozen)
    before = {k: v.clone() for k, v in frozen.net.state_dict().items()}
    result = pretrain_option(env, library, "go_to_0", episodes=32, seed=1)
    assert result.policy is not frozen and result.history[0]["success"] >= 0.9  # it starts trained
    assert all(torch.equal(before[k], v) for k, v in frozen.net.state_dict().items())  # the library's stays as it was
