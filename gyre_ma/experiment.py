"""Experiments: seeds × variants of one base config, run in parallel, resumable.

An experiment file (YAML, validated like a config) names a base config, named variants
as override mappings, the seeds, a budget, what to report and how to evaluate:

.. code-block:: yaml

    name: credit
    base: ../configs/quickstart.yaml   # relative to this file
    overrides: {train.episodes_per_iteration: 16}
    variants:
      milestone: {}
      plain_gae: {credit.mode: plain}
    seeds: 10                          # or a list: [0, 1, 2]
    budget: {iterations: 30}
    report:
      metrics: [validation/sampled_success, validation/greedy_success]
      thresholds: {validation/sampled_success: 0.9}
    evaluation: {episodes: 100}

``gyre-ma experiment FILE`` trains every (variant, seed) as an ordinary run directory,
``<root>/<name>/runs/<variant>-s<seed>``, by running ``gyre-ma train`` on the base config
with the overrides as ``--set`` (so every rule of a run — its lock, resume, config check —
holds here too), then evaluates the run's final policy on held-out task seeds, sampled and
greedy (``eval.json`` in the run directory). Rerunning the experiment skips finished runs
and resumes killed ones from their checkpoint; runs are children of the experiment and
die with it. Runs play in ``--jobs`` local processes (one torch thread each:
``trainer.threads``) or as Ray tasks (``--ray``). A variant with an ``sb3`` mapping trains
Stable-Baselines3 PPO instead (:mod:`gyre_ma.experiment_sb3`). ``gyre-ma report`` turns the
folder into tables with intervals (:mod:`gyre_ma.report`).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gyre_ma.config import MAX_COUNT, ConfigError, _format_error, dump_config, load_config
from gyre_ma.experiment_sb3 import STATE as SB3_STATE
from gyre_ma.experiment_sb3 import SB3Spec
from gyre_ma.files import lock_folder, write_json, write_text
from gyre_ma.options.yaml_file import read_yaml

EVAL_FILE = "eval.json"
"""A run's held-out evaluation, written once it is complete: its presence marks the run done."""
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.+=-]*$"


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True, allow_inf_nan=False)


class Budget(_Spec):
    iterations: int = Field(ge=1, le=MAX_COUNT)
    """Training iterations of every run (``train.iterations``); a variant may set its own
    ``train.iterations`` (e.g. a baseline at 10x the budget)."""


class AtMost(_Spec):
    at_most: float = Field(allow_inf_nan=False)
    """The level a metric reaches by falling to it (a mean episode length, a loss)."""


class ReportSpec(_Spec):
    metrics: list[str] = Field(default_factory=lambda: ["validation/sampled_success", "validation/greedy_success"])
    """``metrics.csv`` columns whose learning curves and final values are reported."""
    thresholds: dict[str, float | AtMost] = Field(default_factory=dict)
    """Metric → level: the env steps at which each run first reached it (steps-to-threshold);
    a number is reached by rising to it (success), ``{at_most: x}`` by falling to x (length)."""
    reps: int = Field(2000, ge=100, le=100_000)
    """Bootstrap resamples of every interval."""
    smooth: int = Field(1, ge=1, le=101)
    """Besides the raw curve's, steps-to-threshold is also read off each run's curve
    smoothed by a centred moving average over this many measured iterations (odd;
    :func:`gyre_ma.stats.centred_mean`), reported beside it; 1: the raw curve only."""

    @field_validator("smooth")
    @classmethod
    def _odd(cls, value: int) -> int:
        if value % 2 == 0:
            raise ValueError(f"must be odd (a centred window), got {value}")
        return value


class EvaluationSpec(_Spec):
    episodes: int = Field(100, ge=1, le=100_000)
    """Held-out task seeds each run's policy plays, once sampled and once greedy."""
    seed: int = Field(1_000_000, ge=0)
    """First held-out task seed (no training or validation episode uses this range)."""
    checkpoint: Literal["final", "best"] = "final"
    """``final``: the last policy; ``best``: the one validation chose."""

    @model_validator(mode="after")
    def _held_out(self) -> EvaluationSpec:
        from gyre_ma.roles import check_held_out_seeds  # imports torch: only where an experiment file is read

        check_held_out_seeds(self.seed, self.episodes, "seed")
        return self


