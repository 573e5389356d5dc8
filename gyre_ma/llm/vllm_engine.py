"""The ``vllm`` engine (GPU; ``pip install gyre-ma[vllm]``), imported only when chosen.

Requests are token ids made by the model directory's own tokenizer with
:class:`~gyre_ma.llm.engine.ScoringTokenizer`, as :class:`~gyre_ma.llm.hf.TransformersEngine`
makes them (BOS first, the candidate's tokens as they fall after the prompt), so both
engines score the same tokens. Scoring asks vLLM
for the prompt's log-probabilities (``prompt_logprobs``, which always include the actual
token) over prompt + candidate and sums the candidate's; generation passes the stop
strings to vLLM's sampler.

Not exercised on this project's CI machines (no GPU); its test compares it with the
transformers engine where a GPU and vLLM are present.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gyre_ma.llm.engine import ScoringTokenizer, check_model_dir, check_requests, per_prompt, start_token


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
        self.start = start_token(self.tokenizer, path)
        self.scoring_tokens = ScoringTokenizer(self.tokenizer, self.start)
        llm_options.setdefault("worker_extension_cls", f"{__name__}.WeightLoader")
        self.llm = vllm.LLM(model=str(path), tokenizer=str(path), dtype=dtype,
                            gpu_memory_utilization=gpu_memory_utilization, **llm_options)

    def load_weights(self, weights: Mapping[str, Any]) -> None:
        """Replace the served model's weights in place (Hugging Face parameter names, as a
        ``state_dict`` of the same architecture has them): vLLM's worker-extension and
        ``collective_rpc`` route for online RL, then its prefix cache is dropped (it holds
        keys and values of the old weights)."""
        items = [(name, tensor.detach().cpu()) for name, tensor in weights.items()]
        self.llm.collective_rpc("gyre_load_weights", args=(items,))
        self.llm.reset_prefix_cache()

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def score(self, prompts: Sequence[str], candidates: Sequence[Sequence[str]]) -> list[np.ndarray]:
        check_requests(prompts, candidates)
        heads, tails = self.scoring_tokens(prompts, candidates)
        requests = [{"prompt_token_ids": head + tail} for head, ts in zip(heads, tails) for tail in ts]
        starts = [len(head) for head, ts in zip(heads, tails) for _ in ts]
        params = self.vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        results = self.llm.generate(requests, params, use_tqdm=False)
        totals = np.array([sum(result.prompt_logprobs[j][req["prompt_token_ids"][j]].logprob
                               for j in range(start, len(req["prompt_token_ids"])))
                           for req, start, result in zip(requests, starts, results, strict=True)])
        return per_prompt(totals, [len(ts) for ts in tails])

    def generate(self, prompts: Sequence[str], *, max_new_tokens: int, stop: Sequence[str] = (),
                 temperature: float = 0.0, seed: int = 0) -> list[str]:
        check_requests(prompts)
        params = self.vllm.SamplingParams(max_tokens=max_new_tokens, temperature=temperature, seed=seed,
                                          stop=[s for s in stop if s] or None, skip_special_tokens=True)
        requests = [{"prompt_token_ids": [self.start] + self._encode(p)} for p in prompts]
        return [r.outputs[0].text for r in self.llm.generate(requests, params, use_tqdm=False)]


class WeightLoader:
    """Mixed into each vLLM worker (``worker_extension_cls``): loads weights sent by
    :meth:`VLLMEngine.load_weights` into the worker's model."""

    def gyre_load_weights(self, weights: list[tuple[str, Any]]) -> None:
        device = next(self.model_runner.model.parameters()).device  # type: ignore[attr-defined]
        self.model_runner.model.load_weights(  # type: ignore[attr-defined]
            weights=[(name, tensor.to(device)) for name, tensor in weights])
