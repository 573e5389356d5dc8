"""Environment ids → factories for the env, its scripted option library and its oracle."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

from gyre_ma.options.errors import callable_name, parameters_of, user_call
from gyre_ma.options.library import OptionLibrary, resolve


@dataclass(frozen=True)
class EnvSpec:
    env: str
    """``module:callable`` returning the native ParallelEnv."""
    library: str
    """``module:callable`` returning the scripted OptionLibrary (given ``env=`` if it takes it)."""
    oracle: str | None = None
    """``module:callable`` returning the oracle Manager (given ``env=``/``library=`` if taken)."""


ENVIRONMENTS: dict[str, EnvSpec] = {
    "techtree_v0": EnvSpec(
        env="gyre_ma.envs.techtree_v0:parallel_env",
        library="gyre_ma.envs.techtree.options:make_library",
        oracle="gyre_ma.envs.techtree.oracle:OracleManager",
    ),
    "workflow_v0": EnvSpec(
        env="gyre_ma.envs.workflow_v0:parallel_env",
        library="gyre_ma.envs.workflow.options:make_library",
        oracle="gyre_ma.envs.workflow.oracle:OracleManager",
    ),
    "coverage_v0": EnvSpec(
        env="gyre_ma.envs.coverage_v0:parallel_env",
        library="gyre_ma.envs.coverage.options:make_library",
        oracle="gyre_ma.envs.coverage.oracle:OracleManager",
    ),
    "scienceworld_v0": EnvSpec(
        env="gyre_ma.envs.scienceworld_env:make_env",
        library="gyre_ma.envs.scienceworld_env:make_library",
        oracle="gyre_ma.envs.scienceworld_env:OracleManager",
    ),
}


def _call(factory: Any, where: str, **available: Any) -> Any:
    """Call a factory with those of ``available`` (``env``, ``library``) it takes by name."""
    params = parameters_of(factory)
    required = [n for n, p in params.items()
                if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                and n not in available]
    if required:
        raise ValueError(f"{where}: factory {factory!r} must take no required argument but "
                         f"{sorted(available)}, got {required}")
    return user_call(factory, where, **{k: v for k, v in available.items() if k in params})


def make_env(env_id: str, **kwargs: Any) -> Any:
    """Build a native ParallelEnv from a registered id or a ``module:callable``."""
    if env_id in ENVIRONMENTS:
        factory = resolve(ENVIRONMENTS[env_id].env, "env.id")
    elif ":" in env_id:
        factory = resolve(env_id, "env.id")
    else:
        raise ValueError(
            f"env.id: unknown environment {env_id!r}; registered: {sorted(ENVIRONMENTS)} "
            "(or give 'module:callable')"
        )
    env = user_call(factory, f"env.id {env_id!r} (env.kwargs)", **kwargs)
    if not hasattr(env, "possible_agents") or not callable(getattr(env, "step", None)):
        raise ValueError(f"env.id: {env_id!r} built {type(env).__name__}, expected a PettingZoo ParallelEnv "
                         "(possible_agents, reset, step)")
    if not callable(getattr(env, "verified_milestones", None)):
        raise ValueError(f"env.id: {env_id!r} built {type(env).__name__}, which has no verified_milestones() method "
                         "(the milestones it has verified, checked on its own state): wrap a PettingZoo or "
                         "Gymnasium env with gyre_ma.envs.adapters.from_pettingzoo / from_gymnasium and its "
                         "milestone detectors")
    return env


def make_library(env_id: str, env: Any, source: str | None = None,
                 kwargs: dict[str, Any] | None = None) -> OptionLibrary:
    """The option library: ``source`` (YAML or ``module:callable``) or the env's own, its
    factory called with ``kwargs`` (the config's ``library_kwargs``)."""
    kwargs = dict(kwargs or {})
    if source is not None:
        library = OptionLibrary.load(source, **{"env": env, **kwargs})  # a library_kwargs "env" wins
    elif env_id in ENVIRONMENTS:
        base = resolve(ENVIRONMENTS[env_id].library, "library")
        try:
            inspect.signature(base).bind_partial(**kwargs)
        except TypeError as exc:
            raise ValueError(f"library_kwargs: the {env_id} library rejected the arguments {sorted(kwargs)} "
                             f"({exc})") from None
        library = _call(functools.partial(base, **kwargs), f"library_kwargs (the {env_id} library)", env=env)
    else:
        raise ValueError(f"library: environment {env_id!r} has no built-in library; set 'library'")
    library.validate()
    same_milestones(library, env, f"library {source or env_id!r}")
    fits_agents(library, env, f"library {source or env_id!r}")
    return library


def fits_agents(library: OptionLibrary, env: Any, where: str) -> None:
    """Refuse an option whose sub-policy says it cannot act for any of ``env``'s agents (a
    neural one for a continuous action space, or built for other spaces: ``misfit``),
    before a first step fails on its action."""
    for option in library:
        misfit = getattr(option.policy, "misfit", None)
        if not callable(misfit):
            continue
        why = {a: misfit(env.observation_space(a), env.action_space(a)) for a in env.possible_agents}
        if all(why.values()):
            agent, reason = next(iter(why.items()))
            others = f" (nor for any other of {list(why)})" if len(why) > 1 else ""
            raise ValueError(f"{where}: option {option.name!r} cannot act for agent {agent!r}{others}: its "
                             f"sub-policy {callable_name(option.policy)} {reason}")


def same_milestones(library: OptionLibrary, env: Any, where: str) -> None:
    """Refuse a library built on other milestones than ``env.task_graph()``'s: a node the env
    never verifies (a goal's name misspelt) leaves every episode unfinished, and training
    reports 0 % success rather than an error."""
    task_graph = getattr(env, "task_graph", None)
    if not callable(task_graph):
        return
    theirs = set(user_call(task_graph, "env.task_graph()").names)
    ours = set(library.graph.names)
    if ours == theirs:
        return
    parts = []
    if ours - theirs:
        parts.append(f"the env never verifies {sorted(ours - theirs)}")
    if theirs - ours:
        parts.append(f"the library's graph lacks {sorted(theirs - ours)}")
    raise ValueError(f"{where}: its task graph's milestones are not the env's: {'; '.join(parts)} "
                     f"(env.task_graph() has {sorted(theirs)}); build the library on the env's own task_graph(), "
                     "or name its milestones as the env does")


def has_oracle(env_id: str) -> bool:
    """Whether ``env_id`` is a registered env with an oracle manager of its own."""
    spec = ENVIRONMENTS.get(env_id)
    return spec is not None and spec.oracle is not None


def make_oracle(env_id: str, env: Any, library: OptionLibrary, source: str | None = None) -> Any:
    """The env's oracle manager, choosing among ``library``'s options; ``source`` (a
    ``module:callable`` taking any of ``env``, ``library`` by name) supplies one for any env."""
    if source is not None:
        manager = _call(resolve(source, "manager.policy"), "manager.policy", env=env, library=library)
    else:
        spec = ENVIRONMENTS.get(env_id)
        if spec is None or spec.oracle is None:
            raise ValueError(f"manager.kind: environment {env_id!r} has no built-in oracle manager; set "
                             "manager.policy to a 'module:callable' that builds one (kind 'scripted')")
        manager = _call(resolve(spec.oracle, "oracle"), "oracle", env=env, library=library)
    if not callable(getattr(manager, "decide", None)):
        raise TypeError(f"manager.policy: {source or env_id!r} built {type(manager).__name__}, which has no "
                        "decide(decisions) -> list[Choice] method (the Manager protocol)")
    return manager
