"""The LLM manager's forward and backward with prompts grouped by length against one padded pass.

``LLMManagerPolicy`` runs a batch's prompts in up to ``GROUPS`` groups of similar length,
each cut to its own longest row, instead of padding every row to the batch's longest. This
plays two iterations of ``configs/llm_quickstart.yaml`` (one update) to get real decisions,
then times, side by side over ``--rounds`` alternating rounds: a learner minibatch (forward
and backward of the summed chosen-option log-probabilities over ``--minibatch`` decisions)
and a rollout round's forward (``--round-rows`` decisions, no gradient), grouped and in
one padded pass. Reports the share of padding tokens either way, the median seconds and
the median of the per-round ratios. Prints one JSON object.

    python benchmarks/llm_manager_grouping.py > benchmarks/results/llm_manager_grouping.json
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]


def _padding_share(lengths: torch.Tensor, groups: list[torch.Tensor]) -> float:
    padded = sum(len(g) * int(lengths[g].max()) for g in groups)
    return round(1 - int(lengths.sum()) / padded, 3)


def main() -> None:
    from gyre_ma.cli import set_overrides
    from gyre_ma.config import load_config
    from gyre_ma.llm.engine import length_groups
    from gyre_ma.loop import Gyre

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minibatch", type=int, default=128, help="decisions per learner minibatch")
    parser.add_argument("--round-rows", type=int, default=32, help="decisions per rollout round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = load_config(ROOT / "configs" / "llm_quickstart.yaml", set_overrides(["train.iterations=2"]))
    gyre = Gyre(config)
    gyre.iteration(0)
    _, trajectories = gyre.iteration(1, return_trajectories=True)
    grouped = gyre.learner.policy
    padded = copy.deepcopy(grouped)
    padded.GROUPS = 1
    calls = [c for t in trajectories for c in t.calls]
    rng = np.random.default_rng(0)

    def inputs(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        pick = [calls[i] for i in rng.choice(len(calls), size=min(n, len(calls)), replace=False)]
        prompt, lengths = grouped.encode([grouped.text(c) for c in pick])
        mask = torch.tensor(np.stack([c.mask for c in pick]))
        return prompt, lengths, mask, torch.tensor([c.option for c in pick])

    def learner_step(policy: Any, batch: tuple) -> None:
        prompt, lengths, mask, chosen = batch
        policy.zero_grad()
        logits = policy(prompt, lengths, mask)
        logits.log_softmax(-1).gather(1, chosen[:, None]).sum().backward()

    def rollout_round(policy: Any, batch: tuple) -> None:
        with torch.no_grad():
            policy(*batch[:3])

    out: dict[str, Any] = {"benchmark": "llm_manager_grouping", "config": "configs/llm_quickstart.yaml",
                           "decisions": len(calls), "threads": 1, "rounds": args.rounds,
                           "groups": grouped.GROUPS, "group_rows": grouped.GROUP_ROWS}
    for name, size, step in (("learner_minibatch", args.minibatch, learner_step),
                             ("rollout_round", args.round_rows, rollout_round)):
        batches = [inputs(size) for _ in range(4)]
        lengths = batches[0][1]
        groups = [torch.from_numpy(g) for g in length_groups(lengths.numpy(), grouped.GROUPS, grouped.GROUP_ROWS)]
        seconds: dict[str, list[float]] = {"grouped": [], "padded": []}
        for policy in (grouped, padded):
            step(policy, batches[0])  # warm
        for _ in range(args.rounds):
            for label, policy in (("grouped", grouped), ("padded", padded)):
                start = time.perf_counter()
                for batch in batches:
                    step(policy, batch)
                seconds[label].append((time.perf_counter() - start) / len(batches))
        out[name] = {"rows": size, "prompt_tokens": [int(lengths.min()), int(np.median(lengths)), int(lengths.max())],
                     "padding_share_grouped": _padding_share(lengths, groups),
                     "padding_share_padded": _padding_share(lengths, [torch.arange(len(lengths))]),
                     "seconds_grouped": round(float(np.median(seconds["grouped"])), 4),
                     "seconds_padded": round(float(np.median(seconds["padded"])), 4),
                     "padded_over_grouped": round(float(np.median(np.divide(seconds["padded"],
                                                                            seconds["grouped"]))), 3)}
    gyre.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
