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
    a text. Every engine scores these same tokens."""
    def encode(texts: list[str]) -> list[list[int]]:
        return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []

    bodies = encode(list(prompts))
    owner = [i for i, cands in enumerate(candidates) for _ in cands]
    flat = [c for cands in candidates for c in cands]
    tails: list[list[int]] = []
    for i, whole in zip(owner, encode([prompts[i] + c for i, c in zip(owner, flat)])):
        n = len(bodies[i])
        tails.append(whole[n:] if len(whole) > n and whole[:n] == bodies[i] else [])
    merged = [k for k, tail in enumerate(tails) if not tail]
    for k, ids in zip(merged, encode([flat[k] for k in merged])):
        if not ids:
            raise ValueError(f"candidate {flat[k]!r} encodes to no tokens")
        tails[k] = ids
    grouped: list[list[list[int]]] = [[] for _ in prompts]
    for i, tail in zip(owner, tails):
        grouped[i].append(tail)
    return [[start] + body for body in bodies], grouped


def per_prompt(values: np.ndarray, counts: Sequence[int]) -> list[np.ndarray]:
    """Flat per-candidate ``values`` → one array per prompt of ``counts[i]`` candidates."""
    out, at = [], 0
    for n in counts:
        out.append(np.asarray(values[at:at + n], dtype=np.float64).copy())
        at += n
    return out

