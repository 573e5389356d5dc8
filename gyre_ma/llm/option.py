"""LLM-backed sub-policies: an option whose primitive actions a language model chooses.

At each step the policy prompts the model with the option's milestone description, the
agent's observation as text (the env's own text observation, or a renderer the user
supplies) and the admissible actions, and acts in one of two ways:

- ``mode="score"`` (constrained): every admissible action is scored as a continuation of
  the prompt; the best is taken (or one is sampled at ``temperature`` > 0 with the call's
  generator), so an action outside the list has probability 0;
- ``mode="generate"``: the model writes an action, which is parsed and validated against
  the admissible ones; an unparsable or invalid output is counted and retried (sampled,
  with a new seed) up to ``retries`` times, then the configured ``fallback`` action is
  taken. Never a crash.

Batched: an LLM policy is a :class:`BatchedSubPolicy` — it says what it needs
(:meth:`LLMPolicy.request`) and acts on the answer (:meth:`LLMPolicy.resolve`). The episode
coroutine (:func:`gyre_ma.rollout.play_episode`) gathers the requests of every agent of a
step into one :class:`ActionRequests`, and the batched rollout engine answers those of
every env in flight with one engine call per model and operation (:func:`answer`).
Called directly (``policy(ctx)``), it answers its own request alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from gyre_ma.llm.engine import LLMEngine

DEFAULT_TEMPLATE = ("Task: {description}\nObservation: {observation}\nAdmissible actions: {actions}\n"
                    "Action:")
"""Fields: ``description`` (the option's milestone description), ``milestone``,
``observation`` (text), ``actions`` (the admissible actions, comma-separated), ``agent``."""


@dataclass(frozen=True)
class LLMRequest:
    """One question for a model: score ``candidates`` after ``prompt``, or (no candidates)
    generate a continuation of ``prompt``."""

    engine: LLMEngine = field(compare=False)
    prompt: str
    candidates: tuple[str, ...] | None = None
    max_new_tokens: int = 32
    stop: tuple[str, ...] = ("\n",)
    temperature: float = 0.0
    seed: int = 0


@dataclass
class ActionRequests:
    """What an episode yields when its LLM-backed sub-policies need the model: the requests
    of the step's agents, answered together (:func:`answer`)."""

    requests: list[LLMRequest]


def answer(requests: Sequence[LLMRequest]) -> list[Any]:
    """Answer ``requests`` with one batched engine call per (engine, operation, decoding):
    a scoring request gets the candidates' log-probabilities (float64 array), a generation
    request its text. Results in request order."""
    out: list[Any] = [None] * len(requests)
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(requests):
        key = (id(r.engine), "score") if r.candidates is not None else (
            id(r.engine), "generate", r.max_new_tokens, r.stop, r.temperature, r.seed)
        groups.setdefault(key, []).append(i)
    for key, idx in groups.items():
        engine = requests[idx[0]].engine
        if key[1] == "score":
            got = engine.score([requests[i].prompt for i in idx], [list(requests[i].candidates) for i in idx])
        else:
            r = requests[idx[0]]
            got = engine.generate([requests[i].prompt for i in idx], max_new_tokens=r.max_new_tokens, stop=r.stop,
                                  temperature=r.temperature, seed=r.seed)
        for i, g in zip(idx, got, strict=True):
            out[i] = g
    return out


@dataclass(frozen=True)
class Resolution:
    """What a batched sub-policy made of its answer: an action, or a retry."""

    action: Any = None
    retry: LLMRequest | None = None
    invalid: bool = False
    """The model's output could not be used (it is counted)."""
    fallback: bool = False
    """Retries ran out: ``action`` is the configured fallback."""


def _words(text: str) -> str:
    """``text`` with its whitespace normalised: how an output or a fallback is matched to an action."""
    return " ".join(text.split())


def _index_of(text: str, actions: Sequence[str]) -> int | None:
    """The index of the action ``text`` is (whitespace aside), None where it is none of them."""
    words = _words(text)
    return next((i for i, a in enumerate(actions) if _words(a) == words), None)


@runtime_checkable
class BatchedSubPolicy(Protocol):
    """A sub-policy whose action comes from a batched model call."""

    def request(self, ctx: Any) -> LLMRequest: ...

    def resolve(self, ctx: Any, request: LLMRequest, reply: Any) -> Resolution: ...


class LLMPolicy:
    """The sub-policy of an LLM option (see the module docstring).

    ``actions(ctx)`` gives the admissible actions as text, and ``to_action(ctx, text)`` the
    env action of one of them (default: its index in the list, for ``Discrete`` spaces);
    ``render(ctx)`` the observation as text (default: ``str(ctx.observation)``);
    ``fallback`` an env action, an action's text (mapped as the model's choice is), or
    ``fallback(ctx)`` giving either. ``retries`` counts generation attempts after the first.
    """

    def __init__(self, engine: LLMEngine, *, actions: Sequence[str] | Callable[[Any], Sequence[str]],
                 description: str = "", milestone: str | None = None, template: str = DEFAULT_TEMPLATE,
                 mode: Literal["score", "generate"] = "score", render: Callable[[Any], str] | None = None,
                 to_action: Callable[[Any, str], Any] | None = None, fallback: Any = None, retries: int = 2,
                 temperature: float = 0.0, max_new_tokens: int = 16, stop: Sequence[str] = ("\n",),
                 name: str = "llm") -> None:
        if mode not in ("score", "generate"):
            raise ValueError(f"LLM option {name!r}: mode must be 'score' or 'generate', got {mode!r}")
        if retries < 0 or max_new_tokens < 1 or not temperature >= 0:
            raise ValueError(f"LLM option {name!r}: need retries >= 0, max_new_tokens >= 1 and temperature >= 0, "
                             f"got {retries}, {max_new_tokens}, {temperature}")
        if mode == "generate" and fallback is None:
            raise ValueError(f"LLM option {name!r}: mode 'generate' needs a fallback action for outputs that "
                             "cannot be used")
        if (isinstance(fallback, str) and to_action is None and not callable(actions)
                and _index_of(fallback, actions) is None):
            raise ValueError(f"LLM option {name!r}: the fallback {fallback!r} is not one of its actions "
                             f"{list(actions)}, and the option has no to_action to make an env action of its text; "
                             "give the env action itself (e.g. its index) or one of the action texts")
        try:
            template.format(description="", milestone="", observation="", actions="", agent="")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"LLM option {name!r}: template {template!r} has an unknown field {exc}; fields: "
                             "description, milestone, observation, actions, agent") from None
        self.engine, self.mode, self.template, self.name = engine, mode, template, name
        self.description, self.milestone = description, milestone
        self._actions, self.render, self.to_action = actions, render, to_action
        self.fallback, self.retries, self.temperature = fallback, retries, temperature
        self.max_new_tokens, self.stop = max_new_tokens, tuple(stop)
        self.__name__ = self.__qualname__ = f"LLMPolicy[{name}]"

    def admissible(self, ctx: Any) -> list[str]:
        got = list(self._actions(ctx) if callable(self._actions) else self._actions)
        if not got or not all(isinstance(a, str) and a.strip() for a in got):
            raise ValueError(f"LLM option {self.name!r}: the admissible actions must be non-empty strings, got {got!r}")
        return got

    def prompt(self, ctx: Any, actions: Sequence[str]) -> str:
        observation = self.render(ctx) if self.render is not None else str(ctx.observation)
        return self.template.format(description=self.description, milestone=self.milestone or "",
                                    observation=observation, actions=", ".join(actions), agent=ctx.agent)

    def request(self, ctx: Any, attempt: int = 0) -> LLMRequest:
        actions = self.admissible(ctx)
        ctx.memory["llm_actions"] = actions
        prompt = self.prompt(ctx, actions)
        if self.mode == "score":
            return LLMRequest(self.engine, prompt, tuple(" " + a for a in actions))
        temperature = self.temperature if attempt == 0 else max(self.temperature, 0.7)  # a retry must differ
        seed = int(ctx.rng.integers(2**31)) if temperature > 0 else 0
        return LLMRequest(self.engine, prompt, None, self.max_new_tokens, self.stop, temperature, seed)

    def resolve(self, ctx: Any, request: LLMRequest, reply: Any) -> Resolution:
        actions: list[str] = ctx.memory["llm_actions"]
        if self.mode == "score":
            scores = np.asarray(reply, dtype=np.float64)
            if self.temperature > 0:
                p = np.exp((scores - scores.max()) / self.temperature)
                k = int(ctx.rng.choice(len(actions), p=p / p.sum()))
            else:
                k = int(np.argmax(scores))
            return Resolution(self._act(ctx, actions, k))
        k = _index_of(str(reply), actions)
        if k is not None:
            ctx.memory.pop("llm_attempt", None)
            return Resolution(self._act(ctx, actions, k))
        attempt = ctx.memory.get("llm_attempt", 0) + 1
        if attempt <= self.retries:
            ctx.memory["llm_attempt"] = attempt
            return Resolution(retry=self.request(ctx, attempt), invalid=True)
        ctx.memory.pop("llm_attempt", None)
        return Resolution(self._fallback(ctx, actions), invalid=True, fallback=True)

    def _fallback(self, ctx: Any, actions: list[str]) -> Any:
        """The fallback as an env action: given as one (an index, ...), or as action text,
        which acts as the model's choice of that text would (``to_action`` of the admissible
        text, else its index); a text not admissible this step goes to ``to_action`` as it is."""
        fallback = self.fallback(ctx) if callable(self.fallback) else self.fallback
        if not isinstance(fallback, str):
            return fallback
        k = _index_of(fallback, actions)
        if k is not None:
            return self._act(ctx, actions, k)
        if self.to_action is not None:
            return self.to_action(ctx, fallback)
        raise ValueError(f"LLM option {self.name!r}: the fallback {fallback!r} is not one of this step's admissible "
                         f"actions {actions}, and the option has no to_action to make an env action of its text; "
                         "give the env action itself (e.g. its index) or an admissible text")

    def _act(self, ctx: Any, actions: list[str], k: int) -> Any:
        return self.to_action(ctx, actions[k]) if self.to_action is not None else k

    def __call__(self, ctx: Any) -> Any:
        """One step alone (outside the batched engine): ask, answer, resolve, retry."""
        request = self.request(ctx)
        while True:
            got = self.resolve(ctx, request, answer([request])[0])
            if got.retry is None:
                return got.action
            request = got.retry

    def __repr__(self) -> str:
        return f"LLMPolicy({self.name!r}, mode={self.mode!r})"


