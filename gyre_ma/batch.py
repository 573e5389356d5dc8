"""The one vocabulary of batch keys, and minibatches of a batch."""

from __future__ import annotations

from typing import Final

import torch

FEATURES: Final = "features"
"""float [N, F] — manager input (observation, milestone bits, last option, time)."""
PROMPT: Final = "prompt"
"""long [N, L] — the LLM manager's prompt tokens, right-padded."""
PROMPT_LENGTH: Final = "prompt_length"
"""long [N] — each prompt's length in tokens."""
REF_LOGITS: Final = "ref_logits"
"""float [N, K] — the LLM manager's frozen reference policy's masked logits (its KL penalty)."""
STATE: Final = "state"
"""float [N, S] — global state at the decision (centralised critic)."""
AGENT: Final = "agent"
"""long [N] — agent index (for the agent-id embedding)."""
MASK: Final = "mask"
"""bool [N, K] — eligible options."""
OPTION: Final = "option"
"""long [N] — chosen option."""
LOG_PROB: Final = "log_prob"
"""float [N] — behaviour policy's log-probability of the chosen option."""
PROXIMAL_LOG_PROB: Final = "proximal_log_prob"
"""float [N] — the learner's policy before the update: its log-probability of the chosen
option (decoupled PPO's proximal policy, added by the learner)."""
VALUE: Final = "value"
"""float [N] — critic value at the decision, at rollout time."""
ADVANTAGE: Final = "advantage"
"""float [N] — credit assigned to the decision."""
RETURN: Final = "return"
"""float [N] — regression target of the critic."""
PROGRESS: Final = "progress"
"""float [N] 0/1 — a milestone was first verified during the call (process-reward label)."""
SUCCESS: Final = "success"
"""float [N] 0/1 — the call's episode verified every goal (process-reward label)."""
GROUP_BEST: Final = "group_best"
"""float [N] 0/1 — the call's episode is the best of its task seed's group (the highest
verified outcome, where the group's outcomes differ): what group-best self-imitation imitates."""

Batch = dict[str, torch.Tensor]


def batch_size(batch: Batch) -> int:
    return int(batch[OPTION].shape[0])


def minibatches(batch: Batch, size: int, generator: torch.Generator) -> list[Batch]:
    """Shuffled minibatches by index slicing — no per-sample collation."""
    n = batch_size(batch)
    order = torch.randperm(n, generator=generator)
    return [{k: v[idx] for k, v in batch.items()} for idx in order.split(size)]
