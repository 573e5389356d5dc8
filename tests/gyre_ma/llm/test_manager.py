"""The LLM manager (issue #21, part 3): a causal LM scoring the eligible options' names
after a text view of the decision, trained online by the same loop with a KL penalty to
a frozen reference, its weights pushed to the rollout workers at each policy version."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest
import torch

pytest.importorskip("transformers", reason="the llm extra (transformers) is not installed")

from gyre_ma import batch as B  # noqa: E402
from gyre_ma.agents.manager import Critic, Featurizer  # noqa: E402
from gyre_ma.agents.noise import NoiseSetting  # noqa: E402
from gyre_ma.backends.worker import RolloutKit, policy_weights  # noqa: E402
from gyre_ma.config import ConfigError, load_config, parse_config  # noqa: E402
from gyre_ma.llm.hf import TransformersEngine  # noqa: E402
from gyre_ma.llm.manager import CUE, DecisionText, LLMActor, LLMManagerPolicy  # noqa: E402
from gyre_ma.llm.tiny import build_tiny_model  # noqa: E402
from gyre_ma.loop import Gyre  # noqa: E402
from gyre_ma.options.decision import Decision  # noqa: E402
from gyre_ma.options.graph import TaskGraph  # noqa: E402
from gyre_ma.options.library import OptionLibrary  # noqa: E402
from gyre_ma.options.option import Option  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
LLM_QUICKSTART = ROOT / "configs" / "llm_quickstart.yaml"
SMALL = {"train.iterations": 2, "train.episodes_per_iteration": 8, "train.max_steps": 80, "roles.evaluators": 2,
         "manager.llm.build.width": 32, "monitor.spot_checks": 0}


def _library(names: list[str]) -> OptionLibrary:
    graph = TaskGraph.from_spec({"milestones": {"a": {}, "b": {"requires": ["a"]}}, "goals": ["b"]})
    library = OptionLibrary("words", graph)
    for name in names:
        library.add(Option(name, lambda ctx: 0, None, done=lambda ctx: True, description=f"do {name}"))
    return library


def _decision(mask, *, agent="agent_0", achieved=("a",), last=-1, others=()):
    return Decision(agent=agent, agent_index=0, observation=None, mask=np.asarray(mask, dtype=bool),
                    achieved=frozenset(achieved), last_option=last, time_fraction=0.25, env=None, others=others)


def _policy(tmp_path, names):
    library = _library(names)
    text = DecisionText(library)
    path = build_tiny_model(tmp_path / "m", text.vocabulary(library, ["agent_0", "agent_1"]), layers=2, width=32)
    return LLMManagerPolicy._load(path, text, 200, str(path)), path


def test_option_names_the_tokenizer_cannot_tell_apart_are_refused(tmp_path):
    """A user's model whose vocabulary lacked the option names: each read as [UNK], every
    option scored alike, and the manager trained for nothing (entropy ln 2 throughout)."""
    library = _library(["left", "right", "wait"])
    text = DecisionText(library)
    path = build_tiny_model(tmp_path / "m", ["take key", "go north", *CUE.split()], layers=1, width=16)
    with pytest.raises(ValueError, match=r"manager.llm: the model's tokenizer \(.*m\) reads options 'left' and "
                                         r"'right' as the same tokens \[\d+\] \(every word of them the unknown "
                                         r"token\), so the manager could never tell them apart"):
        LLMManagerPolicy._load(path, text, 200, str(path))


def test_a_built_manager_model_knows_the_words_build_vocabulary_adds():
    """``render`` writes words the built vocabulary lacked: a user's room descriptions read
    as unknown tokens. ``build.vocabulary`` adds them; without it the model is as before."""
    from gyre_ma.config import LLMManagerConfig

    library = _library(["left", "right", "wait"])
    plain = LLMManagerPolicy.from_config(LLMManagerConfig(build={"layers": 1, "width": 16}), library, ["a0"])
    more = LLMManagerPolicy.from_config(
        LLMManagerConfig(build={"layers": 1, "width": 16, "vocabulary": ["You are in the hall"]}), library, ["a0"])
    unknown = plain.tokenizer.unk_token_id
    assert plain.tokenizer.convert_tokens_to_ids("hall") == unknown
    assert more.tokenizer.convert_tokens_to_ids("hall") != unknown
    assert more.tokenizer.convert_tokens_to_ids("left") != unknown


@pytest.mark.parametrize("single", [True, False], ids=["one pass per prompt", "one row per eligible option"])
def test_an_options_logit_is_the_log_probability_of_its_name_and_ineligible_ones_are_zero(tmp_path, single):
    names = ["left", "right", "wait"]
    policy, path = _policy(tmp_path, names)
    assert policy.single  # a word-level vocabulary: every name one token
    policy.single = single  # the path names of several tokens take (a user's BPE model), on the same model
    decisions = [_decision([1, 0, 1]), _decision([1, 1, 1], last=2, others=(0,), achieved=())]
    texts = [policy.text(d) for d in decisions]
    assert all(t.endswith(CUE) for t in texts)
    assert "right" not in texts[0].split("options :")[1]  # an ineligible option is not even listed
    assert "right" in texts[1].split("options :")[1] and "last : wait" in texts[1] and "others : " in texts[1]
    prompt, lengths = policy.encode(texts)
    with torch.no_grad():
        logits = policy(prompt, lengths, torch.tensor(np.stack([d.mask for d in decisions])))
    engine = TransformersEngine(path)
    for row, (d, text) in enumerate(zip(decisions, texts, strict=True)):
        eligible = np.flatnonzero(d.mask)
        expected = engine.score([text], [[f" {names[k]}" for k in eligible]])[0]
        np.testing.assert_allclose(logits[row, eligible].numpy(), expected, rtol=1e-4, atol=1e-4)
        probs = torch.distributions.Categorical(logits=logits[row]).probs
        assert probs[~torch.from_numpy(d.mask)].eq(0).all() and float(probs.sum()) == pytest.approx(1.0)


@pytest.mark.parametrize("single", [True, False], ids=["one pass per prompt", "one row per eligible option"])
def test_prompts_grouped_by_length_score_and_train_as_one_padded_pass(tmp_path, single):
    """A batch's prompts run in groups of similar length, each cut to its own longest, not
    padded to the batch's longest: the logits and the gradients are those of one padded
    pass, to float round-off, for prompts of many lengths."""
    import copy

    names = ["left", "right", "wait", "look", "take"]
    policy, _ = _policy(tmp_path, names)
    policy.single = single
    rng = np.random.default_rng(0)
    decisions = []
    for _ in range(40):
        mask = rng.random(len(names)) < 0.6
        mask[int(rng.integers(len(names)))] = True
        others = tuple(int(k) for k in rng.choice(len(names), size=int(rng.integers(0, 3))))
        decisions.append(_decision(mask, achieved=("a",) * int(rng.integers(0, 2)), others=others,
                                   last=int(rng.integers(-1, len(names)))))
    prompt, lengths = policy.encode([policy.text(d) for d in decisions])
    assert int(lengths.max()) - int(lengths.min()) >= 10
    mask = torch.tensor(np.stack([d.mask for d in decisions]))
    one_pass = copy.deepcopy(policy)
    one_pass.GROUPS = 1
    out = []
    for p in (policy, one_pass):
        logits = p(prompt, lengths, mask)
        logits[mask].square().sum().backward()
        out.append((logits.detach(), [q.grad for q in p.parameters() if q.grad is not None]))
    (grouped, grads), (padded, padded_grads) = out
    assert torch.equal(grouped[~mask], padded[~mask])
    torch.testing.assert_close(grouped[mask], padded[mask], rtol=1e-5, atol=1e-5)
    assert len(grads) == len(padded_grads) > 0
    for g, h in zip(grads, padded_grads, strict=True):
        torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-5 * float(h.abs().max()))


def test_the_actor_samples_per_episode_and_greedy_takes_the_most_likely_untried(tmp_path):
    policy, _ = _policy(tmp_path, ["left", "right", "wait"])
    featurizer = Featurizer(gym.spaces.Box(0.0, 1.0, (2,)), _library(["left", "right", "wait"]), 2)
    actor = LLMActor(policy, featurizer, critic=Critic(featurizer.dim, 2), slots=2)
    d = [_decision([1, 1, 1], achieved=()) for _ in range(2)]
    d = [Decision(**{**vars(x), "observation": np.zeros(2, np.float32)}) for x in d]
    runs = []
    for _ in range(2):
        actor.begin(0, NoiseSetting(), seed=7)
        actor.begin(1, NoiseSetting("epsilon", 0.5), seed=8)
        runs.append([(c.option, round(c.log_prob, 6)) for _ in range(6) for c in actor.decide([0, 1], d)])
    assert runs[0] == runs[1]  # an episode's choices follow its seed
    actor.begin(0, NoiseSetting(), seed=7, greedy=True)
    with torch.no_grad():
        prompt, lengths = policy.encode([policy.text(d[0])])
        order = policy(prompt, lengths, torch.ones(1, 3, dtype=torch.bool))[0].argsort(descending=True).tolist()
    picks = [actor.decide([0], d[:1])[0].option for _ in range(3)]
    assert picks == order  # the argmax, then the next untried one (milestones unchanged)
    with pytest.raises(ValueError, match="parameter noise is for the MLP manager"):
        actor.begin(1, NoiseSetting("param", 0.1), seed=1)


def test_llm_configs_are_checked_and_name_the_key():
    base = {"manager": {"kind": "llm"}}
    with pytest.raises(ConfigError, match="'llm' needs `llm`"):
        parse_config(base)
    with pytest.raises(ConfigError, match="exactly one of `model`"):
        parse_config({"manager": {"kind": "llm", "llm": {"model": "x", "build": {}}}})
    with pytest.raises(ConfigError, match="roles.explorer_noise.kind"):
        parse_config({"manager": {"kind": "llm", "llm": {"build": {}}}, "roles": {"explorer_noise": {"start": 0.3}}})
    with pytest.raises(ConfigError, match="divisible by `heads`"):
        parse_config({"manager": {"kind": "llm", "llm": {"build": {"width": 30, "heads": 4}}}})
    with pytest.raises(ConfigError, match="`train.self_imitation` is 0.5.*set it to 0"):
        load_config(LLM_QUICKSTART, {"train.self_imitation": 0.5})
    config = load_config(LLM_QUICKSTART, {"manager.llm.build": None, "manager.llm.model": "/no/such/model"})
    with pytest.raises(ValueError, match="manager.llm.model: '/no/such/model' is not a local directory"):
        RolloutKit.from_config(config)


def test_an_llm_managers_roles_explore_by_sampling_unless_the_config_says_otherwise():
    roles = parse_config({"manager": {"kind": "llm", "llm": {"build": {}}}}).roles
    assert (roles.explorer_noise.kind, roles.explorer_noise.start, roles.explorer_noise.end) == ("epsilon", 0.2, 0.02)
    assert roles.executor_noise.kind == "none"
    given = parse_config({"manager": {"kind": "llm", "llm": {"build": {}}},
                          "roles": {"explorers": 3, "executor_noise": {"kind": "temperature", "start": 1.5}},
                          "train": {"episodes_per_iteration": 6}}).roles
    assert given.explorers == 3 and given.explorer_noise.kind == "epsilon"
    assert (given.executor_noise.kind, given.executor_noise.start) == ("temperature", 1.5)
    mlp = parse_config({}).roles  # the MLP manager keeps parameter noise
    assert mlp.explorer_noise.kind == mlp.executor_noise.kind == "param"
    quickstart = ROOT / "configs" / "quickstart.yaml"  # an override (an experiment's variant) makes it an LLM manager
    variant = load_config(quickstart, {"manager.kind": "llm", "manager.llm": {"build": {}}}).roles
    assert (variant.explorer_noise.kind, variant.executor_noise.kind) == ("epsilon", "none")
    assert load_config(quickstart, {"train.iterations": 3}).roles == load_config(quickstart).roles


def test_check_names_a_missing_manager_model(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(LLM_QUICKSTART.read_text().replace("build: {layers: 2, width: 64, heads: 2, context: 512}",
                                                      "model: /no/such/model"))
    out = subprocess.run([sys.executable, "-m", "gyre_ma.cli", "check", str(bad)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2
    assert "manager.llm.model: '/no/such/model' is not a local directory" in out.stderr


def test_the_llm_manager_trains_online_with_a_kl_penalty_to_a_frozen_reference(tmp_path):
    config = load_config(LLM_QUICKSTART, SMALL | {"run_root": str(tmp_path)})
    gyre = Gyre(config, tmp_path / "run")
    reference = gyre.learner.manager_module.module.reference
    start = {k: v.clone() for k, v in gyre.policy.state_dict().items()}
    history = [gyre.iteration(i) for i in range(2)]
    assert all(m["update_skipped"] == 0.0 and m["update_step_size"] > 0 for m in history)
    assert history[0]["ref_kl"] >= 0 and history[1]["ref_kl"] > 0  # the policy moved away from the reference
    for name, value in reference.state_dict().items():  # the reference did not move
        assert torch.equal(value, start[name]), name
    calls = [c for t in gyre.rollout(2)[0] for c in t.calls]
    assert all(c.policy_version == 2 for c in calls)
    # a worker built from the config and given the learner's weights decides as the learner's policy does
    kit = RolloutKit.from_config(config)
    kit.load(policy_weights(gyre.policy, gyre.critic), 2)
    d = calls[0]
    prompt, lengths = gyre.policy.encode([gyre.policy.text(d)])
    mask = torch.from_numpy(d.mask)[None]
    with torch.no_grad():
        assert torch.allclose(kit.policy(prompt, lengths, mask), gyre.policy(prompt, lengths, mask))
    gyre.close()


def test_same_config_and_seed_give_the_same_llm_run():
    config = load_config(LLM_QUICKSTART, SMALL | {"train.iterations": 1})
    runs = []
    for _ in range(2):
        gyre = Gyre(config)
        m = gyre.iteration(0)
        runs.append(({k: v for k, v in m.items() if not k.endswith("seconds")},
                     [p.detach().clone() for p in gyre.policy.parameters()]))
        gyre.close()
    assert json.dumps(runs[0][0], sort_keys=True) == json.dumps(runs[1][0], sort_keys=True)
    assert all(torch.equal(p, q) for p, q in zip(runs[0][1], runs[1][1], strict=True))


@pytest.mark.timeout(600)
def test_ray_workers_get_each_policy_version_of_the_llm_manager_within_the_staleness_bound(tmp_path):
    cmd = [sys.executable, "-m", "gyre_ma.cli", "train", str(LLM_QUICKSTART), "--quiet",
           "--set", f"run_root={tmp_path}",
           "--set", "backend.name=ray", "--set", "backend.workers=2", "--set", "backend.async_rollouts=true",
           "--set", "backend.max_staleness=1", "--set", "backend.startup_timeout_s=500",
           "--set", "backend.ray_init={num_cpus: 2, include_dashboard: false}"]
    for key, value in (SMALL | {"train.iterations": 3}).items():
        cmd += ["--set", f"{key}={value}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = pd.read_csv(tmp_path / "llm_quickstart" / "metrics.csv")
    assert metrics["policy_version"].tolist() == [1, 2, 3]
    assert metrics["staleness/lag"].iloc[1:].eq(1.0).all() and metrics["staleness/dropped"].iloc[1:].eq(0.0).all()
    assert metrics["ref_kl"].iloc[-1] > 0


def test_train_then_eval_an_llm_manager_from_the_cli(tmp_path):
    cmd = [sys.executable, "-m", "gyre_ma.cli", "train", str(LLM_QUICKSTART), "--set", f"run_root={tmp_path}"]
    for key, value in SMALL.items():
        cmd += ["--set", f"{key}={value}"]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    final = tmp_path / "llm_quickstart" / "checkpoints" / "final.pt"
    metrics = tmp_path / "eval.json"
    subprocess.run([sys.executable, "-m", "gyre_ma.cli", "eval", str(final), "--episodes", "4", "--json", str(metrics)],
                   check=True, capture_output=True, text=True, timeout=600)
    assert 0.0 <= json.loads(metrics.read_text())["success_rate"] <= 1.0


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None or not torch.cuda.is_available(),
                    reason="vLLM scores the LLM manager's options only on a CUDA GPU with the vllm extra; "
                           "this machine has neither")
def test_vllm_scores_the_managers_options_as_its_module_does_after_a_weight_push(tmp_path):
    policy, _ = _policy(tmp_path, ["left", "right", "wait"])
    engine = policy.vllm_engine(gpu_memory_utilization=0.2, enforce_eager=True)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p))
    engine.load_weights(policy.model.state_dict())
    d = _decision([1, 0, 1])
    text = policy.text(d)
    prompt, lengths = policy.encode([text])
    with torch.no_grad():
        mine = policy(prompt, lengths, torch.from_numpy(d.mask)[None])[0, [0, 2]].numpy()
    theirs = engine.score([text], [[" left", " wait"]])[0]
    np.testing.assert_allclose(theirs, mine, atol=2e-2)
    assert B.PROMPT in policy.batch_inputs([d])


def test_the_llm_manager_trains_in_bf16_through_the_trainer_config():
    config = load_config(LLM_QUICKSTART, SMALL | {"train.iterations": 1, "trainer.precision": "bf16-true"})
    gyre = Gyre(config)
    m = gyre.iteration(0)
    assert m["update_skipped"] == 0.0 and np.isfinite(m["ref_kl"]) and m["update_step_size"] > 0
    assert next(gyre.learner.manager_module.parameters()).dtype == torch.bfloat16
    gyre.close()
