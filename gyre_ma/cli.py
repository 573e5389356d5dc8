"""The ``gyre-ma`` command line. User mistakes exit with code 2 and one line, no traceback."""

from __future__ import annotations

import argparse
import contextlib
import dis
import errno
import functools
import json
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:  # the commands import what they use, so --help needs neither numpy nor torch
    from gyre_ma.config import ExperimentConfig

_LOG_WIDTH = 120
"""Columns of output written to a file or pipe (rich's default there is 80, which cut the
names in tables); a terminal's own width otherwise."""
console = Console(stderr=False, highlight=False, width=None if sys.stdout.isatty() else _LOG_WIDTH)
err_console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else _LOG_WIDTH)


class UsageError(ValueError):
    """A mistake in how the command was called."""


def _load_library_and_config(source: str, overrides: dict[str, Any] | None = None,
                             ) -> tuple[Any, ExperimentConfig | None, Any]:
    """A config YAML, a library YAML, or ``module:callable`` → (OptionLibrary, config, env;
    a library alone has neither). A config's env, its library (on the env's milestones),
    oracle or scripted manager and rules are built too, so that a config that loads here
    cannot fail on them in ``train``."""
    from gyre_ma.config import load_config
    from gyre_ma.envs.registry import make_env, make_library, make_oracle
    from gyre_ma.options.library import OptionLibrary, fill_variables
    from gyre_ma.options.yaml_file import read_yaml

    path = Path(source)
    if path.suffix in (".yaml", ".yml") or path.exists():
        data = read_yaml(path, "file", UsageError)
        if isinstance(data, dict) and "options" in data and "graph" in data:  # a library alone
            values = _library_values(overrides or {})
            return OptionLibrary.from_spec(fill_variables(data, values, where=path.name), where=path.name), None, None
        config = load_config(path, overrides)
        env = make_env(config.env.id, **config.env.kwargs)
        library = make_library(config.env.id, env, config.library, config.library_kwargs)
        if config.manager.kind in ("oracle", "scripted"):
            make_oracle(config.env.id, env, library, config.manager.policy)
        if config.curriculum.enabled:  # the oracle that measures its path length
            from gyre_ma.curriculum import Curriculum

            Curriculum.oracle(config, env, library)
        if config.rewards.rules or config.rewards.rules_file:  # their milestones, options and checks
            from gyre_ma.rewards.scorer import RewardScorer

            RewardScorer(config.rewards, library.graph, option_names=library.names)
        if config.manager.kind == "llm" and config.manager.llm.model is not None:
            from gyre_ma.llm.engine import check_model_dir

            check_model_dir(config.manager.llm.model, "manager.llm.model")
        return library, config, env
    return OptionLibrary.load(source), None, None


def _library_values(overrides: dict[str, Any]) -> dict[str, Any]:
    """The values of a library file's ``${name}`` variables from ``--set library_kwargs.name=VALUE``
    (or ``--set library_kwargs={...}``), as a config's ``library_kwargs`` gives them; any other key
    is a usage error, since a library file has no config to override."""
    values: dict[str, Any] = {}
    for key, value in overrides.items():
        if key == "library_kwargs" and isinstance(value, dict):
            values.update(value)
        elif key.startswith("library_kwargs.") and key.count(".") == 1:
            values[key.split(".", 1)[1]] = value
        else:
            raise UsageError(f"--set {key}: a library file takes only library_kwargs.NAME=VALUE (the value of its "
                             "${NAME}); to override other keys, check a config that uses the library")
    return values


_PLAYED_KEYS = ("env", "library", "library_kwargs", "manager", "rewards", "train.max_steps")
"""Config keys (and the sections under them) whose override changes what an episode plays."""


def _under(key: str, sections: Sequence[str]) -> bool:
    """Whether the dotted ``key`` is one of ``sections`` or a key under one."""
    return any(key == s or key.startswith(s + ".") for s in sections)


def _plays(key: str) -> bool:
    """Whether an override of the dotted ``key`` changes what an episode plays."""
    return _under(key, _PLAYED_KEYS)


def cmd_check(args: argparse.Namespace) -> int:
    variants: dict[str, dict[str, Any]] = {}
    if _is_experiment_file(args.source):
        from gyre_ma.experiment import load_experiment

        exp = load_experiment(args.source)  # every run's config, validated
        console.print(f"experiment {exp.spec.name!r}: valid — {len(exp.runs)} runs ({', '.join(exp.spec.variants)} × "
                      f"{len(exp.spec.seed_list)} seeds) on {exp.base}; folder {exp.folder}", markup=False,
                      soft_wrap=True)
        args.source = str(exp.base)  # and the base config's library and graph below
        for run in exp.runs:  # and each variant that plays otherwise, after it
            if run.sb3 is None and any(map(_plays, run.overrides)):
                variants.setdefault(run.variant, run.overrides)
    code = _check_one(args, set_overrides(args.set))
    for variant, overrides in variants.items():
        console.print(f"variant {variant!r} (it changes {sorted(filter(_plays, overrides))}):", markup=False,
                      soft_wrap=True)
        library, config, env = _load_library_and_config(args.source, overrides)
        if args.play:
            _play_check(config, library, env, args.play, args.seed)
    if variants:
        console.print("[green]ok[/green]")
    return code


def _check_one(args: argparse.Namespace, overrides: dict[str, Any]) -> int:
    library, config, env = _load_library_and_config(args.source, overrides)
    graph = library.graph
    length, path = max((graph.critical_path(g) for g in graph.goals), key=lambda found: found[0])  # the longest goal's
    table = Table(title=f"option library {library.name!r}: {len(library)} options")
    for col in ("option", "milestone", "kind", "sub-policy", "max_steps", "exclusive", "starts when"):
        table.add_column(col, overflow="fold")  # a name wraps in its cell rather than lose its end
    for opt in library:
        kind = ("restores" if opt.restores else "repeatable" if opt.repeatable
                else "no milestone" if opt.milestone is None else "one-shot")
        node = graph.milestone(opt.milestone) if opt.milestone is not None else None
        after = [*node.requires, *(f"one of {' / '.join(group)}" for group in node.any_of)] if node else []
        starts = " + ".join(
            ([f"after {', '.join(after)}"] if after else [])
            # __name__: what a factory names the closures it makes
            + ([getattr(opt.initiation, "__name__", type(opt.initiation).__name__)] if opt.initiation is not None
               else [])) or "any time"
        exclusive = {1: "yes", None: "—"}.get(opt.capacity, f"≤ {opt.capacity} agents")
        table.add_row(opt.name, opt.milestone or "—", kind, _sub_policy(opt.policy), str(opt.max_steps), exclusive,
                      starts)
    console.print(table)
    console.print(
        f"task graph: {len(graph)} milestones, goals {list(graph.goals)}; "
        f"critical path {length:g} step{'' if length == 1 else 's'} by the milestones' durations"
        + (f" (of the goal {path[-1]!r}, the longest)" if len(graph.goals) > 1 else "") + f": {' → '.join(path)}"
        + ("; no milestone requires another, so the graph leaves the order free (the env may not)"
           if not any(m.requires or m.any_of for m in graph.milestones) else ""), markup=False, soft_wrap=True
    )
    side = [m.name for m in graph.milestones if m.side_effect]
    if side:
        console.print(f"side-effect milestones (no option of their own): {', '.join(side)}", markup=False)
    if graph.unneeded:
        paid = [f"{n} ({graph.milestone(n).reward:g}{', not given' if n in graph.implicit_rewards else ''})"
                for n in graph.unneeded]
        paying = [n for n in graph.unneeded if graph.milestone(n).reward]
        pays, it = ("pays", "it") if len(paying) == 1 else ("pay", "them")
        advice = ("" if not paying else
                  " (each pays the learner to reach it, though no goal needs it: give reward 0 to one that should not)"
                  if len(paying) == len(graph.unneeded) else
                  f" ({', '.join(paying)} {pays} the learner to reach {it}, though no goal needs {it}: give reward 0 "
                  "to one that should not)")
        console.print(f"milestones no goal needs, with the reward each pays when first verified: {', '.join(paid)}"
                      f"{advice}", markup=False, soft_wrap=True)
    if graph.has_alternatives and graph.implicit_rewards:
        console.print(f"alternatives (any_of): every route to the goals pays {graph.remaining_pay(()):g} in default "
                      "milestone rewards in total; a milestone of a route that pays more pays only what it lowers "
                      "the least reward still to earn (TaskGraph.remaining_pay)", markup=False, soft_wrap=True)
    if env is not None:
        differs = _graph_differences(env.task_graph(), graph)
        if differs:
            console.print(f"note: the library's task graph is not env.task_graph(): {differs}; the learner's "
                          "rewards, and which options are eligible, follow the library's", markup=False,
                          soft_wrap=True)
    if config is not None:
        console.print(f"config {args.source!r}: valid (run name {config.name!r}, env {config.env.id})")
        if args.play < 0:
            raise UsageError(f"--play must be >= 0 (episodes to play), got {args.play}")
        if args.seed < 0:
            raise UsageError(f"--seed must be >= 0 (a task seed), got {args.seed}")
        if args.play:
            _play_check(config, library, env, args.play, args.seed)
    console.print("[green]ok[/green]")
    return 0


def _shared_credit(played: Sequence[Any], library: Any, env: Any) -> str:
    """Where an adapted env of several agents has no ``milestone_agent`` and a milestone was
    credited to the calls of two agents or more at once, a line saying so with an example (a
    session-57 user's ``p0_halfway``, reached by agent_1, was also agent_0's call's); else ""."""
    if getattr(env, "credits_by_agent", True) or len(getattr(env, "possible_agents", ())) < 2:
        return ""  # the user's milestone_agent, or an env of gyre-ma's own, credits as it means to
    count, example = 0, ""
    for t in played:
        by: dict[str, list[Any]] = {}
        for c in t.calls:
            for m in c.milestones:
                by.setdefault(m, []).append(c)
        for m, calls in by.items():
            if len({c.agent for c in calls}) > 1:
                count += 1
                example = example or (f"{m!r} to " + " and ".join(f"{c.agent}'s {library[c.option].name}"
                                                                   for c in calls[:3]))
    if not count:
        return ""
    return (f"{count} milestone verifications were credited to the running calls of several agents at once (e.g. "
            f"{example}): without a milestone_agent the adapter credits every agent's running call. Where your env "
            "can tell who reached a milestone, pass milestone_agent=(unwrapped, milestone) -> agent to from_pettingzoo "
            "or from_gymnasium, so each agent's call is paid for its own")


def _check_features(library: Any, env: Any, played: Sequence[Any], timeout_s: float | None = None) -> None:
    """Every option's ``features`` on every decision ``check`` played (what the MLP manager
    reads at each decision, random-order play aside): each must return the same number of
    finite floats, or the error names the option (a session-56 user's features were first
    called by ``train``)."""
    calls = [c for t in played for c in t.calls]
    featured = [option.name for option in library if option.features is not None]
    if not featured or not calls:
        return
    from gyre_ma.agents.manager import Featurizer  # torch: only where options have features

    space = env.observation_space(env.possible_agents[0])
    from gyre_ma.watchdog import TimeBound

    featurizer = Featurizer(space, library, example=calls[0].observation,
                            bound=None if timeout_s is None else TimeBound(timeout_s))
    featurizer.many(calls)
    console.print(f"features of {len(featured)} option{'s' * (len(featured) != 1)} computed on the {len(calls)} "
                  f"decisions played: {featurizer.option_features} finite values each", markup=False, soft_wrap=True)