class ExperimentSpec(_Spec):
    name: str = Field(pattern=_NAME, max_length=200)
    """The experiment's folder under ``root``: one path component."""
    base: str = Field(min_length=1)
    """The base config YAML, relative to the experiment file's folder."""
    root: str = "runs/experiments"
    """Folder of experiment folders, relative to the current directory."""
    overrides: dict[str, Any] = Field(default_factory=dict)
    """Dotted keys (or nested mappings) set on the base config for every variant."""
    variants: dict[str, dict[str, Any]] = Field(min_length=1)
    """Variant name → its overrides, on top of ``overrides``. A variant with an ``sb3``
    mapping trains Stable-Baselines3 PPO on the run's env instead (:mod:`gyre_ma.experiment_sb3`)."""
    seeds: int | list[int] = 3
    """Run seeds (``seed``): a count (0 .. n-1) or a list."""
    budget: Budget
    """Every run's training budget, e.g. ``budget: {iterations: 30}``."""
    report: ReportSpec = Field(default_factory=ReportSpec)
    evaluation: EvaluationSpec = Field(default_factory=EvaluationSpec)

    @field_validator("variants")
    @classmethod
    def _variant_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        import re

        for name in value:
            if not re.match(_NAME, name) or len(name) > 100:
                raise ValueError(f"variant name {name!r} must be one path component: letters, digits, _ . + = -")
        return value

    @field_validator("seeds")
    @classmethod
    def _seed_list(cls, value: int | list[int]) -> int | list[int]:
        seeds = list(range(value)) if isinstance(value, int) else value
        if not seeds or len(seeds) > 10_000 or len(set(seeds)) != len(seeds) or min(seeds) < 0:
            raise ValueError("must be a count in [1, 10000] or a list of distinct seeds >= 0")
        return value

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.seeds)) if isinstance(self.seeds, int) else list(self.seeds)


@dataclass(frozen=True)
class RunSpec:
    """One (variant, seed) of an experiment and the ``gyre-ma train`` overrides that make it."""

    variant: str
    seed: int
    overrides: dict[str, Any]
    sb3: SB3Spec | None = None
    """Stable-Baselines3 PPO trains this run instead of ``gyre-ma train``."""

    @property
    def name(self) -> str:
        return f"{self.variant}-s{self.seed}"


@dataclass
class Experiment:
    """An experiment file, read and checked: every run's config is validated before any runs."""

    spec: ExperimentSpec
    source: Path
    base: Path
    folder: Path
    runs: list[RunSpec]
    workdir: Path | None = None
    """The folder the experiment was started in, where each run's process starts too (it
    imports the user's modules from there), wherever it runs: a Ray task on an existing
    cluster starts in the folder the cluster was started in."""
    pythonpath: str | None = None
    """The starting process's ``PYTHONPATH``, which each run's process is given."""

    @property
    def runs_dir(self) -> Path:
        return self.folder / "runs"

    def run_dir(self, run: RunSpec) -> Path:
        return self.runs_dir / run.name


def load_experiment(path: str | Path, *, root: str | None = None) -> Experiment:
    """Read and validate an experiment file and the config of each of its runs; a mistake
    raises one :class:`ConfigError` naming the key (and the variant)."""
    source = Path(path)
    data = read_yaml(source, "experiment file", ConfigError)
    if not isinstance(data, dict):
        raise ConfigError(f"{source.name}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        spec = ExperimentSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source.name}: {_format_error(exc.errors(include_url=False)[0], ExperimentSpec)}") from None
    base = (source.parent / spec.base).absolute()  # a Ray task on a cluster starts in another folder
    if not base.is_file():
        raise ConfigError(f"{source.name}: 'base': config {str(base)!r} does not exist (the path is relative to "
                          "the experiment file's folder)")
    folder = Path(root if root is not None else spec.root).resolve() / spec.name  # the same path on a Ray node
    common = flatten_overrides(spec.overrides, "overrides")
    for key in ("seed", "name", "run_root", "train.iterations"):
        variants = [n for n, v in spec.variants.items() if key in flatten_overrides(v, f"variants.{n}")]
        if key in common or (variants and key != "train.iterations"):
            raise ConfigError(f"{source.name}: '{key}' is set by the experiment itself (seeds, run names, root, "
                              "budget); remove it from the overrides"
                              + (" (a variant may set its own train.iterations)" if key == "train.iterations" else ""))
    runs = []
    for variant, extra in spec.variants.items():
        extra = dict(extra)
        sb3 = _sb3_spec(extra.pop("sb3", None), f"{source.name}: variants.{variant}.sb3")
        sets = {"train.iterations": spec.budget.iterations} | common | flatten_overrides(extra, f"variants.{variant}")
        for seed in spec.seed_list:
            run = RunSpec(variant, seed, sets | {"seed": seed, "name": f"{variant}-s{seed}"}, sb3)
            try:
                load_config(base, run.overrides | {"run_root": str(folder / "runs")}, overrides_from="override")
            except ConfigError as exc:
                raise ConfigError(f"{source.name}: variant {variant!r}: {exc}") from None
            runs.append(run)
    return Experiment(spec, source, base, folder, runs, workdir=Path.cwd(), pythonpath=os.environ.get("PYTHONPATH"))


