"""The generalisation benchmark's run folders: a killed run's is removed by the next run,
a live run's and anything not named for a process are left alone."""

from __future__ import annotations

import os
import subprocess
import sys


def test_a_killed_runs_folder_is_swept_and_no_other(tmp_path, generalisation):
    bench = generalisation
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its id now names no process (reuse within the test is not a worry)
    dead = tmp_path / f"{bench.SCRATCH}{gone.pid}-abc123"
    live = tmp_path / f"{bench.SCRATCH}{os.getpid()}-def456"
    unnamed = tmp_path / f"{bench.SCRATCH}k3j_x9"  # the naming before process ids
    other = tmp_path / f"gyre-faults-{gone.pid}-x"
    for folder in (dead, live, unnamed, other):
        (folder / "run").mkdir(parents=True)
        (folder / "run" / "latest.pt").write_bytes(b"x")
    assert bench.sweep_scratch(str(tmp_path)) == [str(dead)]
    assert not dead.exists() and live.exists() and unnamed.exists() and other.exists()
