from __future__ import annotations

import logging
import math

import pytest

from gyre_ma.rewards.alarms import (
    AlarmConfig,
    HackingMonitor,
    calls_without_completion,
    halves,
    reward_without_completion,
    rise_p_value,
    rose,
    rules_without_success,
)


def history(reward, success, calls=None, rules=None):
    out = []
    for i, (r, s) in enumerate(zip(reward, success)):
        m = {"iteration": i, "reward/total": r, "success_rate": s}
        if calls is not None:
            m["option_choices"] = calls[i]
        if rules is not None:
            m["rule_pay_rate"] = rules[i]
        out.append(m)
    return out


def logged(reward, success, calls, verified):
    """A window as a run logged it: reward, success, option choices and milestones verified per episode."""
    h = history(reward, success, calls=calls)
    for m, v in zip(h, verified, strict=True):
        m["milestones_verified"] = v
    return h


def ramp(a, b, n=10):
    return [a + (b - a) * i / (n - 1) for i in range(n)]


def test_halves_and_rises():
    assert halves([1, 2, 99, 3, 4]) == (1.5, 3.5)  # the odd middle counts in neither half
    assert rose([10, 10, 14, 14], relative=0.25) == (True, 10, 14)
    assert not rose([10, 10, 12, 12], relative=0.25)[0]
    assert rose([0.0, 0.0, 1.1, 1.1], relative=1.0, floor=1.0)[0]  # near 0: measured against the floor
    with pytest.raises(ValueError, match="at least 2"):
        halves([1.0])


def test_reward_up_with_flat_or_falling_completion_fires():
    a = reward_without_completion(history(ramp(5, 80), [0.0] * 10))
    assert a is not None and a.name == "reward_without_completion" and a.values["reward_after"] > 40
    assert reward_without_completion(history(ramp(30, 80), ramp(0.8, 0.1))) is not None
    assert reward_without_completion(history(ramp(5, 80), ramp(0.0, 0.9))) is None  # completion rose too
    assert reward_without_completion(history([5.0] * 10, [0.0] * 10)) is None  # reward flat
    assert reward_without_completion(history(ramp(5, 80, 9), [0.0] * 9)) is None  # window not full
    hist = history(ramp(5, 80), [0.0] * 10)
    hist[3]["success_rate"] = math.nan
    assert reward_without_completion(hist) is None  # unmeasured: no alarm either way


def test_milestone_pay_for_more_milestones_in_order_is_learning_not_hacking():
    """A session-57 user's PressurePlate learner raised the alarm in every run, on verified
    milestone reward alone, on its way to 93 % held-out: more milestones per episode, each
    after its prerequisites. Such a rise raises no alarm; milestones verified out of order, or
    pay that rose without more milestones, still do, and the message says which."""
    paid = history(ramp(5, 80), [0.0] * 10)
    for m, r, v in zip(paid, ramp(4, 78), ramp(1, 6)):
        m |= {"reward/milestone": r, "milestones_verified": v, "milestones/out_of_order_episodes": 0.0}
    assert reward_without_completion(paid) is None
    assert HackingMonitor().check(paid) == []
    assert reward_without_completion(paid, order_key=None) is not None  # order not watched: the alarm

    paid[7]["milestones/out_of_order_episodes"] = 0.25  # a detector fooled, in one iteration
    a = reward_without_completion(paid)
    assert a is not None and "the rise is verified milestone reward (reward/milestone" in a.message
    assert "up to 25% of an iteration's episodes verified a milestone before its prerequisites" in a.message
    assert "a gain where success_rate follows" in a.message and a.values["milestone_reward_after"] > 40

    paid[7]["milestones/out_of_order_episodes"] = 0.0
    for m in paid:
        m["milestones_verified"] = 3.0  # more pay for the same milestones
    assert "the milestones verified per episode did not rise" in reward_without_completion(paid).message

    for m, v in zip(paid, ramp(1, 6)):
        m["milestones_verified"] = v
        m["reward/milestone"] = 4.0  # the rise paid by something else (a rule, the PRM): the plain message
    assert "milestone" not in reward_without_completion(paid).message


def test_calls_up_without_completion_fires_per_key():
    h = history(ramp(1.0, 3.0), [0.2] * 10, calls=ramp(10, 150))
    for m, t in zip(h, ramp(12, 160)):
        m["tool_calls"] = t
    assert calls_without_completion(h).name == "option_choices_without_completion"
    assert calls_without_completion(h, calls_key="tool_calls").name == "tool_calls_without_completion"
    assert calls_without_completion(history([1.0] * 10, ramp(0.1, 0.9), calls=ramp(10, 150))) is None
    assert calls_without_completion(history([1.0] * 10, [0.2] * 10)) is None  # key absent


