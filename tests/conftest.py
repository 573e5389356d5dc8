"""Fixtures shared by the tests of the benchmark scripts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
