"""The LLM engines on a tiny model built from a config, saved to disk and loaded back the
way a user's model is (issue #21, part 1). No hub: everything is made here."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the llm extra (transformers) is not installed")

from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402

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


def test_loaded_models_compute_gelu_fused_and_score_as_the_model_on_disk(engine, model_dir):
    from transformers import AutoModelForCausalLM
    from transformers.activations import NewGELUActivation

    from gyre_ma.llm.hf import FusedTanhGELU, fuse_gelu

    kinds = {type(m) for m in engine.model.modules()}
    assert FusedTanhGELU in kinds and NewGELUActivation not in kinds
    plain = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()
    assert any(type(m) is NewGELUActivation for m in plain.modules())  # what save_pretrained wrote
    ids = torch.tensor([[engine.start] + engine._encode(TEXTS[0] + " go north")])
    with torch.no_grad():
        before = plain(input_ids=ids).logits
        assert fuse_gelu(plain) == 2 and fuse_gelu(plain) == 0  # one per block, once
        after = plain(input_ids=ids).logits
        np.testing.assert_allclose(after.numpy(), before.numpy(), atol=1e-5)
        np.testing.assert_array_equal(after.numpy(), engine.model(input_ids=ids).logits.numpy())


@pytest.mark.parametrize("size", [100, 40000])
def test_fused_gelu_is_the_tanh_gelu_in_inference_and_in_training(size):
    """Both inference paths (torch's fused kernel on a small tensor, the in-place sigmoid
    form on a large one) and the autograd path compute GPT-2's tanh GELU, over the range of
    activations and beyond it, and leave the input as it was."""
    from gyre_ma.llm.hf import FusedTanhGELU

    gelu = FusedTanhGELU()
    assert (size >= gelu.SIGMOID_FROM) == (size == 40000)
    x = torch.cat([torch.linspace(-30, 30, size // 2), torch.randn(size - size // 2) * 3])
    want = torch.nn.functional.gelu(x.double(), approximate="tanh").numpy()
    with torch.inference_mode():
        got = gelu(x)
    np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-6, atol=1e-6)
    leaf = x.clone().requires_grad_(True)
    out = gelu(leaf)
    out.sum().backward()
    np.testing.assert_allclose(out.detach().double().numpy(), want, rtol=1e-6, atol=1e-6)
    assert leaf.grad is not None and torch.isfinite(leaf.grad).all()
    assert torch.equal(x, leaf.detach())


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
    chunks = eng._chunks(*eng.scoring_tokens(prompts, candidates))
    assert max(map(len, chunks)) <= 2 and sorted(np.concatenate(chunks).tolist()) == list(range(5))
    for prompt, cands, got in zip(prompts, candidates, batched):
        np.testing.assert_allclose(got, [eng.score([prompt], [[c]])[0][0] for c in cands], rtol=0, atol=1e-5)
        np.testing.assert_allclose(got, [_reference_score(eng, prompt, c) for c in cands], rtol=0, atol=1e-4)


def _tiny_llama(directory, model_dir):
    """A 2-layer Llama (grouped-query attention, rotary positions, a gated feed-forward block)
    over the tiny GPT-2's tokenizer, saved like any user's model."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_last_layer_runs_on_the_scored_columns_alone(model_dir, tmp_path, family, monkeypatch):
    """In a scoring pass the last decoder layer's ``mlp`` sees only the columns whose logits
    are read (a row's candidates and its prompt's last token), its SDPA attention computes
    only their queries, and every score is still the plain forward pass's; generation and a
    plain forward pass run the layer on every column."""
    from gyre_ma.llm import hf

    path = model_dir if family == "gpt2" else _tiny_llama(tmp_path / "llama", model_dir)
    eng = make_engine("transformers", path)
    assert eng.model.config._attn_implementation == hf.LAST_COLUMNS_ATTENTION  # the model's own was SDPA
    layers = eng.model.transformer.h if family == "gpt2" else eng.model.model.layers
    seen: list[int] = []
    layers[-1].mlp.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[1]))
    layers[0].mlp.register_forward_hook(lambda module, args, out: seen.append(-args[0].shape[1]))
    queries: list[int] = []

    def counted(module, query, *args, **kwargs):
        queries.append(query.shape[2])
        return sdpa_attention_forward(module, query, *args, **kwargs)

    monkeypatch.setattr(hf, "sdpa_attention_forward", counted)
    prompts = [TEXTS[0], "look", ""]
    candidates = [["go north", "go south", "look"], ["take key"], ["open door", "go north"]]
    scores = eng.score(prompts, candidates)
    width = 1 + max(len(eng._encode(p)) for p in prompts)
    span = max(sum(len(eng._encode(" " + c)) for c in cands) for cands in candidates)
    assert seen == [-(width + span), span + 1]  # the first layer in full, the last on the kept columns
    assert queries == [width + span, span + 1]
    assert eng._last.keep is None and eng._last.attention.gyre_keep is None
    for prompt, cands, got in zip(prompts, candidates, scores):
        np.testing.assert_allclose(got, [_reference_score(eng, prompt, c) for c in cands], rtol=0, atol=1e-5)
    seen.clear()
    queries.clear()
    eng.generate(["go"], max_new_tokens=1)
    assert seen == [-2, 2] and queries == [2, 2] and eng._last.keep is None  # every query, in both layers
    assert set(eng.model.state_dict()) == set(type(eng.model).from_pretrained(path).state_dict())


