"""Wall-clock bounds on a user's code: per option call and per episode.

A sub-policy that blocks (a sleep, a stuck request, an infinite loop) used to hang the
local backend forever. :class:`Watchdog` bounds two things in the process that plays
episodes:

- an option call's time inside its sub-policy, summed over the call's steps
  (``backend.option_timeout_s``): past it the call ends as a failure
  (:attr:`~gyre_ma.options.option.Termination.TIMEOUT`), counted, and its agent decides
  again;
- an episode's wall-clock time (``backend.episode_timeout_s``): past it the episode is
  cut as a truncation, counted.

The rollout loop checks both after every sub-policy step (two clock reads). A call that
never returns is interrupted: a daemon thread watches the deadlines and, in a process
whose main thread plays the episodes (the local backend, Ray actors), sends that thread
``SIGUSR2`` (not ``SIGALRM``, which pytest-timeout and others own), whose handler raises
:class:`OptionTimeout` / :class:`EpisodeTimeout` at the point where it is stuck.
Elsewhere (a rollout off the main thread) only the checks after each step apply.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class OptionTimeout(BaseException):
    """An option call ran past its wall-clock budget (raised inside its sub-policy). A
    BaseException, like KeyboardInterrupt, so that no ``except Exception`` in a user's
    code or in gyre-ma's wrappers of it swallows it."""


class EpisodeTimeout(BaseException):
    """An episode ran past its wall-clock budget (see :class:`OptionTimeout`)."""


class Watchdog:
    """Deadlines of the option step and the episode in progress, and the thread that
    enforces them. One per process (:func:`watchdog`); the rollout loop sets
    :attr:`option_deadline` around each sub-policy step and :attr:`episode_deadline` for
    each episode (``math.inf``: none)."""

    def __init__(self) -> None:
        self.option_deadline = math.inf
        self.episode_deadline = math.inf
        self._fired: type[BaseException] | None = None
        self._thread: threading.Thread | None = None
        self._main = threading.main_thread().ident

    def start(self) -> None:
        """Install the ``SIGUSR2`` handler and start the thread (once; only from the main
        thread, else the after-step checks alone apply)."""
        if self._thread is not None or threading.current_thread() is not threading.main_thread():
            return
        if not hasattr(signal, "pthread_kill"):
            return
        signal.signal(signal.SIGUSR2, self._handler)
        self._thread = threading.Thread(target=self._watch, name="gyre-ma-watchdog", daemon=True)
        self._thread.start()

    def _handler(self, signum: int, frame: object) -> None:
        fired, self._fired = self._fired, None
        now = time.perf_counter()
        if fired is OptionTimeout and now >= self.option_deadline:
            raise OptionTimeout()
        if fired is EpisodeTimeout and now >= self.episode_deadline:
            raise EpisodeTimeout()

    def _watch(self) -> None:
        while True:
            now = time.perf_counter()
            nearest = min(self.option_deadline, self.episode_deadline)
            if now >= nearest and self._fired is None:
                self._fired = OptionTimeout if now >= self.option_deadline else EpisodeTimeout
                signal.pthread_kill(self._main, signal.SIGUSR2)
                time.sleep(0.05)  # let the handler run before looking again
                continue
            time.sleep(min(max(nearest - now, 0.01), 0.25))


class TimeBound:
    """``bound(call)`` runs ``call()`` for at most ``seconds`` of wall-clock time under this
    process's watchdog, raising ``TimeoutError`` past them (an option's ``features``, bounded
    by ``backend.option_timeout_s`` as its sub-policy is). Called where no sub-policy step
    is in progress (a decision), so the option deadline is free."""

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)

    def __call__(self, call: Callable[[], T]) -> T:
        watch = watchdog()
        watch.option_deadline = time.perf_counter() + self.seconds
        try:
            return call()
        except OptionTimeout:
            raise TimeoutError(f"no answer within backend.option_timeout_s={self.seconds:g} s (a search that does "
                               "not end on this observation?)") from None
        finally:
            watch.option_deadline = math.inf


_WATCHDOG: Watchdog | None = None


def watchdog() -> Watchdog:
    """This process's watchdog, started on first use."""
    global _WATCHDOG
    if _WATCHDOG is None:
        _WATCHDOG = Watchdog()
        _WATCHDOG.start()
    return _WATCHDOG