def test_reward_rise_that_only_completed_episodes_show_is_not_hacking():
    # first successes lift the total while completion, over the window, still counts as flat
    h = history(ramp(-3.0, -1.2), [0.0] * 8 + [0.0, 0.2])
    assert reward_without_completion(h) is not None  # without the failed episodes' reward
    for m in h:
        m["reward/total_failed"] = -3.0  # failures earn what they always did
    assert reward_without_completion(h) is None
    assert reward_without_completion(h, failed_key=None) is not None  # the gate is off
    for m, r in zip(h, ramp(-3.0, 6.0)):
        m["reward/total_failed"] = r  # failures get paid more: a hack
    a = reward_without_completion(h)
    assert a is not None and a.values["failed_reward_after"] > a.values["failed_reward_before"]
    assert "did not complete" in a.message
    for m, r in zip(h, ramp(-3.0, -1.5)):
        m["reward/total_failed"] = r  # failures lose fewer guard penalties: learning, not a hack
    assert reward_without_completion(h) is None
    for m, r in zip(h, ramp(-3.0, 6.0)):
        m["reward/total_failed"] = r
    h[4]["reward/total_failed"] = math.nan  # an iteration without failures: the gate is skipped
    assert reward_without_completion(h) is not None


def test_calls_that_buy_verified_milestones_are_progress_not_hacking():
    calls = ramp(10, 30)
    h = history(ramp(1.0, 3.0), [0.0] * 10, calls=calls)
    for m, c in zip(h, calls):
        m["milestones_verified"] = c / 8  # eight calls per milestone throughout
    assert calls_without_completion(h) is None
    assert calls_without_completion(h, progress_key=None) is not None
    for m in h:
        m["milestones_verified"] = 1.5  # the same calls, no more verified progress
    a = calls_without_completion(h)
    assert a is not None and a.values["calls_per_milestone_after"] > a.values["calls_per_milestone_before"]
    for m in h:
        m["milestones_verified"] = 0.0  # below one milestone counts as one: no division blow-up
    assert calls_without_completion(h).values["calls_per_milestone_before"] == pytest.approx(
        a.values["calls_before"])


def test_monitor_gates_come_from_its_config():
    calls = ramp(10, 30)
    h = history(ramp(1.0, 1.2), [0.0] * 10, calls=calls)
    for m, c in zip(h, calls):
        m["milestones_verified"] = c / 8
    assert HackingMonitor().check(h) == []
    names = [a.name for a in HackingMonitor(AlarmConfig(progress_key=None)).check(h)]
    assert names == ["option_choices_without_completion"]


def test_rule_pass_far_above_success_fires():
    assert rules_without_success(history([1] * 10, [0.05] * 10, rules=[1.0] * 10)).name == "rules_without_success"
    assert rules_without_success(history([1] * 10, [0.7] * 10, rules=[0.9] * 10)) is None
    assert rules_without_success(history([1] * 10, [0.05] * 10, rules=[1.0] * 10), margin=0.99) is None


def test_monitor_fires_once_per_episode_of_hacking_and_logs(caplog):
    mon = HackingMonitor(AlarmConfig(window=6))
    healthy = history(ramp(0, 30, 8), ramp(0.0, 0.9, 8), calls=ramp(10, 40, 8), rules=ramp(0.0, 0.9, 8))
    hacked = history(ramp(30, 120, 8), ramp(0.9, 0.0, 8), calls=ramp(40, 200, 8), rules=[1.0] * 8)
    for m in healthy:
        assert mon.update(m) == []
    assert mon.metrics() == {"alarm/active": 0.0}
    with caplog.at_level(logging.WARNING, logger="gyre_ma.rewards"):
        fired_at = [(i, sorted(a.name for a in mon.update(m, 8 + i))) for i, m in enumerate(hacked)]
    first = next(i for i, names in fired_at if names)
    assert "reward_without_completion" in fired_at[first][1]
    names = {a.name for a in mon.fired}
    assert {"reward_without_completion", "option_choices_without_completion", "rules_without_success"} <= names
    assert len(mon.fired) == len(names)  # an alarm that keeps holding is logged once
    assert mon.metrics()["alarm/reward_without_completion"] == 1.0
    assert "reward-hacking alarm reward_without_completion" in caplog.text
    other = HackingMonitor(mon.config)
    other.load_state_dict(mon.state_dict())
    assert other.fired == mon.fired and other.active == mon.active and other.history == mon.history


