"""OptionLibrary: the registry of options users define, in Python or in YAML."""

from __future__ import annotations

import copy
import importlib
import inspect
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from gyre_ma.options.errors import UserCodeError, callable_name, parameters_of, user_call
from gyre_ma.options.graph import TaskGraph
from gyre_ma.options.option import Option, OptionContext
from gyre_ma.options.yaml_file import read_yaml

_OPTION_KEYS = {
    "name", "milestone", "policy", "initiation", "done", "failure", "max_steps", "repeatable",
    "exclusive", "description", "kind", "llm", "neural", "features",
}
_CALLABLE_KEYS = ("policy", "initiation", "done", "failure", "features")
OPTION_KINDS = {"llm": "gyre_ma.llm.option:policy_from_spec", "neural": "gyre_ma.agents.subpolicy:policy_from_spec"}
"""Option kinds a library YAML may declare besides plain callables → the builder of their
sub-policy from the entry's mapping (named by reference: the options layer does not import
the layers above it)."""


def resolve(ref: str, where: str) -> Any:
    """Import ``module:attr.path``; errors name ``where`` (a dotted config path)."""
    if not isinstance(ref, str) or ref.count(":") != 1:
        raise ValueError(f"{where}: expected a 'module:callable' reference, got {ref!r}")
    module_name, attr_path = ref.split(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        hint = ("; gyre-ma imports your modules from the folder it runs in and from PYTHONPATH"
                if exc.name == module_name.split(".")[0] else "")
        raise ValueError(f"{where}: cannot import module {module_name!r} ({exc}){hint}") from None
    except ImportError as exc:
        raise ValueError(f"{where}: cannot import module {module_name!r} ({exc})") from None
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{where}: module {module_name!r} has no attribute {attr_path!r}") from None
    return obj


def reference(obj: Any) -> str:
    """The ``module:qualname`` of an importable object (inverse of :func:`resolve`): one that
    :func:`resolve` leads back to, or an error (a lambda, a local function, an object that
    names itself but is no module attribute)."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        raise ValueError(f"{obj!r} is not importable by reference (lambda or local function)")
    ref = f"{module}:{qualname}"
    try:
        found = resolve(ref, "reference")
    except ValueError:
        found = None
    if found is not obj and not (inspect.ismethod(obj) and found == obj):
        raise ValueError(f"{obj!r} is not importable by reference: {ref!r} does not lead back to it")
    return ref


def _policy_reference(policy: Any) -> str:
    """:func:`reference` of an option's policy, or an error that says how to dump a policy
    that is an object (a neural or LLM sub-policy built in Python)."""
    try:
        return reference(policy)
    except ValueError:
        if inspect.isroutine(policy) or inspect.isclass(policy):
            raise
    raise ValueError(f"its policy is a {type(policy).__name__} object, which has no reference to import; load the "
                     "option from a library entry (kind: neural or kind: llm), which it dumps back, or export() the "
                     "object as a module attribute")


def export(namespace: dict[str, Any], name: str, obj: Any) -> Any:
    """``obj`` (a closure or callable instance made in a loop, one per landmark or stand) as
    ``namespace[name]``, a module's attribute, named so that :func:`reference` gives
    ``module:name`` and :func:`resolve` finds it again: a library holding it can be dumped
    and loaded back. ``namespace`` is the module's ``globals()``."""
    obj.__name__ = obj.__qualname__ = name
    obj.__module__ = namespace["__name__"]
    namespace[name] = obj
    return obj


class OptionLibrary:
    """Options over one task graph. Iteration order is the option index order the
    manager's categorical distribution uses."""

    def __init__(self, name: str, graph: TaskGraph, options: list[Option] | None = None) -> None:
        if not isinstance(graph, TaskGraph):
            raise TypeError(f"library {name!r}: graph must be a TaskGraph, got {type(graph).__name__}")
        self.name = name
        self.graph = graph
        self._options: list[Option] = []
        self._index: dict[str, int] = {}
        self._graph_masks: dict[frozenset[str], np.ndarray] = {}
        """Graph eligibility per achieved set: pure, and asked at every decision."""
        self._gated: list[tuple[int, Option]] = []
        """The options with a state predicate (an initiation, or a milestone they restore),
        with their indices: the only ones :meth:`mask` asks about the state."""
        for opt in options or []:
            self.add(opt)

    # ------------------------------------------------------------------ building
    def add(self, option: Option) -> Option:
        if not isinstance(option, Option):
            raise TypeError(f"library {self.name!r}: expected an Option, got {type(option).__name__}")
        if option.name in self._index:
            raise ValueError(f"library {self.name!r}: duplicate option name {option.name!r}")
        if option.milestone is not None and option.milestone not in self.graph:
            raise ValueError(
                f"library {self.name!r}: option {option.name!r} achieves milestone "
                f"{option.milestone!r}, which is not a node of the task graph; "
                f"known: {list(self.graph.names)}"
            )
        self._index[option.name] = len(self._options)
        self._options.append(option)
        self._graph_masks.clear()
        if option.initiation is not None or option.restores:
            self._gated.append((len(self._options) - 1, option))
        return option

    def option(self, name: str | None = None, **kwargs: Any) -> Callable[[Callable], Callable]:
        """Decorator: register the decorated sub-policy as an option.

        >>> @library.option(milestone="collect_wood", max_steps=50)
        ... def chop_tree(ctx): ...
        """

        def register(fn: Callable) -> Callable:
            self.add(Option(name=name or fn.__name__, policy=fn, **kwargs))
            return fn

        return register

    def validate(self) -> OptionLibrary:
        """Every goal must be achievable with the options this library has (a milestone
        declared ``side_effect`` needs no option of its own)."""
        covered = {o.milestone for o in self._options if o.milestone is not None}
        covered |= {m.name for m in self.graph.milestones if m.side_effect}
        reachable = self.graph.achievable(covered)
        for goal in self.graph.goals:
            if goal not in reachable:
                needed = set(self.graph.required_for(goal)) - covered
                raise ValueError(
                    f"library {self.name!r}: goal {goal!r} is unreachable: no option achieves "
                    f"milestone(s) {sorted(needed)} (declare 'side_effect: true' on a milestone "
                    "that another option's effect reaches)"
                )
        return self

    # ------------------------------------------------------------------ access
    def __iter__(self) -> Iterator[Option]:
        return iter(self._options)

    @property
    def options(self) -> tuple[Option, ...]:
        """The options, in the order the manager indexes them (``for option in library`` too)."""
        return tuple(self._options)

    def __len__(self) -> int:
        return len(self._options)

    def __getitem__(self, key: int | str) -> Option:
        if isinstance(key, str):
            if key not in self._index:
                raise KeyError(f"library {self.name!r} has no option {key!r}; known: {self.names}")
            return self._options[self._index[key]]
        return self._options[key]

    def index(self, name: str) -> int:
        return self._index[self[name].name]

    @property
    def names(self) -> list[str]:
        return [o.name for o in self._options]

    @property
    def asks_state(self) -> bool:
        """Whether :meth:`mask` reads the state (some option has a state predicate): without
        one it needs no context."""
        return bool(self._gated)

    def mask(self, achieved: frozenset[str], ctx: OptionContext | None = None) -> np.ndarray:
        """Options the manager may choose now: graph eligibility, then, when a context is
        given, each option's own initiation predicate (and, for an option that restores its
        milestone, that the milestone does not hold now)."""
        achieved = frozenset(achieved)
        base = self._graph_masks.get(achieved)
        if base is None:
            if len(self._graph_masks) >= 4096:
                self._graph_masks.clear()
            base = self._graph_masks[achieved] = self.graph.mask(self, achieved)
        mask = base.copy()
        if ctx is not None:
            for i, opt in self._gated:
                if mask[i]:
                    try:
                        mask[i] = opt.can_start(ctx)
                    except UserCodeError:  # its answer was not a bool: named already
                        raise
                    except Exception as exc:
                        raise UserCodeError(f"initiation predicate {callable_name(opt.initiation)} of option "
                                            f"{opt.name!r} (agent {ctx.agent!r})", exc) from exc
        return mask

    # ------------------------------------------------------------------ YAML
    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], where: str = "library") -> OptionLibrary:
        """Build from ``{"name", "graph": {...} | "module:callable", "options": [...]}``."""
        if not isinstance(spec, Mapping):
            raise ValueError(f"{where}: expected a mapping, got {type(spec).__name__}")
        unknown = set(spec) - {"name", "graph", "options"}
        if unknown:
            raise ValueError(
                f"{where}: unknown key(s) {sorted(unknown)}; accepted: ['graph', 'name', 'options']"
            )
        graph_spec = spec.get("graph")
        if isinstance(graph_spec, str):
            graph = resolve(graph_spec, f"{where}.graph")
            if callable(graph) and not isinstance(graph, TaskGraph):
                graph = user_call(graph, f"{where}.graph")
            if not isinstance(graph, TaskGraph):
                raise ValueError(f"{where}.graph: {graph_spec!r} gave {type(graph).__name__}, expected a TaskGraph; "
                                 "graph is a TaskGraph spec written inline (goals, milestones), or a "
                                 "'module:callable' returning a TaskGraph (e.g. TaskGraph.from_spec(your_spec)) "
                                 "or naming one")
        else:
            try:
                graph = TaskGraph.from_spec(graph_spec if graph_spec is not None else {})
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{where}.graph: {exc}") from None
        library = cls(str(spec.get("name", "library")), graph)
        options = spec.get("options")
        if not isinstance(options, list) or not options:
            raise ValueError(f"{where}.options: expected a non-empty list of options, got {options!r}")
        for i, raw in enumerate(options):
            at = f"{where}.options[{i}]"
            if not isinstance(raw, Mapping):
                raise ValueError(f"{at}: expected a mapping, got {raw!r}")
            bad = set(raw) - _OPTION_KEYS
            if bad:
                raise ValueError(f"{at}: unknown key(s) {sorted(bad)}; accepted: {sorted(_OPTION_KEYS)}")
            kind = raw.get("kind", "callable")
            if not isinstance(kind, str) or (kind != "callable" and kind not in OPTION_KINDS):
                raise ValueError(f"{at}.kind: expected 'callable' (a policy: module:callable), 'llm' or 'neural', "
                                 f"got {kind!r}")
            if kind in OPTION_KINDS:
                what = {"llm": "its model and prompt", "neural": "its saved weights"}[kind]
                if "name" not in raw or kind not in raw or "policy" in raw:
                    raise ValueError(f"{at}: an option of kind {kind!r} needs 'name' and {kind!r} ({what}), "
                                     "and no 'policy'")
                build = resolve(OPTION_KINDS[kind], f"{at}.kind")
                policy = build(raw[kind], name=str(raw["name"]), milestone=raw.get("milestone"), graph=graph,
                               where=f"{at}.{kind}")
                policy.library_entry = {"kind": kind, kind: copy.deepcopy(dict(raw[kind]))}
                raw = {k: v for k, v in raw.items() if k not in ("kind", kind)} | {"policy": policy}
            for other in OPTION_KINDS:
                if other in raw:
                    raise ValueError(f"{at}: {other!r} is for options of kind {other!r}; add kind: {other}")
            if "name" not in raw or "policy" not in raw:
                raise ValueError(f"{at}: 'name' and 'policy' are required")
            kwargs = {k: v for k, v in raw.items() if k != "kind"}
            for key in _CALLABLE_KEYS:
                if isinstance(kwargs.get(key), str):
                    kwargs[key] = resolve(kwargs[key], f"{at}.{key}")
            try:
                library.add(Option(**kwargs))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{at}: {exc}") from None
        return library.validate()

    def to_spec(self) -> dict[str, Any]:
        """Inverse of :meth:`from_spec`: every callable must be importable by reference, and
        an option of a kind (``llm``, ``neural``) must have been loaded from a library entry,
        whose mapping it gives back; errors name the option."""
        options = []
        for opt in self._options:
            kind_entry = getattr(opt.policy, "library_entry", None)
            try:
                entry: dict[str, Any] = {"name": opt.name, **(copy.deepcopy(kind_entry) if kind_entry is not None
                                                              else {"policy": _policy_reference(opt.policy)})}
                if opt.milestone is not None:
                    entry["milestone"] = opt.milestone
                for key in ("initiation", "done", "failure", "features"):
                    if getattr(opt, key) is not None:
                        entry[key] = reference(getattr(opt, key))
            except ValueError as exc:
                raise ValueError(f"library {self.name!r}: option {opt.name!r}: {exc}") from None
            if opt.max_steps != 200:
                entry["max_steps"] = opt.max_steps
            if opt.repeatable:
                entry["repeatable"] = True
            if opt.exclusive:
                entry["exclusive"] = opt.exclusive
            if opt.description:
                entry["description"] = opt.description
            options.append(entry)
        return {"name": self.name, "graph": self.graph.to_spec(), "options": options}

    @classmethod
    def load(cls, source: str | Path, *, env: Any = None, **kwargs: Any) -> OptionLibrary:
        """Load a YAML file, its ``${name}`` variables filled from ``kwargs`` (see
        :func:`fill_variables`), or call a ``module:callable`` that returns a library with
        ``kwargs`` (the config's ``library_kwargs``) and, if it takes an ``env`` argument
        that ``kwargs`` does not give, ``env`` (the env it is built for), as the built-in
        envs' library factories get theirs."""
        text = str(source)
        path = Path(text)
        if path.suffix in (".yaml", ".yml") or path.exists():
            spec = fill_variables(read_yaml(path, "library file"), kwargs, where=path.name)
            return cls.from_spec(spec, where=path.name)
        factory = resolve(text, "library")
        if isinstance(factory, OptionLibrary) or not callable(factory):
            library = factory
        else:
            wants = parameters_of(factory).get("env")
            if env is not None and "env" not in kwargs and wants is not None:
                kwargs = {**kwargs, "env": env}
            elif env is None and "env" not in kwargs and wants is not None and wants.default is wants.empty:
                raise ValueError(f"library {text!r}: {callable_name(factory)} builds the library for an env (its "
                                 "argument 'env') and none was given; pass a config that names the env and this "
                                 "library instead (gyre-ma graph my_config.yaml, gyre-ma check my_config.yaml)")
            library = user_call(factory, f"library {text!r} (library_kwargs)", **kwargs)
        if not isinstance(library, OptionLibrary):
            raise ValueError(f"library: {text!r} gave {type(library).__name__}, expected an OptionLibrary")
        return library.validate()

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_spec(), sort_keys=False))


