from __future__ import annotations

import csv
import math
import sys

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from gyre_ma.monitor import Monitor, plot_run, read_metrics


def rows(path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def iteration(i: int, **extra: float) -> dict[str, float]:
    return {"iteration": float(i), "env_steps": 100.0 * (i + 1), "success_rate": i / 10,
            "episode_length": 50.0 - i, "episode_reward": float(i)} | extra


def test_a_key_first_logged_later_reaches_the_csv_and_tensorboard(tmp_path):
    monitor = Monitor(tmp_path)
    for i in range(3):
        extra = {"staleness/lag": 0.5 * i} if i >= 1 else {}
        metrics = iteration(i, **extra)
        monitor.log(metrics, step=int(metrics["env_steps"]))
        assert len(rows(tmp_path / "metrics.csv")) == i + 1  # written as it is logged, not at close
    monitor.close()
    logged = rows(tmp_path / "metrics.csv")
    assert [r["iteration"] for r in logged] == ["0.0", "1.0", "2.0"]
    assert [r["step"] for r in logged] == ["100", "200", "300"]  # env steps are the x-axis
    assert [r["staleness/lag"] for r in logged] == ["", "0.5", "1.0"]
    lag = read_metrics(tmp_path / "metrics.csv")["staleness/lag"]
    assert math.isnan(lag[0]) and lag[1:].tolist() == [0.5, 1.0]
    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    assert [(e.step, e.value) for e in events.Scalars("staleness/lag")] == [(200, 0.5), (300, 1.0)]
    assert [e.step for e in events.Scalars("iteration")] == [100, 200, 300]
    assert monitor.history[1]["staleness/lag"] == 0.5


def test_resuming_keeps_the_rows_before_it_as_they_were(tmp_path):
    monitor = Monitor(tmp_path)
    for i in range(4):  # the run was killed after logging iteration 3; its checkpoint says 2
        monitor.log(iteration(i), step=100 * (i + 1))
    monitor.close()
    before = rows(tmp_path / "metrics.csv")
    resumed = Monitor(tmp_path, resume_at=2)
    assert rows(tmp_path / "metrics.csv") == before[:2] and resumed.replaced == 2
    for i in (2, 3):
        resumed.log(iteration(i, **{"alarm/active": 1.0}), step=100 * (i + 1))
    resumed.close()
    after = rows(tmp_path / "metrics.csv")
    assert [r["iteration"] for r in after] == ["0.0", "1.0", "2.0", "3.0"]
    assert [{k: v for k, v in r.items() if k != "alarm/active"} for r in after[:2]] == before[:2]
    assert [r["alarm/active"] for r in after] == ["", "", "1.0", "1.0"]


def test_plot_reads_the_csv_without_pandas(tmp_path, monkeypatch):
    monitor = Monitor(tmp_path)
    for i in range(3):
        monitor.log(iteration(i, **{"milestone/a": i / 2, "curriculum_phase": float(i > 1)}), step=100 * (i + 1))
    monitor.close()
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` now raises ImportError
    png = plot_run(tmp_path, tmp_path / "curves.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def _train_and_resume(run_dir, total: int, first: int, delay: float) -> None:
    """A child process: resume the monitor at ``first`` and log iterations up to ``total``,
    then be killed (by the parent) at a random moment."""
    import os
    import time

    monitor = Monitor(run_dir, resume_at=first)
    for i in range(first, total):
        time.sleep(delay)
        monitor.log(iteration(i), step=100 * (i + 1))
    os._exit(0)


def test_metrics_rows_survive_kills_at_random_moments(tmp_path):
    import multiprocessing as mp
    import os
    import signal

    import numpy as np

    ctx = mp.get_context("fork")
    rng = np.random.default_rng(0)
    total, kills = 10_000, 0  # more than the kills let it log: every child is killed
    while kills < 60:
        done = {int(float(r["iteration"])) for r in rows(tmp_path / "metrics.csv")} if (
            tmp_path / "metrics.csv").exists() else set()
        first = len(done)
        if first >= total:
            break
        child = ctx.Process(target=_train_and_resume, args=(tmp_path, total, first, 0.002))
        child.start()
        child.join(timeout=float(rng.uniform(0.0, 0.05)))
        if child.is_alive():
            os.kill(child.pid, signal.SIGKILL)
            kills += 1
        child.join()
        logged = [int(float(r["iteration"])) for r in rows(tmp_path / "metrics.csv")]
        assert logged == list(range(len(logged))), logged  # every iteration once, in order, from 0
    assert kills >= 50 and len(logged) > 0


def test_a_row_cut_short_is_dropped_and_the_next_rows_follow_it(tmp_path):
    monitor = Monitor(tmp_path)
    for i in range(3):
        monitor.log(iteration(i), step=100 * (i + 1))
    monitor.close()
    path = tmp_path / "metrics.csv"
    text = path.read_text()
    path.write_text(text + "3.0,400,0.3")  # a fourth row whose write was cut short: no newline
    assert read_metrics(path)["iteration"].tolist() == [0.0, 1.0, 2.0]
    monitor = Monitor(tmp_path, resume_at=3)
    monitor.log(iteration(3), step=400)
    monitor.close()
    assert [r["iteration"] for r in rows(path)] == ["0.0", "1.0", "2.0", "3.0"]
    assert rows(path)[3]["episode_length"] == "47.0"  # the whole row, not the torn one


def test_a_row_with_the_same_keys_is_appended_not_the_file_rewritten(tmp_path, monkeypatch):
    import gyre_ma.monitor as monitor_module

    monitor = Monitor(tmp_path)
    monitor.log(iteration(0), step=100)
    rewrites = []
    monkeypatch.setattr(monitor_module, "atomic_write", lambda *a, **k: rewrites.append(a))
    for i in range(1, 5):
        monitor.log(iteration(i), step=100 * (i + 1))
    assert rewrites == []
    monitor.log(iteration(5, **{"new/key": 1.0}), step=600)  # a new key widens the header: one rewrite
    assert len(rewrites) == 1
    monitor.close()


def test_spot_checks_show_the_envs_reward_and_what_the_learner_was_paid_apart(tmp_path):
    """One "reward" column showed the env's own reward (a new user's Crafter paid +1 per
    achievement there), while the learner is paid the arbitrated one: the column misled."""
    import numpy as np

    from gyre_ma.options.examples import breakfast
    from gyre_ma.options.option import Termination
    from gyre_ma.rollout import OptionCall, Trajectory

    library = breakfast()
    traj = Trajectory(task_seed=7, policy_version=3, horizon=100)
    traj.total_reward, traj.length = 2.0, 30
    for option, raw, paid in ((0, 1.0, 0.25), (1, 1.0, 0.0)):
        call = OptionCall(agent="a", agent_index=0, option=option, observation=None, mask=None, achieved=frozenset(),
                          last_option=-1, time_fraction=0.0, log_prob=0.0, value=0.0, start_step=option * 10,
                          policy_version=3, task_seed=7)
        call.raw_reward, call.reward, call.duration, call.termination = raw, paid, 10, Termination.DONE
        traj.calls.append(call)
    path = Monitor(tmp_path).spot_check(0, [traj], library, 1, np.random.default_rng(0), gamma=0.995)
    text = path.read_text()
    assert "env reward 2; paid to the learner 0.25;" in text
    assert "at the call's 21st step pays 0.905 with this run's gamma 0.995" in text  # what *paid* is (a user asked)
    assert "| agent | step | option | steps | env reward | paid | milestones | ended by |" in text
    assert f"| a | 0 | {library[0].name} | 10 | 1 | 0.25 |  | done |" in text
    assert f"| a | 10 | {library[1].name} | 10 | 1 | 0 |  | done |" in text
    assert "## Trajectory 0 — task seed 7, policy v3" in text
    traj.goals = (library.graph.goals[0],)  # an episode with its own goals says them
    text = Monitor(tmp_path).spot_check(1, [traj], library, 1, np.random.default_rng(0), gamma=0.99).read_text()
    assert f"## Trajectory 0 — task seed 7, goals {library.graph.goals[0]}, policy v3" in text
    assert "pays 0.818 with this run's gamma 0.99" in text  # the run's own, not quickstart's (a user's run read 0.995)


def test_spot_checks_show_an_agents_repeated_calls_as_one_row(tmp_path):
    """A session-56 user's 2,000-step factory episodes listed hundreds of one-step ``wait``
    calls, one row each, between the calls that mattered."""
    import numpy as np

    from gyre_ma.options.examples import breakfast
    from gyre_ma.options.option import Termination
    from gyre_ma.rollout import OptionCall, Trajectory

    library = breakfast()
    traj = Trajectory(task_seed=7, policy_version=3, horizon=100)
    traj.length = 30

    def call(agent: str, option: int, step: int, milestones: tuple[str, ...] = ()) -> None:
        c = OptionCall(agent=agent, agent_index=0, option=option, observation=None, mask=None, achieved=frozenset(),
                       last_option=-1, time_fraction=0.0, log_prob=0.0, value=0.0, start_step=step,
                       policy_version=3, task_seed=7)
        c.duration, c.termination, c.milestones, c.reward = 1, Termination.DONE, milestones, 0.5
        traj.calls.append(c)

    for step in range(5):  # a waits five times while b works; b repeats twice, then verifies a milestone
        call("a", 1, step)
        if step < 3:
            call("b", 0, step, ("m",) if step == 2 else ())
    call("a", 0, 5)
    text = Monitor(tmp_path).spot_check(0, [traj], library, 1, np.random.default_rng(0)).read_text()
    rows = [line for line in text.splitlines() if line.startswith("| a |") or line.startswith("| b |")]
    assert rows == [f"| a | 0–4 | {library[1].name} ×5 | 5 | 0 | 2.5 |  | done |",
                    f"| b | 0 | {library[0].name} | 1 | 0 | 0.5 |  | done |",
                    f"| b | 1 | {library[0].name} | 1 | 0 | 0.5 |  | done |",
                    f"| b | 2 | {library[0].name} | 1 | 0 | 0.5 | m | done |",
                    f"| a | 5 | {library[0].name} | 1 | 0 | 0.5 |  | done |"]


def test_plot_draws_the_held_out_validation_beside_the_training_episodes(tmp_path, monkeypatch):
    """`gyre-ma plot` drew the training episodes' curves only, not the held-out figures the
    progress line shows."""
    import matplotlib.axes

    drawn = []
    real = matplotlib.axes.Axes.plot

    def spy(self, *args, **kwargs):
        drawn.append((kwargs.get("label"), list(args[1]) if len(args) > 1 else None))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    monitor = Monitor(tmp_path)
    for i in range(4):
        validated = {"validation/sampled_success": i / 4, "validation/greedy_success": 1.0,
                     "validation/sampled_length": 40.0 - i, "validation/greedy_length": 30.0} if i % 2 else {}
        monitor.log(iteration(i, **validated, **{"reward/total": 1.0 + i}), step=100 * (i + 1))
    monitor.close()
    plot_run(tmp_path)
    labels = dict(drawn)
    # beside the env's own reward (zero on a sparse env), what the learner was paid (a session-56 user's finding)
    assert labels["paid to the learner (reward/total)"] == [1.0, 2.0, 3.0, 4.0] and "the env's own" in labels
    assert labels["held-out validation, sampled"] in ([0.25, 0.75], [39.0, 37.0])  # validated iterations only
    assert {"training episodes", "held-out validation, sampled", "held-out validation, greedy"} <= set(labels)
    assert sum(label == "held-out validation, greedy" for label, _ in drawn) == 2  # success and length


@pytest.mark.parametrize("n", [3, 24])
def test_milestone_rates_each_have_a_colour_and_their_legend_covers_no_curve(tmp_path, n):
    """A session-53 user's 24 milestones were unreadable: the colour cycle repeated every ten,
    and the legend covered the panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gyre_ma.monitor import _legend_columns, _milestone_rates

    fig, ax = plt.subplots(figsize=(6 + 2 * _legend_columns(n), 4))
    x = np.arange(10.0)
    legend = _milestone_rates(ax, x, {f"m{k}": np.linspace(0, 1, 10) ** (k + 1) for k in range(n)})
    colours = {line.get_color() if isinstance(line.get_color(), str) else tuple(line.get_color())
               for line in ax.get_lines()}
    assert len(ax.get_lines()) == n and len(colours) == n
    assert [t.get_text() for t in legend.get_texts()] == [f"m{k}" for k in range(n)]
    fig.tight_layout()
    fig.canvas.draw()
    if n > 8:  # beside the panel, not over its curves
        assert legend.get_window_extent().x0 >= ax.get_window_extent().x1
        assert fig.get_window_extent().x1 >= legend.get_window_extent().x1  # and inside the figure
    plt.close(fig)


def test_plot_smooths_noisy_curves_by_default_over_their_raw_points(tmp_path, monkeypatch):
    """A session-60 user's curves.png was unreadable: each validation point is 4 episodes
    (0, 25, 50, 75 or 100 %), and `gyre-ma plot` had no smoothing."""
    import matplotlib.axes

    from gyre_ma.cli import main
    from gyre_ma.monitor import smoothing_window
    from gyre_ma.stats import centred_mean

    drawn = []
    real = matplotlib.axes.Axes.plot

    def spy(self, *args, **kwargs):
        drawn.append((kwargs.get("label"), np.asarray(args[1], dtype=float), kwargs.get("alpha")))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    monitor = Monitor(tmp_path)
    rng = np.random.default_rng(0)
    sampled = rng.integers(0, 5, size=50) / 4
    for i in range(50):
        monitor.log(iteration(i, **{"validation/sampled_success": sampled[i], "validation/sampled_length": 40.0}),
                    step=100 * (i + 1))
    monitor.close()
    assert [smoothing_window(n) for n in (4, 19, 20, 50, 150)] == [1, 1, 3, 5, 15]
    plot_run(tmp_path)
    smoothed = [y for label, y, _ in drawn if label == "held-out validation, sampled (mean of 5 iterations)"]
    assert len(smoothed) == 2 and np.allclose(smoothed[0], centred_mean(sampled, 5))  # success, then length
    assert any(alpha == 0.25 and np.allclose(y, sampled) for _, y, alpha in drawn)  # the raw points, paler
    drawn.clear()
    plot_run(tmp_path, smooth=1)
    assert [y for label, y, _ in drawn if label == "held-out validation, sampled"][0].tolist() == sampled.tolist()
    with pytest.raises(ValueError, match=r"smooth must be an odd int >= 1"):
        plot_run(tmp_path, smooth=4)
    assert main(["plot", str(tmp_path), "--smooth", "2"]) == 2