# ---------------------------------------------------------------------------- from YAML
_ENGINES: dict[tuple[str, str, str], LLMEngine] = {}
_LLM_KEYS = {"model", "engine", "device", "mode", "actions", "template", "render", "to_action", "fallback",
             "retries", "temperature", "max_new_tokens", "stop", "description"}


def shared_engine(kind: str, model: str, device: str = "cpu") -> LLMEngine:
    """One engine per (kind, model directory, device) in a process: the options of a
    library that name the same model share its weights and its batched calls."""
    from pathlib import Path

    from gyre_ma.llm.factory import make_engine

    key = (kind, str(Path(model).resolve()), device)
    if key not in _ENGINES:
        _ENGINES[key] = make_engine(kind, model, **({"device": device} if kind == "transformers" else {}))  # type: ignore[arg-type]
    return _ENGINES[key]


_REFERENCE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
"""A ``module:callable`` reference, as a YAML entry writes one."""


def policy_from_spec(spec: Any, *, name: str, milestone: str | None, graph: Any, where: str) -> LLMPolicy:
    """An option library entry's ``llm:`` mapping → its :class:`LLMPolicy`:

    ``model`` (a local directory), ``engine`` (``transformers`` | ``vllm``), ``device``,
    ``mode`` (``score`` | ``generate``), ``actions`` (a list of texts or ``module:callable``
    of ctx), ``template``, ``render`` / ``to_action`` / ``fallback`` (``module:callable``; a
    fallback may also be a plain action), ``retries``, ``temperature``, ``max_new_tokens``,
    ``stop``, ``description`` (default: the milestone's description in the task graph)."""
    from gyre_ma.options.library import resolve
    from gyre_ma.options.option import check_callable

    if not isinstance(spec, dict):
        raise ValueError(f"{where}: expected a mapping, got {spec!r}")
    unknown = set(spec) - _LLM_KEYS
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}; accepted: {sorted(_LLM_KEYS)}")
    if "model" not in spec or "actions" not in spec:
        raise ValueError(f"{where}: 'model' (a local model directory) and 'actions' are required")

    def ref(key: str) -> Any:  # a module:callable reference; any other string is itself (a fallback "note: key")
        value = spec.get(key)
        return resolve(value, f"{where}.{key}") if isinstance(value, str) and _REFERENCE.match(value) else value

    actions = ref("actions")
    if not callable(actions) and not (isinstance(actions, list) and actions):
        raise ValueError(f"{where}.actions: expected a list of action texts or module:callable, got {actions!r}")
    description = spec.get("description")
    if description is None and milestone is not None and milestone in graph:
        description = graph.milestone(milestone).description or milestone
    render, to_action, fallback = ref("render"), ref("to_action"), ref("fallback")  # their errors name themselves
    try:
        check_callable(name, "llm.actions", actions if callable(actions) else None)
        check_callable(name, "llm.render", render)
        check_callable(name, "llm.to_action", to_action, 2, "an OptionContext and one admissible action's text")
        check_callable(name, "llm.fallback", fallback if callable(fallback) else None)
        engine = shared_engine(str(spec.get("engine", "transformers")), str(spec["model"]),
                               str(spec.get("device", "cpu")))
        return LLMPolicy(engine, actions=actions, description=description or name, milestone=milestone,
                         template=spec.get("template", DEFAULT_TEMPLATE), mode=spec.get("mode", "score"),
                         render=render, to_action=to_action, fallback=fallback,
                         retries=int(spec.get("retries", 2)), temperature=float(spec.get("temperature", 0.0)),
                         max_new_tokens=int(spec.get("max_new_tokens", 16)), stop=tuple(spec.get("stop", ("\n",))),
                         name=name)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
