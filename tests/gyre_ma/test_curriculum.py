"""Curriculum phases: promotion on windowed verified completion, step caps, state."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre_ma.curriculum import PHASES, Curriculum, oracle_path_lengths
from gyre_ma.rollout import Trajectory


def test_phases_step_caps_and_goals():
    c = Curriculum(120, warmup_goal="data_validated", warmup_path_length=40, window=3, threshold=0.8)
    assert (c.phase, c.goal, c.step_cap) == ("warmup", "data_validated", 60)  # 1.5 × 40
    assert not c.observe(1.0) and not c.observe(1.0)  # window not full yet
    assert c.observe(0.9)
    assert (c.phase, c.goal, c.step_cap) == ("reinforce", None, 300)  # 2.5 × 120
    assert [c.observe(x) for x in (0.9, 0.9, 0.5, 0.9, 0.9)] == [False] * 5  # mean 0.77 < 0.8
    assert c.observe(0.9) and c.phase == "refine" and c.step_cap == 300
    assert not any(c.observe(1.0) for _ in range(10)) and c.phase == "refine"
    assert [(a, b) for _, a, b in c.promotions] == [("warmup", "reinforce"), ("reinforce", "refine")]


def test_without_a_nearer_goal_warmup_shortens_the_cap_only():
    c = Curriculum(100, k=3.0, warmup_k=1.2, refine_k=2.0, window=1, threshold=0.5)
    assert (c.goal, c.step_cap) == (None, 120)
    c.observe(0.5)
    assert c.step_cap == 300
    c.observe(1.0)
    assert c.step_cap == 200
    assert Curriculum(100, warmup=False).phase == "reinforce"
    assert Curriculum(100, warmup_k=None).step_cap == 250


def test_success_uses_the_phase_goal_and_oracle_path_lengths():
    done = Trajectory(task_seed=0, policy_version=0, milestone_steps={"a": 10, "b": 30}, success=True,
                      length=32)
    half = Trajectory(task_seed=1, policy_version=0, milestone_steps={"a": 20})
    assert oracle_path_lengths([done, half]) == {"a": 15.0, "b": 30.0}
    c = Curriculum.from_oracle([done, half], "b", warmup_goal="a", k=2.0, warmup_k=None)
    assert (c.step_cap, c.success_rate([done, half])) == (30, 1.0)
    c.observe(1.0)
    c.observe(1.0)
    c.observe(1.0)
    c.observe(1.0)
    assert c.observe(1.0) and c.step_cap == 60 and c.success_rate([done, half]) == 0.5
    with pytest.raises(ValueError, match="'c' was never verified.*verified: \\['a', 'b'\\]"):
        Curriculum.from_oracle([done], "c")
    assert Curriculum.from_oracle([done, half], k=1.0, warmup=False).step_cap == done.length
    with pytest.raises(ValueError, match="none of the 1 oracle trajectories succeeded"):
        Curriculum.from_oracle([half])


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match=r"`threshold` \(1.5\) must be in \(0, 1\]"):
        Curriculum(10, threshold=1.5)
    with pytest.raises(ValueError, match="must be given together"):
        Curriculum(10, warmup_goal="a")
    with pytest.raises(ValueError, match="success_rate must be a number in \\[0, 1\\], got nan"):
        Curriculum(10).observe(float("nan"))
    with pytest.raises(ValueError, match="phase 'final' is not one of"):
        Curriculum(10).load_state_dict({"phase": "final", "history": [], "observations": 0, "promotions": []})


@settings(max_examples=200, deadline=None)
@given(rates=st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.75, 0.8, 1.0]), max_size=40), split=st.integers(0, 40))
def test_promotion_is_monotone_windowed_and_resumable(rates, split):
    c = Curriculum(50, window=3, threshold=0.75)
    changes = []
    resumed = None
    for i, r in enumerate(rates):
        if i == split:
            resumed = Curriculum(50, window=3, threshold=0.75)
            resumed.load_state_dict(c.state_dict())
        before = c.phase
        changed = c.observe(r)
        if resumed is not None:
            assert resumed.observe(r) == changed and resumed.phase == c.phase
        assert changed == (c.phase != before)
        if changed:
            assert PHASES.index(c.phase) == PHASES.index(before) + 1
            window = rates[max(0, i - 2): i + 1]
            assert len(window) == 3 and sum(window) / 3 >= 0.75
            changes.append(i)
    assert all(b - a >= 3 for a, b in zip(changes, changes[1:]))  # a new phase refills its window
