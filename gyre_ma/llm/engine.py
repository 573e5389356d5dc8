"""One interface to a causal language model: batched scoring and batched generation.

LLM-backed options and managers ask a model two things, always for many agents and
episodes at once (the batched rollout engine gathers them):

- :meth:`LLMEngine.score` — the summed log-probability of each candidate continuation
  given its prompt (an option acting by choosing among admissible actions, a manager
  choosing among eligible options: constrained, so an invalid choice has probability 0);
- :meth:`LLMEngine.generate` — a continuation of each prompt, cut at the first stop
  string (an option that writes a tool call to be parsed and validated).

Two implementations: :class:`~gyre_ma.llm.hf.TransformersEngine` (CPU or GPU) and
:class:`~gyre_ma.llm.vllm_engine.VLLMEngine` (GPU; the ``vllm`` extra, imported only when
chosen). Models are read from a local directory only, never from a hub.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

EngineKind = Literal["transformers", "vllm"]


class LLMEngine(Protocol):
    def score(self, prompts: Sequence[str], candidates: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """For each prompt, the summed log-probability of each of its candidates given it:
        ``candidates[i]`` (non-empty strings) → float64 array of ``len(candidates[i])``."""
        ...

    def generate(self, prompts: Sequence[str], *, max_new_tokens: int, stop: Sequence[str] = (),
                 temperature: float = 0.0, seed: int = 0) -> list[str]:
        """A continuation of each prompt (greedy at temperature 0), cut before the first of
        ``stop``; at most ``max_new_tokens`` tokens."""
        ...


def check_model_dir(path: str | Path, key: str = "model") -> Path:
    """A model must be a local directory holding a config (never a hub name); errors name ``key``."""
    p = Path(path)
    if not p.is_dir():
        raise ValueError(f"{key}: {str(path)!r} is not a local directory; gyre-ma loads models from disk only "
                         "(save one with save_pretrained, or build one with gyre_ma.llm.tiny.build_tiny_model)")
    if not (p / "config.json").is_file():
        raise ValueError(f"{key}: model directory {str(p)!r} has no config.json; expected a directory written by "
                         "save_pretrained (model and tokenizer)")
    return p


def check_requests(prompts: Sequence[str], candidates: Sequence[Sequence[str]] | None = None) -> None:
    if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
        raise TypeError("prompts must be a sequence of strings")
    if candidates is None:
        return
    if len(candidates) != len(prompts):
        raise ValueError(f"need one candidate list per prompt, got {len(candidates)} lists for {len(prompts)} prompts")
    for i, cands in enumerate(candidates):
        if isinstance(cands, str) or not cands or not all(isinstance(c, str) and c for c in cands):
            raise ValueError(f"candidates[{i}] must be a non-empty list of non-empty strings, got {cands!r}")


def start_token(tokenizer: Any, path: Path) -> int:
    """The token every request starts with: the tokenizer's BOS, or its EOS where it has none."""
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if start is None:
        raise ValueError(f"the tokenizer in {str(path)!r} has neither a BOS nor an EOS token to start requests with")
    return int(start)


def scoring_tokens(tokenizer: Any, start: int, prompts: Sequence[str],
                   candidates: Sequence[Sequence[str]]) -> tuple[list[list[int]], list[list[list[int]]]]:
    """Each prompt's tokens (``start`` first) and, per prompt, each candidate's tokens as they
    fall after the prompt; where the boundary merged into one token, the candidate encoded
    apart. At most three batched tokenizer calls (prompts, prompt + candidate texts, the
    merged candidates apart): a fast tokenizer loops in Rust, and a call costs far more than
    a text. Every engine scores these same tokens; :class:`ScoringTokenizer` gives them
    faster where prompts end alike."""
    bodies = _encode(tokenizer, list(prompts))
    grouped, _ = _candidate_tokens(tokenizer, bodies, prompts, candidates)
    return [[start] + body for body in bodies], grouped


