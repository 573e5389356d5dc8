"""The ``transformers`` engine: batched scoring and generation on CPU or GPU.

Every request starts with the tokenizer's BOS token (its EOS where it has none), in
scoring and in generation alike, so a prompt may be empty and both operations condition
on the same text. Scoring runs a call in one forward pass: each prompt once, left-padded,
followed in its own row by all its candidates one after another, with a 4D attention mask
and position ids that make each candidate see its prompt and nothing else, the last
layer computing only the columns whose logits are read; generation
left-pads the prompts and runs ``generate`` with its KV cache, stopping a row at its first
stop string.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import (
    AttentionInterface,
    AttentionMaskInterface,
    AutoModelForCausalLM,
    AutoTokenizer,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask
from transformers.utils.logging import disable_progress_bar

from gyre_ma.llm.engine import (
    LENGTH_GROUP_ROWS,
    LENGTH_GROUPS,
    ScoringTokenizer,
    check_model_dir,
    check_requests,
    length_groups,
    per_prompt,
    start_token,
)


def load_local(path: Path, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """A model directory's causal LM and tokenizer, from disk only, without a progress bar (a
    rollout worker loading its model prints nothing) and without moving the caller's torch
    RNG (a run's draws do not depend on whether a model was loaded); its tanh-approximated
    GELUs fused (:func:`fuse_gelu`). The engine and the LLM manager's learner both load
    through here, so the policy that acts is the one that is trained."""
    disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    with torch.random.fork_rng(devices=[]):
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype)
    fuse_gelu(model)
    return model, tokenizer


_SQRT_8_OVER_PI = math.sqrt(8 / math.pi)


class FusedTanhGELU(torch.nn.Module):
    """The tanh approximation of GELU, ``x · ½(1 + tanh(√(2/π) (x + 0.044715 x³)))``.

    Torch's one fused kernel (``gelu(x, approximate="tanh")``), except in inference on the
    CPU over a large tensor (a batched call's MLP activations), where it is the same function
    written with a sigmoid, ``½(1 + tanh z) = σ(2z)``, in five in-place passes over one new
    tensor: torch's CPU ``tanh``, on which the fused kernel is built, is about six times
    slower than its ``sigmoid``, so from :attr:`SIGMOID_FROM` elements this form takes about
    half the fused kernel's time, within 1e-6 of it (below that, five passes cost more than
    one; ``benchmarks/results/README.md``, session 42)."""

    SIGMOID_FROM = 16384
    """Elements from which CPU inference uses the sigmoid form."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x.device.type != "cpu" or x.numel() < self.SIGMOID_FROM
                or (x.requires_grad and torch.is_grad_enabled())):
            return torch.nn.functional.gelu(x, approximate="tanh")
        z = x * x
        z.mul_(0.044715 * _SQRT_8_OVER_PI).add_(_SQRT_8_OVER_PI).mul_(x)  # 2√(2/π) (x + 0.044715 x³)
        return z.sigmoid_().mul_(x)


def fuse_gelu(model: torch.nn.Module) -> int:
    """Replace each of ``model``'s ``NewGELUActivation`` (transformers' ``gelu_new``: GPT-2,
    GPT-J, CodeGen and the models built by :mod:`gyre_ma.llm.tiny`) with
    :class:`FusedTanhGELU`, the same function to float round-off, as transformers' own
    ``gelu_pytorch_tanh`` is; returns how many were replaced. ``gelu_new`` is eight
    elementwise ops, each a pass over the MLP's widest activations (and a kernel launch):
    on CPU, fusing them made batched scoring 16 % (2×32 model) and 24 % (4×256) faster and
    one-at-a-time scoring 24 % and 12 %, and moved a candidate's log-probability by at most
    1.2e-6 (``benchmarks/results/README.md``, session 40)."""
    from transformers.activations import NewGELUActivation

    replaced = 0
    for module in model.modules():
        for name, child in module.named_children():
            if type(child) is NewGELUActivation:
                setattr(module, name, FusedTanhGELU())
                replaced += 1
    return replaced


