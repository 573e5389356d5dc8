"""GiGPO and GRPO as credit modes: a worked example, the anchor states of real episodes,
and training runs in each mode (issue #20)."""

from __future__ import annotations

import math

import pytest
import torch

from gyre_ma.config import parse_config
from gyre_ma.credit import gigpo_advantages, option_advantages
from gyre_ma.loop import Gyre
from gyre_ma.training_batch import anchor_states, segment


def test_worked_example_two_rollouts_that_part_at_a_shared_state():
    """Two rollouts of one task seed start from the same state (anchor 0); the first
    reaches the goal, the second does not, and from there on their states differ."""
    returns = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    anchors = torch.tensor([[0, 1], [0, 2]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    got = gigpo_advantages(episode_advantages=torch.tensor([1.0, -1.0]), step_returns=returns, anchors=anchors,
                           episode_index=torch.tensor([0, 1]), mask=mask, step_weight=0.5, eps=1e-12)
    # the shared first state compares the two first decisions (±1, weighted 0.5); a state seen
    # once says nothing (0); every decision carries its episode's advantage (±1)
    assert got.flatten().tolist() == pytest.approx([1.5, 1.0, -1.5, -1.0])
    padded = gigpo_advantages(episode_advantages=torch.tensor([1.0, -1.0]), step_returns=returns, anchors=anchors,
                              episode_index=torch.tensor([0, 1]), mask=torch.tensor([[True, False], [True, True]]),
                              step_weight=1.0, eps=1e-12)
    assert padded.flatten().tolist() == pytest.approx([2.0, 0.0, -2.0, -1.0])
    with pytest.raises(ValueError, match="step_weight must be >= 0"):
        gigpo_advantages(episode_advantages=torch.zeros(2), step_returns=returns, anchors=anchors,
                         episode_index=torch.tensor([0, 1]), mask=mask, step_weight=-1.0)


def test_option_advantages_gigpo_pays_the_outcome_at_each_rows_last_call():
    kw = dict(values=torch.zeros(2, 3), durations=torch.ones(2, 3, dtype=torch.long),
              terminated=torch.tensor([[False, True, False], [False, False, True]]),
              truncated=torch.zeros(2, 3, dtype=torch.bool), gamma=0.5, lam=0.95,
              mask=torch.tensor([[True, True, False], [True, True, True]]),
              outcomes=torch.tensor([1.0, 0.0]), groups=torch.tensor([7, 7]))
    adv, ret = option_advantages(mode="gigpo", rewards=torch.zeros(2, 3), anchors=torch.tensor([[0, 1, 0], [0, 2, 3]]),
                                 step_weight=1.0, **kw)
    assert ret.tolist() == [[0.5, 1.0, 0.0], [0.0, 0.0, 0.0]]  # γ = 0.5 from the last call back
    e = 1.0 - 1e-8  # (o − mean) / (std + eps), std = 0.5
    assert adv[0].tolist() == pytest.approx([e + e, e, 0.0]) and adv[1].tolist() == pytest.approx([-2 * e, -e, -e])
    grpo, _ = option_advantages(mode="grpo", rewards=torch.zeros(2, 3), milestones=torch.zeros(2, 3, dtype=torch.bool),
                                **kw)
    assert grpo[0].tolist() == pytest.approx([e, e, 0.0]) and grpo[1].tolist() == pytest.approx([-e, -e, -e])
    with pytest.raises(ValueError, match=r"mode 'gigpo' needs .*missing \['anchors', 'step_weight'\]"):
        option_advantages(mode="gigpo", rewards=torch.zeros(2, 3), **kw)


def _config(mode: str, **credit):
    return parse_config({
        "name": f"peer-{mode}", "env": {"id": "coverage_v0"}, "credit": {"mode": mode, **credit},
        "train": {"iterations": 2, "episodes_per_iteration": 8, "minibatch_size": 32, "epochs": 1},
        "roles": {"explorers": 1, "executors": 3, "evaluators": 0}, "monitor": {"spot_checks": 0}})


def test_first_decisions_of_one_task_seed_share_an_anchor_state():
    gyre = Gyre(_config("gigpo"))
    try:
        _, trajectories = gyre.iteration(0, return_trajectories=True)
    finally:
        gyre.close()
    seg = segment(trajectories, gyre.env.possible_agents)
    flat = [c for row in seg.calls for c in row]
    ids = anchor_states(trajectories, seg, gyre.featurizer.many(flat)).tolist()
    first: dict[int, set[int]] = {}  # task seed → anchors of agent_0's first decisions
    at = 0
    for r, row in enumerate(seg.calls):
        if row[0].agent_index == 0:  # the first to decide: the others' choices are not yet made
            first.setdefault(trajectories[int(seg.episode[r])].task_seed, set()).add(ids[at])
        at += len(row)
    assert len(first) == 2 and all(len(a) == 1 for a in first.values())  # a seed's rollouts start alike
    assert len(set.union(*first.values())) == 2  # and two seeds never share a state
    assert len(set(ids)) < len(ids)


@pytest.mark.parametrize("mode", ["grpo", "gigpo"])
def test_peer_credit_modes_train(mode):
    gyre = Gyre(_config(mode))
    try:
        history = [gyre.iteration(i) for i in range(2)]
    finally:
        gyre.close()
    # both updates ran (none skipped) on finite losses: the peer's advantages reached the trainer
    assert all(m["update_skipped"] == 0.0 and math.isfinite(m["policy_loss"]) for m in history)
    assert gyre.version == 2