def test_forced_calls_that_grow_with_failures_raise_no_calls_alarm():
    """coverage_v0: a failed episode runs to the cap, each frozen agent making a forced
    ``stay`` call per step, so all calls per episode (and per verified milestone) rose
    whenever success dipped, and the calls alarm fired dozens of times a run. It watches
    the calls made among two or more options."""
    from gyre_ma.envs.coverage.options import make_library
    from gyre_ma.envs.coverage.oracle import FixedAssignment
    from gyre_ma.envs.coverage_v0 import parallel_env
    from gyre_ma.metrics import episode_metrics
    from gyre_ma.rollout import run_episode

    env = parallel_env()
    library = make_library(env=env)
    played = [run_episode(env, library, FixedAssignment(library), seed=s) for s in range(20)]
    m = episode_metrics(played, ())
    assert m["option_choices"] == sum(int(c.mask.sum()) > 1 for t in played for c in t.calls) / len(played)
    assert 0 < m["option_choices"] < m["option_calls"]

    h = history(ramp(1.0, 1.2), ramp(0.8, 0.5), calls=[4.0] * 10)
    for row, calls, verified in zip(h, ramp(8.0, 14.0), ramp(2.8, 2.3), strict=True):
        row["option_calls"], row["milestones_verified"] = calls, verified
    assert HackingMonitor().check(h) == []
    assert [a.name for a in HackingMonitor(AlarmConfig(calls_keys=("option_calls",))).check(h)] == [
        "option_calls_without_completion"]


def test_one_iteration_with_an_episode_at_the_cap_is_not_a_calls_alarm():
    """A healthy tech-tree run (option choices per episode, success rate, milestones per
    episode over 10 iterations, as logged): two iterations in which an episode ran to the
    step cap repeating ``wait`` raise the window's second-half *mean* of choices by 27 %.
    The medians do not move; calls rising iteration after iteration still fire."""
    choices = [85.06, 83.0, 78.12, 80.38, 71.56, 110.94, 158.38, 83.06, 76.62, 77.38]
    success = [1.0, 1.0, 1.0, 1.0, 1.0, 0.94, 0.94, 1.0, 0.94, 0.88]
    h = history([2.3] * 10, success, calls=choices)
    for m, v in zip(h, [14.81, 14.56, 14.5, 14.25, 14.38, 14.12, 14.38, 14.06, 13.94, 14.12]):
        m["milestones_verified"] = v
    first, second = halves(choices)
    assert second > 1.25 * first  # the mean alone would have fired
    assert calls_without_completion(h, significance=1.0, reward_key=None) is None  # the medians alone
    for m, c, r in zip(h, ramp(80, 160), ramp(2.3, 2.6), strict=True):
        m["option_choices"], m["reward/total"] = c, r
    assert calls_without_completion(h) is not None


def test_calls_bought_at_a_loss_of_reward_are_not_a_calls_alarm():
    """Calls per episode rising while the reward per episode falls are failures running
    long (healthy tech-tree runs whose success dipped from 1.0 to 0.94), not calls farmed
    for pay: the alarm needs the reward not to fall."""
    h = history(ramp(4.7, 4.4), [1.0] * 5 + [0.94] * 5, calls=ramp(120, 200))
    assert calls_without_completion(h) is None
    a = calls_without_completion(h, reward_key=None)
    assert a is not None and "reward_before" not in a.values
    h = history(ramp(4.7, 9.0), [1.0] * 5 + [0.94] * 5, calls=ramp(120, 200))
    assert calls_without_completion(h).values["reward_after"] > 4.7


def test_calls_that_pay_less_iteration_by_iteration_are_failed_retries_not_a_calls_alarm():
    """A healthy coverage_v0 run (seed 2, iterations 847-856, as logged): option choices per
    episode (3 at best) rose with two failing iterations' retries, success and the halves'
    reward stayed level, and the alarm fired; the iterations with more calls paid less
    (correlation -0.94). The same calls paid more each time they rose still fire."""
    choices = [3.5, 3.0, 3.0, 4.0, 9.375, 6.0, 11.0, 4.625, 6.0, 4.25]
    success = [0.875, 1.0, 0.625, 0.75, 0.25, 0.75, 0.375, 0.875, 0.625, 0.875]
    verified = [2.875, 3.0, 2.625, 2.75, 2.25, 2.625, 2.0, 2.875, 2.625, 2.875]
    reward = [2.625, 3.0, 1.875, 2.25, 0.75, 2.25, 1.125, 2.625, 1.875, 2.625]

    assert halves(reward)[1] >= halves(reward)[0]  # the reward did not fall: the old rule fired
    assert calls_without_completion(logged(reward, success, choices, verified), reward_key=None) is not None
    assert calls_without_completion(logged(reward, success, choices, verified)) is None
    paid = [2.0 + 0.5 * c for c in choices]  # each extra call paid
    a = calls_without_completion(logged(paid, success, choices, verified))
    assert a is not None and a.values["calls_reward_correlation"] == pytest.approx(1.0)


