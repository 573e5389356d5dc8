"""Self-imitation: the replay ring, the group-best rows and the draw by (R − V)⁺, the learner's use of
them, and the default."""

from __future__ import annotations

import pytest
import torch

from gyre_ma import batch as B
from gyre_ma.config import parse_config
from gyre_ma.loop import Gyre
from gyre_ma.trainers.replay import RowReplay
from gyre_ma.trainers.self_imitation import KEYS, group_best, group_best_sample, imitation_sample
from gyre_ma.training_batch import warm_start_value


def rows(n: int, start: int = 0) -> B.Batch:
    ids = torch.arange(start, start + n)
    return {B.FEATURES: ids[:, None].float().repeat(1, 3), B.AGENT: ids % 2, B.MASK: torch.ones(n, 4, dtype=torch.bool),
            B.OPTION: ids % 4, B.RETURN: ids.float(), B.ADVANTAGE: torch.zeros(n)}


def test_the_replay_keeps_the_newest_rows_and_only_what_imitation_reads():
    replay = RowReplay(5, KEYS)
    replay.add(rows(3))
    replay.add(rows(4, start=3))  # 0..6: 0 and 1 overwritten
    assert len(replay) == 5
    assert sorted(replay.rows[B.RETURN].tolist()) == [2.0, 3.0, 4.0, 5.0, 6.0]
    assert B.ADVANTAGE not in replay.rows
    replay.add(rows(9, start=100))  # more than it holds at once: the last 5
    assert sorted(replay.rows[B.RETURN].tolist()) == [104.0, 105.0, 106.0, 107.0, 108.0]
    other = RowReplay(5, KEYS)
    other.load_state_dict(replay.state_dict())
    replay.add(rows(2, start=200))
    other.add(rows(2, start=200))
    assert all(torch.equal(replay.rows[k], other.rows[k]) for k in replay.rows)


def test_the_replay_imitates_only_the_decisions_of_its_last_updates():
    replay = RowReplay(100, KEYS, updates=2)
    for start in (0, 10, 20):
        replay.add(rows(3, start=start))
    assert sorted(replay.recent()[B.RETURN].tolist()) == [10.0, 11.0, 12.0, 20.0, 21.0, 22.0]
    assert len(replay) == 9  # kept (within capacity), not imitated
    assert set(replay.recent()) == set(replay.rows) == set(rows(1)) & set(KEYS)  # no age column
    replay.add(rows(0, start=99))  # an update with no decisions is not an update of the replay
    assert sorted(replay.recent()[B.RETURN].tolist()) == [10.0, 11.0, 12.0, 20.0, 21.0, 22.0]
    other = RowReplay(100, KEYS, updates=2)
    other.load_state_dict(replay.state_dict())  # a resume keeps each row's age
    replay.add(rows(1, start=30))
    other.add(rows(1, start=30))
    assert sorted(other.recent()[B.RETURN].tolist()) == sorted(replay.recent()[B.RETURN].tolist()) == [
        20.0, 21.0, 22.0, 30.0]
    unbounded = RowReplay(100, KEYS)
    unbounded.load_state_dict(replay.state_dict())
    assert len(unbounded.recent()[B.RETURN]) == 10
    with pytest.raises(ValueError, match="updates must be >= 1"):
        RowReplay(100, KEYS, updates=0)


def test_a_replay_saved_before_rows_kept_their_age_loads_as_the_newest_update():
    old = {"rows": {k: v for k, v in rows(4).items() if k in KEYS}, "next": 0}  # as session 42 saved it
    replay = RowReplay(100, KEYS, updates=1)
    replay.load_state_dict(old)
    assert len(replay.recent()[B.RETURN]) == 4
    replay.add(rows(2, start=10))
    assert sorted(replay.recent()[B.RETURN].tolist()) == [10.0, 11.0]


