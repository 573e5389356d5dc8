"""Errors from a user's code, named: which callable, which option and agent, and where.

gyre-ma calls code users write — environments, sub-policies, predicates, detectors, rule
checks, factories. An exception from inside one is re-raised as :class:`UserCodeError`,
one line that names what was being called and the user's ``file:line``, so that
``gyre-ma train`` can report it as a user error (exit 2, the traceback under ``--debug``)
and keep tracebacks for gyre-ma's own bugs. It is a ``ValueError`` so that callers that
handle bad input handle it too; the original exception is its ``__cause__``.
"""

from __future__ import annotations

import functools
import inspect
import sysconfig
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_LIBRARY_DIRS = tuple({str(Path(p).resolve()) for key in ("stdlib", "platstdlib", "purelib", "platlib")
                       if (p := sysconfig.get_paths().get(key))})


class UserCodeError(ValueError):
    """An exception raised inside user-supplied code; ``what`` names the call."""

    playable = False
    """Whether it is a fault an episode can play on through (a sub-policy's, an env step's):
    with ``backend.on_fault: continue`` it ends its call or episode rather than the run."""

    def __init__(self, what: str, error: BaseException) -> None:
        self.what, self.error = what, error
        text = " ".join(str(error).split())
        text = text if len(text) <= 300 else text[:300] + "…"
        where = user_frame(error)
        super().__init__(f"{what} raised {type(error).__name__}: {text}" + (f" (at {where})" if where else ""))

    def __reduce__(self) -> tuple:  # its __init__ takes (what, error), not the message pickle would pass
        return _revive, (type(self), self.args, self.__dict__)

    def name_task_seed(self, seed: int) -> None:
        """End the message with ``[episode of task seed S]`` where it names no task seed yet, so
        the episode can be played again (``gyre-ma check --seed S``)."""
        if self.args and "task seed" not in str(self.args[0]):
            self.args = (f"{self.args[0]} [episode of task seed {seed}]", *self.args[1:])


class UserAnswerError(UserCodeError):
    """A user's callable returned what gyre-ma cannot use (it raised nothing): the message
    names the call, the answer, what was expected and where the callable is defined."""

    def __init__(self, what: str, problem: str, fn: Any = None) -> None:
        self.what, self.error = what, None
        where = defined_at(fn)
        ValueError.__init__(self, f"{what} {problem}" + (f" (defined at {where})" if where else ""))


def _revive(cls: type, args: tuple, state: dict[str, Any]) -> BaseException:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


def defined_at(fn: Any) -> str | None:
    """``file:line`` where a user's function is defined (a lambda's line too), else None."""
    code = getattr(inspect.unwrap(getattr(fn, "__func__", fn)), "__code__", None)
    if code is None:  # a callable instance; its __call__ unwrapped from decorators (torch.inference_mode, ...)
        call = getattr(type(fn), "__call__", None)
        code = getattr(inspect.unwrap(call), "__code__", None) if call is not None else None
    return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else None


def user_frame(error: BaseException) -> str | None:
    """``file:line`` of the innermost frame of ``error``'s traceback outside the standard
    library, installed packages and gyre-ma itself (the user's own code), else the
    innermost frame."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return None
    skip = _LIBRARY_DIRS + gyre_ma_dirs()
    for frame in reversed(frames):
        if frame.filename.startswith("<"):  # code with no file: a dataclass's generated __init__, exec'd text
            continue
        path = str(Path(frame.filename).resolve())
        if not path.startswith(skip):
            return f"{frame.filename}:{frame.lineno}"
    return f"{frames[-1].filename}:{frames[-1].lineno}"


@functools.cache
def gyre_ma_dirs() -> tuple[str, ...]:
    """gyre-ma's own source folders, found beside this one (an editable install keeps them
    outside site-packages; an installed gyre-ma is inside it, which is skipped already)."""
    root = Path(__file__).resolve().parents[1]
    return tuple(str(root / name) + "/" for name in ("gyre_ma", "agents", "envs", "options")
                 if (root / name / "__init__.py").is_file())


def callable_name(fn: Any) -> str:
    """A readable name of a user callable: ``module.qualname``, or its type for an instance."""
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return f"{module}.{name}" if module and module != "builtins" else str(name)


def parameters_of(factory: Any) -> Mapping[str, Any]:
    """The parameters of ``factory``'s signature by name (``inspect.Parameter``); empty
    where it has none to read (a builtin), so a caller asks "does it take x?" alike."""
    try:
        return inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return {}


def user_call(factory: Any, where: str, **kwargs: Any) -> Any:
    """``factory(**kwargs)`` for a factory a user wrote (an env's, a library's, a graph's);
    arguments it does not take are a ValueError naming ``where``, an exception from inside
    it a :class:`UserCodeError` naming it."""
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as exc:
        raise ValueError(f"{where}: {callable_name(factory)} rejected the arguments {sorted(kwargs)} ({exc})") from None
    except ValueError:  # no signature to check (a builtin): let the call say
        pass
    try:
        return factory(**kwargs)
    except UserCodeError:
        raise
    except Exception as exc:
        raise UserCodeError(f"{where}: factory {callable_name(factory)}", exc) from exc
