"""Making an engine: the backend is imported only when chosen (vLLM needs a GPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gyre_ma.llm.engine import EngineKind, LLMEngine


def make_engine(kind: EngineKind, model: str | Path, **options: Any) -> LLMEngine:
    """The engine ``kind`` on the local model directory ``model``."""
    if kind == "transformers":
        from gyre_ma.llm.hf import TransformersEngine

        return TransformersEngine(model, **options)
    if kind == "vllm":
        from gyre_ma.llm.vllm_engine import VLLMEngine

        return VLLMEngine(model, **options)
    raise ValueError(f"engine kind must be 'transformers' or 'vllm', got {kind!r}")
