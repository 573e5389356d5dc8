"""Neural options: an option whose sub-policy is a small network over its agent's observation.

A library mixes them freely with scripted and LLM-backed options; the manager orders them
all alike. :class:`NeuralSubPolicy` maps the agent's observation (an array, flattened to
float32) through a layer-normalised tanh MLP to logits over a ``Discrete`` action space. It
acts greedily (the argmax, so a frozen option is deterministic) or, with ``sample``, draws
from its softmax with the episode's generator (``ctx.rng``), so a run stays reproducible;
pre-training measures both and saves the better (a file records which).

The usual life of one: built untrained for an option, trained on that option's own
milestone (:func:`gyre_ma.pretrain.pretrain_option`, or ``gyre-ma pretrain-option``),
saved (:meth:`NeuralSubPolicy.save`: a ``weights_only`` file, data only), then frozen and
declared in a library, in Python (``Option(name, NeuralSubPolicy.load(path), milestone=...)``)
or in YAML::

    - name: go_to_0
      milestone: covered_0
      kind: neural
      neural: {weights: go_to_0.pt}     # also: sample: true | false (default: as saved)

The manager's updates never touch it: its weights are its own, not the manager's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from gyre_ma.agents.manager import mlp_body
from gyre_ma.options.option import OptionContext

FORMAT = "gyre-ma neural sub-policy v1"
"""The ``format`` entry of a saved sub-policy."""


def draw(logits: Tensor, rng: np.random.Generator) -> int:
    """An index drawn from ``softmax(logits)`` with one uniform of ``rng``."""
    probs = torch.softmax(logits.double(), -1).numpy()
    return int(min(np.searchsorted(np.cumsum(probs), rng.random() * probs.sum()), len(probs) - 1))


class NeuralSubPolicy:
    """An option's sub-policy: observation → one of ``actions`` primitive actions (an
    integer from ``start``). ``name`` labels its errors (the option's name)."""

    def __init__(self, observation_dim: int, actions: int, *, start: int = 0, hidden: int = 64, layers: int = 2,
                 sample: bool = False, name: str = "neural", seed: int = 0) -> None:
        for key, value, low in (("observation_dim", observation_dim, 1), ("actions", actions, 2),
                                ("hidden", hidden, 1), ("layers", layers, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"neural sub-policy {name!r}: {key} must be an int >= {low}, got {value!r}")
        self.observation_dim, self.actions, self.start = observation_dim, actions, int(start)
        self.hidden, self.layers, self.sample, self.name = hidden, layers, bool(sample), name
        with torch.random.fork_rng(devices=[]):  # seeded weights; the caller's RNG stream untouched
            torch.manual_seed(seed)
            self.net = nn.Sequential(*mlp_body(observation_dim, hidden, layers), nn.Linear(hidden, actions))
        self.net.eval()
        self.__name__ = self.__qualname__ = f"neural:{name}"  # how errors name a sub-policy

    # ------------------------------------------------------------------ acting
    def features(self, ctx: OptionContext) -> np.ndarray:
        """The agent's observation as a flat float32 vector of ``observation_dim``."""
        obs = ctx.observation
        try:
            x = np.asarray(obs, dtype=np.float32).reshape(-1)
        except (TypeError, ValueError):
            x = None
        if x is None:
            got = type(obs).__name__
        elif x.shape[0] != self.observation_dim:
            got = f"{x.shape[0]} values"
        elif not np.isfinite(x).all():
            got = f"{x.shape[0]} values, not all finite"
        else:
            return x
        raise ValueError(f"neural sub-policy {self.name!r} (agent {ctx.agent!r}): expected an observation of "
                         f"{self.observation_dim} finite numbers (an array), got {got}")

    def logits(self, x: np.ndarray | Tensor) -> Tensor:
        return self.net(torch.as_tensor(x, dtype=torch.float32))

    @torch.inference_mode()
    def __call__(self, ctx: OptionContext) -> int:
        logits = self.logits(self.features(ctx))
        return self.start + (draw(logits, ctx.rng) if self.sample else int(logits.argmax()))

    def misfit(self, observation_space: Any, action_space: Any) -> str | None:
        """Why this sub-policy cannot act for an agent of these spaces; None where it can.
        It picks one of ``actions`` integers from ``start``, so the action space must be that
        ``Discrete``; its observation must flatten to ``observation_dim`` numbers."""
        from gymnasium import spaces

        if not isinstance(action_space, spaces.Discrete):
            return (f"acts in a Discrete action space only (a softmax over {self.actions} actions), and the agent "
                    f"acts in {action_space}: write this option as a scripted sub-policy, or give the env a "
                    "Discrete action space (a gymnasium ActionWrapper that maps a few discrete choices to actions)")
        if (int(action_space.n), int(action_space.start)) != (self.actions, self.start):
            return (f"picks one of {self.actions} actions from {self.start}, and the agent's action space is "
                    f"{action_space}")
        shape = getattr(observation_space, "shape", None)
        if shape is not None and int(math.prod(shape)) != self.observation_dim:
            return (f"reads {self.observation_dim} observation values, and the agent's observation space "
                    f"{observation_space} holds {int(math.prod(shape))}")
        return None

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path) -> Path:
        """Write the sub-policy (shape, weights and whether it samples: data only) to ``path``; returns it."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"format": FORMAT, "observation_dim": self.observation_dim, "actions": self.actions,
                    "start": self.start, "hidden": self.hidden, "layers": self.layers, "sample": self.sample,
                    "state_dict": self.net.state_dict()}, path)
        return path

    @classmethod
    def load(cls, path: str | Path, *, sample: bool | None = None, name: str | None = None) -> NeuralSubPolicy:
        """A sub-policy written by :meth:`save` (loaded ``weights_only``: a file holds data, never code).
        ``sample`` None: as saved (pre-training saves the mode it measured better; a file
        from before that: greedy)."""
        path = Path(path)
        label = name or path.stem
        if not path.is_file():
            raise ValueError(f"neural sub-policy {label!r}: weights file {str(path)!r} does not exist")
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - a damaged or foreign file: say which and why
            raise ValueError(f"neural sub-policy {label!r}: cannot read {str(path)!r} ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
        if not isinstance(state, Mapping) or state.get("format") != FORMAT:
            raise ValueError(f"neural sub-policy {label!r}: {str(path)!r} is not a saved sub-policy "
                             f"(expected format {FORMAT!r})")
        policy = cls(int(state["observation_dim"]), int(state["actions"]), start=int(state["start"]),
                     hidden=int(state["hidden"]), layers=int(state["layers"]),
                     sample=bool(state.get("sample", False)) if sample is None else sample, name=label)
        try:
            policy.net.load_state_dict(state["state_dict"])
        except (RuntimeError, KeyError) as exc:
            raise ValueError(f"neural sub-policy {label!r}: {str(path)!r} holds weights of another shape "
                             f"({str(exc).splitlines()[0]})") from None
        return policy

    def __repr__(self) -> str:
        return (f"NeuralSubPolicy({self.name!r}, observation_dim={self.observation_dim}, actions={self.actions}, "
                f"hidden={self.hidden}, layers={self.layers}{', sample' if self.sample else ''})")


def for_space(observation_space: Any, action_space: Any, *, name: str = "neural", **kwargs: Any) -> NeuralSubPolicy:
    """An untrained sub-policy shaped for an agent's observation space (a Box) and action
    space (a Discrete)."""
    from gymnasium import spaces

    if not isinstance(action_space, spaces.Discrete):
        raise ValueError(f"neural sub-policy {name!r}: needs a Discrete action space, got {action_space}")
    shape = getattr(observation_space, "shape", None)
    if not isinstance(observation_space, spaces.Box) or not shape:
        raise ValueError(f"neural sub-policy {name!r}: needs a Box observation space (an array), got "
                         f"{observation_space}")
    return NeuralSubPolicy(int(math.prod(shape)), int(action_space.n), start=int(action_space.start), name=name,
                           **kwargs)


def policy_from_spec(spec: Any, *, name: str, milestone: str | None, graph: Any, where: str) -> NeuralSubPolicy:
    """The sub-policy of a library YAML entry of ``kind: neural``: ``{weights: path, sample:
    bool}`` (a relative path is taken from the working directory; without ``sample``, it acts
    as saved: :meth:`NeuralSubPolicy.load`)."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where}: expected a mapping with 'weights' (a file written by NeuralSubPolicy.save), "
                         f"got {spec!r}")
    unknown = set(spec) - {"weights", "sample"}
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}; accepted: ['sample', 'weights']")
    if not isinstance(spec.get("weights"), str):
        raise ValueError(f"{where}.weights: expected the path of a saved sub-policy, got {spec.get('weights')!r}")
    if not isinstance(spec.get("sample", False), bool):  # absent: as saved
        raise ValueError(f"{where}.sample: expected true or false, got {spec.get('sample')!r}")
    try:
        return NeuralSubPolicy.load(spec["weights"], sample=spec.get("sample"), name=name)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
