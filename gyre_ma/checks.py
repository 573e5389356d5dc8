"""Checking a user's setup end to end: the environment, driven by its own option library."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.envs.checks import EnvCheckError, EnvCheckReport, check_env
from gyre_ma.options.decision import Manager
from gyre_ma.options.errors import UserCodeError
from gyre_ma.options.library import OptionLibrary
from gyre_ma.rewards.rules import RuleEngine, RuleResults
from gyre_ma.rollout import Trajectory, run_episode


def check_setup(env: Any | Callable[[], Any], library: OptionLibrary, *,
                manager: Callable[[Any, int], Manager] | None = None, rules: RuleEngine | None = None,
                rule_results: list[RuleResults] | None = None, played: list[Trajectory] | None = None,
                on_fault: str = "stop", own_caps: bool = False, **kwargs: Any) -> EnvCheckReport:
    """:func:`~gyre_ma.envs.checks.check_env` with every episode played by ``library``'s
    options under a seeded random manager, which reaches milestones random actions rarely
    do, or under ``manager(env, seed)`` (a config's oracle or scripted manager, built on the
    env it plays); ``kwargs`` go to ``check_env`` (``seeds``, ``n_steps``, ``module``, ...).
    ``rules`` (a config's rule engine) are evaluated on every episode played, as a rollout
    worker evaluates them, so that a rule that cannot read the env's state fails here; each
    episode's results are appended to ``rule_results``, and each episode to ``played``.
    ``on_fault`` is ``backend.on_fault``: with ``continue`` an episode plays on through a
    fault of the user's code, as in training, and one the env's fault cut is not replayed.
    With ``own_caps`` an episode runs to the env's own ``max_cycles`` as it stands after the
    episode's reset (an adapter's cap per episode), not to ``n_steps``."""
    build = manager if manager is not None else (lambda _env, seed: RandomManager(seed))

    def drive(probe: Any, seed: int, n_steps: int) -> bool:
        try:
            traj = run_episode(probe, library, build(probe, seed), seed=seed, max_steps=None if own_caps else n_steps,
                               on_option_end=rules.on_option_end if rules is not None else None, on_fault=on_fault)
            if played is not None:
                played.append(traj)
            if rules is not None:
                found = rules.end_episode(traj, probe)
                if rule_results is not None:
                    rule_results.append(found)
        except UserCodeError as exc:  # the probe's finding, which the rollout took for the env raising
            if isinstance(exc.error, EnvCheckError):
                raise exc.error from None
            exc.name_task_seed(seed)  # as training names it: found again by --seed
            raise
        return traj.cut_by_fault

    return check_env(env, library=library, drive=drive, **kwargs)


def manager_rates(env: Any, library: OptionLibrary, managers: Mapping[str, Callable[[int], Manager]], *,
                  seeds: int) -> dict[str, float]:
    """Success rate and mean episode length (primitive steps) of each manager over task
    seeds ``0 .. seeds-1``, as ``<name>_success`` and ``<name>_mean_length``; a manager
    is built per seed by ``managers[name](seed)`` (an oracle against a random order, say)."""
    out: dict[str, float] = {}
    for name, build in managers.items():
        runs = [run_episode(env, library, build(seed), seed=seed) for seed in range(seeds)]
        out[f"{name}_success"] = float(np.mean([t.success for t in runs]))
        out[f"{name}_mean_length"] = float(np.mean([t.length for t in runs]))
    return out
