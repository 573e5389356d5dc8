"""Pre-training a neural option on its own milestone, before the manager learns to order it.

:func:`pretrain_option` plays whole episodes of the task in which a *drill* manager
chooses the option being trained whenever it is eligible for an agent (other choices: a
``guide`` manager's, e.g. an oracle, or a uniformly random eligible option), so its calls
start where the manager would start them: after the prerequisites its task graph names.
Each call of the option is one trial: it succeeds when its call verifies the option's
milestone (a repeatable option without one: when it ends by its ``done`` condition), and
a call whose milestone another agent verified first is no trial at all; a success
scores ``1 - length_weight * steps / max_steps`` then, 0 otherwise, so shorter successes
score higher. The network (:class:`~gyre_ma.agents.subpolicy.NeuralSubPolicy`) samples its
actions while it trains and is updated by REINFORCE with the batch's mean score as the
baseline and an entropy bonus, one Adam step per batch of episodes. Everything is seeded:
the same arguments give the same weights.

After training, the frozen network is measured on ``check_episodes`` held-out task seeds
(from ``check_seed``, which training never plays), once acting greedily and once sampling,
under the same drill: a network trained by sampling may do far worse greedily (a greedy
walker can loop between two cells forever), or better. It then acts in the mode that
scored higher (``sample``), which :meth:`~gyre_ma.agents.subpolicy.NeuralSubPolicy.save`
records, so a library entry that does not say ``sample`` acts as measured best. Save it and
declare it in the library the manager trains over (``kind: neural``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.agents.subpolicy import NeuralSubPolicy, draw, for_space
from gyre_ma.options.decision import Choice, Decision, Manager
from gyre_ma.options.library import OptionLibrary
from gyre_ma.options.option import OptionContext, Termination
from gyre_ma.rollout import OptionCall, run_episode


@dataclass
class PretrainResult:
    policy: NeuralSubPolicy
    history: list[dict[str, float]] = field(default_factory=list)
    """Per batch: ``calls`` of the option, their ``success`` rate and mean ``steps``, the
    mean ``score``, the policy's mean ``entropy`` over its steps, and ``episodes`` so far."""
    check: dict[str, dict[str, float]] = field(default_factory=dict)
    """The frozen network on the held-out seeds, ``greedy`` and ``sampled``: ``calls``,
    ``success``, ``steps`` and ``score`` as in :attr:`history`; empty with no check."""


class _Trials:
    """The option's sub-policy while it trains: samples from the network with the call's
    generator and keeps each call's (features, action) steps until the call ends."""

    def __init__(self, policy: NeuralSubPolicy) -> None:
        self.policy = policy
        self.open: dict[str, list[tuple[np.ndarray, int]]] = {}
        """Agent → the steps of its call in progress."""
        self.__name__ = self.__qualname__ = f"training:{policy.name}"

    @torch.inference_mode()
    def __call__(self, ctx: OptionContext) -> int:
        x = self.policy.features(ctx)
        action = draw(self.policy.logits(x), ctx.rng)
        if ctx.steps == 0:
            self.open[ctx.agent] = []
        self.open[ctx.agent].append((x, action))
        return self.policy.start + action


class _Drill:
    """Chooses ``target`` whenever it is eligible; otherwise asks ``guide`` (default: a
    seeded uniformly random eligible option, :class:`~gyre_ma.agents.baselines.RandomManager`)."""

    def __init__(self, target: int, guide: Manager | None, seed: int) -> None:
        self.target, self.guide = target, guide if guide is not None else RandomManager(seed)

    def decide(self, decisions: Sequence[Decision]) -> list[Choice]:
        return [Choice(self.target) if d.mask[self.target] else self.guide.decide([d])[0] for d in decisions]

    def episode_start(self, env: Any, seed: int) -> None:
        if callable(getattr(self.guide, "episode_start", None)):
            self.guide.episode_start(env, seed)

    def option_end(self, call: OptionCall, env: Any) -> None:
        if callable(getattr(self.guide, "option_end", None)):
            self.guide.option_end(call, env)