LAST_COLUMNS_ATTENTION = "gyre_last_columns"
"""The attention implementation of an engine's model that would otherwise use ``sdpa``:
``sdpa`` itself (its masks too), but for an attention module marked by
:class:`LastColumns`, which computes only its last ``gyre_keep`` queries. Registered by
name with transformers' ``AttentionInterface`` and ``AttentionMaskInterface``."""


def _last_columns_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    keep = getattr(module, "gyre_keep", None)
    if keep is None or attention_mask is None or query.shape[2] <= keep:
        return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    cut = query.shape[2] - keep
    out, weights = sdpa_attention_forward(module, query[:, :, cut:], key, value, attention_mask[:, :, cut:],
                                          *args, **kwargs)
    return torch.nn.functional.pad(out, (0, 0, 0, 0, cut, 0)), weights  # (batch, columns, heads, head size)


AttentionInterface.register(LAST_COLUMNS_ATTENTION, _last_columns_attention)
AttentionMaskInterface.register(LAST_COLUMNS_ATTENTION, sdpa_mask)


class LastColumns:
    """The last decoder layer (GPT-2, Llama, Qwen, Mistral, Phi, Gemma), made to compute only
    a pass's last ``keep`` columns inside :meth:`kept`: its feed-forward block (child ``mlp``)
    runs on those columns alone, and, where the model's attention is SDPA, its attention
    (child ``attn`` or ``self_attn``) computes only their queries, against keys and values
    of every column.

    Scoring reads the logits of a row's last columns only (its candidates and the prompt's
    last token). A feed-forward block is position-wise, and a query's attention output
    depends on no other query, so in the last layer nothing read depends on the other
    columns, which are left zero. Every earlier layer runs in full, and the last layer's
    keys and values too. Outside :meth:`kept` (generation, training, a plain forward pass)
    the layer runs as it is. Forward hooks and an attention implementation registered by
    name (:data:`LAST_COLUMNS_ATTENTION`, set on the model once), not wrapper modules, so the
    model's ``state_dict`` keeps its keys (weights pushed into the engine load as they are)
    and a call pays no more than setting ``keep``. Eager attention runs in full: its
    function is each model's own."""

    def __init__(self, mlp: torch.nn.Module, attention: torch.nn.Module | None) -> None:
        self.attention = attention
        """The last layer's attention module, marked with ``gyre_keep`` (None: it runs in full)."""
        self.keep: int | None = None
        self._cut = 0
        """Columns the current call of the feed-forward block left out (0: it ran in full)."""
        mlp.register_forward_pre_hook(self._slice)
        mlp.register_forward_hook(self._pad)

    @classmethod
    def of(cls, model: Any) -> LastColumns | None:
        """The columns kept of ``model``'s last decoder layer, its attention implementation
        set to :data:`LAST_COLUMNS_ATTENTION` where it was ``sdpa``; None where it has no list
        of ``num_hidden_layers`` layers whose last holds an ``mlp``."""
        count = getattr(model.config, "num_hidden_layers", None)
        for module in model.modules():
            if isinstance(module, torch.nn.ModuleList) and len(module) == count:
                layer = module[-1]
                mlp = getattr(layer, "mlp", None)
                if not isinstance(mlp, torch.nn.Module):
                    return None
                attention = next((a for a in (getattr(layer, "self_attn", None), getattr(layer, "attn", None))
                                  if isinstance(a, torch.nn.Module)), None)
                if attention is not None and model.config._attn_implementation == "sdpa":
                    model.set_attn_implementation(LAST_COLUMNS_ATTENTION)
                else:
                    attention = None
                return cls(mlp, attention)
        return None

    @contextmanager
    def kept(self, keep: int) -> Iterator[None]:
        """The last layer computes only the last ``keep`` columns of each pass in this block."""
        self.keep = keep
        if self.attention is not None:
            self.attention.gyre_keep = keep
        try:
            yield
        finally:
            self.keep = None
            if self.attention is not None:
                self.attention.gyre_keep = None

    def _slice(self, module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        x = args[0] if args else None
        self._cut = 0
        if self.keep is None or not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[1] <= self.keep:
            return None
        self._cut = x.shape[1] - self.keep
        return (x[:, self._cut:].contiguous(), *args[1:])

    def _pad(self, module: torch.nn.Module, args: tuple[Any, ...], out: Any) -> Any:
        if not self._cut:
            return None
        if isinstance(out, torch.Tensor):
            return torch.nn.functional.pad(out, (0, 0, self._cut, 0))
        return (torch.nn.functional.pad(out[0], (0, 0, self._cut, 0)), *out[1:])  # (hidden, router logits, ...)


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
        self.model, self.tokenizer = load_local(path, getattr(torch, dtype))
        self.model.to(self.device).eval()
        self._keeps_logits = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        """Whether the forward pass can skip the logits scoring does not read (``logits_to_keep``)."""
        self._last = LastColumns.of(self.model)
        """The last layer, run on the scored columns alone (None: in full)."""
        tok = self.tokenizer
        self.start = start_token(tok, path)
        self.scoring_tokens = ScoringTokenizer(tok, self.start)
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
        attention = getattr(self.model.config, "_attn_implementation", None) or "eager"
        if attention not in ("eager", "sdpa", LAST_COLUMNS_ATTENTION):
            raise ValueError(f"scoring packs each prompt's candidates behind it with a 4D attention mask, which needs "
                             f"the 'eager' or 'sdpa' attention implementation; {str(self.path)!r} uses {attention!r}")
        heads, tails = self.scoring_tokens(prompts, candidates)
        out: list[np.ndarray] = [np.empty(0)] * len(heads)
        for chunk in self._chunks(heads, tails):
            for i, scores in zip(chunk.tolist(), self._score_chunk([heads[i] for i in chunk],
                                                                  [tails[i] for i in chunk])):
                out[i] = scores
        return out

    GROUPS = LENGTH_GROUPS
    """Most groups of similar prompt length a call's requests are split into (:func:`length_groups`)."""
    GROUP_ROWS = LENGTH_GROUP_ROWS
    """Fewest requests a group holds."""
    GROUP_SAVING = 0.25
    """Share of a call's padded tokens that grouping must save to be used: each group is a
    forward pass of its own, whose fixed cost outweighs a little padding."""

    def _chunks(self, heads: list[list[int]], tails: list[list[list[int]]]) -> list[np.ndarray]:
        """The requests' indices, one array per forward pass: in order, ``max_batch`` at a
        time; or, where prompts differ enough in length that it saves :attr:`GROUP_SAVING`
        of the padded tokens (every row is padded to its pass's longest prompt and longest
        candidates), in up to :attr:`GROUPS` groups of similar prompt length (more where
        ``max_batch`` needs more). A request's scores do not depend on the others in its
        pass (but for float round-off)."""
        n = len(heads)
        if n == 0:
            return []
        head = np.fromiter(map(len, heads), np.int64, n)
        span = np.fromiter((sum(map(len, ts)) for ts in tails), np.int64, n)
        plain = np.array_split(np.arange(n), -(-n // self.max_batch))
        grouped = length_groups(head, self.GROUPS, self.GROUP_ROWS, at_least=len(plain))
        if len(grouped) == 1:
            return plain

        def padded(chunks: list[np.ndarray]) -> int:
            return sum(len(c) * int(head[c].max() + span[c].max()) for c in chunks)

        return grouped if padded(grouped) <= (1 - self.GROUP_SAVING) * padded(plain) else plain

    def _score_chunk(self, heads: list[list[int]], tails: list[list[list[int]]]) -> list[np.ndarray]:
        """One forward pass for the whole chunk. Row i is prompt i (left-padded, so every
        prompt ends in the same column) followed by its candidates back to back (right-padded).
        A candidate's tokens attend to their prompt and to their own earlier tokens, and their
        positions go on from the prompt's end, so each is scored exactly as if it alone followed
        the prompt; the prompt is computed once, and no KV cache is copied per candidate; the
        last layer runs on the kept columns alone (:class:`LastColumns`). The
        index arithmetic runs in NumPy: on arrays this small a NumPy op costs a fraction of a
        torch op's dispatch, and a batched call makes a few dozen of them."""
        n, counts = len(heads), [len(ts) for ts in tails]
        flat = [tail for ts in tails for tail in ts]
        head_len = np.fromiter(map(len, heads), np.int64, n)
        width = int(head_len.max())
        pad_width = width - head_len  # each row's left padding
        # Per candidate token: its candidate, row, offset in its candidate and in its row's candidates.
        lengths = np.fromiter(map(len, flat), np.int64, len(flat))
        cand_row = np.repeat(np.arange(n), counts)
        owner = np.repeat(np.arange(len(flat)), lengths)
        row = cand_row[owner]
        token = np.arange(len(owner))
        in_cand = token - (lengths.cumsum() - lengths)[owner]
        row_tokens = np.bincount(cand_row, weights=lengths, minlength=n).astype(np.int64)
        in_row = token - (row_tokens.cumsum() - row_tokens)[row]
        span = int(row_tokens.max())
        column = width + in_row

        ids = np.full((n, width + span), self.pad, np.int64)
        for i, (head, pad) in enumerate(zip(heads, pad_width.tolist())):
            ids[i, pad:width] = head
        tokens = np.fromiter(chain.from_iterable(flat), np.int64, len(owner))  # every candidate's, in order
        ids[row, column] = tokens
        before = np.arange(width) - pad_width[:, None]  # a prompt column's position; negative: padding
        segment = np.full((n, width + span), -1, np.int64)  # -1 padding, 0 the prompt, else which candidate
        segment[:, :width][before >= 0] = 0
        segment[row, column] = owner + 1
        positions = np.zeros((n, width + span), np.int64)
        positions[:, :width] = np.maximum(before, 0)
        positions[row, column] = head_len[row] + in_cand
        query, key = segment[:, None, :, None], segment[:, None, None, :]
        order = np.arange(width + span)
        sees = (order[None, :] <= order[:, None]) & (key >= 0) & ((key == 0) | (key == query))
        sees |= np.eye(width + span, dtype=bool)  # padding sees itself: no row all −inf (a NaN)

        # −inf where a token may not attend, added to its attention scores: eager attention adds it, SDPA takes it
        # as it is (a boolean mask it would convert in every layer; once here is cheaper).
        dev, dtype = self.device, self.model.dtype
        mask = torch.where(torch.from_numpy(sees).to(dev), torch.zeros((), dtype=dtype, device=dev),
                           torch.full((), -math.inf, dtype=dtype, device=dev))
        with self._last.kept(span + 1) if self._last is not None else nullcontext():
            logits = self.model(input_ids=torch.from_numpy(ids).to(dev), attention_mask=mask,
                                position_ids=torch.from_numpy(positions).to(dev), use_cache=False,
                                **({"logits_to_keep": span + 1} if self._keeps_logits else {})).logits
        # Kept column k predicts the token in column width + k; a candidate's first token is
        # predicted by the prompt's last column.
        source = np.where(in_cand > 0, in_row, 0)
        rows = logits[:, -(span + 1):][torch.from_numpy(row).to(dev), torch.from_numpy(source).to(dev)].float()
        picked = rows.gather(1, torch.from_numpy(tokens).to(dev)[:, None])[:, 0] - torch.logsumexp(rows, -1)
        total = np.bincount(owner, weights=picked.double().cpu().numpy(), minlength=len(flat))
        return per_prompt(total, counts)

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
    """A ``generate`` stopping criterion: a row is done once its new text holds a stop string.

    ``generate`` asks after every token, and a row it has marked done stays done, so a stop
    string is looked for where it can first appear: ending in the newest token. Only each
    row's last :attr:`window` new tokens are decoded, not its whole new text (which made the
    check grow with every token: +27 % on 32 greedy tokens at batch 16, session 47). A stop
    string of n characters ending in the newest token spans at most its last n tokens, since
    a token decodes to a character or more; :attr:`MARGIN` more cover the tokens that decode
    to nothing (special tokens) or change how the one before them decodes (a character
    split over byte-level tokens)."""

    MARGIN = 8

    def __init__(self, tokenizer: Any, stop: Sequence[str], prompt_width: int) -> None:
        self.tokenizer, self.stop, self.width = tokenizer, list(stop), prompt_width
        self.window = max(map(len, self.stop)) + self.MARGIN
        """New tokens decoded per row and step."""

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        start = max(self.width, input_ids.shape[1] - self.window)
        texts = self.tokenizer.batch_decode(input_ids[:, start:], skip_special_tokens=True)
        return torch.tensor([any(s in t for s in self.stop) for t in texts], device=input_ids.device)