def _graph_differences(env_graph: Any, graph: Any) -> str:
    """What differs between the env's task graph and the library's (same milestones: ``make_library``
    refuses others): goals, rewards, prerequisites; empty where nothing does."""
    parts = []
    if set(env_graph.goals) != set(graph.goals):
        parts.append(f"goals {list(graph.goals)} (the env's {list(env_graph.goals)})")
    rewards = [n for n in graph.names if env_graph.milestone(n).reward != graph.milestone(n).reward]
    if rewards:
        parts.append("rewards of " + ", ".join(f"{n} {graph.milestone(n).reward:g} (the env's "
                                               f"{env_graph.milestone(n).reward:g})" for n in rewards))
    needs = [n for n in graph.names if (env_graph.milestone(n).requires, env_graph.milestone(n).any_of)
             != (graph.milestone(n).requires, graph.milestone(n).any_of)]
    if needs:
        parts.append(f"prerequisites of {needs}")
    return "; ".join(parts)


def _sub_policy(policy: Any) -> str:
    """What acts for an option: an LLM, a network, or code (a function or a Behaviour)."""
    return {"LLMPolicy": "llm", "NeuralSubPolicy": "neural"}.get(type(policy).__name__, "scripted")


def _play_check(config: ExperimentConfig, library: Any, env: Any, episodes: int, first_seed: int = 0) -> None:
    """Play ``episodes`` seeded episodes of the config's env, task seeds from ``first_seed``
    (any: a training seed an error named is played again), fresh envs (each to the config's
    ``train.max_steps``, else to the env's own ``max_cycles`` of that episode), each replayed
    for determinism, every reset and step checked (:func:`~gyre_ma.checks.check_setup`): an
    env or option that breaks at its first
    step fails here, not in ``train``. A config whose manager is fixed (``oracle`` or
    ``scripted``) is played by that manager, so a mistake in it shows here too, not first in
    ``eval``; any other by a random order of the library's options."""
    import functools

    from gyre_ma.checks import check_setup
    from gyre_ma.envs.registry import make_env, make_oracle
    from gyre_ma.rewards.milestones import last_calls
    from gyre_ma.rollout import ended_by_env, short_of_goals

    factory = functools.partial(make_env, config.env.id, **config.env.kwargs)
    own_caps = not config.train.max_steps and getattr(env, "max_cycles", None) is not None
    cap = config.train.max_steps or getattr(env, "max_cycles", None) or 1000  # check_env's bound
    fixed = config.manager.kind in ("oracle", "scripted")
    manager = ((lambda probe, _seed: make_oracle(config.env.id, probe, library, config.manager.policy))
               if fixed else None)
    engine, found, played = None, [], []
    if config.rewards.rules or config.rewards.rules_file:  # evaluated on the episodes, as a worker does
        from gyre_ma.rewards.scorer import RewardScorer

        engine = RewardScorer(config.rewards, library.graph, option_names=library.names).engine
    report = check_setup(factory, library, manager=manager, seeds=tuple(range(first_seed, first_seed + episodes)),
                         n_steps=int(cap), pettingzoo_tests=False, rules=engine, rule_results=found, played=played,
                         on_fault=config.backend.on_fault, own_caps=own_caps)
    goals = list(library.graph.goals)
    missed = [g for g in goals if g not in report.milestones]
    by = (f"by the config's {config.manager.kind} manager"
          + (f" ({config.manager.policy})" if config.manager.policy else "") if fixed
          else "by a random order of the library's options")
    if any(t.goals for t in played):  # each episode has its own goals
        named = sorted({g for t in played for g in t.goals}, key=goals.index)
        reached = (f"{sum(t.success for t in played)} of {len(played)} episodes reached their own goals "
                   f"(their goals among {named}, one set an episode)")
    else:
        reached = (f"goals {missed} not reached" + ("" if fixed else " (a random order may not; training learns one)")
                   if missed else f"goals {goals} reached, all of them in {sum(t.success for t in played)} of "
                   f"{len(played)} episodes")
    _check_features(library, env, played, config.backend.option_timeout_s)
    cut = sum(t.cut_by_fault for t in played)
    steps = sum(t.length for t in played)
    console.print(f"played {episodes} episode{'s' * (episodes != 1)} {by}: {steps} steps in all, "
                  + ("each episode replayed with the same milestones" if not cut else
                     f"each episode but the {cut} a fault cut replayed with the same milestones")
                  + f"; {len(report.milestones)} of {len(library.graph)} milestones verified; {reached}",
                  markup=False, soft_wrap=True)
    faults = sum(len(t.faults) for t in played)
    if faults:
        console.print(f"faults played on through (backend.on_fault: continue): {faults}, e.g. "
                      f"{next(f for t in played for f in t.faults)}", markup=False, soft_wrap=True)
    short = short_of_goals(played, goals)
    if short is not None:
        console.print(f"note: {short}", markup=False, soft_wrap=True)
    stuck = [t for t in played if t.dead_ends]
    if stuck:
        console.print(f"note: {_dead_ends(stuck, len(played))}", markup=False, soft_wrap=True)
    shared = _shared_credit(played, library, env)
    if shared:
        console.print(f"note: {shared}", markup=False, soft_wrap=True)
    lost = [t for t in played if not t.success and ended_by_env(t)]
    if lost and short is None and (fixed or len(lost) == len(played)):  # a fixed manager is meant to reach them
        t = lost[0]
        their = "their" if t.goals else "the"
        unseen = [g for g in (t.goals or goals) if g not in t.milestone_steps]
        # terminated unless some agent's last call was truncated (a session-60 user's trains that arrived
        # terminated, the env's time limit cut the others: "terminated" sent them looking for a loss)
        terminated = not any(t.calls[i].truncated for i in last_calls(t))
        why = (f"A loss (a death, a failed task) ends an episode so, and an untrained order meets many; where the env "
               f"ended them at a goal instead, the detector of {unseen} does not see it" if terminated else
               "The env's own time limit came first (its truncation, not max_cycles): raise it, or the goals are "
               "out of reach in that many steps")
        console.print(f"note: the env ended {len(lost)} of {len(played)} episodes before {their} goals were verified "
                      f"(task seed {t.task_seed}, {'terminated' if terminated else 'truncated'} at step {t.length}: "
                      f"verified {sorted(t.milestone_steps, key=t.milestone_steps.get) or 'nothing'}, not {unseen}). "
                      f"{why}", markup=False, soft_wrap=True)
    if report.unverifiable:
        console.print(f"taken on trust (no verifier or detector to re-check them): {list(report.unverifiable)}",
                      markup=False, soft_wrap=True)
    if engine is not None:
        console.print(f"rules on those episodes: {_rule_summary(engine.rules, found)}", markup=False, soft_wrap=True)


def _rule_summary(rules: Sequence[Any], results: Sequence[Any]) -> str:
    """Each rule's verdicts over the episodes ``results`` come from, in a phrase: how many a
    guard vetoed, in how many a process rule paid, and its passes of its evaluations."""
    n = len(results)
    parts = []
    for rule in rules:
        evaluated = sum(r.evaluated.get(rule.name, 0) for r in results)
        passed = sum(r.passed.get(rule.name, 0) for r in results)
        checks = f"passed {passed} of {evaluated} checks" if evaluated else "never checked"
        if rule.kind == "guard":
            vetoed = sum(rule.name in r.violations for r in results)
            parts.append(f"guard {rule.name!r} vetoed {vetoed} of {n} episodes ({checks})")
        else:
            paid = sum(any(rule.name in p for p in r.paid) for r in results)
            parts.append(f"process rule {rule.name!r} paid in {paid} of {n} episodes ({checks})")
    return "; ".join(parts)


def _is_experiment_file(source: str) -> bool:
    """A YAML mapping with ``base`` (a key no config has): an experiment file, so that one
    whose ``variants`` is misspelt is told so, not judged as a config."""
    from gyre_ma.options.yaml_file import read_yaml

    path = Path(source)
    if path.suffix not in (".yaml", ".yml") or not path.is_file():
        return False
    data = read_yaml(path, "file", UsageError)
    return isinstance(data, dict) and "base" in data


def cmd_graph(args: argparse.Namespace) -> int:
    library, _, _ = _load_library_and_config(args.source, set_overrides(args.set))
    achieved = [a for a in (args.achieved or "").split(",") if a]
    for a in achieved:
        if a not in library.graph:
            raise UsageError(f"--achieved: {a!r} is not a milestone; known: {list(library.graph.names)}")
    out = Path(args.out)
    if out.suffix.lower() == ".dot":
        out.write_text(library.graph.to_dot(achieved))
    elif out.suffix.lower() == ".png":
        library.graph.draw(str(out), achieved=achieved, title=f"{library.name} — task graph")
    else:
        raise UsageError(f"--out: expected a .png or .dot file, got {args.out!r}")
    if args.dot:
        Path(args.dot).write_text(library.graph.to_dot(achieved))
    console.print(f"wrote {out}")
    return 0


