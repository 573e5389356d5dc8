"""``benchmarks/generalisation_curves.py``: runs pooled over files, read at shared points,
a run seed given twice refused."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    path = ROOT / "benchmarks" / "generalisation_curves.py"
    spec = importlib.util.spec_from_file_location("generalisation_curves", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _result(seeds, curves, path):
    """A generalisation.py output for one env, ``curves[k]`` the (env_steps, sampled, length) points of run k."""
    runs = [{"curve": [{"env_steps": s, "success_rate": v, "validation/sampled_success": v,
                        "validation/greedy_success": 1.0, "episode_length": length} for s, v, length in curve],
             "sampled": {"success": 1.0, "mean_length": 11.0}, "greedy": {"success": 1.0, "mean_length": 10.0}}
            for curve in curves]
    reference = {"oracle": {"success": 1.0, "mean_length": 10.0}, "random": {"success": 0.5, "mean_length": 15.0}}
    path.write_text(json.dumps({"seeds": seeds, "envs": {"toy": {"reference": reference, "runs": runs}}}))
    return str(path)


def test_runs_of_two_files_are_pooled_and_read_at_the_same_points(tmp_path):
    a = _result([0, 1], [[(100, 0.5, 20.0), (200, 0.95, 12.0)], [(100, 0.2, 30.0), (200, 0.6, 14.0)]],
                tmp_path / "a.json")
    b = _result([2], [[(100, 0.9, 11.0), (250, 1.0, 10.0)]], tmp_path / "b.json")
    out = json.loads(subprocess.run([sys.executable, str(ROOT / "benchmarks" / "generalisation_curves.py"), a, b,
                                     "--png", str(tmp_path / "c.png")],
                                    capture_output=True, text=True, check=True).stdout)
    toy = out["envs"]["toy"]
    assert toy["run_seeds"] == [0, 1, 2] and toy["env_steps_per_run"] == [200, 200, 250]
    assert toy["steps_to_sampled_0.9"]["per_run"] == [200, None, 100]  # run 1 never reached it
    last = toy["at"][-1]  # at the shortest run's end (200): 0.95, 0.6, 0.9; lengths 1.2, 1.4, 1.1
    assert last["env_steps"] == 200
    assert last["sampled_success"][0] == pytest.approx(0.817, abs=1e-3)  # the IQM of three runs is their mean
    assert last["length_ratio"][0] == pytest.approx(1.233, abs=1e-3)
    assert toy["final_heldout"]["sampled"]["length_ratio"] == [1.1, 1.1, 1.1]
    assert (tmp_path / "c.png").stat().st_size > 0


def test_a_run_seed_in_two_files_is_refused(tmp_path):
    a = _result([0, 1], [[(100, 0.5, 20.0)], [(100, 0.2, 30.0)]], tmp_path / "a.json")
    b = _result([1], [[(100, 0.9, 11.0)]], tmp_path / "b.json")
    with pytest.raises(ValueError, match=r"env 'toy': run seed 1 is in .*b\.json and in an earlier file"):
        _script().pooled([a, b])
