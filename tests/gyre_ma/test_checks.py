"""check_setup: every registered environment and the adapted MiniGrid pass PettingZoo's
conformance tests and gyre's checks, driven by their own option libraries."""

from __future__ import annotations

import importlib

import pytest

from gyre_ma.checks import check_setup
from gyre_ma.envs.minigrid_doorkey import make_env as make_doorkey
from gyre_ma.envs.minigrid_doorkey import make_library as make_doorkey_library
from gyre_ma.envs.registry import ENVIRONMENTS, make_env, make_library


@pytest.mark.parametrize("env_id", sorted(ENVIRONMENTS))
def test_check_env_passes_on_every_shipped_environment(env_id):
    module = importlib.import_module(f"gyre_ma.envs.{env_id}")
    env = make_env(env_id)
    library = make_library(env_id, env)
    report = check_setup(lambda: make_env(env_id), library, module=module, seeds=(0, 1, 2), n_steps=300)
    assert {"parallel_api_test", "parallel_seed_test", "api_test", "seed_test", "max_cycles_test"} <= set(
        report.pettingzoo_tests
    )
    assert report.milestones, "the random manager should verify at least one milestone"


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_check_setup_passes_on_adapted_minigrid_driven_by_its_options() -> None:
    report = check_setup(make_doorkey, make_doorkey_library(), n_steps=100)
    assert report.milestones == {"has_key", "door_open", "reached_goal"}
    assert report.pettingzoo_tests == ("parallel_api_test", "parallel_seed_test", "api_test", "seed_test")
    assert report.steps > 0


