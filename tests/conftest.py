"""Fixtures shared by the tests of the benchmark scripts, and the Hypothesis profile.

Property tests draw the same examples on every run (``derandomize``): the suite that
decides whether a change lands gives the same verdict twice (a fresh CI machine, with no
example database, once drew a float round-off case that no run here had). To explore
afresh: ``HYPOTHESIS_PROFILE=explore python -m pytest``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]

settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


@pytest.fixture(scope="session")
def generalisation():
    """``benchmarks/generalisation.py`` as a module (the folder is not a package)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("generalisation_bench", ROOT / "benchmarks" / "generalisation.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
