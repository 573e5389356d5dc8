"""Small causal LMs built from a config, saved like any user's model.

Tests, examples and ``configs/llm_quickstart.yaml`` need a model without a hub: a GPT-2
of a few layers over a word-level vocabulary (``tokenizers``), written with
``save_pretrained`` so that it is loaded back through the same code a user's model takes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

SPECIAL = ("[PAD]", "[UNK]", "[BOS]", "[EOS]")


def words_of(texts: Iterable[str]) -> list[str]:
    """The word-level vocabulary of ``texts``, in first-seen order: runs of word characters
    and single punctuation marks (how the tokenizer splits)."""
    seen: dict[str, None] = {}
    for text in texts:
        for w in re.findall(r"\w+|[^\w\s]", text):
            seen.setdefault(w, None)
    return list(seen)


def build_tiny_model(directory: str | Path, vocabulary: Iterable[str], *, layers: int = 2, width: int = 32,
                     heads: int = 2, context: int = 512, seed: int = 0) -> Path:
    """A randomly initialised GPT-2 (``layers`` × ``width``, ``heads`` heads, ``context``
    positions) and a word-level tokenizer over ``vocabulary`` (plus ``[PAD] [UNK] [BOS]
    [EOS]``), saved to ``directory``; returns it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
    from transformers.utils.logging import disable_progress_bar

    disable_progress_bar()

    if layers < 1 or width < 1 or heads < 1 or width % heads:
        raise ValueError(f"need layers, width, heads >= 1 and width divisible by heads, got {layers}, {width}, {heads}")
    vocab = {w: i for i, w in enumerate(SPECIAL)}
    for w in vocabulary:
        for piece in re.findall(r"\w+|[^\w\s]", w):
            vocab.setdefault(piece, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces and glues nothing else
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]",
                                        bos_token="[BOS]", eos_token="[EOS]")
    config = GPT2Config(vocab_size=len(vocab), n_positions=context, n_embd=width, n_layer=layers, n_head=heads,
                        bos_token_id=vocab["[BOS]"], eos_token_id=vocab["[EOS]"], pad_token_id=vocab["[PAD]"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