def set_overrides(pairs: Sequence[str] | None) -> dict[str, Any]:
    """``--set KEY=VALUE`` pairs → ``{dotted key: YAML value}`` (see ``config.with_overrides``)."""
    from gyre_ma.options.yaml_file import load_yaml

    out = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise UsageError(f"--set: expected KEY=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        out[key] = load_yaml(value, f"--set {key}: the value {value[:100]!r}", UsageError)
    return out


def cmd_train(args: argparse.Namespace) -> int:
    from gyre_ma.config import load_config

    overrides = set_overrides(args.set)
    if args.iterations is not None:
        if args.iterations < 1:
            raise UsageError(f"--iterations must be >= 1, got {args.iterations}")
        overrides["train.iterations"] = args.iterations
    if args.run_root is not None:
        overrides["run_root"] = args.run_root
    config = load_config(args.config, overrides)  # a broken config fails before torch is imported
    with contextlib.ExitStack() as held:  # the run's lock is let go however training ends
        return _train(args, config, held)


def _train(args: argparse.Namespace, config: Any, held: contextlib.ExitStack) -> int:
    import numpy as np
    from rich.progress import (
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from gyre_ma.config import CODE_FILE, code_files, code_references, dump_config
    from gyre_ma.files import write_json, write_text
    from gyre_ma.monitor import Monitor
    from gyre_ma.rewards.alarms import ORDER_KEY
    from gyre_ma.rollout import short_of_goals

    run_dir = config.run_dir
    if args.resume:
        if not _has_run_checkpoints(run_dir / "checkpoints"):
            raise UsageError(f"nothing to resume: {str(run_dir)!r} holds no checkpoint of a run; train without "
                             "--resume to start it")
        if not (run_dir / "checkpoints" / "manifest.json").is_file():  # checked before anything is made
            slots = sorted(p.name for p in (run_dir / "checkpoints").glob("*.pt") if p.name != INITIAL)
            if slots:  # its files are there, the record of which to trust is not
                raise UsageError(f"cannot resume {str(run_dir)!r}: its checkpoints/manifest.json (which slot file is "
                                 f"which, and its hash) is missing, so its checkpoints {slots[:5]} cannot be "
                                 "verified or resumed. They still evaluate (gyre-ma eval FILE); to train this run "
                                 "anew, move its checkpoints folder away, or train under another name")
            raise UsageError(f"nothing to resume: {str(run_dir)!r} holds no checkpoint of a run; train without "
                             "--resume to start it")
        held.enter_context(_lock_run(run_dir))
        change = _config_change(run_dir, config, force=args.force_config)
        finished = (f"run {config.name!r} has already done its {config.train.iterations} iterations (checkpoints "
                    f"in {run_dir / 'checkpoints'}); raise --iterations to train it further")
        if _finished(run_dir, config.train.iterations):  # said before the learner is imported and built (seconds)
            console.print(finished, markup=False, soft_wrap=True)
            return 0
        _say_building(args, config, run_dir)
        from gyre_ma.checkpoints import save_checkpoint
        from gyre_ma.loop import Gyre

        gyre = Gyre.resume(config, run_dir)
        if gyre.next_iteration >= config.train.iterations and (run_dir / "checkpoints" / "final.pt").is_file():
            gyre.close()
            console.print(finished, markup=False, soft_wrap=True)
            return 0
        if change:
            _record_change(run_dir, change, gyre.next_iteration)
        if "train.iterations" in change:  # the schedules stretch to the new length: say what that does
            was, now = change["train.iterations"]
            at = gyre.next_iteration
            console.print(f"note: train.iterations {was} -> {now}: the schedules that span the run (entropy, "
                          "explorer noise, temperature, lr, the average of the last weights) stretch over "
                          f"{now} iterations, so iteration {at} stands at {config.train.progress(at):.0%} of them, "
                          f"not at {config.train.model_copy(update={'iterations': was}).progress(at):.0%} where "
                          "the run left them: exploration rises "
                          "again before it anneals, and held-out success may dip first", markup=False,
                          soft_wrap=True)
    else:
        fresh = not run_dir.exists()
        held.enter_context(_lock_run(run_dir))  # first: a run another trainer holds is named as such
        checkpoints = run_dir / "checkpoints"
        if _has_run_checkpoints(checkpoints):
            if not (checkpoints / "manifest.json").is_file():
                raise UsageError(f"run directory {str(run_dir)!r} already has checkpoint files but no "
                                 "checkpoints/manifest.json, so it cannot be resumed; to train this run anew, move its "
                                 "checkpoints folder (and metrics.csv) away, or choose another name/run_root")
            raise UsageError(f"run directory {str(run_dir)!r} already has checkpoints; "
                             "pass --resume to continue it, or choose another name/run_root")
        logged = run_dir / "metrics.csv"
        if logged.is_file() and len(logged.read_bytes().splitlines()) > 1:  # an earlier run's: keep it
            raise UsageError(f"run directory {str(run_dir)!r} holds the metrics.csv of an earlier run but no "
                             "checkpoint to resume it from; move metrics.csv away (a fresh run would overwrite it), "
                             "or choose another name/run_root")
        _say_building(args, config, run_dir)
        from gyre_ma.checkpoints import save_checkpoint
        from gyre_ma.loop import Gyre

        try:
            gyre = Gyre(config, run_dir)
        except BaseException:
            if fresh:
                _remove_if_only_lock(run_dir)
            raise
        write_text(run_dir / "config.yaml", dump_config(config))
        if (run_dir / ERROR_FILE).is_file():  # an earlier attempt's errors stay, marked as such
            _append_error(run_dir, "a fresh run started here; the errors above are an earlier attempt's")
        if gyre.learns and config.manager.kind != "llm":  # the untrained manager, for eval
            initial = save_checkpoint(checkpoints / INITIAL, gyre.state_dict())
            if gyre.checkpoints is not None:  # its hash in the manifest, checked when eval loads it
                gyre.checkpoints.record_file(initial)
    first = gyre.next_iteration
    if files := code_files(config):  # the user's code as it trains, for eval to tell whether it changed since
        write_json(run_dir / CODE_FILE, files)
    held.push(functools.partial(_record_error, run_dir, gyre))  # from here on, an error is kept in the run too
    monitor = Monitor(run_dir, resume_at=first if args.resume else None)
    if args.resume:
        again = (f"; the {monitor.replaced} iteration(s) logged after that checkpoint are played again and their "
                 "rows of metrics.csv replaced") if monitor.replaced else ""
        if monitor.lacks(first - 1) and (row := gyre.last_metrics) is not None and row["iteration"] == first - 1:
            monitor.log(row, step=int(row["env_steps"]))  # the stop came between the checkpoint and its row
            again += f"; iteration {first}'s row of metrics.csv, which the stop cut, written from the checkpoint"
        console.print(f"resuming run {config.name!r} after iteration {first} of {config.train.iterations}, from its "
                      f"latest checkpoint ({gyre.env_steps:,} env steps so far){again}", markup=False, soft_wrap=True)
    spot_rng = np.random.default_rng([config.seed, first])
    metrics: dict[str, float] = {}
    session_steps = session_seconds = 0.0  # this session's iterations
    session_start = time.monotonic()
    said_stop = said_order = said_goals = said_dead = said_greedy = False
    columns = (TextColumn("[bold]iter {task.completed}/{task.total}"), BarColumn(),
               TextColumn("{task.fields[steps]} env steps{task.fields[rate]} · {task.fields[success]}"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    try:
        live = console.is_terminal  # redirected to a file, a live bar is cut to 80 columns: a line an iteration
        with Progress(*columns, console=console, disable=args.quiet or not live) as progress:
            task = progress.add_task("train", total=config.train.iterations, completed=first,
                                     steps=gyre.env_steps, rate="", success="—")
            for i in range(first, config.train.iterations):
                before = gyre.env_steps
                metrics, trajectories = gyre.iteration(i, return_trajectories=True)
                session_steps += metrics["env_steps"] - before
                session_seconds += metrics["iteration_seconds"]
                rate = f" ({(metrics['env_steps'] - before) / max(metrics['iteration_seconds'], 1e-9):,.0f}/s)"
                monitor.log(metrics, step=int(metrics["env_steps"]))  # iteration is a column
                monitor.spot_check(i, trajectories, gyre.library, config.monitor.spot_checks, spot_rng,
                                   config.credit.gamma)
                progress.update(task, advance=1, steps=int(metrics["env_steps"]), rate=rate,
                                success=_success_line(metrics))
                if not live and not args.quiet:  # a live bar shows its own time left
                    left = (time.monotonic() - session_start) / (i + 1 - first) * (config.train.iterations - i - 1)
                    console.print(f"iter {i + 1}/{config.train.iterations} · {int(metrics['env_steps'])} env steps"
                                  f"{rate} · {_success_line(metrics)} · {_duration(left)} left at this rate",
                                  markup=False, soft_wrap=True)
                said_stop = _say_rollbacks(progress.console, gyre, metrics, i, said_stop)
                short = None if said_goals else short_of_goals(trajectories, gyre.library.graph.goals)
                if short is not None:
                    said_goals = True
                    progress.console.print(f"warning: iteration {i}: {short}", markup=False, soft_wrap=True)
                cut = [t for t in trajectories if t.dead_ends]
                if cut and not said_dead:
                    said_dead = True
                    progress.console.print(f"warning: iteration {i}: {_dead_ends(cut, len(trajectories))} (metric "
                                           "dead_ends; warned once)", markup=False, soft_wrap=True)
                gap = None if said_greedy else _greedy_gap(_validation_window(monitor.history,
                                                                            config.roles.evaluators))
                if gap is not None:
                    said_greedy = True
                    progress.console.print(f"warning: iteration {i}: {gap} (warned once)", markup=False,
                                           soft_wrap=True)
                if gyre.out_of_order is not None and not said_order:
                    said_order = True
                    progress.console.print(
                        f"warning: iteration {i}: {metrics[ORDER_KEY]:.0%} of the episodes "
                        f"verified a milestone before its prerequisites, e.g. {gyre.out_of_order}: {_OUT_OF_ORDER}; "
                        f"its rewards were paid (metric {ORDER_KEY})",
                        markup=False, soft_wrap=True)
    finally:
        gyre.close()
    monitor.close()
    checkpoint = save_checkpoint(run_dir / "checkpoints" / "final.pt", gyre.state_dict())
    if gyre.checkpoints is not None:  # its hash beside the slots': eval checks it as resume checks theirs
        gyre.checkpoints.record_file(checkpoint)
    table = Table(title=f"run {config.name!r} — summary")
    table.add_column("metric")
    table.add_column("value (the final iteration's, but where it says)", justify="right")
    window = _validation_window(monitor.history, config.roles.evaluators)
    for mode in ("sampled", "greedy") if window else ():
        key = f"validation/window_{mode}_success"
        table.add_row(f"held-out validation, {mode}: the last {window['validation/window_iterations']:.0f} "
                      f"validations' {window['validation/window_episodes']:.0f} episodes",
                      f"{window[key]:.1%} (95 % CI {window[key + '_ci95_low']:.1%}–{window[key + '_ci95_high']:.1%})")
    last = f" (its {config.roles.evaluators} episodes)"
    for key in ("validation/sampled_success", "validation/greedy_success", "validation/success_rate",
                "success_rate", "episode_length", "episode_reward", "option_calls", "agents_lost", "env_steps",
                "policy_version", "entropy", "kl", "checkpoint/rollbacks", "checkpoint/lr_scale"):
        if key in metrics:
            table.add_row(key + (" (the env's own, summed)" if key == "episode_reward" else
                                 last if key in ("validation/sampled_success", "validation/greedy_success") else ""),
                          f"{metrics[key]:.4g}")
    faults = {k: sum(row.get(k, 0.0) for row in monitor.history) for k in _FAULT_KEYS
              if any(k in row for row in monitor.history)}
    for key, total in faults.items():
        table.add_row(f"{key} (this session)", f"{total:.4g}")
    if session_seconds > 0:  # rollouts, updates and validation together
        table.add_row("env steps per second of training (this session)", f"{session_steps / session_seconds:,.0f}")
    console.print(table)
    console.print(f"run directory: {run_dir}  checkpoint: {checkpoint}")
    trust = " --trust-config" if code_references(config) else ""  # your own code, in the run you just trained
    console.print(f"held-out figures of final.pt with 95 % intervals: gyre-ma eval {run_dir} --episodes 200{trust} "
                  "(and again with --greedy)", markup=False, soft_wrap=True)
    ck = gyre.checkpoints
    if ck is not None and ck.best_score is not None:  # final.pt: the policy the run ended with; best.pt may be better
        episodes = ("held-out validation episodes, sampled and greedy together" if gyre.config.roles.evaluators
                    else "training episodes (roles.evaluators is 0: no held-out validation)")
        length = f" in {ck.best_length:.1f} steps on average" if ck.best_length is not None else ""
        console.print(f"best.pt: validation success {ck.best_score:.1%}{length} over {ck.best_episodes} {episodes}, "
                      "the window that chose it, so an optimistic figure (evaluate it on fresh seeds with gyre-ma eval "
                      f"{run_dir / 'checkpoints' / 'best.pt'})", markup=False)
    write_json(run_dir / "summary.json", metrics | window | {f"{k}_total": v for k, v in faults.items()})
    return 0


VALIDATION_WINDOW = 10
"""Validations the run's summary pools for its held-out figure (a session-57 user's summary
showed the last iteration's 4 episodes, 25 %, against eval's 77.5 % on 200)."""


def _validation_window(history: list[dict[str, float]], per_mode: int) -> dict[str, float]:
    """Held-out validation success, sampled and greedy, pooled over the session's last
    :data:`VALIDATION_WINDOW` validations (``per_mode`` episodes each), with 95 % Wilson
    intervals: ``validation/window_{mode}_success`` (``_ci95_low``, ``_ci95_high``),
    ``validation/window_episodes`` and ``validation/window_iterations``; empty without
    validations. The policy changed over the window, so it is a guide; ``gyre-ma eval``
    measures the final one."""
    import math

    from gyre_ma.metrics import wilson_interval

    rows = [row for row in history if math.isfinite(row.get("validation/sampled_success", math.nan))
            and math.isfinite(row.get("validation/greedy_success", math.nan))][-VALIDATION_WINDOW:]
    if not rows or per_mode < 1:
        return {}
    out: dict[str, float] = {}
    total = per_mode * len(rows)
    for mode in ("sampled", "greedy"):
        wins = sum(round(row[f"validation/{mode}_success"] * per_mode) for row in rows)
        low, high = wilson_interval(wins, total)
        out |= {f"validation/window_{mode}_success": wins / total, f"validation/window_{mode}_success_ci95_low": low,
                f"validation/window_{mode}_success_ci95_high": high}
    return out | {"validation/window_episodes": float(total), "validation/window_iterations": float(len(rows))}


def _greedy_gap(window: dict[str, float]) -> str | None:
    """Where held-out greedy play falls far short of sampled play over a whole
    :func:`_validation_window` (sampled at least 50 %, greedy at most half of it, their
    intervals apart), why that may be and what to do, in words; else None. A session-58
    user's Overcooked library (options with no milestone, a soup needing three onions
    potted) validated at 0 % greedy against 94-96 % sampled, and nothing said why."""
    if window.get("validation/window_iterations", 0) < VALIDATION_WINDOW:
        return None
    key = "validation/window_{}_success"
    sampled, greedy = window[key.format("sampled")], window[key.format("greedy")]
    if sampled < 0.5 or greedy > sampled / 2 or window[key.format("greedy") + "_ci95_high"] >= window[
            key.format("sampled") + "_ci95_low"]:
        return None
    return (f"held-out greedy success {greedy:.0%} against sampled {sampled:.0%} over the last "
            f"{window['validation/window_iterations']:.0f} validations ({window['validation/window_episodes']:.0f} "
            "episodes of each). Greedy play sets aside an option its agent has tried since its milestones last changed "
            "(so that a deterministic manager does not repeat a do-nothing option forever), unless the option has no "
            "milestone and its call did work its agent sees (more than one step, a changed observation): where "
            "repeated calls of a one-step option, or of one with a milestone, make progress that no milestone "
            "verifies (one onion of the three a soup needs), greedy moves on after one call. Give such units of work "
            "milestones, or read this task's figures sampled; gyre-ma eval RUN --greedy --json FILE lists each "
            "episode's calls")


INITIAL = "initial.pt"
"""The policy a fresh run starts from, before its first update: ``gyre-ma eval`` it for the
untrained manager's figures, the baseline that shows what training added (a run killed
before its first ``latest`` checkpoint holds only this, and starts afresh). Not written for
an LLM manager, whose untrained policy is its model directory, already on disk, and whose
checkpoints each hold a copy of the model's weights."""


def _has_run_checkpoints(checkpoints: Path) -> bool:
    """Whether a run's ``checkpoints`` folder holds something of its training: any file but
    :data:`INITIAL` and a manifest that records no slot (only ``initial.pt``'s hash, as a run
    killed or failed before its first checkpoint leaves it)."""
    if not checkpoints.is_dir():
        return False
    for path in checkpoints.iterdir():
        if path.name == INITIAL:
            continue
        if path.name == "manifest.json":
            try:
                if not json.loads(path.read_text()).get("slots"):
                    continue
            except (OSError, ValueError, AttributeError):
                pass  # a manifest that cannot be read is a run's, to be looked at, not overwritten
        return True
    return False


def _lock_run(run_dir: Path) -> Any:
    """An exclusive lock on ``run_dir`` for this process's lifetime: a second trainer of
    the same run is refused, not interleaved."""
    from gyre_ma.files import FolderInUse, lock_folder

    try:
        return lock_folder(run_dir, "gyre-ma train", "wait for it or choose another name/run_root")
    except FolderInUse as exc:
        raise UsageError(f"run directory {exc}") from None


def _remove_if_only_lock(run_dir: Path) -> None:
    """Remove a run folder this command made that holds nothing but its lock: the run's
    setup failed (a library that does not fit the env, a factory that raised) before it
    wrote anything, and the next try should find no folder, as the first one did."""
    try:
        if [p.name for p in run_dir.iterdir()] == [".lock"]:
            (run_dir / ".lock").unlink()
            run_dir.rmdir()
    except OSError:  # someone else's file appeared, or the folder went: leave what is there
        pass


_OUT_OF_ORDER = ("a milestone detector the policy fooled, or a task graph that does not match the env (gyre-ma check "
                 "fails such an env where its episodes meet it: play more of them, --play 40)")
"""What a milestone verified before its prerequisites says, as train and eval tell it."""


_FAULT_KEYS = ("backend/restarts", "backend/timeouts", "backend/reissued", "backend/requeued", "backend/replaced",
               "staleness/dropped", "option_timeouts/count", "faults/count")
"""Faults survived, counted per iteration and summed over the session in the summary."""


_BUDGET_KEYS = ("train.iterations", "run_root")
"""Config keys a resume may change without --force-config: the budget (and how the run
root, which found this very run directory, is spelled)."""
_PLACEMENT_KEYS = ("backend.name", "backend.workers", "backend.cpus_per_worker", "backend.max_restarts",
                   "backend.max_attempts", "backend.sample_timeout_s", "backend.startup_timeout_s",
                   "backend.pipeline_depth", "backend.episodes_per_call", "backend.ray_init")
"""Config keys (and the keys under them) a resume may change too: where and how the
episodes are played, which a synchronous run's figures do not depend on (the local
backend and Ray give the same; a run trained on a cluster may go on without it)."""


def _may_change(key: str) -> bool:
    return key in _BUDGET_KEYS or _under(key, _PLACEMENT_KEYS)


def _finished(run_dir: Path, iterations: int) -> bool:
    """Whether the run's checkpoint manifest records its ``latest`` slot at the last of
    ``iterations`` and its ``final.pt`` is there: a resume has nothing to train. False where
    the manifest cannot say (the resume then loads the checkpoint and decides from it)."""
    try:  # the manifest named as above, not by checkpoints.MANIFEST: importing that module costs torch's seconds
        step = json.loads((run_dir / "checkpoints" / "manifest.json").read_text())["slots"]["latest"]["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return isinstance(step, int) and step + 1 >= iterations and (run_dir / "checkpoints" / "final.pt").is_file()


def _config_change(run_dir: Path, config: ExperimentConfig, *, force: bool) -> dict[str, Any]:
    """The keys of ``config`` that differ from the run's own ``config.yaml`` (dotted key →
    [was, now]); a change beyond the budget is refused unless ``force``."""
    from gyre_ma.config import dump_config

    path = run_dir / "config.yaml"
    if not path.is_file():
        return {}
    before, after = _flatten(yaml.safe_load(path.read_text())), _flatten(yaml.safe_load(dump_config(config)))
    change = {k: [before.get(k), after.get(k)] for k in sorted(set(before) | set(after))
              if before.get(k) != after.get(k)}
    beyond = [k for k in change if not _may_change(k)]
    if beyond and not force:
        listed = ", ".join(f"{k}: {change[k][0]!r} -> {change[k][1]!r}" for k in beyond[:10])
        raise UsageError(f"--resume: the config differs from the run's ({listed}{', …' if len(beyond) > 10 else ''}); "
                         "a resumed run keeps its config except the budget (train.iterations) and where episodes are "
                         "played (backend.name, backend.workers, ...). Pass --force-config "
                         "to continue with the change (recorded in config_history.yaml), or start a new run")
    return change


def _record_change(run_dir: Path, change: dict[str, Any], iteration: int) -> None:
    """Append a resume's config change to ``run_dir/config_history.yaml``; ``config.yaml``
    stays the config the run started with."""
    from gyre_ma.files import write_text

    path = run_dir / "config_history.yaml"
    history = yaml.safe_load(path.read_text()) if path.is_file() else []
    history.append({"resumed_at_iteration": iteration, "changed": change})
    write_text(path, yaml.safe_dump(history, sort_keys=False))


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix: node}
    out: dict[str, Any] = {}
    for k, v in node.items():
        out |= _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    return out


def _say_building(args: argparse.Namespace, config: Any, run_dir: Path) -> None:
    """The line ``train`` prints before it builds the learner, which takes seconds (torch,
    Lightning, the env, the manager): a session-59 user saw nothing for 23 s (68 s under load)."""
    if not args.quiet:
        console.print(f"run {config.name!r} in {run_dir}: building the learner (env, options, manager) for "
                      f"{config.train.iterations} iteration{'' if config.train.iterations == 1 else 's'} …",
                      markup=False, soft_wrap=True)


def _duration(seconds: float) -> str:
    """``seconds`` as a person reads a wait: "40 s", "12 min", "1 h 05 min"."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def _success_line(metrics: dict[str, float]) -> str:
    """Held-out success and mean length (sampled / greedy) where validation ran, then the
    training episodes': where success saturates, the lengths show the learning."""
    train = f"train {metrics['success_rate']:.0%} in {metrics['episode_length']:.0f} steps"
    if "validation/sampled_success" not in metrics:
        return f"success: {train}"
    return (f"held-out {metrics['validation/sampled_success']:.0%} in {metrics['validation/sampled_length']:.0f} "
            f"steps sampled / {metrics['validation/greedy_success']:.0%} in "
            f"{metrics['validation/greedy_length']:.0f} greedy · {train}")


def _say_rollbacks(out: Console, gyre: Any, metrics: dict[str, float], iteration: int, said_stop: bool) -> bool:
    """Print each rollback and its LR cut, and once that rollbacks have stopped; returns
    whether the stop has been said."""
    if metrics.get("checkpoint/rolled_back"):
        r = gyre.checkpoints.rollbacks[-1]
        out.print(f"iteration {iteration}: rolled back to the {r.slot!r} checkpoint ({r.reason}); learning rate "
                  f"now {r.lr_scale:g}× the configured", markup=False, highlight=False)
    if metrics.get("checkpoint/rollbacks_stopped") and not said_stop:
        out.print(f"iteration {iteration}: {len(gyre.checkpoints.rollbacks)} rollbacks reached "
                  "(checkpoints.max_rollbacks): validation drops are no longer rolled back and the learning rate "
                  "is no longer cut", markup=False, highlight=False)
        return True
    return said_stop


def cmd_eval(args: argparse.Namespace) -> int:
    import numpy as np

    from gyre_ma.checkpoints import load_checkpoint
    from gyre_ma.config import code_references, parse_config
    from gyre_ma.files import write_json
    from gyre_ma.metrics import episode_metrics, goal_metrics, out_of_order, wilson_interval, with_goal
    from gyre_ma.player import Player
    from gyre_ma.rewards.alarms import ORDER_KEY
    from gyre_ma.roles import check_held_out_seeds, evaluation_tasks

    if args.episodes < 1:
        raise UsageError(f"--episodes must be >= 1, got {args.episodes}")
    try:
        check_held_out_seeds(args.seed, args.episodes, "--seed")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.stream < 0:
        raise UsageError(f"--stream must be >= 0, got {args.stream}")
    path, config = _eval_target(args)
    state = None if path is None else load_checkpoint(path)
    if path is not None:
        args.checkpoint = str(path)
    if config is None:  # the checkpoint's own config: data, unless the user trusts it
        config = parse_config(state["config"], source=f"{path} (config)")
        references = code_references(config)
        if references and not args.trust_config:
            listed = ", ".join(f"{k}={v!r}" for k, v in references[:8])
            raise UsageError(f"the config stored in {str(path)!r} would import code ({listed}); gyre-ma does not "
                             "run code named by a checkpoint. If you trust this file, pass --trust-config; or "
                             "pass your own config with --config FILE.yaml")
        if references:
            console.print(f"trusting the config stored in {path}: it imports "
                          + ", ".join(f"{k}={v!r}" for k, v in references), markup=False, soft_wrap=True)
    for changed in _code_changed_since(path, config) if path is not None else ():
        console.print(f"warning: {changed}", markup=False, soft_wrap=True)
    if args.greedy and not config.manager.learns:
        raise UsageError(f"--greedy: the {config.manager.kind} manager has no greedy choice to take (greedy takes a "
                         "learned manager's most likely option); evaluate it without --greedy")
    if config.backend.name != "local" and "backend.name" not in set_overrides(args.set):
        # a synchronous run's episodes are the same wherever they are played: no cluster to start for an evaluation
        console.print(f"playing on the local backend (the config's is {config.backend.name!r}; the figures are the "
                      "same: pass a config with --set backend.name=ray to play there)", markup=False, soft_wrap=True)
        config = config.model_copy(update={"backend": config.backend.model_copy(update={"name": "local"})})
    tasks = evaluation_tasks(range(args.seed, args.seed + args.episodes), greedy=args.greedy, stream=args.stream)
    with Player(config, state) as player:
        trajectories = _play_with_progress(player, tasks, config.rollout.num_envs)
    names = player.library.graph.names
    metrics = episode_metrics(trajectories, names)
    metrics |= player.arbitrate(trajectories)
    low, high = wilson_interval(sum(t.success for t in trajectories), len(trajectories))
    metrics |= {"success_ci95_low": low, "success_ci95_high": high}
    mode = "greedy" if args.greedy else "sampled"
    what = (args.checkpoint if path is not None
            else f"{args.checkpoint} (manager {config.manager.kind}, nothing learned)")
    table = Table(title=f"eval of {what} — {args.episodes} episodes "
                        f"({mode}, task seeds {args.seed}–{args.seed + args.episodes - 1}, stream {args.stream})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("verified completion", f"{metrics['success_rate']:.1%} (95 % CI {low:.1%}–{high:.1%})")
    if any(t.vetoed for t in trajectories):  # the guards' verdict beside it, not only among the reward rows
        table.add_row("  of them vetoed by a guard rule (the learner counts these failures)",
                      f"{sum(t.success and t.vetoed for t in trajectories) / len(trajectories):.1%} of episodes")
    disorder, example = out_of_order(trajectories, player.library.graph)
    metrics[ORDER_KEY] = disorder
    if example is not None:
        table.add_row("episodes with a milestone before its prerequisites (see below)", f"{disorder:.1%}")
    won = [t for t in trajectories if t.success]  # a success ends at the goal: its length is the steps to it
    metrics |= {"steps_to_goal": float(np.mean([t.length for t in won])) if won else float("nan"),
                "calls_to_goal": float(np.mean([len(t.calls) for t in won])) if won else float("nan")}
    steps_ci = _mean_interval([t.length for t in won])
    length_ci = _mean_interval([t.length for t in trajectories])
    metrics |= {"steps_to_goal_ci95_low": steps_ci[0], "steps_to_goal_ci95_high": steps_ci[1],
                "episode_length_ci95_low": length_ci[0], "episode_length_ci95_high": length_ci[1]}
    table.add_row("steps to the goal (successes)", f"{metrics['steps_to_goal']:.1f}{_ci_text(steps_ci)}" if won
                  else "— (no episode reached it)")
    table.add_row("option calls to the goal (successes)", f"{metrics['calls_to_goal']:.1f}" if won else "—")
    table.add_row("agents lost per episode (left before the end, their last call verifying no milestone)",
                  f"{metrics['agents_lost']:.2f}")
    table.add_row("episodes cut at a dead end", f"{metrics['dead_ends']:.1%}")
    if "faults/per_episode" in metrics:  # backend.on_fault: continue
        table.add_row("faults played on through per episode / episodes an env fault cut",
                      f"{metrics['faults/per_episode']:.2f} / {metrics['faults/episodes_cut']:.1%}")
    table.add_row("failed episodes: the env ended them / the step cap cut them",
                  f"{metrics['failed_env_ended']:.1%} / {metrics['failed_step_cap']:.1%}")
    table.add_row("episode length (primitive steps)", f"{metrics['episode_length']:.1f}{_ci_text(length_ci)}")
    table.add_row("option calls per episode", f"{metrics['option_calls']:.1f}")
    for key in sorted(k for k in metrics if k.startswith("score/")):  # the env's own figures of each episode
        name = key.split("/", 1)[1]
        values = [t.scores[name] for t in trajectories if name in t.scores]
        interval = _mean_interval(values)
        metrics |= {f"{key}_ci95_low": interval[0], f"{key}_ci95_high": interval[1]}
        table.add_row(f"score {name} (the env's, mean of the {len(values)} episodes that gave it)",
                      f"{metrics[key]:.4g} (95 % CI {interval[0]:.4g}–{interval[1]:.4g})")
    if "llm/requests" in metrics:
        table.add_row("LLM sub-policy requests per episode", f"{metrics['llm/requests']:.1f}")
        table.add_row("  unusable outputs (invalid) / fallback actions",
                      f"{metrics['llm/invalid_share']:.1%} / {metrics['llm/fallback_share']:.1%}")
    for m in names:
        table.add_row(f"milestone {m}", f"{metrics[f'milestone/{m}']:.1%}")
    goals = goal_metrics(trajectories, player.library.graph.goals)  # where each episode has its own goals
    metrics |= goals
    table.add_row("env reward per episode (the env's own, summed: episode_reward)", f"{metrics['episode_reward']:.4g}")
    table.add_row("paid to the learner per episode (the arbitrated reward it backs up: reward/…)", "")
    for key in sorted(k for k in metrics if k.startswith("reward/")):
        table.add_row(f"  {_REWARD_LABELS.get(key, key.split('/', 1)[1])}", f"{metrics[key]:.4g}")
    console.print(table)
    cut = [t for t in trajectories if t.dead_ends]
    if cut:
        console.print(_dead_ends(cut, len(trajectories)), markup=False, soft_wrap=True)
    if example is not None:
        console.print(f"milestones verified out of the task graph's order, e.g. {example}: {_OUT_OF_ORDER}",
                      markup=False, soft_wrap=True)
    if goals:  # each episode has its own goals: how each goal fared
        by_goal = Table(title="goals: the episodes that had each")
        for col in ("goal", "episodes", "verified completion", "steps to the goal (successes)"):
            by_goal.add_column(col, justify="left" if col == "goal" else "right")
        for g in player.library.graph.goals:
            had = with_goal(trajectories, g, player.library.graph.goals)
            won = [t.length for t in had if t.success]
            low, high = wilson_interval(len(won), len(had)) if had else (float("nan"), float("nan"))
            by_goal.add_row(g, str(len(had)), f"{len(won) / len(had):.1%} (95 % CI {low:.1%}–{high:.1%})" if had
                            else "—", f"{np.mean(won):.1f}{_ci_text(_mean_interval(won))}" if won else "—")
        console.print(by_goal)
    options = _option_figures(trajectories, player.library)
    if options:
        by_option = Table(title="option calls: how each ended (share of its calls)")
        shares = ("achieved", "failure", "step_cap", "blocked", "cut_short", "verified_milestone")
        by_option.add_column("option", min_width=min(max(map(len, options)), 40), overflow="fold")  # whole names:
        for col in ("calls per episode", "mean steps", "achieved", "failed: its predicate",  # build_assembler_mk1
                    "failed: step cap", "failed: blocked, fault, timeout", "cut short",     # and _mk2 read alike cut
                    "verified a milestone"):
            by_option.add_column(col, justify="right")
        for name, row in options.items():
            if row["mean_steps"] is None:
                by_option.add_row(name, "0", *["—"] * (1 + len(shares)))
                continue
            by_option.add_row(name, f"{row['calls_per_episode']:.2f}", f"{row['mean_steps']:.1f}",
                              *(f"{row[k]:.1%}" for k in shares))
        console.print(by_option)
        console.print("achieved: its milestone verified, or its done condition met; failed: its failure predicate "
                      "held (a deliberate yield is one), it reached its max_steps, or its sub-policy blocked "
                      "(CANNOT_PROCEED), raised (a fault played on through) or ran out of time; cut short: the episode "
                      "ended first; verified a milestone: one was first verified during the call (an option with no "
                      "milestone whose done condition is a timer achieves every call: this says whether its calls "
                      "moved the task)", markup=False, soft_wrap=True)
    if args.json:  # the figures, and each episode's own (for intervals of your choosing, or pairing with another run)
        option_names = player.library.names
        episodes = [{"task_seed": int(t.task_seed), "success": bool(t.success), "length": int(t.length),
                     "option_calls": len(t.calls), "milestone_steps": dict(t.milestone_steps),
                     "calls": [_call_record(c, option_names) for c in t.calls]}
                    | ({"scores": dict(t.scores)} if t.scores else {})
                    | ({"goals": list(t.goals)} if goals else {})
                    | ({"faults": len(t.faults), "cut_by_fault": t.cut_by_fault} if "faults/per_episode" in metrics
                       else {}) for t in trajectories]
        played = {"checkpoint": what, "mode": mode if config.manager.learns else None,  # a fixed manager has none
                  "stream": args.stream, "first_seed": args.seed,
                  "episodes": args.episodes}  # what gyre-ma compare says of it
        write_json(Path(args.json), metrics | {"played": played, "episodes": episodes, "options": options})
    return 0


EVAL_PROGRESS_SECONDS = 10.0
"""From how long an evaluation has run, ``gyre-ma eval`` says how far it is."""


def _play_with_progress(player: Any, tasks: list[Any], num_envs: int) -> list[Any]:
    """``player.play(tasks)`` in rounds of a few times ``num_envs`` episodes, with a line of
    progress after a round once :data:`EVAL_PROGRESS_SECONDS` have passed (a session-57
    user's 200-episode eval was three silent minutes). An episode's play depends on its task
    alone, not on which others share its round, so the figures are those of one call."""
    size = max(4 * num_envs, 32)
    played: list[Any] = []
    start = time.perf_counter()
    for at in range(0, len(tasks), size):
        played += player.play(tasks[at:at + size])
        spent = time.perf_counter() - start
        if spent >= EVAL_PROGRESS_SECONDS and len(played) < len(tasks):
            left = spent / len(played) * (len(tasks) - len(played))
            console.print(f"eval: {len(played)} of {len(tasks)} episodes played in {spent:.0f} s, about {left:.0f} s "
                          "left", markup=False, soft_wrap=True)
    return played


def _call_record(call: Any, option_names: list[str]) -> dict[str, Any]:
    """One option call of an episode, as ``eval --json`` lists it: who called what, when, for
    how long, and how it ended (``termination`` as the option table's columns name it)."""
    return {"agent": call.agent, "option": option_names[call.option], "start_step": int(call.start_step),
            "steps": int(call.duration), "termination": call.termination.value if call.termination else None,
            "milestones": list(call.milestones)}


_ACHIEVED = ("milestone", "done")
_FAILED = {"failure": ("failure",), "step_cap": ("max_steps",), "blocked": ("blocked", "fault", "timeout")}
"""How a failed call ended, by ``--json``'s key: ``failed`` is their sum."""


def _option_figures(trajectories: Sequence[Any], library: Any) -> dict[str, dict[str, float]]:
    """Per option called: calls per episode, mean steps a call, and the shares of its calls
    that achieved what they were for, failed (``failed``, and apart: its ``failure`` predicate,
    its ``step_cap``, ``blocked``, a fault or a timeout), or were cut short by the episode's end,
    and of those during which a milestone was first verified (``verified_milestone``: a
    session-58 user's ``spread_out``, ended by a timer, achieved 98.9 % of its calls and never
    caught anything)
    (which option of a library is the weak one: a session-53 user found it in the spot checks;
    a session-56 user's failure predicate yields on danger, a failure to be told from the others)."""
    names = library.names
    ended: dict[str, list[str]] = {}
    steps: dict[str, int] = {}
    verified: dict[str, int] = {}
    for t in trajectories:
        for c in t.calls:
            name = names[c.option]
            ended.setdefault(name, []).append(c.termination.value if c.termination is not None else "episode")
            steps[name] = steps.get(name, 0) + c.duration
            verified[name] = verified.get(name, 0) + bool(c.milestones)
    n = max(len(trajectories), 1)
    failed = tuple(e for ends in _FAILED.values() for e in ends)
    out: dict[str, dict[str, float]] = {}
    for name in names:
        if name not in ended:  # never called: every option has its row
            out[name] = {"calls_per_episode": 0.0, "mean_steps": None, "achieved": None, "failed": None,
                         **dict.fromkeys(_FAILED), "cut_short": None, "verified_milestone": None}
            continue
        ends, calls = ended[name], len(ended[name])
        out[name] = {"calls_per_episode": calls / n, "mean_steps": steps[name] / calls,
                     "achieved": sum(e in _ACHIEVED for e in ends) / calls,
                     "failed": sum(e in failed for e in ends) / calls,
                     **{key: sum(e in kinds for e in ends) / calls for key, kinds in _FAILED.items()},
                     "cut_short": sum(e not in _ACHIEVED + failed for e in ends) / calls,
                     "verified_milestone": verified[name] / calls}
    return out


def _mean_interval(values: list[float]) -> tuple[float, float]:
    """A percentile-bootstrap 95 % interval of the mean of ``values`` (NaN for none)."""
    from gyre_ma.stats import mean_interval

    if not values:
        return float("nan"), float("nan")
    interval = mean_interval(values)
    return interval.low, interval.high


def _dead_ends(cut: Sequence[Any], of: int) -> str:
    """The episodes cut at a dead end of the library, and why the first was, in words."""
    t = cut[0]
    return (f"{len(cut)} of {of} episodes were cut at a dead end, an agent with no eligible option (task seed "
            f"{t.task_seed}, {t.dead_end_why or 'agents ' + str(t.dead_ends)})")


_REWARD_LABELS = {
    "reward/env": "env (the env's own × rewards.env_reward)",
    "reward/total": "total",
    "reward/total_failed": "total of the failed episodes",
    "reward/removed": "removed by guard rules",
    "reward/vetoed_episodes": "share of episodes a guard vetoed",
    "reward/vetoed_successes": "share of episodes a guard vetoed that verified every goal",
}
"""``gyre-ma eval``'s names of the learner's reward parts (the others go by their part's name)."""


def _ci_text(interval: tuple[float, float]) -> str:
    low, high = interval
    return "" if low != low else f" (95 % CI {low:.1f}–{high:.1f})"


_EVAL_SLOTS = ("final.pt", "best.pt", "latest.pt")
"""What ``gyre-ma eval RUN_DIR`` evaluates, first found first: the policy the run ended with
(the average of its last updates), else its best validation, else its latest slot. ``best.pt``
is judged on a few held-out episodes an iteration (on success, and since session 50 on the mean
length among windows of equal success; before, on success alone, so it was often an early
policy). On the 16 held-out runs compared in ``benchmarks/results/README.md`` (session
47: tech tree, quickstart, LLM quickstart), ``best.pt``'s sampled paths were 8-41 % longer
than ``final.pt``'s on every run and its sampled success lower on 10 runs, higher on 5;
greedy, it succeeded a little more often (on 8 runs, by 0.5-2 points; less often on 1). With the
length tie-break (session 51, the same 16 runs), ``best.pt`` is about as good as ``final.pt``:
sampled success higher on 8 runs, equal on 5, lower on 3; paths 0.96-1.11× as long."""


def _code_changed_since(checkpoint: Path, config: Any) -> list[str]:
    """Each file of the user's code that differs from what the run of ``checkpoint`` (in a
    run directory's ``checkpoints/``) recorded when it trained (:data:`CODE_FILE`), in words;
    empty where nothing was recorded. A session-58 user edited their env module between
    training and evaluating, and nothing would have said so had it changed what was trained."""
    from gyre_ma.config import CODE_FILE, code_files

    folder = checkpoint.resolve().parent
    recorded = folder.parent / CODE_FILE
    if folder.name != "checkpoints" or not recorded.is_file():
        return []
    try:
        then = json.loads(recorded.read_text())
        if not isinstance(then, dict):
            raise ValueError("not a mapping")
    except (OSError, ValueError):
        return [f"{recorded} cannot be read, so whether your code changed since the run trained is unknown"]
    now = code_files(config)
    return [f"{file} {'is gone' if file not in now else 'has changed'} since the run trained ({recorded} holds "
            "its hash then): these figures are of your code as it is now"
            for file, digest in then.items() if now.get(file) != digest]


def _eval_target(args: argparse.Namespace) -> tuple[Path | None, Any]:
    """The checkpoint ``gyre-ma eval`` means, and the config to rebuild it with (None: the
    checkpoint's own). A checkpoint file is itself; a run directory or a config YAML (whose
    run directory is then used, with that config) mean the run's final checkpoint, else its
    best or latest one (:data:`_EVAL_SLOTS`). A config whose manager does not learn (an
    oracle, a scripted or random order) means no checkpoint (None): it is played as it is,
    whatever run has its name."""
    from gyre_ma.config import load_config

    target, config = Path(args.checkpoint), None
    overrides = set_overrides(args.set)
    if args.config is not None:
        config = load_config(args.config, overrides)
    if target.is_file() and target.suffix in (".yaml", ".yml"):
        config = load_config(target, overrides)
        if not config.manager.learns:
            return None, config  # an oracle, scripted or random order: nothing to load, whatever run has its name
        if not config.run_dir.exists():
            raise UsageError(f"config {str(target)!r}: its run directory {str(config.run_dir)!r} does not exist; "
                             f"train it first (gyre-ma train {target}), or pass a checkpoint file")
        target = config.run_dir
    if target.is_dir():
        folder = target / "checkpoints" if (target / "checkpoints").is_dir() else target
        found = next((folder / slot for slot in _EVAL_SLOTS if (folder / slot).is_file()), None)
        if found is None:
            raise UsageError(f"{str(target)!r} holds no checkpoint ({', '.join(_EVAL_SLOTS)} in "
                             f"{str(folder)!r}); pass a checkpoint file written by gyre-ma train")
        console.print(f"evaluating {found}", markup=False, soft_wrap=True)
        if found.name == "final.pt" and (folder / "best.pt").is_file():
            console.print(f"  (the policy the run ended with; its best validation, judged on fewer episodes: "
                          f"{folder / 'best.pt'})", markup=False, soft_wrap=True)
        target = found
    elif not target.exists():
        raise UsageError(f"checkpoint {str(target)!r} does not exist; pass a checkpoint file, a run directory "
                         "or the run's config YAML")
    if overrides and config is None:
        raise UsageError("--set changes a config, and none was given: evaluate a config YAML, or pass --config "
                         "FILE.yaml beside the checkpoint (the checkpoint's stored config is not edited)")
    return target, config


def cmd_pretrain_option(args: argparse.Namespace) -> int:
    import torch

    from gyre_ma.config import load_config
    from gyre_ma.envs.registry import make_env, make_library, make_oracle
    from gyre_ma.pretrain import pretrain_option

    for key, low in (("episodes", 1), ("batch_episodes", 1), ("check_episodes", 0)):
        if getattr(args, key) < low:
            raise UsageError(f"--{key.replace('_', '-')} must be >= {low}, got {getattr(args, key)}")
    config = load_config(args.config, set_overrides(args.set))
    out = Path(args.out)
    if out.suffix != ".pt":
        raise UsageError(f"--out: expected a .pt file, got {args.out!r}")
    torch.set_num_threads(1)
    env = make_env(config.env.id, **config.env.kwargs)
    library = make_library(config.env.id, env, config.library, config.library_kwargs)
    guide = make_oracle(config.env.id, env, library, config.manager.policy) if args.guide == "oracle" else None
    every = max(1, (args.episodes // args.batch_episodes) // 10)  # about ten rows of progress
    table = Table(title=f"pre-training option {args.option!r} on {config.env.id} ({args.episodes} episodes)")
    for column in ("episodes", "calls", "success", "steps", "entropy"):
        table.add_column(column, justify="right")
    batches = 0

    def show(row: dict[str, float]) -> None:
        nonlocal batches
        if batches % every == 0 or row["episodes"] >= args.episodes:
            table.add_row(f"{row['episodes']:.0f}", f"{row['calls']:.0f}", f"{row['success']:.2f}",
                          f"{row['steps']:.1f}", f"{row['entropy']:.2f}")
        batches += 1

    result = pretrain_option(env, library, args.option, episodes=args.episodes, batch_episodes=args.batch_episodes,
                             lr=args.lr, guide=guide, seed=args.seed, hidden=args.hidden,
                             check_episodes=args.check_episodes, check_seed=args.check_seed, on_batch=show)
    result.policy.save(out)
    console.print(table)
    if result.check:
        check = Table(title=f"the trained option on {args.check_episodes} held-out task seeds from {args.check_seed}")
        for column in ("acting", "calls", "success", "steps", "score"):
            check.add_column(column, justify="right")
        for mode, row in result.check.items():
            check.add_row(mode, f"{row['calls']:.0f}", f"{row['success']:.2f}", f"{row['steps']:.1f}",
                          f"{row['score']:.3f}")
        console.print(check)
    mode = "sampling" if result.policy.sample else "greedily"
    why = " (it scored higher so on the held-out seeds)" if result.check else ""
    console.print(f"wrote {out}: declare it in the library as kind: neural, neural: {{weights: {out}}}; it acts "
                  f"{mode}{why}, unless the entry sets sample: true or false", markup=False, soft_wrap=True)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from gyre_ma.monitor import plot_run

    if args.smooth is not None and (args.smooth < 1 or args.smooth % 2 == 0):
        raise UsageError(f"--smooth must be an odd number >= 1 (iterations a centred mean pools), got {args.smooth}")
    console.print(f"wrote {plot_run(args.run_dir, args.out, smooth=args.smooth)}")
    return 0


def cmd_experiment(args: argparse.Namespace) -> int:
    from rich.live import Live

    from gyre_ma.experiment import counted, grid, load_experiment, run_experiment, run_state

    if args.ray_address is not None and not args.ray:
        raise UsageError("--ray-address is the cluster the runs go to with --ray; add --ray")
    exp = load_experiment(args.file, root=args.root)  # every run's config is checked before any runs
    done = sum(run_state(exp.run_dir(r)) == "done" for r in exp.runs)
    console.print(f"experiment {exp.spec.name!r}: {counted(len(exp.runs), 'run')} ({grid(exp.spec)}), "
                  f"{done} already done; folder {exp.folder}", markup=False, soft_wrap=True)
    table = not args.quiet and console.is_terminal  # redirected to a file, a line per change of a run's state
    view = Live(console=console, auto_refresh=False, transient=False) if table else contextlib.nullcontext()
    said: dict[str, str] = {}
    try:
        with view as live:
            def show(records: list) -> None:
                if live is not None:
                    live.update(_experiment_table(exp, records), refresh=True)
                    return
                for r in records:
                    if said.setdefault(r.run.name, "pending") != r.state:
                        said[r.run.name] = r.state
                        console.print(_experiment_line(exp, r), markup=False, soft_wrap=True)

            records = run_experiment(exp, jobs=args.jobs, use_ray=args.ray, ray_address=args.ray_address,
                                     on_progress=show if not args.quiet else None)
    finally:
        if table:
            console.print()  # the live table leaves the cursor at its last line's end
    failed = [r for r in records if r.state == "failed"]
    for r in failed:
        err_console.print(f"run {r.run.name}: {r.error}", markup=False, soft_wrap=True)
    if failed:
        err_console.print(f"gyre-ma experiment: {len(failed)} of {len(records)} runs failed (logs in "
                          f"{exp.folder / 'logs'}); rerun the same command to retry them — finished runs are kept",
                          markup=False, soft_wrap=True)
        return 1
    console.print(f"all {len(records)} runs done; the report: gyre-ma report {exp.folder}", markup=False,
                  soft_wrap=True)
    return 0


def _run_status(exp: Any, record: Any) -> tuple[str, str]:
    """A run's iterations done of its total ("2/30") and its time so far ("5 s"; "" before it starts)."""
    import time

    from gyre_ma.experiment import run_progress

    done, total = run_progress(exp, record.run)
    spent = "" if record.started is None else f"{(record.ended or time.time()) - record.started:.0f} s"
    return f"{min(done, total)}/{total}", spent


def _experiment_line(exp: Any, record: Any) -> str:
    """One run's state as a line of the log (``experiment`` with its output redirected)."""
    iterations, spent = _run_status(exp, record)
    return f"run {record.run.name}: {record.state} ({iterations} iterations{', ' + spent if spent else ''})"


def _experiment_table(exp: Any, records: list) -> Table:
    table = Table(title=f"experiment {exp.spec.name!r}")
    for column in ("run", "state", "iterations", "time"):
        table.add_column(column, justify="right" if column in ("iterations", "time") else "left")
    for r in records:
        table.add_row(r.run.name, r.state, *_run_status(exp, r))
    return table


def cmd_report(args: argparse.Namespace) -> int:
    from gyre_ma.report import write_report

    if args.reps is not None and args.reps < 100:
        raise UsageError(f"--reps must be >= 100, got {args.reps}")
    path = write_report(Path(args.exp_dir), reps=args.reps)
    console.print(f"wrote {path} (with report.json, runs.csv and the curves beside it)", markup=False, soft_wrap=True)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from gyre_ma.compare import CompareError, compare, load_evaluation, mismatches
    from gyre_ma.files import write_json

    try:
        runs = [load_evaluation(f) for f in (args.first, args.second)]
        names = (Path(args.first).stem, Path(args.second).stem)
        if names[0] == names[1]:
            names = (args.first, args.second)
        result = compare(*runs, names=names)
    except CompareError as exc:
        raise UsageError(str(exc)) from None
    a, b = names
    console.print(f"compared on {result['task_seeds']} task seeds ({result['first_seed']}–{result['last_seed']}), "
                  "paired seed by seed", markup=False, soft_wrap=True)
    table = Table()
    table.add_column("")
    for name, played in zip(names, result["played"]):
        shown = "" if not isinstance(played, dict) else f"\n{played['checkpoint']}" + (
            f" ({played['mode']})" if played.get("mode") else "")
        table.add_column(name + shown, justify="right")
    table.add_row("verified completion", *(f"{p:.1%} (95 % CI {lo:.1%}–{hi:.1%})"
                                           for p, (lo, hi) in zip(result["success"], result["success_ci"])))
    table.add_row("seeds it alone solved", str(result["first_only"]), str(result["second_only"]))
    steps = result.get("steps_to_goal")
    if steps:
        table.add_row(f"steps to the goal on the {steps['seeds']} seeds both solved",
                      *(f"{m:.1f}" for m in steps["means"]))
    for name, row in result.get("scores", {}).items():
        table.add_row(f"score {name} (mean of the {row['seeds']} seeds both gave it)",
                      *(f"{m:.4g}" for m in row["means"]))
    console.print(table)
    low, high = result["difference_ci"]
    console.print(f"{a} − {b}: {100 * result['difference']:+.1f} points of verified completion (95 % CI "
                  f"{100 * low:+.1f} to {100 * high:+.1f}, Newcombe's interval for paired rates); of the "
                  f"{result['first_only'] + result['second_only']} seeds one alone solved, {a} solved "
                  f"{result['first_only']}: exact McNemar p = {result['mcnemar_p']:.2g}", markup=False, soft_wrap=True)
    if steps:
        console.print(f"steps to the goal, {a} − {b} on the seeds both solved: {steps['difference']:+.1f} (95 % CI "
                      f"{steps['difference_ci'][0]:+.1f} to {steps['difference_ci'][1]:+.1f}, bootstrap over those "
                      "seeds)", markup=False, soft_wrap=True)
    for name, row in result.get("scores", {}).items():
        console.print(f"score {name}, {a} − {b}: {row['difference']:+.4g} (95 % CI {row['difference_ci'][0]:+.4g} to "
                      f"{row['difference_ci'][1]:+.4g}, bootstrap over those seeds)", markup=False, soft_wrap=True)
    for note in mismatches(result):
        console.print(f"note: {note}", markup=False, soft_wrap=True)
    if args.json:
        write_json(Path(args.json), result)
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "check": cmd_check, "graph": cmd_graph, "train": cmd_train, "eval": cmd_eval, "plot": cmd_plot,
    "experiment": cmd_experiment, "report": cmd_report, "pretrain-option": cmd_pretrain_option,
    "compare": cmd_compare,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gyre-ma", description=__doc__)
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check", help="validate a config, experiment file or option library without training "
                                     "(a config's env is played for a few episodes)")
    p.add_argument("source", help="config YAML, experiment YAML, library YAML, or module:callable")
    p.add_argument("--play", type=int, default=2, metavar="N",
                   help="with a config: play N seeded episodes of its env by a random order of its options, each "
                        "replayed for determinism, every reset and step checked (default 2; 0: validate only)")
    p.add_argument("--seed", type=int, default=0,
                   help="first task seed to play (default 0); the task seed an error or fault of training names "
                        "plays that episode's task again (by the check's own order of options)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (dotted), as train does")
    p = sub.add_parser("graph", help="draw a library's task graph")
    p.add_argument("source", help="config YAML, library YAML, or module:callable")
    p.add_argument("--out", default="graph.png", help="output .png or .dot")
    p.add_argument("--dot", help="also write DOT text here")
    p.add_argument("--achieved", help="comma-separated milestones to colour as achieved")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config key (dotted); with a library file, library_kwargs.NAME=VALUE gives ${NAME}")
    p = sub.add_parser("train", help="train a manager from a config")
    p.add_argument("config", help="experiment config YAML")
    p.add_argument("--iterations", type=int, help="override train.iterations")
    p.add_argument("--run-root", help="override run_root (folder of run directories)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (dotted)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--resume", action="store_true", help="continue the run from its latest checkpoint")
    p.add_argument("--force-config", action="store_true",
                   help="with --resume: continue with a config that differs from the run's (the change is recorded)")
    p = sub.add_parser("eval", help="evaluate a checkpoint on fresh episodes")
    p.add_argument("checkpoint", help="a checkpoint written by gyre-ma train, a run directory (its final.pt) "
                                      "or a run's config YAML (a config whose manager does not learn, such as "
                                      "an oracle, needs no run)")
    p.add_argument("--config", help="rebuild the env, library and manager from this config YAML instead of the "
                                    "checkpoint's")
    p.add_argument("--trust-config", action="store_true",
                   help="let the checkpoint's own config import the code it names (module:callable references)")
    p.add_argument("--episodes", type=int, default=20, help="episodes to run")
    p.add_argument("--seed", type=int, default=1_000_000, help="first task seed (training uses others)")
    p.add_argument("--greedy", action="store_true", help="take the most likely option")
    p.add_argument("--stream", type=int, default=0,
                   help="sampling stream: any two policies evaluated on the same seeds and stream draw the same "
                        "random numbers, so their figures differ by their choices alone (default 0)")
    p.add_argument("--json", help="also write the metrics as JSON here")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a key of the config evaluated (a config YAML, or --config), as train does")
    p = sub.add_parser("compare", help="two evaluations of the same task seeds, paired seed by seed: the difference "
                                       "in success with its interval")
    p.add_argument("first", help="a JSON written by gyre-ma eval --json (a learned policy, say)")
    p.add_argument("second", help="another, played on the same task seeds (a baseline: --set manager.kind=random, "
                                  "your heuristic as a scripted manager, another checkpoint)")
    p.add_argument("--json", help="also write the comparison as JSON here")
    p = sub.add_parser("pretrain-option", help="train a neural option's sub-policy on its own milestone")
    p.add_argument("config", help="config YAML: the env (e.g. an easier variant, through --set) and the library")
    p.add_argument("--option", required=True, help="the option to train (its milestone is the reward)")
    p.add_argument("--out", required=True, help="where to write its weights (.pt)")
    p.add_argument("--episodes", type=int, default=2000, help="episodes to play (default 2000)")
    p.add_argument("--batch-episodes", type=int, default=16, help="episodes per update (default 16)")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam step size (default 0.003)")
    p.add_argument("--hidden", type=int, default=64, help="width of its two hidden layers (default 64)")
    p.add_argument("--check-episodes", type=int, default=100,
                   help="then held-out episodes to measure it on, greedy and sampling; it acts in the mode that "
                        "scored higher (default 100; 0: no check, and it acts greedily)")
    p.add_argument("--check-seed", type=int, default=1_000_000, help="first held-out task seed (default 1000000)")
    p.add_argument("--guide", choices=["random", "oracle"], default="random",
                   help="who chooses the other options: a random eligible one, or the env's oracle (manager.policy) "
                        "(default random)")
    p.add_argument("--seed", type=int, default=0, help="first task seed; also seeds the weights (default 0)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (dotted)")
    p = sub.add_parser("plot", help="draw a run's learning curves and milestone rates to PNG")
    p.add_argument("run_dir", help="a run directory written by gyre-ma train")
    p.add_argument("--out", help="PNG path (default RUN_DIR/curves.png)")
    p.add_argument("--smooth", type=int, metavar="N",
                   help="draw success and length as centred means over N iterations (odd) over the raw points; "
                        "default: about a tenth of the run's iterations (none under 20); 1: raw only")
    p = sub.add_parser("experiment", help="train seeds × variants of an experiment file, in parallel; rerun to resume")
    p.add_argument("file", help="experiment YAML (base config, variants, seeds, budget, report, evaluation)")
    p.add_argument("--jobs", type=int, help="runs at once as local processes (one torch thread each; default 1); "
                   "with --ray, the most runs on the cluster at once (default: all, Ray running as many as it has "
                   "CPUs)")
    p.add_argument("--ray", action="store_true", help="run each run as a Ray task instead")
    p.add_argument("--ray-address", help="with --ray: an existing cluster's address (default: start one here)")
    p.add_argument("--root", help="override the experiment's root folder")
    p.add_argument("--quiet", action="store_true", help="no progress table")
    p = sub.add_parser("report", help="tables with confidence intervals, curves and a CSV of an experiment's runs")
    p.add_argument("exp_dir", help="the experiment folder (<root>/<name>) written by gyre-ma experiment")
    p.add_argument("--reps", type=int, help="bootstrap resamples (default: the experiment file's report.reps)")
    for p in sub.choices.values():  # also after the command (gyre-ma train CONFIG --debug); unset keeps the top one
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks for errors")
    return parser


@contextlib.contextmanager
def _warnings_in_one_line(command: str) -> Iterator[None]:
    """gyre-ma's own warnings as one line, ``gyre-ma train: warning: ...``, rather than
    Python's ``file:line: RuntimeWarning: ...`` with a line of gyre-ma's source under it;
    other packages' warnings as Python shows them."""
    import warnings

    from gyre_ma.options.errors import gyre_ma_dirs

    plain = warnings.formatwarning

    def one_line(message: Any, category: type[Warning], filename: str, lineno: int, line: str | None = None) -> str:
        if str(Path(filename).resolve()).startswith(gyre_ma_dirs()):
            return f"gyre-ma {command}: warning: {' '.join(str(message).split())}\n"
        if not sys.stderr.isatty():  # a log file: no colour codes (gymnasium colours its warnings)
            message = re.sub(r"\x1b\[[0-9;]*m", "", str(message))
        return plain(message, category, filename, lineno, line)

    warnings.formatwarning = one_line
    try:
        yield
    finally:
        warnings.formatwarning = plain


class Terminated(KeyboardInterrupt):
    """``SIGTERM`` (a scheduler's or ``kill``'s stop) in ``gyre-ma train``: ended as Ctrl-C ends it."""


@contextlib.contextmanager
def _terminate_as_interrupt(wanted: bool) -> Iterator[None]:
    """While training as the program, ``SIGTERM`` raises :class:`Terminated` in the main thread, so
    a run stopped by ``kill`` says what it kept and how to resume, as an interrupted one does (a
    session-57 user's killed run left no word in its log). A handler someone else installed is
    left alone."""
    import signal
    import threading

    if (not wanted or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise Terminated()

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _lines_as_printed() -> None:
    """Standard output and error a line at a time where they are no terminal (a log file, a
    pipe): Python buffers them in blocks there, so a session-58 user's redirected evals showed
    their progress lines only when they ended, 15-25 minutes on."""
    for stream in (sys.stdout, sys.stderr):
        if not stream.isatty():
            with contextlib.suppress(AttributeError, ValueError):
                stream.reconfigure(line_buffering=True)


def _package_conflict(exc: BaseException) -> str:
    """Where ``exc`` is an ImportError raised inside another package as it was imported (not
    in gyre-ma's code), a line saying the installed packages conflict; else "". A session-60
    user's Flatland pinned numpy<2, pyarrow 20 refused it as ``train`` began, and the message
    called that a bug in gyre-ma."""
    from gyre_ma.options.errors import gyre_ma_dirs

    if not isinstance(exc, ImportError) or exc.__traceback__ is None:
        return ""
    innermost = traceback.extract_tb(exc.__traceback__)[-1].filename
    if str(Path(innermost).resolve()).startswith(gyre_ma_dirs()) or innermost.startswith("<frozen importlib"):
        return ""
    return (f"a package failed to import ({' '.join(str(exc).split())[:300]}) in {innermost}: the installed "
            "packages conflict (pip check lists what does not fit), not your input, nor gyre-ma; install versions "
            "that fit together (an env pinning numpy<2 needs pyarrow<20, say)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    program = argv is None
    if argv is None:  # the program: import a config's modules from the folder it runs in, as python -m does
        _import_from(Path.cwd())
        _lines_as_printed()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed its one-line usage error
        if exc.code and argv[:1] == ["train"] and any(a.split("=")[0] == "--jobs" for a in argv):
            err_console.print("gyre-ma train: a run plays in one process (rollout.num_envs episodes in flight, "
                              "backend.name: ray for more processes); --jobs is gyre-ma experiment's, which trains "
                              "several runs (seeds, variants) at once", markup=False, soft_wrap=True)
        return int(exc.code or 0)
    try:
        with _warnings_in_one_line(args.command), _terminate_as_interrupt(args.command == "train" and program):
            return COMMANDS[args.command](args)
    except KeyboardInterrupt as exc:
        if args.debug:
            raise
        how = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
        err_console.print(f"gyre-ma {args.command}: {how}{_INTERRUPTED_NOTE.get(args.command, '')}",
                          markup=False, soft_wrap=True)
        return 143 if isinstance(exc, Terminated) else 130
    except Exception as exc:
        if args.debug:
            raise
        if not _user_error(exc):
            traceback.print_exc()
            conflict = _package_conflict(exc)
            if conflict:
                err_console.print(f"gyre-ma {args.command}: {conflict}", markup=False, soft_wrap=True)
            elif not _raised_on_purpose(exc):  # else a failure gyre-ma detected (Ray workers that never started)
                err_console.print(f"gyre-ma {args.command}: this is a bug in gyre-ma, not in your input: please report "
                                  "it with the traceback above", markup=False, soft_wrap=True)
            return 1
        text = " ".join(str(exc).split())
        text = text if len(text) <= _MAX_ERROR else text[:_MAX_ERROR] + "… (cut; --debug shows all)"
        if args.command in ("train", "eval") and getattr(exc, "playable", False):
            text += " (to play on through a rare fault like this one, set backend.on_fault: continue)"
        from gyre_ma.options.errors import UserCodeError

        seed = re.search(r"task seed (\d+)", text)
        if args.command == "train" and seed is not None and isinstance(exc, UserCodeError):
            text += (f"; gyre-ma check {args.config} --seed {seed[1]} --play 1 plays that task again by a random "
                     "order of the options")
        if args.command == "train" and isinstance(exc, OSError) and exc.errno in _STORAGE_FULL_OR_LOCKED:
            text += ("; the run keeps every iteration it completed: make room (or make the run root writable) "
                     "and rerun with --resume")
        err_console.print(f"gyre-ma {args.command}: error: {text}", markup=False, soft_wrap=True)
        return 2


ERROR_FILE = "error.txt"
"""Where a training run that stopped on an error keeps it, one entry per stop."""


def _record_error(run_dir: Path, gyre: Any, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
    """An ``__exit__`` callback: append the error that is stopping ``gyre``'s training, with
    the time and iteration, to the run's :data:`ERROR_FILE` (stderr alone had it; a run
    left to train overnight kept no reason). Never suppresses the error."""
    if not isinstance(exc, Exception):  # an interrupt is not an error; none at all, nothing to keep
        return False
    text = (" ".join(str(exc).split()) if _user_error(exc)
            else "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip())
    _append_error(run_dir, f"iteration {gyre.next_iteration + 1} of {gyre.config.train.iterations} (as the progress "
                           f"line counts): {type(exc).__name__}: {text}")
    return False


def _append_error(run_dir: Path, text: str) -> None:
    """Append one entry, stamped with the local time, to the run's :data:`ERROR_FILE`."""
    try:
        with (run_dir / ERROR_FILE).open("a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime())} {text}\n")
    except OSError:
        pass  # a full disk or a read-only run root: the error itself still reaches stderr


def _import_from(folder: Path) -> None:
    """Let ``module:callable`` references find the user's modules in ``folder`` (after
    every installed package, so that a file there never shadows one). ``python -m``, an
    experiment's runs (started so) and Ray's workers (started in the driver's folder)
    find them there already."""
    if str(folder) not in sys.path and "" not in sys.path:
        sys.path.append(str(folder))


_INTERRUPTED_NOTE = {
    "train": "; the run keeps every iteration it completed: rerun with --resume to continue it",
    "experiment": "; finished runs are kept, and a rerun resumes the others from their checkpoints",
}
"""What an interrupted command kept, and how to go on."""
_STORAGE_FULL_OR_LOCKED = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}
"""Storage errors after which a run can continue with ``--resume`` once they are fixed."""
_MAX_ERROR = 2000
"""Characters of an error line; an error that echoes a huge input is cut."""


def _user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is about the user's input or code (one line, exit 2) rather than a bug
    in gyre-ma (traceback, exit 1): an error from the user's code (:class:`UserCodeError`),
    a storage error (``OSError``: a full disk, a read-only or missing path), or a
    ValueError / TypeError that gyre-ma raised on purpose — by a ``raise`` statement in its
    own source, the way every check of a config, library or env reports. Anything else (a
    KeyError, a RuntimeError, ...) is not the user's: a traceback, exit 1."""
    from gyre_ma.options.errors import UserCodeError

    if isinstance(exc, (UserCodeError, OSError)):
        return True
    if not isinstance(exc, (ValueError, TypeError)):
        return False
    return exc.__traceback__ is None or _raised_on_purpose(exc)


def _raised_on_purpose(exc: BaseException) -> bool:
    """Whether a ``raise`` statement in gyre-ma's own source raised ``exc`` (rather than an
    operation failing inside it, or code outside it)."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code  # the instruction that raised, not the source text (which may have changed)
    return _in_gyre_ma(code.co_filename) and code.co_code[tb.tb_lasti] == _RAISE


_RAISE = dis.opmap["RAISE_VARARGS"]


def _in_gyre_ma(filename: str) -> bool:
    import gyre_ma
    import gyre_ma.agents
    import gyre_ma.envs
    import gyre_ma.options

    path = Path(filename).resolve()
    roots = {Path(p).resolve() for package in (gyre_ma, gyre_ma.agents, gyre_ma.envs, gyre_ma.options)
             for p in package.__path__}
    return any(path.is_relative_to(root) for root in roots)


if __name__ == "__main__":
    sys.exit(main())
