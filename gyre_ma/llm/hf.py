"""The ``transformers`` engine: batched scoring and generation on CPU or GPU.

Every request starts with the tokenizer's BOS token (its EOS where it has none), in
scoring and in generation alike, so a prompt may be empty and both operations condition
on the same text. Scoring runs the prompts of a call once, left-padded in one forward
pass, and then every candidate of every prompt in a second pass on its prompt's KV cache;
generation left-pads the prompts and runs ``generate`` with its KV cache, stopping a row
at its first stop string.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteria, StoppingCriteriaList
from transformers.utils.logging import disable_progress_bar

from gyre_ma.llm.engine import check_model_dir, check_requests, per_prompt, scoring_tokens, start_token


class TransformersEngine:
    """A causal LM from a local directory (``save_pretrained`` of a model and its tokenizer)."""

    def __init__(self, model: str | Path, *, device: str = "cpu", dtype: str = "float32",
                 max_batch: int = 64) -> None:
        path = check_model_dir(model)
        if not hasattr(torch, dtype) or not isinstance(getattr(torch, dtype), torch.dtype):
            raise ValueError(f"dtype must name a torch dtype (float32, bfloat16, float16), got {dtype!r}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.path, self.device, self.max_batch = path, torch.device(device), max_batch
        disable_progress_bar()  # a rollout worker loading its model prints nothing
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=getattr(torch, dtype))
        self.model.to(self.device).eval()
        self._cache_arg = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        """The forward pass's KV-cache argument (``past_key_values`` before transformers 5.x renamed it)."""
        tok = self.tokenizer
        self.start = start_token(tok, path)
        self.pad = int(tok.pad_token_id if tok.pad_token_id is not None else self.start)
        self.never = sorted({t for t in (tok.pad_token_id, tok.bos_token_id, tok.unk_token_id)
                             if t is not None and t != tok.eos_token_id})
        """Tokens generation never emits: padding, a second BOS, the unknown word."""

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # ------------------------------------------------------------------ scoring
    @torch.inference_mode()
    def score(self, prompts: Sequence[str], candidates: Sequence[Sequence[str]]) -> list[np.ndarray]:
        check_requests(prompts, candidates)
        heads, tails = scoring_tokens(self.tokenizer, self.start, prompts, candidates)
        out: list[np.ndarray] = []
        for at in range(0, len(heads), self.max_batch):
            out += self._score_chunk(heads[at:at + self.max_batch], tails[at:at + self.max_batch])
        return out

    def _score_chunk(self, heads: list[list[int]], tails: list[list[list[int]]]) -> list[np.ndarray]:
        """Each prompt runs once (left-padded, its KV cache kept); its candidates then run
        on copies of its cache (right-padded): the prompt is not recomputed per candidate."""
        dev = self.device
        width = max(map(len, heads))
        ids = torch.tensor([[self.pad] * (width - len(h)) + h for h in heads], device=dev)
        mask = torch.tensor([[0] * (width - len(h)) + [1] * len(h) for h in heads], device=dev)
        first = self.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                           use_cache=True)
        owner = torch.tensor([i for i, ts in enumerate(tails) for _ in ts], device=dev)
        flat = [t for ts in tails for t in ts]
        span = max(map(len, flat))
        cand = torch.tensor([t + [self.pad] * (span - len(t)) for t in flat], device=dev)
        cand_mask = torch.tensor([[1] * len(t) + [0] * (span - len(t)) for t in flat], device=dev)
        logp_first = torch.log_softmax(first.logits[:, -1].float(), dim=-1)[owner].gather(-1, cand[:, :1]).squeeze(-1)
        total = logp_first
        if span > 1:
            cache = getattr(first, "cache", None) or first.past_key_values
            cache.reorder_cache(owner)  # one copy of its prompt's cache per candidate
            lengths = torch.tensor([len(h) for h in heads], device=dev)[owner]
            rest = self.model(input_ids=cand[:, :-1], attention_mask=torch.cat([mask[owner], cand_mask[:, :-1]], -1),
                              position_ids=lengths[:, None] + torch.arange(span - 1, device=dev),
                              **{self._cache_arg: cache})
            logp = torch.log_softmax(rest.logits.float(), dim=-1).gather(-1, cand[:, 1:, None]).squeeze(-1)
            total = total + (logp * cand_mask[:, 1:]).sum(-1)
        return per_prompt(total.double().cpu().numpy(), [len(ts) for ts in tails])

    # ------------------------------------------------------------------ generation
    @torch.inference_mode()
    def generate(self, prompts: Sequence[str], *, max_new_tokens: int, stop: Sequence[str] = (),
                 temperature: float = 0.0, seed: int = 0) -> list[str]:
        check_requests(prompts)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {temperature!r}")
        stop = [s for s in stop if s]
        out: list[str] = []
        for at in range(0, len(prompts), self.max_batch):
            batch = [[self.start] + self._encode(p) for p in prompts[at:at + self.max_batch]]
            width = max(map(len, batch))
            ids = torch.tensor([[self.pad] * (width - len(b)) + b for b in batch], device=self.device)
            mask = torch.tensor([[0] * (width - len(b)) + [1] * len(b) for b in batch], device=self.device)
            sampling: dict[str, Any] = (dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
                                        if temperature > 0 else dict(do_sample=False))
            with torch.random.fork_rng(devices=[] if self.device.type == "cpu" else [self.device]):
                torch.manual_seed(seed + at)
                tokens = self.model.generate(
                    input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, pad_token_id=self.pad,
                    eos_token_id=self.tokenizer.eos_token_id, use_cache=True, suppress_tokens=self.never or None,
                    stopping_criteria=StoppingCriteriaList([_StopAt(self.tokenizer, stop, width)]) if stop else None,
                    **sampling)
            texts = self.tokenizer.batch_decode(tokens[:, width:], skip_special_tokens=True)
            out += [_cut(t, stop) for t in texts]
        return out


def _cut(text: str, stop: Sequence[str]) -> str:
    ends = [i for s in stop if (i := text.find(s)) >= 0]
    return text[:min(ends)] if ends else text


class _StopAt(StoppingCriteria):
    """A ``generate`` stopping criterion: a row is done once its new text holds a stop string."""

    def __init__(self, tokenizer: Any, stop: Sequence[str], prompt_width: int) -> None:
        self.tokenizer, self.stop, self.width = tokenizer, list(stop), prompt_width

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(input_ids[:, self.width:], skip_special_tokens=True)
        return torch.tensor([any(s in t for s in self.stop) for t in texts], device=input_ids.device)
