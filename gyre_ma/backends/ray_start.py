"""Starting Ray for gyre-ma: the user's ``ray.init`` arguments checked before anything
starts, a private instance unless an address is given, and an unreachable address named
at once rather than retried for minutes.

Imports ``ray`` only when called, so the experiment driver and the CLI stay light.
"""

from __future__ import annotations

import inspect
import os
import socket
from collections.abc import Mapping
from typing import Any

CONNECT_TIMEOUT_S = 5.0
"""Seconds to wait for a TCP connection to a given cluster address before calling it unreachable."""


def start_ray(init: Mapping[str, Any] | None = None, *, where: str = "backend.ray_init", **defaults: Any) -> None:
    """``ray.init(**(defaults | init))``, with:

    * every key of ``init`` one of ``ray.init``'s arguments (a misspelt key is named, with
      the accepted ones, as a mistake in ``where``; before, Ray raised a RuntimeError
      after starting, which read as a bug in gyre-ma);
    * no ``address`` (and no ``RAY_ADDRESS`` in the environment): ``address="local"``, a
      Ray instance of this process's own. Ray's default joins any cluster already started
      on the machine (``ray start``), someone else's on a shared one;
    * an address ``host:port`` (or ``ray://host:port``) that takes no TCP connection within
      :data:`CONNECT_TIMEOUT_S` named as unreachable (Ray itself retries for minutes)."""
    import ray

    args = dict(defaults) | dict(init or {})
    accepted = sorted(p for p, spec in inspect.signature(ray.init).parameters.items()
                      if spec.kind is not inspect.Parameter.VAR_KEYWORD)
    unknown = sorted(k for k in args if k not in accepted and not str(k).startswith("_"))
    if unknown:
        raise ValueError(f"{where}: unknown ray.init argument(s) {unknown}; accepted: {accepted}")
    if args.get("address"):
        _check_reachable(str(args["address"]), where)
    elif os.environ.get("RAY_ADDRESS"):
        _check_reachable(os.environ["RAY_ADDRESS"], "RAY_ADDRESS (the environment)")
    else:
        args["address"] = "local"
    try:
        ray.init(**args)
    except ConnectionError as exc:
        if args["address"] == "local" or os.environ.get("RAY_AUTH_MODE") == "token":
            raise
        raise ValueError(f"{where}: {exc}; a cluster started with token authentication (what ray start does since "
                         "Ray 2.59) takes only drivers that send its token: set RAY_AUTH_MODE=token in the "
                         "environment (the token is read from RAY_AUTH_TOKEN or ~/.ray/auth_token; ray "
                         "get-auth-token prints it), or on the head machine use the address auto") from None


def _check_reachable(address: str, where: str) -> None:
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():  # "auto", "local", a name Ray resolves itself
        return
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ValueError(f"{where}: no Ray cluster answers at {address!r} ({exc.strerror or exc}); start one "
                         "there (ray start --head) or correct the address") from None