def _encode(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []


def _after(head: Sequence[int], whole: Sequence[int]) -> list[int] | None:
    """The tokens of ``whole`` after ``head``; None where ``head`` is not its prefix (the boundary merged)."""
    n = len(head)
    return list(whole[n:]) if len(whole) > n and list(whole[:n]) == list(head) else None


def _candidate_tokens(tokenizer: Any, bodies: Sequence[Sequence[int]], prompts: Sequence[str],
                      candidates: Sequence[Sequence[str]]) -> tuple[list[list[list[int]]], list[list[bool]]]:
    """Per prompt and candidate: its tokens after the prompt (or encoded apart where the
    boundary merged), and whether it was encoded apart."""
    owner = [i for i, cands in enumerate(candidates) for _ in cands]
    flat = [c for cands in candidates for c in cands]
    tails = [_after(bodies[i], whole) for i, whole in zip(owner, _encode(tokenizer, [prompts[i] + c for i, c in
                                                                                     zip(owner, flat)]))]
    merged = [k for k, tail in enumerate(tails) if tail is None]
    for k, ids in zip(merged, _encode(tokenizer, [flat[k] for k in merged])):
        if not ids:
            raise ValueError(f"candidate {flat[k]!r} encodes to no tokens")
        tails[k] = ids
    grouped: list[list[list[int]]] = [[] for _ in prompts]
    apart: list[list[bool]] = [[] for _ in prompts]
    encoded_apart = set(merged)
    for k, (i, tail) in enumerate(zip(owner, tails)):
        grouped[i].append(tail)  # type: ignore[arg-type]
        apart[i].append(k in encoded_apart)
    return grouped, apart


class ScoringTokenizer:
    """:func:`scoring_tokens` with a cache of candidate tokens keyed by how the prompt ends.

    Prompts of one kind end alike (a template's "choose :" or "> "), and the candidates are
    the same few names or actions, yet encoding every prompt + candidate text costs most of
    a batched scoring call on a small model. The tokens a candidate gets after a prompt
    depend only on the prompt's last tokens (for the word-level, BPE and unigram tokenizers
    of causal LMs, whose merges do not reach back over earlier words), so they are cached
    under (the text of the prompt's last :attr:`CONTEXT` tokens, the candidate). A new key is
    tokenized both ways, in full and from that ending alone, and cached only where the two
    agree; a key where they differ is always tokenized in full. Slow (Python) tokenizers,
    which give no offsets, are always tokenized in full."""

    CONTEXT = 2
    """How many of the prompt's last tokens make the key."""

    def __init__(self, tokenizer: Any, start: int, *, cache_size: int = 65536) -> None:
        self.tokenizer, self.start, self.cache_size = tokenizer, start, cache_size
        self.cache: dict[tuple[str, str], list[int] | None] = {}
        """(prompt ending, candidate) → the candidate's tokens; None: tokenize in full."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._backend = backend if backend is not None and backend.truncation is None and backend.padding is None \
            else None
        """The Rust tokenizer, called directly (it gives offsets and skips the wrapper's
        per-text work); None for a slow tokenizer or one set to truncate or pad."""

    def __call__(self, prompts: Sequence[str],
                 candidates: Sequence[Sequence[str]]) -> tuple[list[list[int]], list[list[list[int]]]]:
        if self._backend is None or self.cache_size < 1:
            return scoring_tokens(self.tokenizer, self.start, prompts, candidates)
        encodings = self._backend.encode_batch(list(prompts), add_special_tokens=False) if prompts else []
        bodies = [e.ids for e in encodings]
        endings = [self._ending(p, e) for p, e in zip(prompts, encodings)]
        grouped: list[list[list[int] | None]] = [[self.cache.get((end, c)) for c in cands]
                                                 for end, cands in zip(endings, candidates)]
        missing = [(i, j) for i, row in enumerate(grouped) for j, tail in enumerate(row) if tail is None]
        if missing:
            rows = sorted({i for i, _ in missing})
            full, apart = _candidate_tokens(self.tokenizer, [bodies[i] for i in rows], [prompts[i] for i in rows],
                                            [candidates[i] for i in rows])
            at = {i: r for r, i in enumerate(rows)}
            self._learn(missing, bodies, endings, candidates, full, apart, at)
            for i, j in missing:
                grouped[i][j] = full[at[i]][j]
        return [[self.start] + body for body in bodies], grouped  # type: ignore[return-value]

    def _ending(self, prompt: str, encoding: Any) -> str:
        """The prompt's text from the end of the token before its last :attr:`CONTEXT` (the
        whole prompt where it has no more): the whitespace before those tokens belongs to the
        ending, as it belongs to the token after it in byte-level BPE. That one token's offsets
        are asked for alone: the whole list costs a Python tuple per token, a quarter of
        tokenizing the prompt."""
        n = len(encoding)
        return prompt if n <= self.CONTEXT else prompt[encoding.token_to_chars(n - self.CONTEXT - 1)[1]:]

    def _learn(self, missing: list[tuple[int, int]], bodies: list[list[int]], endings: list[str],
               candidates: Sequence[Sequence[str]], full: list[list[list[int]]], apart: list[list[bool]],
               at: dict[int, int]) -> None:
        """Cache the keys of ``missing`` whose tokens from the prompt's ending alone equal the
        full ones: the same tail after the ending, or a merged boundary both ways (the
        candidate then encoded apart)."""
        new = {(endings[i], candidates[i][j]): (i, j) for i, j in missing
               if (endings[i], candidates[i][j]) not in self.cache}
        if not new:
            return
        if len(self.cache) + len(new) > self.cache_size:
            self.cache.clear()
        keys = list(new)
        wholes = self._backend.encode_batch([end + c for end, c in keys], add_special_tokens=False)
        for (end, c), whole in zip(keys, wholes):
            i, j = new[(end, c)]
            tail, tokens = _after(bodies[i][-self.CONTEXT:], whole.ids), full[at[i]][j]
            agrees = tail is None if apart[at[i]][j] else tail == tokens
            self.cache[(end, c)] = tokens if agrees else None


LENGTH_GROUPS = 4
"""Most groups of similar length a batch of prompts is split into, one forward pass each."""
LENGTH_GROUP_ROWS = 8
"""Fewest prompts a length group holds."""


def length_groups(lengths: np.ndarray, groups: int = LENGTH_GROUPS, min_rows: int = LENGTH_GROUP_ROWS, *,
                  at_least: int = 1) -> list[np.ndarray]:
    """Row indices in groups of similar ``lengths``, shortest first, for one padded forward
    pass each (every row padded to its own group's longest, not the batch's): ``groups``
    groups, fewer where they would hold under ``min_rows`` rows, but never fewer than
    ``at_least`` (a caller whose pass takes at most so many rows); one group of every row
    in order where that leaves fewer than two. The transformers engine's scoring and the
    LLM manager both group their prompts this way."""
    n = len(lengths)
    count = max(min(groups, n // max(min_rows, 1)), at_least)
    if count <= 1:
        return [np.arange(n)]
    return np.array_split(np.argsort(lengths, kind="stable"), count)


def per_prompt(values: np.ndarray, counts: Sequence[int]) -> list[np.ndarray]:
    """Flat per-candidate ``values`` → one array per prompt of ``counts[i]`` candidates."""
    out, at = [], 0
    for n in counts:
        out.append(np.asarray(values[at:at + n], dtype=np.float64).copy())
        at += n
    return out

