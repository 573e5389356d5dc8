"""The ``vllm`` engine (GPU; ``pip install gyre-ma[vllm]``), imported only when chosen.

Requests are token ids made by the model directory's own tokenizer exactly as
:class:`~gyre_ma.llm.hf.TransformersEngine` makes them (BOS first, the candidate's tokens
as they fall after the prompt), so both engines score the same tokens. Scoring asks vLLM
for the prompt's log-probabilities (``prompt_logprobs``, which always include the actual
token) over prompt + candidate and sums the candidate's; generation passes the stop
strings to vLLM's sampler.

Not exercised on this project's CI machines (no GPU); its test compares it with the
transformers engine where a GPU and vLLM are present.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gyre_ma.llm.engine import check_model_dir, check_requests


class VLLMEngine:
    def __init__(self, model: str | Path, *, dtype: str = "auto", gpu_memory_utilization: float = 0.5,
                 **llm_options: Any) -> None:
        try:
            import vllm
        except ImportError as exc:
            raise ValueError("the vllm engine needs vLLM and a CUDA GPU: pip install 'gyre-ma[vllm]', or use "
                             "engine kind 'transformers'") from exc
        from transformers import AutoTokenizer

        path = check_model_dir(model)
        self.vllm = vllm
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        tok = self.tokenizer
        self.start = int(tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id)
        self.llm = vllm.LLM(model=str(path), tokenizer=str(path), dtype=dtype,
                            gpu_memory_utilization=gpu_memory_utilization, **llm_options)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def score(self, prompts: Sequence[str], candidates: Sequence[Sequence[str]]) -> list[np.ndarray]:
        check_requests(prompts, candidates)
        requests, starts = [], []
        for prompt, cands in zip(prompts, candidates):
            head = [self.start] + self._encode(prompt)
            for cand in cands:
                whole = [self.start] + self._encode(prompt + cand)
                tail = whole[len(head):] if whole[:len(head)] == head and len(whole) > len(head) else self._encode(cand)
                requests.append({"prompt_token_ids": head + tail})
                starts.append(len(head))
        params = self.vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        results = self.llm.generate(requests, params, use_tqdm=False)
        totals = np.empty(len(requests))
        for k, (req, result) in enumerate(zip(requests, results)):
            ids = req["prompt_token_ids"]
            totals[k] = sum(result.prompt_logprobs[j][ids[j]].logprob for j in range(starts[k], len(ids)))
        out, at = [], 0
        for cands in candidates:
            out.append(totals[at:at + len(cands)].copy())
            at += len(cands)
        return out

    def generate(self, prompts: Sequence[str], *, max_new_tokens: int, stop: Sequence[str] = (),
                 temperature: float = 0.0, seed: int = 0) -> list[str]:
        check_requests(prompts)
        params = self.vllm.SamplingParams(max_tokens=max_new_tokens, temperature=temperature, seed=seed,
                                          stop=[s for s in stop if s] or None, skip_special_tokens=True)
        requests = [{"prompt_token_ids": [self.start] + self._encode(p)} for p in prompts]
        return [r.outputs[0].text for r in self.llm.generate(requests, params, use_tqdm=False)]