def test_rise_p_value_is_the_exact_one_sided_rank_test():
    assert rise_p_value(list(range(10))) == pytest.approx(1 / 252)  # every pair favours the second half
    assert rise_p_value(list(range(10, 0, -1))) == pytest.approx(1.0)
    assert rise_p_value([2.0] * 10) == pytest.approx(146 / 252)  # all ties: U = 12.5, taken as P(U >= 12)
    # scipy.stats.mannwhitneyu(second, first, alternative="greater", method="exact"): 0.1111
    assert rise_p_value([8.25, 9.25, 12.6, 14, 9.12, 20.8, 9.38, 11.2, 17, 11.6]) == pytest.approx(28 / 252)
    assert rise_p_value([1.0, 5.0, 2.0]) == pytest.approx(0.5)  # odd length: the middle value sits out
    with pytest.raises(ValueError, match="at least 2"):
        rise_p_value([1.0])


def test_calls_that_scatter_without_a_trend_are_not_a_calls_alarm():
    """A healthy LockedRoom run (seed 0 of ``benchmarks/generalisation.py``, iterations 3-12,
    as logged): every episode succeeds and verifies its 4 milestones for a reward of 4,
    while option choices per episode scatter from 9 to 23. The second half's median is 37 %
    above the first's, and the alarm fired. Its iterations beat the first half's in 18 of 25
    pairs (p = 0.14): scatter. And at a level reward the calls bought nothing; a steady climb
    of calls that the reward follows still fires."""
    choices = [14.0, 9.12, 20.8, 9.38, 11.2, 17.0, 11.6, 9.62, 15.4, 22.9]
    h = history([4.0] * 10, [1.0] * 10, calls=choices)
    for m in h:
        m["milestones_verified"] = 4.0
    assert rose(choices, relative=0.25, median=True)[0]
    assert HackingMonitor().check(h) == []
    assert calls_without_completion(h, significance=1.0, reward_key=None) is not None  # the old rule
    assert calls_without_completion(h, reward_key=None) is None  # scatter
    for m, c in zip(h, sorted(choices), strict=True):
        m["option_choices"] = c
    assert calls_without_completion(h) is None  # a trend, but the extra calls bought no reward
    for m, r in zip(h, ramp(4.0, 4.5), strict=True):
        m["reward/total"] = r
    a = calls_without_completion(h)
    assert a is not None and a.values["calls_rise_p"] == pytest.approx(1 / 252)


def test_calls_whose_pay_rises_within_its_scatter_are_not_a_calls_alarm():
    """A healthy MPE simple_spread run (``mpe_spread``, seed 0, iterations 296-305, as
    logged): choices per episode climbed as agents asked every step chose ``stay`` more,
    success fell, and the halves' reward rose 1 % (8.32 -> 8.40) while scattering from 3.75
    to 10.1; the alarm fired. The calls' rise passes the rank test, the reward's does not
    (p = 0.79): nothing was bought. The same calls paid more each time still fire."""
    choices = [18.88, 17.5, 13.88, 6.62, 20.62, 22.62, 25.5, 21.25, 22.88, 19.0]
    success = [0.5, 0.25, 0.5, 0.5, 0.25, 0.375, 0.125, 0.125, 0.125, 0.125]
    verified = [3.38, 3.12, 3.5, 3.25, 3.12, 3.0, 3.12, 3.12, 3.12, 3.12]
    reward = [10.12, 9.38, 9.0, 3.75, 9.38, 9.0, 6.38, 9.38, 9.38, 7.88]

    first, second = halves(reward)
    assert second > first and rise_p_value(choices) <= 0.05  # what the rule before this test asked
    assert rise_p_value(reward) > 0.5
    assert calls_without_completion(logged(reward, success, choices, verified)) is None
    assert HackingMonitor().check(logged(reward, success, choices, verified)) == []
    paid = sorted(reward)  # the same pay, rising iteration after iteration
    a = calls_without_completion(logged(paid, success, choices, verified))
    assert a is not None and a.values["reward_rise_p"] <= 0.05