def _sb3_spec(data: Any, where: str) -> SB3Spec | None:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of Stable-Baselines3 PPO settings (env_steps, n_envs, ...), "
                          f"got {data!r}")
    try:
        return SB3Spec.model_validate(data)
    except ValidationError as exc:
        errors = sorted(exc.errors(include_url=False), key=lambda e: e["type"] != "extra_forbidden")  # a typo first
        raise ConfigError(f"{where}: {_format_error(errors[0], SB3Spec)}") from None


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: "1 run", "3 runs"."""
    return f"{n} {noun}{'s' * (n != 1)}"


def grid(spec: ExperimentSpec) -> str:
    """The experiment's grid of runs in words: "4 variants × 3 seeds"."""
    return f"{counted(len(spec.variants), 'variant')} × {counted(len(spec.seed_list), 'seed')}"


def flatten_overrides(mapping: Mapping[str, Any], where: str, prefix: str = "") -> dict[str, Any]:
    """Nested override mappings → dotted keys; a value that is not a mapping is set whole."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"'{where}': override keys must be non-empty strings, got {key!r}")
        dotted = prefix + key
        if isinstance(value, dict) and value:
            out |= flatten_overrides(value, where, dotted + ".")
        else:
            out[dotted] = value
    return out


# ---------------------------------------------------------------------------- state of a run
RunState = Literal["new", "partial", "trained", "done"]


def run_state(run_dir: Path) -> RunState:
    """Where a run stands, from its files: ``done`` (evaluated), ``trained`` (``final.pt``),
    ``partial`` (a checkpoint to resume from, gyre-ma's or an SB3 run's), ``new``.

    gyre-ma resumes from the ``latest`` slot only: a run killed after its first ``best``
    checkpoint but before its first ``latest`` one is ``new`` (it replays from scratch to the
    same weights). A manifest that cannot be read counts as ``partial``, so the resume names
    it and nothing is removed."""
    checkpoints = run_dir / "checkpoints"
    if (run_dir / EVAL_FILE).is_file():
        return "done"
    if (checkpoints / "final.pt").is_file():
        return "trained"
    if (run_dir / SB3_STATE).is_file():
        return "partial"
    manifest = checkpoints / "manifest.json"
    if not manifest.is_file():
        return "new"
    try:
        slots = json.loads(manifest.read_text()).get("slots")
    except (OSError, ValueError, AttributeError):
        return "partial"
    return "partial" if not isinstance(slots, dict) or "latest" in slots else "new"


def completed_iterations(run_dir: Path) -> int:
    """Rows of the run's ``metrics.csv`` (complete lines only)."""
    try:
        with (run_dir / "metrics.csv").open("rb") as f:
            return max(f.read().count(b"\n") - 1, 0)
    except OSError:
        return 0


