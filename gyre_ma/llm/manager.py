"""The LLM manager: a causal language model that picks the next option.

At each decision the model reads a text view of the decision state (:class:`DecisionText`:
the task, the agent, the time used, the verified milestones, its last option, what the
other agents run, the eligible options and their descriptions) and every *eligible*
option is scored by the log-probability of its name after that prompt; the manager
samples from the softmax of these scores over the eligible options. Ineligible options
are never scored: they have probability zero, as under the MLP manager's mask.

:class:`LLMManagerPolicy` is an ``nn.Module`` like :class:`~gyre_ma.agents.manager.ManagerPolicy`
and is trained by the same loop (PPO or GRPO on the chosen option's log-probability with
the same milestone-anchored advantages, :class:`~gyre_ma.trainers.manager.ManagerModule`
through Lightning Fabric) plus a KL penalty to a frozen copy of the initial model; the
critic stays the MLP critic on the manager's numeric features. Rollout workers hold a copy
whose weights are replaced at each policy version (:class:`LLMActor`, one batched forward
pass per round of decisions); with ``engine: vllm`` the eligible names are scored by vLLM,
its weights replaced in place (:meth:`~gyre_ma.llm.vllm_engine.VLLMEngine.load_weights`).

Exploration is by sampling (``epsilon`` or ``temperature`` noise); parameter noise is for
the MLP manager. A greedy episode takes the most likely untried option, as the MLP
manager's does (:meth:`~gyre_ma.agents.noise.PolicyActor._untried_argmax`).
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from gyre_ma import batch as B
from gyre_ma.agents.noise import PolicyActor, RowwiseForward, _Slot
from gyre_ma.llm.engine import (
    LENGTH_GROUP_ROWS,
    LENGTH_GROUPS,
    check_model_dir,
    length_groups,
    scoring_tokens,
    start_token,
)

if TYPE_CHECKING:
    from gyre_ma.agents.manager import Critic, Featurizer, StateScaler
    from gyre_ma.config import LLMManagerConfig
    from gyre_ma.options.decision import Decision
    from gyre_ma.options.library import OptionLibrary
    from gyre_ma.rollout import OptionCall

CUE = "choose :"
"""Every prompt ends with this; an option's name is scored as what follows it."""
TIME_BINS = 10
"""The time used is written in tenths of the step cap."""


class DecisionText:
    """A decision (or a recorded call: the same fields) → the manager's prompt.

    One line each: the task's goals (the episode's, where the env says them), the agent,
    the time used (in tenths), the verified milestones, the agent's last option, the options
    the other agents run, the eligible options (with their descriptions), then :data:`CUE`.
    ``render`` (a decision → text) adds a line (e.g. the observation as text)."""

    def __init__(self, library: OptionLibrary, *, descriptions: bool = True,
                 render: Callable[[Any], str] | None = None) -> None:
        self.names = list(library.names)
        self.goals = " , ".join(library.graph.goals)
        self.descriptions = [o.description or "" for o in library] if descriptions else None
        self.render = render

    def __call__(self, d: Decision | OptionCall) -> str:
        names = self.names
        time = min(int(d.time_fraction * TIME_BINS), TIME_BINS)
        eligible = np.flatnonzero(d.mask)
        if self.descriptions is None:
            options = " ; ".join(names[k] for k in eligible)
        else:
            options = " ; ".join(f"{names[k]} : {self.descriptions[k]}".strip(" :") for k in eligible)
        goals = " , ".join(d.goals) if d.goals else self.goals
        lines = [f"task : {goals}", f"agent : {d.agent}", f"time : {time} / {TIME_BINS}",
                 "verified : " + (" , ".join(sorted(d.achieved)) or "none"),
                 "last : " + (names[d.last_option] if d.last_option >= 0 else "none"),
                 "others : " + (" , ".join(names[k] for k in d.others) or "none")]
        if self.render is not None:
            lines.append(str(self.render(d)))
        lines += [f"options : {options}", CUE]
        return "\n".join(lines)

    def vocabulary(self, library: OptionLibrary, agents: Sequence[str]) -> list[str]:
        """Every word a prompt of this view can hold (but those of ``render``, which
        ``manager.llm.build.vocabulary`` adds): the vocabulary of a model built from config."""
        texts = [CUE, "task verified last others options agent time none / : ; ,", *agents,
                 *(str(i) for i in range(TIME_BINS + 1)), *self.names, *library.graph.names, self.goals]
        texts += self.descriptions or []
        return texts


