"""The critic's replay: earlier updates' rows the critic fits on beside the current batch."""

from __future__ import annotations

import torch

from gyre_ma import batch as B
from gyre_ma.config import parse_config
from gyre_ma.loop import Gyre


def coverage(tmp_path, replay: int, name: str = "run") -> Gyre:
    return Gyre(parse_config({"env": {"id": "coverage_v0"}, "run_root": str(tmp_path), "name": name,
                              "roles": {"evaluators": 0}, "train": {"critic_replay": replay}}), tmp_path / name)


def test_each_update_fits_the_critic_on_the_replayed_rows_then_the_new_ones(tmp_path):
    gyres = [coverage(tmp_path, 100, "replay"), coverage(tmp_path, 0, "on_policy")]
    try:
        trajectories, _ = gyres[0].rollout(0)
        gyres[0].arbitrate(trajectories)
        batch = gyres[0].batch(trajectories)
        n = len(batch[B.RETURN])
        updates = [batch | {B.RETURN: torch.full((n,), float(i))} for i in range(1, 4)]
        fitted: dict[str, list[torch.Tensor]] = {"replay": [], "on_policy": []}
        for gyre, seen in zip(gyres, fitted.values(), strict=True):
            fit = gyre.learner.fitter.fit

            def spy(module, rows, _fit=fit, _seen=seen, _critic=gyre.learner.critic_module, **options):
                if module is _critic:
                    _seen.append(rows[B.RETURN].clone())
                return _fit(module, rows, **options)

            gyre.learner.fitter.fit = spy
            for update in updates:
                gyre.learner.fit(update, trajectories)
        # the ring holds the newest 100 rows: the critic sees them before each new batch
        expected = [[1.0] * n, [1.0] * n + [2.0] * n]
        expected.append(([1.0] * n + [2.0] * n)[-100:] + [3.0] * n)
        assert [sorted(r.tolist()) for r in fitted["replay"]] == [sorted(e) for e in expected]
        assert [r.tolist() for r in fitted["on_policy"]] == [[float(i)] * n for i in range(1, 4)]
        assert len(gyres[0].learner.critic_replay) == 100
        assert B.ADVANTAGE not in gyres[0].learner.critic_replay.rows  # only what the critic reads
        assert "critic_replay" in gyres[0].learner.state_dict()
        assert gyres[1].learner.critic_replay is None
        assert "critic_replay" not in gyres[1].learner.state_dict()
    finally:
        for gyre in gyres:
            gyre.close()


def test_a_resumed_run_replays_the_same_rows_and_ends_bit_for_bit(tmp_path):
    straight = coverage(tmp_path, 300, "straight")
    for i in range(4):
        straight.iteration(i)
    straight.close()
    first = coverage(tmp_path, 300, "resumed")
    for i in range(2):
        first.iteration(i)
    first.close()
    resumed = Gyre.resume(first.config, tmp_path / "resumed")
    try:
        assert len(resumed.learner.critic_replay) > 0
        for i in range(2, 4):
            resumed.iteration(i)
        for key, value in straight.critic.state_dict().items():
            assert torch.equal(value, resumed.critic.state_dict()[key]), key
        for key, value in straight.learner.critic_replay.rows.items():
            assert torch.equal(value, resumed.learner.critic_replay.rows[key]), key
    finally:
        resumed.close()
