"""Every registered environment passes PettingZoo's conformance tests and gyre's checks."""

from __future__ import annotations

import importlib

import pytest

from gyre_ma.envs.registry import ENVIRONMENTS, make_env, make_library
from gyre_ma.envs.testing import check_env


@pytest.mark.parametrize("env_id", sorted(ENVIRONMENTS))
def test_check_env_passes_on_every_shipped_environment(env_id):
    module = importlib.import_module(f"gyre_ma.envs.{env_id}")
    env = make_env(env_id)
    library = make_library(env_id, env)
    report = check_env(lambda: make_env(env_id), library=library, module=module, seeds=(0, 1, 2), n_steps=300)
    assert {"parallel_api_test", "parallel_seed_test", "api_test", "seed_test", "max_cycles_test"} <= set(
        report.pettingzoo_tests
    )
    assert report.milestones, "the random manager should verify at least one milestone"