def test_a_call_of_prompts_of_many_lengths_runs_in_length_groups_with_the_same_scores(model_dir, engine):
    """Requests whose prompts differ enough in length run in groups of similar length (one
    forward pass each, less padding), and score as they do in one pass; prompts of one length
    stay in one pass, as does a call too small to split."""
    rng = np.random.default_rng(0)
    words = " ".join(TEXTS).split()
    ragged = [" ".join(rng.choice(words, size=int(rng.integers(1, 40)))) for _ in range(32)]
    even = [" ".join(rng.choice(words, size=12)) for _ in range(32)]
    candidates = [["go north", "look", " take key"]] * 32
    one_pass = make_engine("transformers", model_dir)
    one_pass.GROUPS = 1
    chunks = engine._chunks(*engine.scoring_tokens(ragged, candidates))
    assert len(chunks) > 1 and sorted(np.concatenate(chunks).tolist()) == list(range(32))
    for got, want in zip(engine.score(ragged, candidates), one_pass.score(ragged, candidates), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert len(engine._chunks(*engine.scoring_tokens(even, candidates))) == 1
    assert len(engine._chunks(*engine.scoring_tokens(ragged[:8], candidates[:8]))) == 1
    assert engine.score([], []) == []


def test_length_groups_sort_rows_into_groups_of_similar_length_and_keep_small_batches_whole():
    """The one grouping rule of the engine and the LLM manager: rows sorted by length (ties in
    order) and split into at most ``groups`` groups of ``min_rows`` rows or more; a batch
    too small for two groups stays one group, in order."""
    from gyre_ma.llm.engine import length_groups

    lengths = np.array([5, 1, 9, 3, 3, 7, 2, 8, 6, 4])
    groups = length_groups(lengths, groups=4, min_rows=3)
    assert [g.tolist() for g in groups] == [[1, 6, 3, 4], [9, 0, 8], [5, 7, 2]]
    assert all(lengths[a].max() <= lengths[b].min() for a, b in zip(groups, groups[1:]))
    assert [g.tolist() for g in length_groups(lengths, groups=4, min_rows=2)] == [[1, 6, 3], [4, 9, 0], [8, 5], [7, 2]]
    assert [g.tolist() for g in length_groups(lengths, groups=4, min_rows=6)] == [list(range(10))]
    assert [g.tolist() for g in length_groups(lengths, groups=1, min_rows=1)] == [list(range(10))]
    # a pass of at most 4 rows: never fewer than 3 groups, however few rows a group may hold
    assert [g.tolist() for g in length_groups(lengths, groups=4, min_rows=6, at_least=3)] == \
        [[1, 6, 3, 4], [9, 0, 8], [5, 7, 2]]
    assert [g.tolist() for g in length_groups(np.array([], dtype=np.int64))] == [[]]


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
    assert engine.generate(prompts, max_new_tokens=8, stop=["zzz"]) == batched  # a stop never written cuts nothing
    stop = max(batched, key=len)[-2:]  # written by one row at least: that row is cut before its first occurrence
    cut = engine.generate(prompts, max_new_tokens=8, stop=[stop])
    assert cut != batched
    for full, short in zip(batched, cut):
        assert short == (full[:full.index(stop)] if stop in full else full)
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
    vllm_engine = make_engine("vllm", model_dir, gpu_memory_utilization=0.2, enforce_eager=True)
    prompts, candidates = [TEXTS[0]], [["go north", "look"]]
    np.testing.assert_allclose(vllm_engine.score(prompts, candidates)[0], engine.score(prompts, candidates)[0],
                               atol=1e-2)
    assert vllm_engine.generate(["go"], max_new_tokens=4) == engine.generate(["go"], max_new_tokens=4)


def _byte_level_bpe(extra: tuple[str, ...] = ()):
    """A GPT-2-style byte-level BPE tokenizer trained here on a few sentences (merges that
    join word pieces, spaces attached to the word after them), and on ``extra``."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    core = ByteLevelBPETokenizer()
    core.train_from_iterator([" ".join(TEXTS)] * 20 + ["gogo northward doors opened looking"] * 5 + list(extra),
                             vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"])
    return PreTrainedTokenizerFast(tokenizer_object=core._tokenizer, eos_token="<|endoftext|>")


@pytest.mark.parametrize("kind", ["word_level", "byte_level_bpe"])
def test_the_stop_check_decodes_a_window_and_stops_where_the_whole_text_would(model_dir, kind):
    """Generation's stop check decodes each row's last few new tokens, not its whole new
    text. Token by token, over random sequences, it must fire first at the same step as a
    check of the whole text, for stop strings taken from the text (so they do occur), with a
    byte-level BPE whose tokens split multi-byte characters and with special tokens, which
    decode to nothing, mixed in."""
    from transformers import AutoTokenizer

    from gyre_ma.llm.hf import _StopAt

    tokenizer = (AutoTokenizer.from_pretrained(model_dir) if kind == "word_level"
                 else _byte_level_bpe(extra=("café → déjà vu 日本語 ✓✓ naïve",) * 5))
    rng = np.random.default_rng(0)
    width, fired = 3, 0
    for _ in range(60):
        tokens = rng.integers(0, len(tokenizer), size=width + 40)
        text = tokenizer.decode(tokens[width:], skip_special_tokens=True)
        if len(text) < 8:
            continue
        at = int(rng.integers(0, len(text) - 6))
        stop = [text[at:at + int(rng.integers(1, 7))]]
        windowed = _StopAt(tokenizer, stop, width)
        checks = {"window": lambda end: bool(windowed(torch.tensor(tokens[None, :end]), None)[0]),
                  "whole": lambda end: any(s in tokenizer.decode(tokens[width:end], skip_special_tokens=True)
                                           for s in stop)}
        first = {name: next((end for end in range(width + 1, len(tokens) + 1) if check(end)), None)
                 for name, check in checks.items()}
        assert first["window"] == first["whole"], (stop, tokens.tolist())
        fired += first["whole"] is not None
    assert fired > 40


@pytest.mark.parametrize("kind", ["word_level", "byte_level_bpe"])
@pytest.mark.parametrize("context", [0, 2])
def test_cached_scoring_tokens_equal_the_full_encoding(model_dir, kind, context):
    """``ScoringTokenizer`` (candidate tokens cached by how the prompt ends) gives exactly the
    tokens of ``scoring_tokens`` (every prompt + candidate encoded in full), call after call
    as the cache fills, for candidates with and without a leading space (some merge with the
    prompt's last word). With no context tokens the ending is only the prompt's trailing
    text, which cannot tell "go" + "north" (one word) from "north" alone: such keys must be
    found to disagree and tokenized in full rather than cached wrong."""
    from transformers import AutoTokenizer

    from gyre_ma.llm.engine import ScoringTokenizer, scoring_tokens

    tokenizer = AutoTokenizer.from_pretrained(model_dir) if kind == "word_level" else _byte_level_bpe()
    cached = type("Short", (ScoringTokenizer,), {"CONTEXT": context})(tokenizer, 0)
    rng = np.random.default_rng(0)
    words = " ".join(TEXTS).split() + ["gogo", "northward"]
    for _ in range(30):
        prompts = [" ".join(rng.choice(words, size=rng.integers(0, 8))) + str(rng.choice(["", " ", " :"]))
                   for _ in range(4)]
        candidates = [[str(rng.choice(["", " "])) + " ".join(rng.choice(words, size=rng.integers(1, 3)))
                       for _ in range(3)] for _ in prompts]
        assert cached(prompts, candidates) == scoring_tokens(tokenizer, 0, prompts, candidates)
    stored = [v for v in cached.cache.values() if v is not None]
    assert len(stored) > 20  # the cache served most keys
    if context == 0:
        assert None in cached.cache.values()  # and refused some