def run_progress(exp: Experiment, run: RunSpec) -> tuple[int, int]:
    """(iterations done, iterations in all) of ``run``: its own ``train.iterations`` (a variant
    may set its own), or for an SB3 run its PPO iterations (one rollout of every env, then an
    update)."""
    done = completed_iterations(exp.run_dir(run))
    if run.sb3 is not None:
        return done, -(-run.sb3.env_steps // (run.sb3.n_envs * run.sb3.n_steps))
    return done, int(run.overrides["train.iterations"])


# ---------------------------------------------------------------------------- playing a run
@dataclass
class Progress:
    """What the progress table shows of one run."""

    run: RunSpec
    state: str = "pending"
    error: str | None = None
    started: float | None = None
    ended: float | None = None


def train_command(exp: Experiment, run: RunSpec, *, resume: bool) -> list[str]:
    """The ``gyre-ma train`` arguments of ``run``."""
    cmd = ["train", str(exp.base.resolve()), "--quiet", "--run-root", str(exp.runs_dir.resolve())]
    for key, value in run.overrides.items():
        text = yaml.safe_dump(value, default_flow_style=True, width=1 << 20).strip()
        cmd += ["--set", f"{key}={text.removesuffix(chr(10) + '...')}"]  # a bare scalar's document end marker
    return cmd + (["--resume"] if resume else [])


def play_command(exp: Experiment, run: RunSpec, state: RunState) -> list[str]:
    """One process per run (:mod:`gyre_ma.experiment_run`): train it (unless trained), then
    evaluate it on held-out seeds."""
    e = exp.spec.evaluation
    cmd = [sys.executable, "-m", "gyre_ma.experiment_run", str(exp.run_dir(run).resolve()),
           "--episodes", str(e.episodes), "--seed", str(e.seed), "--checkpoint", e.checkpoint]
    if run.sb3 is not None:
        return cmd + ["--sb3", run.sb3.model_dump_json(), "--train-seed", str(run.seed)]
    if state in ("new", "partial"):
        cmd += ["--", *train_command(exp, run, resume=state == "partial")]
    return cmd


def play_run(exp: Experiment, run: RunSpec, progress: Progress | None = None) -> None:
    """Train (or resume) and evaluate one run, in a child process that dies with this one;
    a finished run is left as it is. Raises :class:`RunFailed` with the last line of the
    child's output."""
    run_dir = exp.run_dir(run)
    logs = exp.folder / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    state = run_state(run_dir)
    if state == "done":
        return
    if state == "new" and run_dir.exists():
        shutil.rmtree(run_dir)  # killed before its first latest checkpoint: nothing to resume from
    if run.sb3 is not None and state == "new":  # its child trains on this config (gyre-ma train writes its own)
        config = load_config(exp.base, run.overrides | {"run_root": str(exp.runs_dir)})
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text(run_dir / "config.yaml", dump_config(config))
    if progress is not None:
        progress.state = {"new": "training", "partial": "resuming", "trained": "evaluating"}[state]
    here = exp.workdir if exp.workdir is not None and exp.workdir.is_dir() else None  # a node without it: its own
    _call(play_command(exp, run, state), logs / f"{run.name}.log", "the run", cwd=here, pythonpath=exp.pythonpath)


class RunFailed(RuntimeError):
    def __init__(self, what: str, rc: int, last_line: str) -> None:
        self.what, self.rc, self.last_line = what, rc, last_line
        super().__init__(f"{what} exited {rc}: {last_line}")


class RunInterrupted(RunFailed):
    """The run's process stopped on SIGINT (Ctrl-C): it resumes on the next rerun."""


_INTERRUPTED = (130, -signal.SIGINT)
"""Exit codes of a child stopped by SIGINT: gyre-ma's own (130), or the signal itself."""
_CHILDREN: set[subprocess.Popen] = set()
_CHILDREN_LOCK = threading.Lock()
"""The run processes now running, so that an interrupted experiment can stop them."""


def _call(cmd: list[str], log: Path, what: str, *, cwd: Path | None = None, pythonpath: str | None = None) -> None:
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(cmd)}\n".encode())
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                preexec_fn=_die_with_parent)
        with _CHILDREN_LOCK:
            _CHILDREN.add(proc)
        try:
            rc = proc.wait()
        finally:
            with _CHILDREN_LOCK:
                _CHILDREN.discard(proc)
    if rc != 0:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        raise (RunInterrupted if rc in _INTERRUPTED else RunFailed)(what, rc, lines[-1] if lines else f"see {log}")


