"""Language models behind options and managers: one engine interface, two backends.

``transformers`` (CPU or GPU) and ``vllm`` (GPU, the ``vllm`` extra) are imported only when
an engine of that kind is made. See :mod:`gyre_ma.llm.engine`.
"""

from gyre_ma.llm.engine import EngineKind, LLMEngine
from gyre_ma.llm.factory import make_engine

__all__ = ["EngineKind", "LLMEngine", "make_engine"]
