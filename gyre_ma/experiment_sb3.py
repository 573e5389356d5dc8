"""Stable-Baselines3 PPO as an experiment variant: the single-agent learner from outside.

A variant with an ``sb3`` mapping (:class:`SB3Spec`) trains SB3's PPO instead of running
``gyre-ma train``: on the run's environment (the base config's ``env``, with the variant's
overrides) seen through :func:`~gyre_ma.envs.adapters.to_gymnasium`, so it needs a
one-agent env, every primitive step a decision and no options. Its run directory holds
what the report reads from a gyre-ma run: ``config.yaml``, ``metrics.csv`` (per rollout:
``env_steps``, the ``success_rate`` and ``episode_length`` of the episodes that ended in
it) and ``eval.json`` (the final policy on held-out task seeds, sampled and deterministic
as greedy). Training episodes draw gyre-ma's training task seeds
(:func:`~gyre_ma.roles.task_seed`), so no held-out seed is trained on. The run keeps a
checkpoint of SB3's own (``checkpoints/sb3.zip`` and ``checkpoints/sb3.json``) every
``checkpoint_every`` PPO iterations and at the end: a killed SB3 run resumes from the last
one, its metrics rows after it dropped (the resumed run is not bit-identical to an
uninterrupted one: the episodes in progress at the checkpoint start again). Its child process:
``python -m gyre_ma.experiment_run RUN_DIR --sb3 JSON --train-seed S --episodes N --seed S``.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import gymnasium
from pydantic import BaseModel, ConfigDict, Field

from gyre_ma.config import load_config
from gyre_ma.files import atomic_write, write_json


class SB3Spec(BaseModel):
    """Stable-Baselines3 PPO's budget and hyperparameters (the defaults: 16 envs × 256 steps
    an update, the managers' γ, an entropy bonus SB3 leaves at 0)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True, allow_inf_nan=False)

    env_steps: int = Field(ge=1, le=10**12)
    """Env steps to train for (all envs together)."""
    n_envs: int = Field(16, ge=1, le=1024)
    """Envs stepped together (SB3's ``DummyVecEnv``)."""
    n_steps: int = Field(256, ge=1)
    """Steps per env between updates."""
    batch_size: int = Field(512, ge=1)
    """Minibatch size."""
    n_epochs: int = Field(4, ge=1, le=1000)
    """Passes over each rollout."""
    gamma: float = Field(0.995, gt=0, le=1)
    """Discount."""
    ent_coef: float = Field(0.01, ge=0)
    """Entropy bonus."""
    learning_rate: float = Field(3e-4, gt=0)
    """Adam's step size."""
    checkpoint_every: int = Field(50, ge=1)
    """PPO iterations between checkpoints (a kill loses at most these)."""


CHECKPOINT = Path("checkpoints") / "sb3.zip"
STATE = Path("checkpoints") / "sb3.json"
"""Written after the model: its presence marks a checkpoint complete (iteration, env steps,
each env's episode count)."""