_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def fill_variables(spec: Any, values: Mapping[str, Any], *, where: str) -> Any:
    """``spec`` (a parsed library YAML) with each ``${name}`` in its strings replaced by
    ``values[name]`` (the config's ``library_kwargs``): a string that is one variable takes
    the value as it is (a number stays a number), one with text around it its ``str``. So a
    shipped library can leave the user's choices — the model directory of its LLM options —
    open. A variable without a value, or a value no variable uses, is an error."""
    used: set[str] = set()
    missing: list[tuple[str, str]] = []

    def fill(node: Any, at: str) -> Any:
        if isinstance(node, Mapping):
            return {k: fill(v, f"{at}.{k}") for k, v in node.items()}
        if isinstance(node, list):
            return [fill(v, f"{at}[{i}]") for i, v in enumerate(node)]
        if not isinstance(node, str) or "${" not in node:
            return node
        names = _VARIABLE.findall(node)
        used.update(names)
        missing.extend((n, at) for n in names if n not in values)
        whole = _VARIABLE.fullmatch(node)
        if whole is not None:
            return values.get(whole.group(1), node)
        return _VARIABLE.sub(lambda m: str(values.get(m.group(1), m.group(0))), node)

    out = fill(spec, where)
    if missing:
        name, at = missing[0]
        raise ValueError(f"{at}: variable ${{{name}}} has no value; set library_kwargs.{name} (in a config, or "
                         f"--set library_kwargs.{name}=VALUE; given: {sorted(values) or 'none'})")
    unused = sorted(set(values) - used)
    if unused:
        raise ValueError(f"library_kwargs: {where} has no variable(s) {unused}; its variables: "
                         f"{sorted(used) or 'none'}")
    return out
