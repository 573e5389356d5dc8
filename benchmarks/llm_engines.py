"""LLM engine throughput: batched scoring and generation against one request at a time.

A decision is one prompt (a text observation of ~40 words) scored against its admissible
actions (5 candidates of 1–3 words), the way an ``LLMOption`` or the LLM manager decides.
For each model size and batch size B in 1, 16, 64: decisions/s when the B decisions go to
the engine in one ``score`` call, and when each goes alone (the same B decisions); and
generated tokens/s of greedy ``generate`` for B prompts at once and one at a time. Models
are built from a config (``gyre_ma.llm.tiny``) and loaded back from disk. ``--engine
transformers`` (the default) runs on ``--device`` (``cpu``, or ``cuda`` where a GPU is);
``--engine vllm`` needs a CUDA GPU and the ``vllm`` extra (``--vllm-options`` a JSON
object of ``vllm.LLM`` keyword arguments, e.g. ``'{"enforce_eager": true}'``). The
batched and one-at-a-time arms alternate over ``--rounds`` rounds; a row gives each arm's
median rate and the median of the per-round ratios, so a machine whose load changes during
the run skews the ratio less. ``--ragged-batch`` prompts of 10 to 80 words are also scored
in one call grouped by length (the transformers engine's default where prompts differ
enough) against one padded pass. Prints one JSON object.

    python benchmarks/llm_engines.py > benchmarks/results/llm_engines.json
    python benchmarks/llm_engines.py --engine vllm > benchmarks/results/llm_engines_vllm.json
"""

from __future__ import annotations

import argparse
import gc
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


def _rates(fns: list[Any], counts: list[int], min_seconds: float, rounds: int) -> list[list[float]]:
    """Per round, count / seconds per call of each of ``fns`` (``counts[k]`` items a call), each
    repeated for at least ``min_seconds / rounds`` in turn: the arms alternate, so a change of the
    machine's load during the run falls on all of them alike rather than on whichever ran last."""
    for fn in fns:
        fn()  # warm
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, count, rates in zip(fns, counts, out):
            calls, start = 0, time.perf_counter()
            while True:
                fn()
                calls += 1
                spent = time.perf_counter() - start
                if spent >= min_seconds / rounds:
                    rates.append(count * calls / spent)
                    break
    return out


def _paired(fast: list[float], slow: list[float]) -> dict[str, float]:
    """Median rates of two arms measured round by round, and the median of their per-round ratios."""
    return {"fast": round(float(np.median(fast)), 1), "slow": round(float(np.median(slow)), 1),
            "ratio": round(float(np.median(np.divide(fast, slow))), 2)}


def _rows(engine: Any, batches: list[int], rng: np.random.Generator, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Scoring and generation, batched against one at a time, at each batch size."""
    rows = []
    for b in batches:
        prompts = [_prompt(rng) for _ in range(b)]
        cands = [ACTIONS] * b
        score = _paired(*_rates([lambda: engine.score(prompts, cands),
                                 lambda: [engine.score([p], [ACTIONS]) for p in prompts]], [b, b],
                                args.min_seconds, args.rounds))
        made = engine.generate(prompts, max_new_tokens=args.new_tokens)  # tokens actually generated (EOS ends some)
        tokens = sum(len(engine._encode(t)) for t in made)
        gen = _paired(*_rates([lambda: engine.generate(prompts, max_new_tokens=args.new_tokens),
                               lambda: [engine.generate([p], max_new_tokens=args.new_tokens) for p in prompts]],
                              [tokens, tokens], args.min_seconds, args.rounds))
        rows.append({"batch": b, "score_decisions_per_s_batched": score["fast"],
                     "score_decisions_per_s_one_at_a_time": score["slow"], "score_speedup": score["ratio"],
                     "generate_tokens_per_s_batched": gen["fast"], "generate_tokens_per_s_one_at_a_time": gen["slow"],
                     "generate_speedup": gen["ratio"]})
    return rows


def _ragged(engine: Any, rng: np.random.Generator, args: argparse.Namespace) -> dict[str, Any]:
    """Scoring ``--ragged-batch`` prompts of 10 to 80 words in one call, grouped by length (the
    engine's default, where it saves padding) against one padded pass per ``max_batch``."""
    b = args.ragged_batch
    prompts = [" ".join(rng.choice(WORDS, size=int(rng.integers(10, 81)))) for _ in range(b)]
    cands = [ACTIONS] * b
    if not hasattr(engine, "GROUPS"):  # an engine without length groups (vLLM schedules its own batches)
        return {}

    def one_pass() -> None:
        engine.GROUPS = 1
        try:
            engine.score(prompts, cands)
        finally:
            del engine.GROUPS  # back to the class's default

    chunks = [len(c) for c in engine._chunks(*engine.scoring_tokens(prompts, cands))]
    rates = _paired(*_rates([lambda: engine.score(prompts, cands), one_pass], [b, b], args.min_seconds, args.rounds))
    return {"batch": b, "prompt_words": [10, 80], "chunks": chunks, "decisions_per_s_grouped": rates["fast"],
            "decisions_per_s_one_pass": rates["slow"], "grouped_over_one_pass": rates["ratio"]}


def _parameters(model_dir: Any) -> int:
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engine", choices=["transformers", "vllm"], default="transformers")
    parser.add_argument("--device", default="cpu", help="the transformers engine's device")
    parser.add_argument("--vllm-options", default="{}", help="JSON object of vllm.LLM keyword arguments")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--min-seconds", type=float, default=2.0, help="per arm, over all rounds")
    parser.add_argument("--rounds", type=int, default=5, help="batched and one-at-a-time alternate this many times")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--ragged-batch", type=int, default=64,
                        help="prompts of 10-80 words scored grouped by length against one pass (0: skip)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    batches = [int(b) for b in args.batches.split(",")]
    rng = np.random.default_rng(0)
    vllm_options = json.loads(args.vllm_options)
    if not isinstance(vllm_options, dict):
        parser.error(f"--vllm-options must be a JSON object of vllm.LLM keyword arguments, got {args.vllm_options!r}")
    options = ({"device": args.device} if args.engine == "transformers"
               else {"gpu_memory_utilization": 0.3, **vllm_options})
    out: dict[str, Any] = {"benchmark": "llm_engines", "engine": args.engine, "options": options,
                           "device": args.device if args.engine == "transformers" else "cuda",
                           "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                           "threads": 1, "rounds": args.rounds, "candidates_per_decision": len(ACTIONS),
                           "prompt_words": 40, "models": {}}
    for name, size in SIZES.items():
        model_dir = build_tiny_model(tempfile.mkdtemp(), WORDS + ACTIONS, **size)
        engine = make_engine(args.engine, model_dir, **options)
        params = _parameters(model_dir)
        rows = _rows(engine, batches, rng, args)
        out["models"][name] = {"parameters": params, **size, "rows": rows}
        if args.ragged_batch:
            out["models"][name]["ragged"] = _ragged(engine, rng, args)
        del engine  # a vLLM engine holds its share of the GPU until collected
        gc.collect()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
