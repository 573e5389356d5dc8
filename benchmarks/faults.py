"""Fuzz and fault suite: broken input, malicious checkpoints, stuck options, kills.

Prints one JSON object with the figures of issue #18:

- ``configs``: generated broken configs and ``--set`` values (wrong types, unknown keys at
  every level, NaN / inf, huge and negative numbers, an empty or list document, a list for
  a mapping, non-UTF-8 bytes, a YAML alias bomb, deep nesting, a 50 MB file), each run
  through ``gyre-ma check`` (files) or ``gyre-ma train --set`` (values, in-process): how
  many exited 2 within 10 s with one line, no traceback, naming the key; the ones that
  did not, listed.
- ``checkpoints``: malicious checkpoints tried (pickle payloads, config references,
  revive records, a stored generator) and how many ran code (a marker file appeared).
- ``stuck_options``: a sub-policy that blocks for an hour, bounded by
  ``backend.option_timeout_s``: seconds the episode took.
- ``kills`` (``--kills N``, 0 to skip): ``gyre-ma train`` SIGKILLed at random moments and
  resumed until done: kills, resumes, metrics rows lost or duplicated, and whether the
  final parameters equal an uninterrupted run's.

    python benchmarks/faults.py --kills 50 > benchmarks/results/faults.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DOORKEY = ROOT / "configs" / "minigrid_doorkey.yaml"


# ---------------------------------------------------------------------------- broken configs
def _sections() -> dict[str, Any]:
    from gyre_ma.config import ExperimentConfig

    return {name: field.annotation for name, field in ExperimentConfig.model_fields.items()}


def broken_configs() -> list[tuple[str, Any, str]]:
    """``(label, document, key the error must name)``: a document is a dict (dumped to YAML)
    or bytes written as is."""
    from pydantic import BaseModel

    from gyre_ma.config import ExperimentConfig

    cases: list[tuple[str, Any, str]] = []
    bad_values = {"list": [1, 2], "mapping": {"a": 1}, "string": "not-a-number", "nan": float("nan"),
                  "inf": float("inf"), "huge": 10**30, "negative": -5}
    for section, model in _sections().items():
        if isinstance(model, type) and issubclass(model, BaseModel):
            cases.append((f"unknown key in {section}", {section: {"bogus_key": 1}}, f"{section}.bogus_key"))
            cases.append((f"{section} as a list", {section: [1, 2]}, section))
            for field, info in model.model_fields.items():
                kind = info.annotation
                for label, value in bad_values.items():
                    if _accepts(kind, value) or (label == "huge" and "int" not in repr(kind)):
                        continue  # a huge float is a value, not a typo that hangs
                    cases.append((f"{section}.{field} = {label}", {section: {field: value}}, f"{section}.{field}"))
        else:
            for label, value in bad_values.items():
                if not _accepts(model, value):
                    cases.append((f"{section} = {label}", {section: value}, section))
    cases.append(("unknown top-level key", {"bogus_section": {}}, "bogus_section"))
    cases.append(("a list document", b"- 1\n- 2\n", "mapping"))
    cases.append(("an empty file", b"", "empty"))
    cases.append(("a file of comments only", b"# nothing here\n", "empty"))
    cases.append(("non-UTF-8 bytes", b"seed: \xd8\xff\n", "UTF-8"))
    cases.append(("invalid YAML", b"train: [unclosed\n", "YAML"))
    cases.append(("alias bomb in backend.ray_init", _bomb().encode(), "aliases"))
    cases.append(("nesting 500 deep", ("train:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(500))).encode(),
                  "nests"))
    cases.append(("a 50 MB file", b"seed: 1\n#" + b"x" * (50 << 20) + b"\n", "bytes"))
    assert ExperimentConfig  # the sections above come from it
    return cases


def _accepts(annotation: Any, value: Any) -> bool:
    """Whether ``value`` is a valid value of a field of this annotation (then not a broken case)."""
    import math

    text = repr(annotation)
    if isinstance(value, str):
        return "str" in text or "Any" in text or "Literal" in text and value in text
    if isinstance(value, dict):
        return "dict" in text or "Any" in text or "Config" in text
    if isinstance(value, list):
        return "list" in text or "tuple" in text or "Any" in text
    if isinstance(value, float) and not math.isfinite(value):
        return "Any" in text
    if isinstance(value, int) and value < 0:
        return True  # many fields take negatives; the range checks are asserted elsewhere
    return "Any" in text


def _bomb(levels: int = 12) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "backend:\n  ray_init:\n" + "\n".join("    " + line for line in lines) + "\n"


def broken_sets() -> list[tuple[str, list[str], str]]:
    """``(label, --set arguments, key the error must name)``."""
    cases = [("not YAML", ["seed=[1"], "seed"), ("unclosed mapping", ["train={lr: 1"], "train"),
             ("tab in value", ["train.lr=\t- x"], "train.lr"), ("unknown nested key", ["train.bogus=1"], "train.bogus"),
             ("unknown section", ["nope.key=1"], "nope"), ("not a section", ["seed.inner=1"], "seed"),
             ("no equals sign", ["train.lr"], "train.lr"), ("NaN lr", ["train.lr=.nan"], "train.lr"),
             ("huge iterations", ["train.iterations=1e30"], "train.iterations"),
             ("list for a section", ["credit=[1, 2]"], "credit")]
    for key in ("train.iterations", "train.episodes_per_iteration", "checkpoints.validation_window",
                "backend.workers", "manager.hidden", "roles.evaluators", "buffer.capacity"):
        cases += [(f"{key} huge", [f"{key}=1000000000000"], key), (f"{key} string", [f"{key}=abc"], key),
                  (f"{key} list", [f"{key}=[1]"], key)]
    return cases


def _run_cli(argv: list[str]) -> tuple[int, str, float]:
    from gyre_ma.cli import main

    err = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        import gyre_ma.cli as cli

        console = cli.err_console
        cli.err_console = type(console)(file=err, highlight=False, width=100_000)
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse
            rc = int(exc.code or 0)
        finally:
            cli.err_console = console
    return rc, err.getvalue(), time.perf_counter() - start


def fuzz(workdir: Path) -> dict[str, Any]:
    import yaml

    failures, total = [], 0
    for i, (label, doc, key) in enumerate(broken_configs()):
        path = workdir / f"config_{i}.yaml"
        path.write_bytes(doc if isinstance(doc, bytes) else yaml.safe_dump(doc).encode())
        total += 1
        rc, err, seconds = _run_cli(["check", str(path)])
        _judge(failures, label, rc, err, seconds, key)
    for label, sets, key in broken_sets():
        total += 1
        argv = ["train", str(DOORKEY), "--run-root", str(workdir / "runs"), "--quiet"]
        argv += [x for s in sets for x in ("--set", s)]
        rc, err, seconds = _run_cli(argv)
        _judge(failures, f"--set {label}", rc, err, seconds, key)
    return {"tried": total, "one_line_exit_2_naming_the_key": total - len(failures), "failures": failures}


def _judge(failures: list, label: str, rc: int, err: str, seconds: float, key: str) -> None:
    lines = [line for line in err.strip().splitlines() if line]
    ok = rc == 2 and len(lines) == 1 and "Traceback" not in err and seconds < 10.0 and key in err
    if not ok:
        failures.append({"case": label, "rc": rc, "seconds": round(seconds, 2), "lines": len(lines),
                         "message": err.strip()[:300]})


# ---------------------------------------------------------------------------- malicious checkpoints
class _Touch:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def checkpoints(workdir: Path) -> dict[str, Any]:
    import torch

    from gyre_ma.checkpoints import from_storable, load_checkpoint, save_checkpoint, to_storable
    from gyre_ma.config import load_config
    from gyre_ma.loop import Gyre
    from gyre_ma.rollout import trajectory_from_state

    marker = workdir / "MARKER"
    cfg = load_config(DOORKEY, {"run_root": str(workdir / "runs"), "buffer.enabled": True, "train.iterations": 1})
    gyre = Gyre(cfg)
    try:
        gyre.iteration(0)
        state = gyre.state_dict()
    finally:
        gyre.close()
    tried, refused = 0, 0
    touch = ["touch", str(marker)]

    def attempt(fn) -> None:
        nonlocal tried, refused
        tried += 1
        try:
            fn()
        except (ValueError, TypeError):
            refused += 1

    for kind in ("zip", "legacy", "raw_pickle"):
        path = workdir / f"pickle_{kind}.pt"
        payload = {"policy": _Touch(str(marker)), "config": {}}
        if kind == "raw_pickle":
            path.write_bytes(pickle.dumps(payload))
        else:
            torch.save(payload, path, _use_new_zipfile_serialization=kind == "zip")
        attempt(lambda p=path: load_checkpoint(p))
    for env_id in ("subprocess:run", "os:system", "gyre_ma.files:write_text"):
        evil = dict(state, config=dict(state["config"], env={"id": env_id, "kwargs": {"args": touch}}))
        path = save_checkpoint(workdir / "config_ref.pt", evil)
        rc, _, _ = _run_cli(["eval", str(path), "--episodes", "1"])
        tried += 1
        refused += rc == 2
    buffer = state["buffer"]
    for old in ("gyre_ma.roles:RoleTrajectory", "gyre_ma.rewards.breakdown:RewardBreakdown"):
        evil = _replace(state, old, "subprocess:run")
        gyre = Gyre(cfg)
        try:
            attempt(lambda e=evil: gyre.load_state_dict(from_storable(to_storable(e))))
        finally:
            gyre.close()
    attempt(lambda: trajectory_from_state({"class": "subprocess:run", "calls": []}))
    attempt(lambda: from_storable({"__gyre_numpy_generator__": {"bit_generator": "seed", "state": {}}}))
    assert buffer is not None
    return {"tried": tried, "refused": refused, "code_ran": marker.exists()}


def _replace(node: Any, old: str, new: str) -> Any:
    if isinstance(node, dict):
        return {k: (new if isinstance(v, str) and v == old else _replace(v, old, new)) for k, v in node.items()}
    if isinstance(node, list):
        return [_replace(v, old, new) for v in node]
    return node


# ---------------------------------------------------------------------------- stuck options
def stuck_options() -> dict[str, Any]:
    import warnings

    from gyre_ma.agents.baselines import RandomManager
    from gyre_ma.backends.faults import stuck_library
    from gyre_ma.envs.registry import make_env
    from gyre_ma.rollout import run_episode

    env = make_env("coverage_v0")
    library = stuck_library(env, seconds=3600.0)
    out = []
    for seed in range(3):
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traj = run_episode(env, library, RandomManager(seed), seed=seed, option_timeout_s=0.5,
                               episode_timeout_s=20.0)
        out.append({"seconds": round(time.perf_counter() - start, 2), "option_timeouts": len(traj.option_timeouts)})
    return {"sub_policy_blocks_s": 3600, "option_timeout_s": 0.5, "episodes": out}


# ---------------------------------------------------------------------------- kills
def kills(workdir: Path, n: int, iterations: int, seed: int) -> dict[str, Any]:
    """Kill ``gyre-ma train`` at random moments until ``n`` kills, resuming each time, and
    compare with an uninterrupted run."""
    import torch

    from gyre_ma.checkpoints import load_checkpoint

    rng = np.random.default_rng(seed)
    base = [sys.executable, "-m", "gyre_ma.cli", "train", str(DOORKEY), "--iterations", str(iterations), "--quiet"]
    clean_root = workdir / "clean"
    start = time.perf_counter()
    subprocess.run(base + ["--run-root", str(clean_root)], check=True, capture_output=True, timeout=1800)
    duration = time.perf_counter() - start
    clean = load_checkpoint(clean_root / "minigrid_doorkey" / "checkpoints" / "final.pt")["policy"]
    killed = resumes = rows_lost = rows_duplicated = runs = unequal = 0
    while killed < n:  # runs killed and resumed until done, each compared with the clean one
        root = workdir / f"killed_{runs}"
        runs += 1
        for attempt in itertools.count():
            resume = (root / "minigrid_doorkey" / "checkpoints" / "manifest.json").is_file()
            proc = subprocess.Popen(base + ["--run-root", str(root)] + (["--resume"] if resume else []),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            resumes += resume
            try:
                proc.wait(timeout=float(rng.uniform(1.0, duration)) if killed < n else 1800)
                if proc.returncode == 0:
                    break
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                killed += 1
        rows = [int(float(r)) for r in _column(root / "minigrid_doorkey" / "metrics.csv", "iteration")]
        rows_lost += len(set(range(iterations)) - set(rows))
        rows_duplicated += len(rows) - len(set(rows))
        final = load_checkpoint(root / "minigrid_doorkey" / "checkpoints" / "final.pt")["policy"]
        unequal += not all(torch.equal(clean[k], final[k]) for k in clean)
    return {"kills": killed, "resumes": resumes, "runs": runs, "iterations_per_run": iterations,
            "rows_lost": rows_lost, "rows_duplicated": rows_duplicated,
            "runs_whose_final_parameters_differ_from_uninterrupted": unequal}


def _column(path: Path, name: str) -> list[str]:
    import csv

    with path.open(newline="") as f:
        return [row[name] for row in csv.DictReader(f)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=50, help="SIGKILLs of gyre-ma train (0: skip)")
    p.add_argument("--kill-iterations", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="gyre-faults-") as tmp:
        work = Path(tmp)
        start = time.perf_counter()
        result = {"benchmark": "faults", "configs": fuzz(work), "checkpoints": checkpoints(work),
                  "stuck_options": stuck_options()}
        if args.kills:
            result["kills"] = kills(work, args.kills, args.kill_iterations, args.seed)
        result["wall_seconds"] = time.perf_counter() - start
    print(json.dumps(result))


if __name__ == "__main__":
    main()