def _interrupt_children() -> None:
    """SIGINT to every run process still running: each stops at once (its checkpoints keep
    what it finished) rather than play to its end after the experiment was interrupted."""
    with _CHILDREN_LOCK:
        running = list(_CHILDREN)
    for proc in running:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)


def _libc() -> Any:
    with contextlib.suppress(OSError):
        return ctypes.CDLL(None, use_errno=True)
    return None


_LIBC = _libc()
"""Loaded here, not in the forked child: dlopen there could deadlock on a lock another
thread of this process held at the fork."""


def _die_with_parent() -> None:
    """In the child before exec: be killed when the experiment process dies (Linux
    ``PR_SET_PDEATHSIG``), so a killed experiment leaves no run holding its lock."""
    if _LIBC is not None:
        with contextlib.suppress(Exception):
            _LIBC.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1


def run_experiment(exp: Experiment, *, jobs: int | None = None, ray_address: str | None = None,
                   use_ray: bool = False, on_progress: Callable[[list[Progress]], None] | None = None,
                   ) -> list[Progress]:
    """Play every run not yet done, ``jobs`` at a time in local processes (None: 1), or as
    Ray tasks, at most ``jobs`` on the cluster at once (None: all, Ray running as many as
    it has CPUs); returns each run's progress record (``state`` ``done`` or ``failed`` with
    its error)."""
    if jobs is not None and jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    with lock_folder(exp.folder, "gyre-ma experiment", "wait for it, or give this one another name or root"):
        return _run_locked(exp, jobs=jobs, ray_address=ray_address, use_ray=use_ray, on_progress=on_progress)


def _run_locked(exp: Experiment, *, jobs: int | None, ray_address: str | None, use_ray: bool,
                on_progress: Callable[[list[Progress]], None] | None) -> list[Progress]:
    _record_spec(exp)
    records = [Progress(run) for run in exp.runs]
    for rec in records:
        if run_state(exp.run_dir(rec.run)) == "done":
            rec.state = "done"
    todo = [rec for rec in records if rec.state != "done"]
    stop = threading.Event()

    def play(rec: Progress) -> None:
        rec.started = time.time()
        try:
            play_run(exp, rec.run, rec)
            rec.state = "done"
        except RunInterrupted:
            rec.state = "interrupted"
        except RunFailed as exc:
            rec.state, rec.error = "failed", str(exc)
        finally:
            rec.ended = time.time()

    def report() -> None:
        while not stop.wait(1.0):
            on_progress(records)

    watcher = threading.Thread(target=report, daemon=True) if on_progress is not None else None
    if watcher is not None:
        watcher.start()
    try:
        if use_ray:
            _run_on_ray(exp, todo, ray_address, jobs)
        else:
            with ThreadPoolExecutor(max_workers=jobs or 1) as pool:
                futures = [pool.submit(play, rec) for rec in todo]
                try:
                    for future in futures:
                        future.result()
                except KeyboardInterrupt:  # stop the running runs too, rather than wait for their ends
                    for future in futures:
                        future.cancel()
                    _interrupt_children()
                    raise
    finally:
        stop.set()
        if watcher is not None:
            watcher.join()
            on_progress(records)
    return records


def _run_on_ray(exp: Experiment, todo: list[Progress], address: str | None, jobs: int | None) -> None:
    """Each run a Ray task of one CPU (the cluster's nodes must see the experiment folder
    and the base config at the same paths: a shared filesystem), at most ``jobs`` of them
    submitted at a time (None: all at once, Ray running as many as the cluster has CPUs)."""
    import ray

    if not ray.is_initialized():
        from gyre_ma.backends.ray_start import start_ray

        start_ray({"address": address} if address else None, where="--ray-address", log_to_driver=False,
                  include_dashboard=False)

    @ray.remote(num_cpus=1, max_retries=0)
    def task(run: RunSpec) -> str | None:
        marker = _ray_start_marker(exp, run)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()  # the driver reads when Ray started it: until then the run waits in Ray's queue
        try:
            play_run(exp, run)
        except RunFailed as exc:
            return str(exc)
        return None

    waiting, pending = list(todo), {}
    for rec in todo:
        rec.state, rec.started = "queued on ray", None

    def submit() -> None:
        while waiting and (jobs is None or len(pending) < jobs):
            rec = waiting.pop(0)
            _ray_start_marker(exp, rec.run).unlink(missing_ok=True)  # before the task can make it
            pending[task.remote(rec.run)] = rec

    submit()
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
        for rec in pending.values():
            marker = _ray_start_marker(exp, rec.run)
            if rec.started is None and marker.is_file():
                rec.state, rec.started = "running on ray", marker.stat().st_mtime
        if not ready:
            continue
        rec = pending.pop(ready[0])
        error = ray.get(ready[0])
        rec.state, rec.error, rec.ended = ("failed", error, time.time()) if error else ("done", None, time.time())
        rec.started = rec.started if rec.started is not None else rec.ended
        _ray_start_marker(exp, rec.run).unlink(missing_ok=True)
        submit()


