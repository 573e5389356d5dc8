"""Kill-and-resume, rollback after a provoked collapse, NaN guard, curriculum phases."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from gyre_ma.checkpoints import load_checkpoint
from gyre_ma.config import load_config
from gyre_ma.loop import Gyre
from gyre_ma.stability import Stability, significant_drop
from gyre_ma.store import TrajectoryStore

ROOT = Path(__file__).resolve().parents[2]
DOORKEY = ROOT / "configs" / "minigrid_doorkey.yaml"
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


def write_config(tmp_path: Path, name: str, base: Path = DOORKEY, **overrides) -> Path:
    data = yaml.safe_load(base.read_text())
    data["name"] = name
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def train(config: Path, run_root: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gyre_ma.cli", "train", str(config), "--run-root",
                             str(run_root), "--quiet", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_killed_run_resumes_to_the_same_parameters_bit_for_bit(tmp_path):
    iterations = "6"
    tail = {"train.average_last": 0.75}  # the weight average runs from iteration 2: the kill lands in it
    straight = train(write_config(tmp_path, "straight", **tail), tmp_path, "--iterations", iterations)
    _, err = straight.communicate(timeout=600)
    assert straight.returncode == 0, err

    config = write_config(tmp_path, "killed", **tail)
    run_dir = tmp_path / "killed"
    victim = train(config, tmp_path, "--iterations", iterations)
    deadline = time.time() + 300
    while time.time() < deadline:  # kill it mid-run, once half the iterations are logged
        csv = run_dir / "metrics.csv"
        if csv.exists() and len(csv.read_text().splitlines()) > 3:
            break
        time.sleep(0.05)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=60)
    assert victim.returncode == -signal.SIGKILL
    assert not (run_dir / "checkpoints" / "final.pt").exists()
    resumed = train(config, tmp_path, "--iterations", iterations, "--resume")
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err

    a = load_checkpoint(tmp_path / "straight" / "checkpoints" / "final.pt")
    b = load_checkpoint(run_dir / "checkpoints" / "final.pt")
    for part in ("policy", "critic"):
        assert a[part].keys() == b[part].keys()
        for key in a[part]:
            assert torch.equal(a[part][key], b[part][key]), f"{part}.{key} differs after resume"
    assert a["version"] == b["version"] and a["env_steps"] == b["env_steps"]
    logged = pd.read_csv(run_dir / "metrics.csv")
    assert logged["iteration"].tolist() == list(range(int(iterations)))  # no row lost or repeated


def test_resuming_needs_a_checkpoint_and_a_fresh_run_refuses_to_overwrite(tmp_path, capsys):
    from gyre_ma.cli import main  # in this process: the refusals are the CLI's own, not a subprocess's

    config = write_config(tmp_path, "fresh")
    command = ["train", str(config), "--run-root", str(tmp_path), "--quiet"]
    assert main([*command, "--resume"]) == 2 and "nothing to resume" in capsys.readouterr().err
    assert main([*command, "--iterations", "1"]) == 0
    capsys.readouterr()
    assert main([*command, "--iterations", "1"]) == 2 and "--resume" in capsys.readouterr().err
    (tmp_path / "fresh" / "checkpoints" / "manifest.json").unlink()  # each refusal used to point at the other
    assert main([*command, "--resume"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "its checkpoints/manifest.json (which slot file is which, and its hash) is missing" in err, err
    assert "move its checkpoints folder away, or train under another name" in err
    assert main([*command, "--iterations", "1"]) == 2  # and without --resume, not "pass --resume"
    assert "already has checkpoint files but no checkpoints/manifest.json" in capsys.readouterr().err
    (tmp_path / "fresh" / "checkpoints").rename(tmp_path / "fresh" / "old_checkpoints")
    assert main([*command, "--iterations", "1"]) == 2  # the earlier run's metrics.csv is not overwritten
    assert "holds the metrics.csv of an earlier run" in " ".join(capsys.readouterr().err.split())
    (tmp_path / "fresh" / "metrics.csv").rename(tmp_path / "fresh" / "old_metrics.csv")
    assert main([*command, "--iterations", "1"]) == 0


def test_provoked_collapse_is_rolled_back_with_the_lr_cut_logged(tmp_path):
    """A bad update (a reward bug) wrecks the policy;
    validation (each iteration's 32 sampled episodes) catches it, the best parameters come back
    and the LR is halved."""
    cfg = load_config(DOORKEY, {"env.kwargs": {"max_cycles": 20}, "roles.evaluators": 0,
                                "train.episodes_per_iteration": 32, "checkpoints.validation_window": 1,
                                "checkpoints.rollback_threshold": 0.3})
    gyre = Gyre(cfg, tmp_path / "run")
    turn = gyre.library.index("turn")
    with torch.no_grad():
        gyre.policy.head.bias[turn] = -6.0  # a competent policy: it rarely dawdles
    update = gyre.update

    def spiked(batch, trajectories):
        metrics = update(batch, trajectories)
        if gyre.next_iteration == 1:  # the bad update: the policy now dawdles
            with torch.no_grad():
                gyre.policy.head.bias[turn] = 12.0
        return metrics

    gyre.update = spiked
    history = [gyre.iteration(i) for i in range(4)]
    assert history[0]["validation/success_rate"] >= 0.75
    best = gyre.checkpoints.load("best")
    assert history[2]["validation/success_rate"] < history[0]["validation/success_rate"] - 0.3
    assert history[2]["checkpoint/rolled_back"] == 0.0  # one window's drop could be chance
    assert history[3]["checkpoint/rolled_back"] == 1.0  # a second, disjoint window confirms it
    assert history[3]["checkpoint/lr_scale"] == 0.5
    for key, value in best["policy"].items():
        assert torch.equal(gyre.policy.state_dict()[key], value)
    lrs = [g["lr"] for g in gyre.learner.manager_module.optimizers().optimizer.param_groups]
    assert all(math.isclose(lr, cfg.train.lr * 0.5) for lr in lrs)
    assert gyre.checkpoints.rollbacks and gyre.checkpoints.rollbacks[-1].step == 3


def test_nan_rewards_skip_updates_then_roll_back(tmp_path):
    cfg = load_config(DOORKEY, {"checkpoints.nan_max_consecutive": 2, "roles.evaluators": 0})
    gyre = Gyre(cfg, tmp_path / "run")
    gyre.iteration(0)
    build = gyre.batch

    def poisoned(trajectories):
        batch = build(trajectories)
        return dict(batch, advantage=torch.full_like(batch["advantage"], math.nan))

    gyre.batch = poisoned
    before = {k: v.clone() for k, v in gyre.policy.state_dict().items()}
    first = gyre.iteration(1)
    assert first["update_skipped"] == 1.0 and first.get("checkpoint/rolled_back", 0.0) == 0.0
    assert all(torch.equal(before[k], v) for k, v in gyre.policy.state_dict().items())
    second = gyre.iteration(2)
    assert second["update_skipped"] == 1.0 and second["checkpoint/rolled_back"] == 1.0
    assert second["checkpoint/lr_scale"] == 0.5


def test_curriculum_phases_change_and_show_in_the_plot(tmp_path):
    from gyre_ma.monitor import plot_run

    config = write_config(tmp_path, "cur", ROOT / "configs" / "quickstart.yaml", **{
        "curriculum.enabled": True, "curriculum.threshold": 0.5, "curriculum.window": 1,
        "curriculum.warmup_goal": "place_table", "curriculum.oracle_episodes": 2,
        "train.episodes_per_iteration": 4, "roles.evaluators": 2})
    out = subprocess.run([sys.executable, "-m", "gyre_ma.cli", "train", str(config), "--run-root", str(tmp_path),
                          "--quiet", "--iterations", "4"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    metrics = pd.read_csv(tmp_path / "cur" / "metrics.csv")
    phases = metrics["curriculum_phase"].tolist()
    assert phases[0] == 0 and phases[-1] > 0, phases
    caps = metrics["curriculum_step_cap"].tolist()
    assert caps[0] < caps[-1]
    png = plot_run(tmp_path / "cur")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_resume_restores_the_buffer_pools_so_elite_mixing_continues_identically(tmp_path):
    overrides = {"buffer.enabled": True, "buffer.elite_ratio": 0.25, "buffer.max_staleness": 2,
                 "buffer.capacity": 400, "train.iterations": 4}
    straight = Gyre(load_config(DOORKEY, overrides), tmp_path / "straight")
    for i in range(4):
        straight.iteration(i)
    first = Gyre(load_config(DOORKEY, overrides), tmp_path / "split")
    for i in range(2):
        first.iteration(i)
    pools = len(first.buffer)
    first.close()  # as a killed process would, it lets go of the store
    resumed = Gyre.resume(load_config(DOORKEY, overrides), tmp_path / "split")
    assert resumed.next_iteration == 2 and len(resumed.buffer) == pools > 0
    for i in range(2, 4):
        resumed.iteration(i)
    for key, value in straight.policy.state_dict().items():
        assert torch.equal(value, resumed.policy.state_dict()[key]), key
    assert straight.buffer.metrics() == resumed.buffer.metrics()


def test_a_resume_drops_what_the_killed_run_stored_after_its_checkpoint(tmp_path):
    """Killed after the store wrote iteration 2's trajectories but before the latest slot
    recorded iteration 2: the resumed run plays iteration 2 again, and its store ends
    with the uninterrupted run's trajectories, each once."""
    import shutil

    overrides = {"buffer.enabled": True, "train.iterations": 4}
    straight = Gyre(load_config(DOORKEY, overrides), tmp_path / "straight")
    for i in range(4):
        straight.iteration(i)
    straight.close()
    first = Gyre(load_config(DOORKEY, overrides), tmp_path / "split")
    for i in range(2):
        first.iteration(i)
    shutil.copytree(tmp_path / "split" / "checkpoints", tmp_path / "at_2")
    first.iteration(2)
    first.close()
    shutil.rmtree(tmp_path / "split" / "checkpoints")
    shutil.copytree(tmp_path / "at_2", tmp_path / "split" / "checkpoints")  # the slot of iteration 2 never landed
    resumed = Gyre.resume(load_config(DOORKEY, overrides), tmp_path / "split")
    assert resumed.next_iteration == 2
    for i in range(2, 4):
        resumed.iteration(i)
    resumed.close()
    columns = ["traj_id", "task_seed", "length", "success"]
    tables = [TrajectoryStore(tmp_path / run / "buffer" / "store").table("trajectories").select(columns).to_pylist()
              for run in ("straight", "split")]
    assert len(tables[1]) == len({r["traj_id"] for r in tables[1]}) > 0
    assert tables[1] == tables[0]


# ---------------------------------------------------------------- rollback that cannot freeze a run
def test_a_drop_is_significant_only_beyond_chance_for_its_sample_sizes():
    assert significant_drop(best=0.75, best_episodes=48, score=0.4, episodes=48, confidence=0.95)
    assert not significant_drop(best=0.75, best_episodes=8, score=0.4, episodes=8, confidence=0.95)
    assert not significant_drop(best=0.6, best_episodes=48, score=0.6, episodes=48, confidence=0.95)
    assert not significant_drop(best=1.0, best_episodes=48, score=0.9, episodes=48, confidence=0.95)  # a best is a max
    assert significant_drop(best=1.0, best_episodes=48, score=0.8, episodes=48, confidence=0.95)
    assert not significant_drop(best=1.0, best_episodes=48, score=1.0, episodes=48, confidence=0.95)


def test_the_best_is_judged_as_the_highest_of_every_validation_so_far():
    """30 of 32 as the best of one window is significantly above 16 of 32; as the best of
    300 windows it is not (an unchanged policy's luckiest window reads that high)."""
    drop = dict(best=30 / 32, best_episodes=32, score=0.5, episodes=32, confidence=0.99)
    assert significant_drop(**drop) and significant_drop(**drop, candidates=1)
    assert not significant_drop(**drop, candidates=300)
    assert significant_drop(**(drop | {"score": 0.25}), candidates=300)  # a collapse still is
    with pytest.raises(ValueError, match="candidates"):
        significant_drop(**drop, candidates=0)


def _noisy_run(tmp_path, overrides, iterations=50, episodes=8, p=0.6, seed=0, collapse=None):
    """Stability judging sampled success of a policy that never changes: binomial noise only
    (or, with ``collapse=(iteration, rate)``, one that falls to ``rate`` at ``iteration``)."""
    config = load_config(DOORKEY, overrides).checkpoints
    stability = Stability.from_config(config, tmp_path)
    rng = np.random.default_rng(seed)
    state = {"policy": {"w": torch.zeros(2)}}
    for i in range(iterations):
        q = collapse[1] if collapse is not None and i >= collapse[0] else p
        rate = rng.binomial(episodes, q) / episodes
        score, n = stability.score(rate, episodes=episodes)
        stability.checkpoints.save("latest", state, step=i)
        stability.validate(score, n, None, step=i)
    return stability


def test_noisy_validation_of_an_unchanged_policy_rarely_rolls_back(tmp_path):
    """The 3-agent report: 8 episodes an iteration. The old rule (any drop beyond the threshold,
    on any sample) rolled back again and again; so did one significant window below a best that
    was itself the luckiest window (1.6 rollbacks per 50-iteration run at 30-60 % success). The
    default — a drop below the best's lower bound on two windows that share no episode — rolls
    back an unchanged policy in none of thirty."""
    old = _noisy_run(tmp_path / "old", {"checkpoints.min_validation_episodes": 1,
                                        "checkpoints.rollback_confidence": 0.5,
                                        "checkpoints.rollback_threshold": 0.1, "checkpoints.max_rollbacks": 1000})
    assert len(old.checkpoints.rollbacks) >= 5
    for p in (0.3, 0.6, 0.9):
        runs = [_noisy_run(tmp_path / f"default-{p}-{seed}", {}, p=p, seed=seed) for seed in range(10)]
        assert sum(len(r.checkpoints.rollbacks) for r in runs) == 0, p


def test_a_long_noisy_run_does_not_roll_back_against_its_luckiest_window(tmp_path):
    """Coverage, 1,200 iterations: against the best of hundreds of windows taken at face
    value, an unchanged policy at 50 % rolled back 3 times (seed 0), each halving the LR;
    judged as the highest of every validation so far it never does, and a collapse to 20 %
    late in the run still rolls back within a few iterations."""
    runs = [_noisy_run(tmp_path / f"long-{seed}", {}, iterations=1200, p=0.5, seed=seed) for seed in (0, 9)]
    assert [len(r.checkpoints.rollbacks) for r in runs] == [0, 0]
    assert runs[0].judged == 1200 - 3  # the first three windows hold fewer than 32 episodes
    collapsed = _noisy_run(tmp_path / "collapse", {}, iterations=700, p=0.8, collapse=(600, 0.2))
    assert len(collapsed.checkpoints.rollbacks) >= 1
    assert 600 <= collapsed.checkpoints.rollbacks[0].step <= 620


def test_rollbacks_stop_after_max_rollbacks_and_no_best_comes_from_a_small_sample(tmp_path):
    stability = Stability.from_config(load_config(DOORKEY, {"checkpoints.max_rollbacks": 2}).checkpoints, tmp_path)
    state = {"policy": {"w": torch.zeros(2)}}
    stability.checkpoints.save("latest", state, step=0)
    assert stability.validate(1.0, 16, None, step=0).action == "kept" and stability.checkpoints.best_score is None
    assert stability.validate(0.9, 64, None, step=1).action == "improved"
    assert stability.checkpoints.best_episodes == 64
    window = stability.config.validation_window
    step = 2
    for _ in range(2):  # a drop rolls back once it held over window + 1 validations in a row
        for _ in range(window):
            assert not stability.validate(0.2, 64, None, step=step).rolled_back
            step += 1
        assert stability.validate(0.2, 64, None, step=step).rolled_back
        step += 1
    assert stability.rollbacks_stopped
    kept = stability.validate(0.1, 64, None, step=step)
    assert kept.action == "kept" and len(stability.checkpoints.rollbacks) == 2 and kept.lr_scale == 0.25


def test_among_windows_of_equal_success_best_is_the_one_with_shorter_paths(tmp_path):
    """A task every policy completes (the warehouse a user wrote): best.pt stayed the first
    policy to reach 100 %, 1.6x the oracle's length, while the run ended 1.07x. Success
    still decides first, and only success decides a rollback."""
    stability = Stability.from_config(load_config(DOORKEY).checkpoints, tmp_path)
    ck = stability.checkpoints
    step = 0

    def judge(rate: float, length: float) -> str:
        nonlocal step
        ck.save("latest", {"policy": {"w": torch.full((2,), float(step))}}, step=step)
        score, n = stability.score(rate, episodes=32, length=length)
        step += 1
        return stability.validate(score, n, None, step=step).action

    window = stability.config.validation_window
    for _ in range(window):
        judge(1.0, 136.0)
    assert ck.best_score == 1.0 and ck.best_length == 136.0
    assert [judge(1.0, 90.0) for _ in range(window)][-1] == "improved"  # the window's pooled length fell
    assert ck.best_length == 90.0 and ck.load("best")["policy"]["w"][0] == step - 1
    assert judge(1.0, 120.0) == "kept" and ck.best_length == 90.0  # longer: not better
    assert judge(0.9, 10.0) == "kept" and ck.best_score == 1.0  # shorter but failing more: not better
    resumed = Stability.from_config(load_config(DOORKEY).checkpoints, tmp_path)
    resumed.load_state_dict(stability.state_dict())
    assert list(resumed.recent) == list(stability.recent) and resumed.length == stability.length
    old = stability.state_dict()
    old["recent_scores"] = [r[:2] for r in old["recent_scores"]]  # a checkpoint from before lengths were kept
    resumed.load_state_dict(old)
    assert math.isnan(resumed.length) and resumed.score(1.0, episodes=32, length=5.0)[0] == pytest.approx(
        stability.score(1.0, episodes=32, length=5.0)[0])


def test_validation_is_held_out_by_default_sampled_and_greedy(tmp_path):
    """Measurement 4: with the old default (no evaluators) "validation" was the mean of the
    training episodes. Now every iteration plays held-out seeds, once sampled and once greedy,
    from a seed range training never draws from."""
    from gyre_ma.roles import TRAINING_SEEDS, VALIDATION_SEEDS

    cfg = load_config(DOORKEY)
    assert cfg.roles.evaluators > 0
    gyre = Gyre(cfg, tmp_path / "run")
    played = []
    collect = gyre.backend.collect

    def recording(weights, version, tasks):
        played.extend(tasks)
        return collect(weights, version, tasks)

    gyre.backend.collect = recording
    metrics = [gyre.iteration(i) for i in range(2)]
    held_out = [t for t in played if t.role == "evaluator"]
    training = [t for t in played if t.role != "evaluator"]
    assert len(held_out) == 2 * 2 * cfg.roles.evaluators and {t.greedy for t in held_out} == {False, True}
    assert all(VALIDATION_SEEDS <= t.task_seed < TRAINING_SEEDS for t in held_out)
    assert all(t.task_seed >= TRAINING_SEEDS for t in training)
    assert {t.task_seed for t in held_out}.isdisjoint(t.task_seed for t in training)
    for m in metrics:
        assert {"validation/sampled_success", "validation/greedy_success", "validation/success_rate"} <= set(m)
    assert metrics[1]["validation/episodes"] == 2 * 2 * cfg.roles.evaluators  # pooled over the window


def test_a_kill_between_a_new_best_and_the_latest_slot_resumes_to_the_same_decisions(tmp_path, monkeypatch):
    """Issue #18, 6: a kill after validation saved a new best but before the iteration's
    latest slot left the manifest's best score one iteration ahead, so the resumed run's
    validation decided differently from an uninterrupted one."""
    overrides = {"train.iterations": 7, "checkpoints.min_validation_episodes": 8, "train.episodes_per_iteration": 8}
    straight = Gyre(load_config(QUICKSTART, overrides), tmp_path / "straight")
    history, best_scores = [], []
    for i in range(7):
        history.append(straight.iteration(i))
        best_scores.append(straight.checkpoints.best_score)
    straight.close()
    bests = [i for i in range(1, 7) if best_scores[i] != best_scores[i - 1]]
    assert bests, f"no new best to kill after: {best_scores}"
    kill_at = bests[-1]
    run = Gyre(load_config(QUICKSTART, overrides), tmp_path / "killed")
    for i in range(kill_at):
        run.iteration(i)
    real_save = run.checkpoints.save

    def die_before_latest(slot, state, **kwargs):
        if slot == "latest":
            raise KeyboardInterrupt("killed")  # the process dies here: best is saved, latest is not
        return real_save(slot, state, **kwargs)

    monkeypatch.setattr(run.checkpoints, "save", die_before_latest)
    with pytest.raises(KeyboardInterrupt):
        run.iteration(kill_at)
    run.close()
    resumed = Gyre.resume(load_config(QUICKSTART, overrides), tmp_path / "killed")
    # the decisions are those of the iteration resumed at, not the killed one's new best
    assert resumed.checkpoints.best_score == best_scores[kill_at - 1] != best_scores[kill_at]
    again = [resumed.iteration(i) for i in range(kill_at, 7)]
    resumed.close()
    def timeless(rows):
        return [{k: repr(v) for k, v in row.items() if not k.endswith("seconds")} for row in rows]

    assert timeless(again) == timeless(history[kill_at:])


def test_validation_and_best_judge_by_successes_no_guard_vetoed(tmp_path):
    """Session 53 made a vetoed success a failure to the learner, but validation (and so
    ``best.pt`` and the rollbacks) still counted it: a run whose policy learned a shortcut
    the guards catch would have kept that policy as its best. A guard here vetoes every
    episode that reaches the goal, so every success is vetoed."""
    guard = {"name": "never_the_goal", "kind": "guard", "given": {"reached_goal": True},
             "require": {"has_key": False}}
    cfg = load_config(DOORKEY, {"rewards.rules": [guard], "train.iterations": 2})
    gyre = Gyre(cfg, tmp_path / "run")
    metrics, trajectories = gyre.iteration(0, return_trajectories=True)
    assert metrics["success_rate"] > 0.5 and all(t.vetoed for t in trajectories if t.success)
    assert metrics["reward/vetoed_successes"] == metrics["success_rate"]
    assert metrics["validation/sampled_success"] == metrics["validation/greedy_success"] == 0.0
    assert metrics["validation/success_rate"] < 0.2  # its score: no win counted, shrunk toward the prior

    unguarded = Gyre(load_config(DOORKEY, {"train.iterations": 2}), tmp_path / "plain").iteration(0)
    assert unguarded["validation/sampled_success"] > 0.5  # the same policy, judged without the guard
