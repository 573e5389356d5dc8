"""The package re-exports its public names lazily (PEP 562), each from the module defining it."""

from __future__ import annotations

import importlib

from gyre_ma import rewards


def test_every_public_name_resolves_to_its_defining_module():
    assert sorted(rewards.__all__) == sorted(rewards._MODULE_OF)
    for name in rewards.__all__:
        module = importlib.import_module(f"gyre_ma.rewards.{rewards._MODULE_OF[name]}")
        assert getattr(rewards, name) is getattr(module, name), name
    assert set(rewards.__all__) <= set(dir(rewards))
    assert rewards.PRMConfig is importlib.import_module("gyre_ma.rewards.prm").PRMConfig
