"""Wall-clock bounds: a stuck option cannot hang training (issue #18, measurement 3).

A sub-policy that blocks used to hang the local backend forever (rc 124 after 120 s,
nothing printed). Now its call ends as a failure after ``backend.option_timeout_s``, is
counted and warned about, and the episode goes on; an episode past
``backend.episode_timeout_s`` is cut.
"""

from __future__ import annotations

import time

import pytest

from gyre_ma.backends.faults import stuck_library
from gyre_ma.config import parse_config
from gyre_ma.envs.registry import make_env
from gyre_ma.metrics import episode_metrics
from gyre_ma.options.option import Termination
from gyre_ma.rollout import run_episode


def _stuck_first():
    """A manager that picks the stuck option whenever it may, else the first eligible."""
    from gyre_ma.options.decision import Choice

    class StuckFirst:
        def decide(self, decisions):
            out = []
            for d in decisions:
                stuck = len(d.mask) - 1
                out.append(Choice(stuck if d.mask[stuck] else int(d.mask.nonzero()[0][0])))
            return out

    return StuckFirst()


def test_a_blocking_sub_policy_is_cut_and_the_episode_goes_on(monkeypatch):
    monkeypatch.setattr("gyre_ma.rollout._WARNED_TIMEOUTS", set())  # warned once per option and process
    env = make_env("coverage_v0")
    library = stuck_library(env, seconds=3600.0)
    start = time.perf_counter()
    with pytest.warns(RuntimeWarning, match="option 'stuck'.*option_timeout_s=0.2"):
        traj = run_episode(env, library, _stuck_first(), seed=3, option_timeout_s=0.2, episode_timeout_s=30.0)
    elapsed = time.perf_counter() - start
    stuck = [c for c in traj.calls if library[c.option].name == "stuck"]
    # each stuck call is cut without a step; its agent takes another option and the episode runs on
    assert stuck and all(c.termination is Termination.TIMEOUT and c.duration == 0 for c in stuck)
    assert traj.success or traj.length == env.max_cycles  # played to its end: the goal or the step cap
    assert traj.length > 0 and traj.option_timeouts == ["stuck"] * len(stuck)
    assert elapsed < 0.2 * len(stuck) + 5.0
    assert episode_metrics([traj], ())["option_timeouts"] == len(stuck)


def test_an_episode_past_its_budget_is_cut_as_a_truncation():
    env = make_env("coverage_v0")
    library = stuck_library(env, seconds=0.05)  # slow, not stuck: each step well under the call's budget
    with pytest.warns(RuntimeWarning, match="episode_timeout_s=0.3"):
        traj = run_episode(env, library, _stuck_first(), seed=3, option_timeout_s=10.0, episode_timeout_s=0.3)
    assert traj.timed_out and not traj.success and 0 < traj.length < env.max_cycles
    assert all(c.truncated for c in traj.calls if c.termination is Termination.EPISODE)
    assert episode_metrics([traj], ())["episode_timeouts"] == 1.0


def _stuck_config(tmp_path, backend: str):
    return parse_config({"name": "stuck", "env": {"id": "coverage_v0"},
                         "library": "gyre_ma.backends.faults:stuck_library", "run_root": str(tmp_path),
                         "manager": {"kind": "random"}, "backend": {"name": backend, "workers": 1,
                                                                     "option_timeout_s": 0.2,
                                                                     "episode_timeout_s": 20.0}})


def test_the_local_backend_bounds_a_stuck_option(tmp_path):
    from gyre_ma.backends import make_backend
    from gyre_ma.roles import RolloutTask

    cfg = _stuck_config(tmp_path, "local")
    backend = make_backend("local", cfg)
    try:
        got = backend.collect(None, 0, [RolloutTask("executor", s) for s in (1, 2)])  # warned once per process
    finally:
        backend.close()
    assert len(got) == 2 and sum(len(t.option_timeouts) for t in got) > 0


def test_the_ray_backend_bounds_a_stuck_option(tmp_path):
    ray = pytest.importorskip("ray")
    from gyre_ma.backends import make_backend
    from gyre_ma.roles import RolloutTask

    cfg = _stuck_config(tmp_path, "ray")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        backend = make_backend("ray", cfg, **cfg.backend.options)
        try:
            start = time.perf_counter()
            got = backend.collect(None, 0, [RolloutTask("executor", s) for s in (1, 2)])
            elapsed = time.perf_counter() - start
        finally:
            backend.close()
    finally:
        ray.shutdown()
    assert len(got) == 2 and sum(len(t.option_timeouts) for t in got) > 0
    assert elapsed < cfg.backend.sample_timeout_s  # cut by the option bound, not the actor's sample timeout
