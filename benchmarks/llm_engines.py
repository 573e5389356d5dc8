"""LLM engine throughput: batched scoring and generation against one request at a time.

A decision is one prompt (a text observation of ~40 words) scored against its admissible
actions (5 candidates of 1–3 words), the way an ``LLMOption`` or the LLM manager decides.
For each model size and batch size B in 1, 16, 64: decisions/s when the B decisions go to
the engine in one ``score`` call, and when each goes alone (the same B decisions); and
generated tokens/s of greedy ``generate`` for B prompts at once and one at a time. Models
are built from a config (``gyre_ma.llm.tiny``) and loaded back from disk; CPU only here
(``--device cuda`` where a GPU is). Prints one JSON object.

    python benchmarks/llm_engines.py > benchmarks/results/llm_engines.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from typing import Any

import numpy as np
import torch

from gyre_ma.llm import make_engine
from gyre_ma.llm.tiny import build_tiny_model

WORDS = ("you are in the kitchen . there is a stove , a sink , a fridge and a door to the hallway . the stove is off . "
         "in your inventory : a pot of water , a thermometer . go to hallway open fridge activate stove look around "
         "pour water into pot wait use thermometer on water focus on water pick up pot").split()
ACTIONS = ["activate stove", "open fridge", "go to hallway", "look around", "use thermometer on water"]
SIZES = {"tiny_2x32": dict(layers=2, width=32, heads=2), "small_4x256": dict(layers=4, width=256, heads=4)}


def _prompt(rng: np.random.Generator) -> str:
    return " ".join(rng.choice(WORDS, size=40))


def _rate(fn: Any, count: int, min_seconds: float) -> float:
    """count / seconds per call of ``fn``, repeated for at least ``min_seconds``."""
    fn()  # warm
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        spent = time.perf_counter() - start
        if spent >= min_seconds:
            return count * calls / spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--min-seconds", type=float, default=2.0)
    parser.add_argument("--new-tokens", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    batches = [int(b) for b in args.batches.split(",")]
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {"benchmark": "llm_engines", "device": args.device, "threads": 1,
                           "candidates_per_decision": len(ACTIONS), "prompt_words": 40, "models": {}}
    for name, size in SIZES.items():
        engine = make_engine("transformers", build_tiny_model(tempfile.mkdtemp(), WORDS + ACTIONS, **size),
                             device=args.device)
        params = sum(p.numel() for p in engine.model.parameters())
        rows = []
        for b in batches:
            prompts = [_prompt(rng) for _ in range(b)]
            cands = [ACTIONS] * b
            batched = _rate(lambda: engine.score(prompts, cands), b, args.min_seconds)
            alone = _rate(lambda: [engine.score([p], [ACTIONS]) for p in prompts], b, args.min_seconds)
            made = engine.generate(prompts, max_new_tokens=args.new_tokens)  # tokens actually generated (EOS ends some)
            tokens = sum(len(engine._encode(t)) for t in made)
            gen_batched = _rate(lambda: engine.generate(prompts, max_new_tokens=args.new_tokens), tokens,
                                args.min_seconds)
            gen_alone = _rate(lambda: [engine.generate([p], max_new_tokens=args.new_tokens) for p in prompts],
                              tokens, args.min_seconds)
            rows.append({"batch": b, "score_decisions_per_s_batched": round(batched, 1),
                         "score_decisions_per_s_one_at_a_time": round(alone, 1),
                         "score_speedup": round(batched / alone, 2),
                         "generate_tokens_per_s_batched": round(gen_batched, 1),
                         "generate_tokens_per_s_one_at_a_time": round(gen_alone, 1),
                         "generate_speedup": round(gen_batched / gen_alone, 2)})
        out["models"][name] = {"parameters": params, **size, "rows": rows}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
