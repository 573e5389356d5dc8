"""The LLM engines on a tiny model built from a config, saved to disk and loaded back the
way a user's model is (issue #21, part 1). No hub: everything is made here."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the llm extra (transformers) is not installed")

from gyre_ma.llm import make_engine  # noqa: E402
from gyre_ma.llm.tiny import build_tiny_model, words_of  # noqa: E402

TEXTS = ["you are in a dark room . a door is north .", "go north", "go south", "look", "take key", "open door"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), words_of(TEXTS), layers=2, width=32, heads=2)


@pytest.fixture(scope="module")
def engine(model_dir):
    return make_engine("transformers", model_dir)


def _reference_score(engine, prompt: str, candidate: str) -> float:
    """The candidate's summed log-probability from one plain forward pass of prompt + candidate."""
    head = [engine.start] + engine._encode(prompt)
    ids = head + engine._encode(candidate)
    with torch.no_grad():
        logits = engine.model(input_ids=torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    return float(sum(logp[j - 1, ids[j]] for j in range(len(head), len(ids))))


def test_batched_scores_equal_one_at_a_time_and_a_plain_forward_pass(engine):
    prompts = [TEXTS[0], "", "you are in a room"]
    candidates = [["go north", "go south", "look"], ["take key"], ["open door", "go north"]]
    batched = engine.score(prompts, candidates)
    assert [len(b) for b in batched] == [3, 1, 2] and all(b.dtype == np.float64 for b in batched)
    for prompt, cands, got in zip(prompts, candidates, batched):
        alone = np.concatenate([engine.score([prompt], [[c]])[0] for c in cands])
        np.testing.assert_allclose(got, alone, atol=1e-4)
        np.testing.assert_allclose(got, [_reference_score(engine, prompt, c) for c in cands], atol=1e-4)
        assert (got < 0).all()
    two_tokens = engine.score([TEXTS[0]], [["go north"]])[0][0]
    one_token = engine.score([TEXTS[0]], [["go"]])[0][0]
    assert two_tokens < one_token  # a longer continuation has more probability to pay


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_scores_equal_one_at_a_time_for_ragged_prompts_and_candidates(model_dir, attention):
    """Prompts of 1 to 13 tokens, candidates of 1 to 7 tokens and 1 to 4 per prompt, in chunks
    of 2 prompts: every score equals the candidate scored alone and a plain forward pass. After
    "a door is north . go" the candidate "north" merges into one unknown word, so it is encoded
    apart (the fallback of ``scoring_tokens``)."""
    eng = make_engine("transformers", model_dir, max_batch=2)
    eng.model.set_attn_implementation(attention)
    prompts = ["", "look", TEXTS[0], "a door is north . go", "take key"]
    candidates = [["go north . open door", "look"], ["look", " take key", " go north .", "go"],
                  ["open door", "go", " you are in a dark room ."], ["north"], ["open door", " go"]]
    batched = eng.score(prompts, candidates)
    assert [len(b) for b in batched] == [len(c) for c in candidates]
    for prompt, cands, got in zip(prompts, candidates, batched):
        np.testing.assert_allclose(got, [eng.score([prompt], [[c]])[0][0] for c in cands], rtol=0, atol=1e-5)
        np.testing.assert_allclose(got, [_reference_score(eng, prompt, c) for c in cands], rtol=0, atol=1e-4)


def test_scores_follow_what_the_model_learned(model_dir, tmp_path):
    """A few gradient steps on "... north . go north" make that the best-scored action."""
    eng = make_engine("transformers", model_dir)
    prompt = "a door is north ."
    ids = torch.tensor([[eng.start] + eng._encode(prompt + " go north")])
    opt = torch.optim.Adam(eng.model.parameters(), lr=1e-2)
    eng.model.train()
    for _ in range(30):
        loss = eng.model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    eng.model.eval()
    scores = eng.score([prompt], [["go north", "go south", "look", "take key"]])[0]
    assert int(np.argmax(scores)) == 0 and scores[0] > np.log(0.5)


def test_greedy_generation_is_deterministic_cut_at_stops_and_the_same_in_any_batch(engine):
    prompts = ["you are in a dark room .", "go", "a door is north . open"]
    batched = engine.generate(prompts, max_new_tokens=8)
    assert batched == engine.generate(prompts, max_new_tokens=8)
    assert batched == [engine.generate([p], max_new_tokens=8)[0] for p in prompts]  # left padding is masked
    cut = engine.generate(prompts, max_new_tokens=8, stop=["door", "north"])
    for full, short in zip(batched, cut):
        assert "door" not in short and "north" not in short
        assert full.startswith(short.rstrip())
    sampled = engine.generate(prompts, max_new_tokens=8, temperature=1.0, seed=5)
    assert sampled == engine.generate(prompts, max_new_tokens=8, temperature=1.0, seed=5)
    assert len(engine.tokenizer(sampled[0], add_special_tokens=False)["input_ids"]) <= 8
    assert all("[PAD]" not in s and "[BOS]" not in s for s in sampled)


def test_bad_requests_and_models_are_named(engine, tmp_path):
    with pytest.raises(ValueError, match="one candidate list per prompt"):
        engine.score(["a", "b"], [["x"]])
    with pytest.raises(ValueError, match=r"candidates\[0\] must be a non-empty list"):
        engine.score(["a"], [[]])
    with pytest.raises(TypeError, match="sequence of strings"):
        engine.generate("go", max_new_tokens=2)
    with pytest.raises(ValueError, match="not a local directory; gyre-ma loads models from disk only"):
        make_engine("transformers", "gpt2")  # a hub name is never fetched
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no config.json"):
        make_engine("transformers", tmp_path / "empty")
    with pytest.raises(ValueError, match="engine kind must be"):
        make_engine("onnx", tmp_path)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None or not torch.cuda.is_available(),
                    reason="vLLM needs the vllm extra and a CUDA GPU; neither is on this machine")
def test_vllm_scores_like_transformers(model_dir, engine):
    vllm_engine = make_engine("vllm", model_dir)
    prompts, candidates = [TEXTS[0]], [["go north", "look"]]
    np.testing.assert_allclose(vllm_engine.score(prompts, candidates)[0], engine.score(prompts, candidates)[0],
                               atol=1e-2)
    assert vllm_engine.generate(["go"], max_new_tokens=4) == engine.generate(["go"], max_new_tokens=4)
