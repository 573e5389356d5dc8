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
    rose,
    rules_without_success,
)


def history(reward, success, calls=None, rules=None):
    out = []
    for i, (r, s) in enumerate(zip(reward, success)):
        m = {"iteration": i, "reward/total": r, "success_rate": s}
        if calls is not None:
            m["option_calls"] = calls[i]
        if rules is not None:
            m["rule_pay_rate"] = rules[i]
        out.append(m)
    return out


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


def test_calls_up_without_completion_fires_per_key():
    h = history([1.0] * 10, [0.2] * 10, calls=ramp(10, 150))
    for m, t in zip(h, ramp(12, 160)):
        m["tool_calls"] = t
    assert calls_without_completion(h).name == "option_calls_without_completion"
    assert calls_without_completion(h, calls_key="tool_calls").name == "tool_calls_without_completion"
    assert calls_without_completion(history([1.0] * 10, ramp(0.1, 0.9), calls=ramp(10, 150))) is None
    assert calls_without_completion(history([1.0] * 10, [0.2] * 10)) is None  # key absent


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
    assert {"reward_without_completion", "option_calls_without_completion", "rules_without_success"} <= names
    assert len(mon.fired) == len(names)  # an alarm that keeps holding is logged once
    assert mon.metrics()["alarm/reward_without_completion"] == 1.0
    assert "reward-hacking alarm reward_without_completion" in caplog.text
    other = HackingMonitor(mon.config)
    other.load_state_dict(mon.state_dict())
    assert other.fired == mon.fired and other.active == mon.active and other.history == mon.history