def test_the_imitation_window_is_a_fraction_of_the_run_and_the_learner_keeps_to_it(tmp_path):
    def config(iterations: int, **train):
        return parse_config({"env": {"id": "coverage_v0"}, "run_root": str(tmp_path), "roles": {"evaluators": 0},
                             "train": {"iterations": iterations, **train}})

    assert [config(n).train.self_imitation_updates for n in (1, 50, 1200)] == [1, 50, 1200]  # by default, the run
    assert [config(n, self_imitation_window=0.1).train.self_imitation_updates for n in (1, 4, 50, 1200)] == [
        1, 1, 5, 120]
    with pytest.raises(ValueError, match="self_imitation_window"):
        config(50, self_imitation_window=0.0)
    gyre = Gyre(config(20, self_imitation_window=0.1))  # a window of 2 updates
    try:
        for i in range(4):
            gyre.iteration(i)
        replay = gyre.learner.replay
        assert replay.updates == 2 and replay.added == 4
        assert 0 < len(replay.recent()[B.RETURN]) < len(replay)
    finally:
        gyre.close()


def test_the_replay_names_the_keys_of_a_batch_that_does_not_fit():
    replay = RowReplay(8, KEYS)
    replay.add(rows(2))
    wider = rows(2) | {B.FEATURES: torch.zeros(2, 7)}
    with pytest.raises(ValueError, match="features"):
        replay.add(wider)


def test_only_rows_that_beat_their_value_are_drawn_and_the_scale_is_their_mean_excess():
    data = rows(4)  # returns 0, 1, 2, 3
    values = torch.tensor([1.0, 1.0, 1.5, 5.0])  # only row 2 beats its value, by 0.5
    sample, scale = imitation_sample(data, values, size=50, generator=torch.Generator().manual_seed(0))
    assert set(sample[B.OPTION].tolist()) == {2}
    assert B.RETURN not in sample
    assert scale == pytest.approx(0.5 / 4)
    assert imitation_sample(data, values + 10.0, size=5, generator=torch.Generator()) is None


def test_the_draw_follows_the_excess():
    data = rows(2)
    values = torch.tensor([-1.0, -2.0])  # excess 1 and 3
    sample, _ = imitation_sample(data, values, size=4000, generator=torch.Generator().manual_seed(0))
    assert (sample[B.OPTION] == 1).float().mean().item() == pytest.approx(0.75, abs=0.03)


def test_an_update_imitates_a_decision_that_beat_the_critic(tmp_path):
    def learner(weight: float) -> Gyre:
        return Gyre(parse_config({"env": {"id": "coverage_v0"}, "run_root": str(tmp_path), "roles": {"evaluators": 0},
                                  "train": {"self_imitation": weight, "self_imitation_rows": "beat_critic"}}))

    gyres = [learner(1.0), learner(0.0)]
    try:
        trajectories, _ = gyres[0].rollout(0)
        gyres[0].arbitrate(trajectories)
        batch = gyres[0].batch(trajectories)
        row = int(torch.nonzero(batch[B.MASK].sum(-1) > 1)[0])
        for g in gyres:  # the critic as the first update starts it on this batch (its mean return)
            g.learner.critic.initialise(warm_start_value(batch[B.RETURN]))
            g.learner.critic_initialised = True
        # one decision whose return far exceeds anything that critic expects
        one = {k: v[row:row + 1] for k, v in batch.items()} | {B.RETURN: torch.tensor([100.0]),
                                                                 B.ADVANTAGE: torch.zeros(1)}

        def log_prob(gyre: Gyre) -> float:
            with torch.no_grad():
                logits = gyre.policy.batch_logits(one)
            return torch.log_softmax(logits, -1)[0, one[B.OPTION][0]].item()

        before = [log_prob(g) for g in gyres]
        assert before[0] == before[1]
        metrics = [g.learner.fit(one, trajectories) for g in gyres]
        assert metrics[0]["imitation_weight"] > 50.0
        assert "imitation_weight" not in metrics[1]
        # the same PPO steps (no advantage) in both; only the imitating learner raised the probability
        assert log_prob(gyres[0]) - before[0] > log_prob(gyres[1]) - before[1] + 0.005
        assert len(gyres[0].learner.replay) == 1
        state = gyres[0].learner.state_dict()
        assert torch.equal(state["self_imitation"]["rows"][B.RETURN], torch.tensor([100.0]))
    finally:
        for g in gyres:
            g.close()


