"""Rollout backends: ``local`` (in-process, the default) and ``ray`` (rollout actors).

Importing this package never imports ray; :func:`make_backend` imports a backend's
module only when it is chosen.
"""

from gyre_ma.backends.base import BACKENDS, Backend, make_backend

__all__ = ["BACKENDS", "Backend", "make_backend"]