def pretrain_option(env: Any, library: OptionLibrary, option: str, *, policy: NeuralSubPolicy | None = None,
                    episodes: int = 2000, batch_episodes: int = 16, lr: float = 3e-3, entropy_coef: float = 0.01,
                    length_weight: float = 0.5, guide: Manager | None = None, seed: int = 0, hidden: int = 64,
                    max_steps: int | None = None, check_episodes: int = 100, check_seed: int = 1_000_000,
                    on_batch: Callable[[dict[str, float]], None] | None = None) -> PretrainResult:
    """Train a neural sub-policy for ``library``'s option ``option`` on ``env`` (a gyre env:
    the task the option will serve in, or an easier variant of it). ``policy``: the network
    to train (default: a copy of the option's own if it is neural already, else a new one
    shaped for the first agent's spaces, ``hidden`` wide).
    ``episodes`` in batches of ``batch_episodes``; task seeds ``seed, seed + 1, ...``.
    ``max_steps`` caps each episode's primitive steps (default: the env's own). Then
    ``check_episodes`` held-out episodes from ``check_seed`` in each mode (0: none, and the
    network acts greedily, or as ``policy`` was built)."""
    if option not in library.names:
        raise ValueError(f"pretrain_option: library {library.name!r} has no option {option!r}; "
                         f"options: {library.names}")
    for key, value, low in (("episodes", episodes, 1), ("batch_episodes", batch_episodes, 1),
                            ("check_episodes", check_episodes, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"pretrain_option: {key} must be an int >= {low}, got {value!r}")
    if check_episodes and check_seed < seed + episodes and seed < check_seed + check_episodes:
        raise ValueError(f"pretrain_option: the check's seeds [{check_seed}, {check_seed + check_episodes}) overlap "
                         f"training's [{seed}, {seed + episodes}); choose a check_seed outside them")
    if not 0.0 <= length_weight < 1.0:
        raise ValueError(f"pretrain_option: length_weight must be in [0, 1), got {length_weight!r}")
    target = library.index(option)
    spec = library[target]
    agent = env.possible_agents[0]
    if policy is None and isinstance(spec.policy, NeuralSubPolicy):  # trained before: go on from its weights
        policy = copy.deepcopy(spec.policy)
    if policy is None:
        policy = for_space(env.observation_space(agent), env.action_space(agent), name=option, hidden=hidden,
                           seed=seed)
    trials = _Trials(policy)
    drilled = _with_policy(library, target, trials)
    drill = _Drill(target, guide, seed)
    optimizer = torch.optim.Adam(policy.net.parameters(), lr=lr)
    finished: list[tuple[list[tuple[np.ndarray, int]], float, bool, int]] = []

    def steps_of(call: OptionCall) -> list[tuple[np.ndarray, int]] | None:
        return trials.open.pop(call.agent, None)

    result = PretrainResult(policy)
    played = 0
    policy.net.train()
    try:
        while played < episodes:
            finished.clear()
            for _ in range(min(batch_episodes, episodes - played)):
                trials.open.clear()
                _drill_episode(env, drilled, target, drill, seed + played, max_steps, steps_of, length_weight,
                               finished)
                played += 1
            result.history.append(row := _update(policy, optimizer, finished, entropy_coef) | {"episodes": played})
            if on_batch is not None:
                on_batch(row)
    finally:
        policy.net.eval()
    if check_episodes:
        for mode in ("greedy", "sampled"):
            frozen = copy.deepcopy(policy)
            frozen.sample = mode == "sampled"
            checked = _with_policy(library, target, frozen)
            trials_of: list[tuple[range, float, bool, int]] = []
            checker = _Drill(target, guide, check_seed)
            for k in range(check_episodes):  # a network acts at every step of its call: its steps are the call's
                _drill_episode(env, checked, target, checker, check_seed + k, max_steps,
                               lambda call: range(call.duration), length_weight, trials_of)
            result.check[mode] = _summary(trials_of)
        scores = {mode: row["score"] for mode, row in result.check.items()}
        policy.sample = bool(scores["sampled"] > scores["greedy"])  # NaN (no call): greedy
    return result


def _with_policy(library: OptionLibrary, target: int, policy: Any) -> OptionLibrary:
    """``library`` with ``policy`` as option ``target``'s sub-policy."""
    return OptionLibrary(library.name, library.graph,
                         [dataclasses.replace(o, policy=policy) if i == target else o for i, o in enumerate(library)])


def _drill_episode(env: Any, drilled: OptionLibrary, target: int, drill: _Drill, seed: int, max_steps: int | None,
                   steps_of: Callable[[OptionCall], Any], length_weight: float,
                   finished: list[tuple[Any, float, bool, int]]) -> None:
    """One episode of ``drilled`` (the library with the sub-policy under training or check
    as option ``target``'s); each call of it that took a step and was not beaten to its
    milestone by another agent is appended to ``finished`` as (its steps, score, success,
    length)."""
    spec = drilled[target]

    def ended(call: OptionCall, env_now: Any) -> None:
        steps = steps_of(call) if call.option == target else None
        taken = (spec.milestone is not None and spec.milestone not in call.milestones
                 and spec.milestone in env_now.verified_milestones())  # another agent got there first
        if steps and not taken:  # a call that took no step (blocked at once) teaches nothing
            won = (spec.milestone in call.milestones if spec.milestone is not None
                   else call.termination is Termination.DONE)
            score = 1.0 - length_weight * len(steps) / spec.max_steps if won else 0.0
            finished.append((steps, score, won, len(steps)))

    run_episode(env, drilled, drill, seed=seed, max_steps=max_steps, on_option_end=ended)


def _summary(finished: list[tuple[Any, float, bool, int]]) -> dict[str, float]:
    """Calls, success rate, mean steps and mean score of a list of finished calls."""
    if not finished:
        return {"calls": 0.0, "success": float("nan"), "steps": float("nan"), "score": float("nan")}
    return {"calls": float(len(finished)), "success": float(np.mean([won for _, _, won, _ in finished])),
            "steps": float(np.mean([n for *_, n in finished])), "score": float(np.mean([s for _, s, _, _ in finished]))}


def _update(policy: NeuralSubPolicy, optimizer: torch.optim.Optimizer,
            finished: list[tuple[list[tuple[np.ndarray, int]], float, bool, int]],
            entropy_coef: float) -> dict[str, float]:
    """One REINFORCE step on the batch's calls: each step's advantage is its call's score
    less the batch's mean score (the per-step mean over the batch's steps is the loss)."""
    if not finished:
        return _summary(finished) | {"entropy": float("nan")}
    baseline = float(np.mean([score for _, score, _, _ in finished]))
    x = torch.from_numpy(np.stack([f for steps, *_ in finished for f, _ in steps]))
    actions = torch.tensor([a for steps, *_ in finished for _, a in steps])
    advantage = torch.tensor([score - baseline for steps, score, _, _ in finished for _ in steps],
                             dtype=torch.float32)
    log_probs = torch.log_softmax(policy.logits(x), -1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    loss = -(advantage * log_probs[torch.arange(len(actions)), actions]).mean() - entropy_coef * entropy.mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return _summary(finished) | {"entropy": float(entropy.mean().detach())}