def _distinct_names(names: Sequence[str], tokens: Sequence[Sequence[int]], tokenizer: Any, source: str) -> None:
    """Options whose names the tokenizer reads as the same tokens (every word of them
    unknown, say) get the same score whatever the weights: the manager trains on and
    learns nothing between them (entropy at ln 2 throughout). One error naming them."""
    seen: dict[tuple[int, ...], str] = {}
    for name, ids in zip(names, tokens, strict=True):
        other = seen.setdefault(tuple(ids), name)
        if other != name:
            unknown = getattr(tokenizer, "unk_token_id", None)
            why = " (every word of them the unknown token)" if unknown is not None and set(ids) == {unknown} else ""
            raise ValueError(f"manager.llm: the model's tokenizer ({source}) reads options {other!r} and {name!r} as "
                             f"the same tokens {list(ids)}{why}, so the manager could never tell them apart; use a "
                             "model whose vocabulary covers the option names (build one from config: manager.llm."
                             "build, or gyre_ma.llm.tiny.build_tiny_model over "
                             "DecisionText(library).vocabulary(library, agents))")


class LLMManagerPolicy(nn.Module):
    """A causal LM over the eligible options: the logit of option k is the summed
    log-probability of its name's tokens after the prompt; ineligible options are masked."""

    def __init__(self, model: nn.Module, tokenizer: Any, text: DecisionText, *, max_prompt_tokens: int = 480,
                 source: str = "model") -> None:
        super().__init__()
        self.model = model.eval()
        self.tokenizer, self.text, self.max_prompt_tokens = tokenizer, text, max_prompt_tokens
        self.start = start_token(tokenizer, Path(source))
        self.filler = int(tokenizer.eos_token_id if tokenizer.eos_token_id is not None else self.start)
        """What pads a prompt on the right: never attended by its tokens (the attention is
        causal), and not the pad token, which would make transformers ask for an attention mask."""
        _, (tails,) = scoring_tokens(tokenizer, self.start, [CUE], [[f" {n}" for n in text.names]])
        self.names = [list(t) for t in tails]
        """Each option's name as tokens, as they follow :data:`CUE`."""
        _distinct_names(text.names, self.names, tokenizer, source)
        self.single = all(len(t) == 1 for t in self.names)
        """Every name one token: one forward pass per prompt scores them all."""
        self.register_buffer("name_tokens", torch.tensor([t[0] for t in self.names], dtype=torch.long),
                             persistent=False)
        positions = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
        longest = max_prompt_tokens + max(len(t) for t in self.names)
        if positions is not None and longest > positions:
            raise ValueError(f"manager.llm.max_prompt_tokens ({max_prompt_tokens}) plus the longest option name "
                             f"({longest - max_prompt_tokens} tokens) exceeds the model's {positions} positions "
                             f"({source}); lower max_prompt_tokens or use a model with a longer context")

    # ------------------------------------------------------------------ building
    @classmethod
    def from_config(cls, config: LLMManagerConfig, library: OptionLibrary, agents: Sequence[str]) -> LLMManagerPolicy:
        """Load ``config.model`` from its local directory, or build the small model of
        ``config.build`` (saved to a temporary directory and loaded back through the same code)."""
        from gyre_ma.options.library import resolve

        render = resolve(config.render, "manager.llm.render") if config.render else None
        text = DecisionText(library, descriptions=config.descriptions, render=render)
        if config.model is not None:
            return cls._load(check_model_dir(config.model, "manager.llm.model"), text, config.max_prompt_tokens,
                             config.model)
        from gyre_ma.llm.tiny import build_tiny_model

        b = config.build
        with tempfile.TemporaryDirectory(prefix="gyre-llm-manager-") as tmp:
            path = build_tiny_model(tmp, [*text.vocabulary(library, agents), *b.vocabulary], layers=b.layers,
                                    width=b.width,
                                    heads=b.heads, context=b.context, seed=b.seed)
            return cls._load(path, text, config.max_prompt_tokens, "manager.llm.build")

    @classmethod
    def _load(cls, path: Path, text: DecisionText, max_prompt_tokens: int, source: str) -> LLMManagerPolicy:
        from gyre_ma.llm.hf import load_local

        model, tokenizer = load_local(path)
        return cls(model, tokenizer, text, max_prompt_tokens=max_prompt_tokens, source=source)

    def train(self, mode: bool = True) -> LLMManagerPolicy:
        """The model stays in eval mode while training too: dropout would make the policy
        that is trained differ from the one that acted (the PPO ratio compares the two)."""
        super().train(mode)
        self.model.eval()
        return self

    def vllm_engine(self, **options: Any) -> Any:
        """A vLLM engine serving this model (its weights now; later ones through
        :meth:`~gyre_ma.llm.vllm_engine.VLLMEngine.load_weights`), from a temporary copy on disk."""
        from gyre_ma.llm.vllm_engine import VLLMEngine

        folder = tempfile.TemporaryDirectory(prefix="gyre-vllm-manager-")
        self.model.save_pretrained(folder.name)
        self.tokenizer.save_pretrained(folder.name)
        engine = VLLMEngine(folder.name, **options)
        engine.folder = folder  # the copy lives as long as the engine
        return engine

    def frozen_copy(self) -> LLMManagerPolicy:
        """The reference policy: a copy of these weights that no optimiser moves."""
        ref = copy.deepcopy(self)
        ref.requires_grad_(False)
        return ref.eval()

    # ------------------------------------------------------------------ prompts
    def encode(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """Prompts → right-padded token ids [N, L] (the start token first; a prompt longer than
        ``max_prompt_tokens`` keeps its last tokens) and their lengths [N]."""
        ids = self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        keep = self.max_prompt_tokens - 1
        rows = [[self.start] + list(r[-keep:]) for r in ids]
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
        out = torch.full((len(rows), int(lengths.max()) if rows else 1), self.filler, dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        return out, lengths

    def batch_inputs(self, calls: Sequence[Decision | OptionCall]) -> B.Batch:
        """The batch keys this policy reads for ``calls``: their prompts' tokens and lengths."""
        prompt, lengths = self.encode([self.text(c) for c in calls])
        return {B.PROMPT: prompt, B.PROMPT_LENGTH: lengths}

    # ------------------------------------------------------------------ forward
    def forward(self, prompt: Tensor, lengths: Tensor, mask: Tensor) -> Tensor:
        """prompt [N, L] long (right-padded), lengths [N], mask [N, K] bool → masked logits [N, K]."""
        prompt = prompt[:, :int(lengths.max())]
        neg = torch.finfo(torch.float32).min
        if self.single:  # the name's one token after the prompt's last: one pass per prompt
            logits = self._next_token_logits(prompt, lengths - 1)
            scores = logits.float().log_softmax(-1)[:, self.name_tokens]
            return scores.masked_fill(~mask, neg)
        return self._summed_scores(prompt, lengths, mask).masked_fill(~mask, neg)

    def _next_token_logits(self, ids: Tensor, at: Tensor) -> Tensor:
        """The LM's next-token logits at position ``at[i]`` of row ``i`` [N, V]; the output
        layer runs only there (a vocabulary × every position would dwarf the rest)."""
        rows = torch.arange(ids.shape[0], device=ids.device)
        return self.model.get_output_embeddings()(self._hidden_at(ids, at + 1, rows, at))

    GROUPS = LENGTH_GROUPS
    """Most groups of similar length one forward pass over prompts is split into (:func:`length_groups`)."""
    GROUP_ROWS = LENGTH_GROUP_ROWS
    """Fewest rows a group holds."""

    def _hidden_at(self, ids: Tensor, lengths: Tensor, rows: Tensor, positions: Tensor) -> Tensor:
        """The model's last hidden state at position ``positions[j]`` of row ``rows[j]`` [J, H];
        ``ids`` [N, L] holds right-padded rows of ``lengths`` [N] tokens. The rows run in up to
        :attr:`GROUPS` groups of similar length, each cut to its own longest row: a batch's
        prompts differ in length (53-151 tokens on the LLM quickstart, where padding to the
        longest of a learner's minibatch of 128 made 37 % of its tokens padding). A row's
        tokens attend causally to their own row alone, so the grouping changes a row's hidden
        states by float round-off only."""
        groups = length_groups(lengths.cpu().numpy(), self.GROUPS, self.GROUP_ROWS)
        if len(groups) == 1:
            return self.model.base_model(input_ids=ids[:, :int(lengths.max())]).last_hidden_state[rows, positions]
        slot = torch.empty(ids.shape[0], dtype=torch.long, device=ids.device)
        pieces, picked = [], []
        for group in (torch.from_numpy(g).to(ids.device) for g in groups):
            hidden = self.model.base_model(input_ids=ids[group, :int(lengths[group].max())]).last_hidden_state
            slot[group] = torch.arange(len(group), device=ids.device)
            mine = torch.isin(rows, group).nonzero().squeeze(1)
            pieces.append(hidden[slot[rows[mine]], positions[mine]])
            picked.append(mine)
        return torch.cat(pieces)[torch.argsort(torch.cat(picked))]

    def _summed_scores(self, prompt: Tensor, lengths: Tensor, mask: Tensor) -> Tensor:
        """Names of several tokens: one row per eligible (prompt, option), the prompt then the
        name, summing the log-probability of each name token."""
        device = prompt.device
        pairs = mask.nonzero().tolist()
        rows, targets, positions, owner = [], [], [], []
        for r, (i, k) in enumerate(pairs):
            n = int(lengths[i])
            name = self.names[k]
            rows.append(torch.cat([prompt[i, :n], torch.tensor(name, dtype=torch.long, device=device)]))
            for j, token in enumerate(name):
                positions.append((r, n - 1 + j))
                targets.append(token)
                owner.append(r)
        width = max(len(x) for x in rows)
        ids = torch.full((len(rows), width), self.filler, dtype=torch.long, device=device)
        for r, x in enumerate(rows):
            ids[r, :len(x)] = x
        at = torch.tensor(positions, dtype=torch.long, device=device)
        row_lengths = torch.tensor([len(x) for x in rows], dtype=torch.long, device=device)
        hidden = self._hidden_at(ids, row_lengths, at[:, 0], at[:, 1])
        logp = self.model.get_output_embeddings()(hidden).float().log_softmax(-1)
        token = logp.gather(1, torch.tensor(targets, dtype=torch.long, device=device)[:, None]).squeeze(1)
        per_row = torch.zeros(len(rows), device=device).index_add(0, torch.tensor(owner, device=device), token)
        out = torch.zeros(mask.shape, device=device)
        index = torch.tensor(pairs, dtype=torch.long, device=device)
        return out.index_put((index[:, 0], index[:, 1]), per_row)

    def distribution(self, prompt: Tensor, lengths: Tensor, mask: Tensor) -> torch.distributions.Categorical:
        return torch.distributions.Categorical(logits=self(prompt, lengths, mask))

    def batch_logits(self, batch: B.Batch) -> Tensor:
        return self(batch[B.PROMPT], batch[B.PROMPT_LENGTH], batch[B.MASK])


class LLMActor(PolicyActor):
    """The LLM manager of many episodes at once: each round one batched forward pass of the
    model over every slot's prompt, and one of the critic; sampling, greedy memory and
    values as :class:`~gyre_ma.agents.noise.PolicyActor` (whose choice code it shares).
    Rows are right-padded to the longest prompt of their group of similar length
    (:meth:`LLMManagerPolicy._hidden_at`), so a row's float round-off may depend on the
    round; for a given (seed, ``num_envs``) the rounds, and so the results, are the same
    run to run."""

    def __init__(self, policy: LLMManagerPolicy, featurizer: Featurizer, *, critic: Critic | None = None,
                 state_scaler: StateScaler | None = None, slots: int = 1, engine: Any = None) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.policy, self.featurizer, self.critic, self.state_scaler = policy, featurizer, critic, state_scaler
        self.engine = engine
        """A vLLM engine scoring the names instead of the policy's module (None: the module)."""
        self.slots = [_Slot() for _ in range(slots)]
        self._critic_forward = RowwiseForward(critic) if critic is not None else None
        self._stacks = None

    @torch.no_grad()
    def begin(self, slot: int, noise: Any, seed: int, *, greedy: bool = False) -> None:
        if noise.kind == "param" and noise.scale > 0 and not greedy:
            raise ValueError("the LLM manager explores by sampling; parameter noise is for the MLP manager "
                             "(roles.*_noise.kind: none, epsilon or temperature)")
        s = self.slots[slot]
        s.noise, s.greedy, s.tried, s.uniforms, s.perturbed = noise, greedy, {}, [], False
        s.generator.manual_seed(int(seed))

    def masked_logits(self, slots: Sequence[int], decisions: Sequence[Decision], features: Tensor, agent: Tensor,
                      mask: Tensor) -> Tensor:
        texts = [self.policy.text(d) for d in decisions]
        if self.engine is not None:
            return self._engine_logits(texts, mask)
        prompt, lengths = self.policy.encode(texts)
        return self.policy(prompt, lengths, mask)

    def _engine_logits(self, texts: list[str], mask: Tensor) -> Tensor:
        names = self.policy.text.names
        eligible = [np.flatnonzero(row).tolist() for row in mask.numpy()]
        scores = self.engine.score(texts, [[f" {names[k]}" for k in ks] for ks in eligible])
        out = torch.full(mask.shape, torch.finfo(torch.float32).min)
        for i, (ks, s) in enumerate(zip(eligible, scores, strict=True)):
            out[i, ks] = torch.as_tensor(s, dtype=torch.float32)
        return out