def train(run_dir: Path, spec: SB3Spec, seed: int) -> Any:
    """Train PPO on the env of ``run_dir/config.yaml`` (resuming from its checkpoint where it
    has one); ``metrics.csv`` gets a row per PPO iteration."""
    import json

    import numpy as np
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv

    from gyre_ma.monitor import Monitor

    torch.set_num_threads(1)
    config = load_config(run_dir / "config.yaml")
    envs = DummyVecEnv([lambda k=k: TrainingSeeds(_single_agent(config), seed, k) for k in range(spec.n_envs)])
    state = json.loads((run_dir / STATE).read_text()) if (run_dir / STATE).is_file() else None
    if state is None:
        hyper = spec.model_dump(exclude={"env_steps", "n_envs", "checkpoint_every"})
        model = PPO("MlpPolicy", envs, seed=seed, device="cpu", verbose=0, **hyper)
        monitor = Monitor(run_dir)
    else:
        model = PPO.load(run_dir / CHECKPOINT, env=envs, device="cpu")
        model.num_timesteps = int(state["env_steps"])
        for env, episodes in zip(envs.envs, state["episodes"], strict=True):
            env.episodes = int(episodes)
        monitor = Monitor(run_dir, resume_at=int(state["iteration"]))

    def save(iteration: int) -> None:
        archive = io.BytesIO()
        model.save(archive)
        atomic_write(run_dir / CHECKPOINT, archive.getvalue())
        write_json(run_dir / STATE, {"iteration": iteration, "env_steps": int(model.num_timesteps),
                                     "episodes": [env.episodes for env in envs.envs]})

    class Curve(BaseCallback):
        """Success and length of the episodes that ended in each rollout, one metrics row
        each, and a checkpoint every ``checkpoint_every`` rows."""

        def __init__(self, first: int) -> None:
            super().__init__()
            self.ended: list[tuple[bool, int]] = []
            self.rollouts = first

        def _on_step(self) -> bool:
            for done, info in zip(self.locals["dones"], self.locals["infos"], strict=True):
                if done:
                    self.ended.append((bool(info["success"]), int(info["length"])))
            return True

        def _on_rollout_end(self) -> None:
            row: dict[str, float] = {"iteration": self.rollouts, "env_steps": self.num_timesteps}
            if self.ended:
                row |= {"success_rate": float(np.mean([s for s, _ in self.ended])),
                        "episode_length": float(np.mean([n for _, n in self.ended])), "episodes": len(self.ended)}
            monitor.log(row, step=self.num_timesteps)
            self.ended, self.rollouts = [], self.rollouts + 1
            if self.rollouts % spec.checkpoint_every == 0:
                save(self.rollouts)

    curve = Curve(0 if state is None else int(state["iteration"]))
    remaining = spec.env_steps - model.num_timesteps
    if remaining > 0:
        model.learn(total_timesteps=remaining, callback=curve, reset_num_timesteps=state is None)
        save(curve.rollouts)
    return model


def evaluate(run_dir: Path, model: Any, *, episodes: int, seed: int) -> dict[str, Any]:
    """The trained policy on ``episodes`` held-out task seeds from ``seed``, sampled and
    deterministic (``greedy``); writes and returns ``eval.json`` in the format of
    :func:`gyre_ma.experiment.evaluate_run` (without option calls: there are none)."""
    from gyre_ma.metrics import heldout_result

    env = _single_agent(load_config(run_dir / "config.yaml"))
    out: dict[str, Any] = {"checkpoint": "sb3 (final)", "episodes": episodes, "first_seed": seed}
    for mode, deterministic in (("sampled", False), ("greedy", True)):
        played = []
        for i in range(episodes):
            obs, info = env.reset(seed=seed + i)
            length, done = 0, False
            while not done:
                action, _ = model.predict(obs, deterministic=deterministic)
                obs, _, terminated, truncated, info = env.step(int(action))
                length, done = length + 1, terminated or truncated
            played.append((bool(info["success"]), length))
        out[mode] = heldout_result(played)
    write_json(run_dir / "eval.json", out)
    return out


def _single_agent(config: Any) -> Any:
    from gyre_ma.envs.adapters import to_gymnasium
    from gyre_ma.envs.registry import make_env

    env = make_env(config.env.id, **config.env.kwargs)
    if len(env.possible_agents) != 1:
        raise ValueError(f"an sb3 variant trains a single-agent learner and needs a one-agent env; env "
                         f"{config.env.id!r} has agents {list(env.possible_agents)} (set its agent count in "
                         "env.kwargs, e.g. n_agents: 1, in the variant or the overrides)")
    return to_gymnasium(env)


class TrainingSeeds(gymnasium.Wrapper):
    """Every reset draws the next training task seed of (run seed, env index), and ``info``
    carries the episode's length: SB3 resets without a seed, which would leave the tasks to
    the env's own generator, and held-out seeds could come up."""

    def __init__(self, env: gymnasium.Env, seed: int, index: int) -> None:
        super().__init__(env)
        self.run_seed, self.index, self.episodes, self.length = seed, index, 0, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        from gyre_ma.roles import task_seed

        self.episodes, self.length = self.episodes + 1, 0
        return self.env.reset(seed=task_seed(self.run_seed, self.episodes, self.index), options=options)

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.length += 1
        return obs, reward, terminated, truncated, info | {"length": self.length}