def _ray_start_marker(exp: Experiment, run: RunSpec) -> Path:
    """A file the run's Ray task makes as it starts: the progress table's time counts the
    run's own, not its wait in Ray's queue behind the runs holding the cluster's CPUs."""
    return exp.folder / "logs" / f"{run.name}.ray-started"


def _record_spec(exp: Experiment) -> None:
    """``experiment.yaml`` in the folder: the spec its runs were made with. A rerun may add
    seeds and variants or change the report and evaluation; changing what an existing run
    trains with is refused, naming the key."""
    path = exp.folder / "experiment.yaml"
    now = exp.spec.model_dump(mode="json") | {"base": str(exp.base.resolve())}
    if path.is_file():
        before = yaml.safe_load(path.read_text()) or {}
        for key in ("base", "overrides", "budget"):
            if before.get(key) != now.get(key):
                raise ConfigError(f"experiment folder {str(exp.folder)!r} holds runs made with a different {key!r} "
                                  f"({before.get(key)!r}, now {now.get(key)!r}); use another name or root")
        for variant, sets in now["variants"].items():
            if variant in before.get("variants", {}) and before["variants"][variant] != sets:
                raise ConfigError(f"experiment folder {str(exp.folder)!r}: variant {variant!r} changed "
                                  f"({before['variants'][variant]!r}, now {sets!r}); give the new one another name")
    write_text(path, yaml.safe_dump(now, sort_keys=False))


# ---------------------------------------------------------------------------- held-out evaluation
def evaluate_run(run_dir: Path, *, episodes: int, seed: int, checkpoint: str = "final") -> dict[str, Any]:
    """Play the run's ``final`` (or ``best``) policy on ``episodes`` held-out task seeds from
    ``seed``, sampled and greedy; writes and returns ``eval.json``. The run's own config is
    used: the experiment wrote it from the user's base config. A manager that learns nothing
    (random, oracle, scripted) is played as it is, sampled only: ``greedy`` is None."""
    from gyre_ma.checkpoints import load_checkpoint
    from gyre_ma.metrics import heldout_result
    from gyre_ma.player import Player
    from gyre_ma.roles import evaluation_tasks

    config = load_config(run_dir / "config.yaml")
    path = run_dir / "checkpoints" / f"{checkpoint}.pt"
    if not path.is_file():
        path = run_dir / "checkpoints" / "final.pt"  # no validation ran, so no best
    learns = config.manager.learns
    out: dict[str, Any] = {"checkpoint": path.name if learns else None, "episodes": episodes, "first_seed": seed,
                           "learns": learns, "greedy": None}  # a manager that learns nothing has no greedy choice
    with Player(config, load_checkpoint(path) if learns else None) as player:
        for mode, greedy in (("sampled", False), ("greedy", True))[:2 if learns else 1]:
            played = player.play(evaluation_tasks(range(seed, seed + episodes), greedy=greedy))
            out[mode] = heldout_result([(t.success, t.length) for t in played]) | {
                "option_calls": sum(len(t.calls) for t in played) / len(played)}
    write_json(run_dir / EVAL_FILE, out)
    return out


__all__ = ["Budget", "EvaluationSpec", "Experiment", "ExperimentSpec", "Progress", "ReportSpec", "RunFailed",
           "RunSpec", "evaluate_run", "load_experiment", "play_run", "run_experiment", "run_progress", "run_state"]