def test_self_imitation_off_keeps_no_replay(tmp_path):
    cfg = parse_config({"env": {"id": "coverage_v0"}, "run_root": str(tmp_path), "roles": {"evaluators": 0},
                        "train": {"self_imitation": 0.0}})
    gyre = Gyre(cfg)
    try:
        assert gyre.learner.replay is None
        assert "self_imitation" not in gyre.learner.state_dict()
    finally:
        gyre.close()


def test_a_resumed_run_replays_the_same_decisions_and_ends_bit_for_bit(tmp_path):
    raw = {"env": {"id": "coverage_v0"}, "roles": {"evaluators": 0}, "train": {"self_imitation": 1.0}}  # group-best

    def config(name: str):
        return parse_config(raw | {"name": name, "run_root": str(tmp_path)})

    straight = Gyre(config("straight"), tmp_path / "straight")
    for i in range(4):
        straight.iteration(i)
    straight.close()
    first = Gyre(config("resumed"), tmp_path / "resumed")
    for i in range(2):
        first.iteration(i)
    first.close()
    resumed = Gyre.resume(config("resumed"), tmp_path / "resumed")
    try:
        assert len(resumed.learner.replay) > 0
        for i in range(2, 4):
            resumed.iteration(i)
        for key, value in straight.policy.state_dict().items():
            assert torch.equal(value, resumed.policy.state_dict()[key]), key
        assert all(torch.equal(v, resumed.learner.replay.rows[k]) for k, v in straight.learner.replay.rows.items())
    finally:
        resumed.close()


def test_the_learner_trusts_a_winner_by_how_likely_its_choice_is_now_against_then(tmp_path):
    gyre = Gyre(parse_config({"env": {"id": "coverage_v0"}, "run_root": str(tmp_path), "roles": {"evaluators": 0}}))
    try:
        assert gyre.config.train.self_imitation_trust
        for i in range(3):
            gyre.iteration(i)
        rows = gyre.learner.replay.rows
        best = rows[B.GROUP_BEST] > 0
        assert bool(best.any()) and not bool(best.all())
        trust = gyre.learner._trust(rows)
        assert bool((trust[~best] == 0).all())
        with torch.no_grad():
            logits = gyre.learner.manager_module.module.policy.batch_logits({k: v[best] for k, v in rows.items()})
        now = torch.distributions.Categorical(logits=logits).log_prob(rows[B.OPTION][best])
        expected = (now - rows[B.LOG_PROB][best]).exp().clamp(max=1.0)
        assert torch.allclose(trust[best], expected, atol=1e-5)
        assert bool((trust[best] < 1).any())  # three updates on: some choices have become less likely
    finally:
        gyre.close()


def test_a_checkpoint_whose_replay_has_no_log_probabilities_resumes_with_an_empty_replay(tmp_path):
    cfg = parse_config({"env": {"id": "coverage_v0"}, "run_root": str(tmp_path), "roles": {"evaluators": 0}})
    gyre = Gyre(cfg, tmp_path / "a")
    try:
        gyre.iteration(0)
        state = gyre.learner.state_dict()
        state["self_imitation"]["rows"].pop(B.LOG_PROB)  # as session 42 wrote it
        assert len(gyre.learner.replay) > 0  # iteration 0 filled it
        with pytest.warns(UserWarning, match="log-probability"):
            gyre.learner.load_state_dict(state)
        assert len(gyre.learner.replay) == 0  # loaded into a learner that held rows: those go too
        gyre.iteration(1)  # the replay refills, with the log-probabilities
        assert len(gyre.learner.replay) > 0 and B.LOG_PROB in gyre.learner.replay.rows
    finally:
        gyre.close()


