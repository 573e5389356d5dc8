"""The worked example of a user's own environment (``examples/warehouse``), run as the
README tells a user to: the gyre-ma program from the example's folder, which imports the
user's module from there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

WAREHOUSE = Path(__file__).parents[1] / "examples" / "warehouse"


def _gyre_ma(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    program = shutil.which("gyre-ma", path=str(Path(sys.executable).parent)) or shutil.which("gyre-ma")
    assert program is not None, "the gyre-ma console script is installed with the package"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, program, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_the_warehouse_example_checks_trains_and_evaluates_from_its_folder(tmp_path):
    work = tmp_path / "warehouse"
    shutil.copytree(WAREHOUSE, work)
    checked = _gyre_ma("check", "warehouse.yaml", cwd=work)
    assert checked.returncode == 0, checked.stderr[-2000:]
    assert "5 of 5 milestones verified; goals ['product_done'] reached" in " ".join(checked.stdout.split())
    trained = _gyre_ma("train", "warehouse.yaml", "--iterations", "2", "--quiet", cwd=work)
    assert trained.returncode == 0, trained.stderr[-2000:]
    for config, extra in (("warehouse.yaml", ["--trust-config"]), ("oracle.yaml", [])):
        out = _gyre_ma("eval", config, "--episodes", "10", *extra, "--json", f"{config}.json", cwd=work)
        assert out.returncode == 0, out.stderr[-2000:]
        result = json.loads((work / f"{config}.json").read_text())
        assert len(result["episodes"]) == 10 and 0.0 <= result["success_rate"] <= 1.0
        assert "since the run trained" not in out.stdout  # the code it trained with
    with (work / "warehouse.py").open("a") as f:  # a session-58 user edited their env between train and eval
        f.write("\n# edited after training\n")
    out = _gyre_ma("eval", "warehouse.yaml", "--episodes", "1", "--trust-config", cwd=work)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"warning: {(work / 'warehouse.py').resolve()} has changed since the run trained" in " ".join(
        out.stdout.split())
    oracle = json.loads((work / "oracle.yaml.json").read_text())
    assert oracle["success_rate"] == 1.0 and oracle["episode_length"] < 150  # random orders take ~160 steps