def test_a_groups_best_episodes_are_those_at_its_highest_outcome_where_outcomes_differ():
    outcomes = torch.tensor([0.5, 0.8, 0.8, 0.2, 0.7, 0.7, 0.7, 0.0, 0.9, 0.3])
    groups = torch.tensor([1, 1, 1, 1, 2, 2, 2, 3, 4, 4])
    # group 1: the two at 0.8 (a tie at the top); group 2: all alike, none; group 3: alone, none
    assert group_best(outcomes, groups).tolist() == [0, 1, 1, 0, 0, 0, 0, 0, 1, 0]
    assert group_best(torch.zeros(0), torch.zeros(0, dtype=torch.long)).tolist() == []


def test_group_best_draws_only_the_winners_rows_and_nothing_without_them():
    data = rows(4) | {B.GROUP_BEST: torch.tensor([0.0, 1.0, 0.0, 1.0])}
    sample, scale = group_best_sample(data, size=4000, generator=torch.Generator().manual_seed(0))
    assert set(sample[B.OPTION].tolist()) == {1, 3}
    assert (sample[B.OPTION] == 1).float().mean().item() == pytest.approx(0.5, abs=0.03)  # uniformly
    assert scale == 1.0
    assert B.RETURN not in sample and B.GROUP_BEST not in sample
    assert group_best_sample(data | {B.GROUP_BEST: torch.zeros(4)}, size=5, generator=torch.Generator()) is None


def test_a_winner_the_policy_has_moved_away_from_is_drawn_less_and_the_term_shrinks_with_it():
    data = rows(4) | {B.GROUP_BEST: torch.tensor([0.0, 1.0, 0.0, 1.0])}
    trust = torch.tensor([1.0, 1.0, 1.0, 0.25])  # row 3's choice: a quarter as likely now as when it was made
    sample, scale = group_best_sample(data, size=5000, generator=torch.Generator().manual_seed(0), trust=trust)
    assert (sample[B.OPTION] == 3).float().mean().item() == pytest.approx(0.25 / 1.25, abs=0.03)
    assert scale == pytest.approx((1.0 + 0.25) / 2)  # the mean trust over the winners
    assert group_best_sample(data, size=5, generator=torch.Generator(), trust=torch.zeros(4)) is None


def test_by_default_the_option_manager_imitates_its_groups_winners_and_the_baselines_do_not(tmp_path):
    def config(kind: str, **train):
        return parse_config({"env": {"id": "coverage_v0"}, "run_root": str(tmp_path),
                             "manager": {"kind": kind}, "train": train})

    assert config("learned").imitation_weight == 1.0
    assert config("learned").train.self_imitation_rows == "group_best"
    assert config("flat").imitation_weight == 0.0  # flat PPO stays the plain baseline
    assert config("learned", self_imitation=0.0).imitation_weight == 0.0
    assert config("flat", self_imitation=0.5).imitation_weight == 0.5


def test_the_batch_marks_the_decisions_of_each_groups_best_episode_and_an_update_imitates_them(tmp_path):
    gyre = Gyre(parse_config({"env": {"id": "coverage_v0"}, "run_root": str(tmp_path), "roles": {"evaluators": 0},
                              "seed": 3}))
    try:
        trajectories, _ = gyre.rollout(0)
        gyre.arbitrate(trajectories)
        batch = gyre.batch(trajectories)
        outcome = {id(t): 1.0 * t.success - 0.5 * t.success * t.length / t.horizon for t in trajectories}
        seeds = {t.task_seed for t in trajectories}
        expected = []
        for t in trajectories:
            group = [outcome[id(u)] for u in trajectories if u.task_seed == t.task_seed]
            top = max(group)
            won = top > sum(group) / len(group) + 1e-9 and outcome[id(t)] >= top - 1e-9
            expected += [float(won)] * len(t.calls)
        assert len(seeds) > 1 and batch[B.GROUP_BEST].tolist() == expected
        assert 0 < sum(expected) < len(expected)
        metrics = gyre.learner.fit(batch, trajectories)
        assert 0 < metrics["imitation_weight"] <= 1.0 and metrics["imitation_loss"] > 0  # the mean trust
        assert len(gyre.learner.replay) == int((batch[B.MASK].sum(-1) > 1).sum())
    finally:
        gyre.close()
