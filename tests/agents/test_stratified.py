"""Stratified sampling of a task seed's group (``roles.stratify``): one systematic sample of
uniforms per group, each episode's still uniform, refined after each choice."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gyre_ma.agents.manager import ManagerPolicy
from gyre_ma.agents.noise import NoiseSetting, PolicyActor, _Slot
from gyre_ma.config import parse_config
from gyre_ma.options.decision import Decision
from gyre_ma.roles import RolloutTask, iteration_tasks

F, K, A = 8, 6, 2


class _Identity:
    def many(self, decisions: list[Decision]) -> np.ndarray:
        return np.stack([d.observation for d in decisions])


def _group(strata: int, seed: int = 11, version: int = 3, **kw) -> list[RolloutTask]:
    return [RolloutTask("executor", seed, e, strata=strata, **kw) for e in range(strata)]


@pytest.mark.parametrize("strata", [2, 4, 5])
def test_a_groups_leads_are_one_systematic_sample(strata):
    for version in range(20):
        leads = [t.lead(version) for t in _group(strata, seed=7 + version)]
        assert all(0.0 <= u < 1.0 for u in leads)
        scaled = np.array(leads) * strata
        assert sorted(np.floor(scaled).astype(int)) == list(range(strata))  # one lead in each stratum
        assert np.ptp(scaled - np.floor(scaled)) < 1e-12  # and one shift for all of them
    assert [t.lead(3) for t in _group(strata)] == [t.lead(3) for t in _group(strata)]
    assert [t.lead(3) for t in _group(strata)] != [t.lead(4) for t in _group(strata)]


def test_each_episodes_lead_is_uniform_so_it_samples_its_own_policy():
    leads = np.array([RolloutTask("explorer", 5, 2, strata=4).lead(v) for v in range(4000)])
    counts = np.histogram(leads, bins=10, range=(0.0, 1.0))[0]
    assert counts.min() > 320 and counts.max() < 480  # 400 expected in each tenth
    assert abs(leads.mean() - 0.5) < 0.02


def test_greedy_held_out_and_unstratified_episodes_have_no_lead():
    assert RolloutTask("executor", 1, 0).lead(0) is None
    assert RolloutTask("executor", 1, 0, strata=4, greedy=True).lead(0) is None
    assert RolloutTask("executor", 1, 0, strata=4, stream=0).lead(0) is None


@pytest.mark.parametrize("strata, episode", [(1, 0), (4, 4), (3, -1)])
def test_a_bad_stratum_is_named(strata, episode):
    with pytest.raises(ValueError, match="strata"):
        RolloutTask("executor", 1, episode, strata=strata)


def test_iteration_tasks_stratify_each_seeds_group_only_when_asked():
    noise = {"executor": NoiseSetting("param", 0.01), "explorer": NoiseSetting("param", 0.3)}
    on = iteration_tasks(seeds=[3, 9], explorers=1, executors=3, noise=noise, stratify=True)
    assert [t.strata for t in on] == [4] * 8 and [t.episode for t in on[:4]] == [0, 1, 2, 3]
    off = iteration_tasks(seeds=[3, 9], explorers=1, executors=3, noise=noise)
    assert [t.strata for t in off] == [0] * 8
    alone = iteration_tasks(seeds=[3], explorers=0, executors=1, noise=noise, stratify=True)
    assert alone[0].strata == 0  # a group of one has nothing to stratify against


def test_refining_the_lead_keeps_the_policys_joint_distribution():
    """Two choices in a row drawn from one lead: over a fine grid of leads, each pair of
    choices takes exactly its probability's share, so a lead refined after a choice is
    as good as a fresh uniform."""
    p = np.array([0.5, 0.0, 0.3, 0.2])
    q = {0: np.array([0.1, 0.9, 0.0, 0.0]), 2: np.array([0.25, 0.25, 0.25, 0.25]), 3: np.array([0.0, 0.0, 0.6, 0.4])}
    n, counts = 20_000, {}
    for i in range(n):
        s = _Slot()
        s.lead = (i + 0.5) / n
        picks = []
        for probs in (p, None):
            probs = q[picks[0]] if probs is None else probs
            u = s.draw()
            pick = int(np.searchsorted(np.cumsum(probs), u * probs.sum(), side="right"))
            s.refine(probs, pick, u)
            picks.append(pick)
        counts[tuple(picks)] = counts.get(tuple(picks), 0) + 1
    want = {(a, b): p[a] * q[a][b] for a in q for b in range(4) if p[a] * q[a][b] > 0}
    assert set(counts) == set(want)
    for pair, share in want.items():
        assert counts[pair] / n == pytest.approx(share, abs=2 / n)


def test_a_lead_gives_way_to_the_generator_once_its_choices_grow_unlikely():
    s = _Slot()
    s.generator.manual_seed(0)
    s.lead = 0.5
    probs = np.array([0.01, 0.99])
    s.refine(probs, 0, 0.005)
    s.refine(probs, 0, s.lead * 0.01)
    assert s.lead is not None and s.width == pytest.approx(1e-4)
    s.refine(probs, 0, s.lead * 0.01)
    s.refine(probs, 0, s.lead * 0.01)
    assert s.lead is None
    assert s.draw() == float(torch.rand(1, generator=torch.Generator().manual_seed(0)))


def test_a_stratified_group_takes_each_option_its_probability_times_the_group_size_rounded():
    """Four slots facing the same decision with the same policy: a stratified group takes each
    option ⌊4p⌋ or ⌈4p⌉ times (a systematic sample), where independent draws repeat the
    likeliest option or miss one of probability ≥ 1/4 in many groups."""
    torch.manual_seed(0)
    pol = ManagerPolicy(F, K, A, hidden=32)
    with torch.no_grad():
        pol.head.weight.mul_(0.05)  # a spread policy: some options above 1/4, some near 0
        pol.head.bias.copy_(torch.tensor([1.5, 0.8, 0.0, -3.0, -3.0, 0.3]))
    actor = PolicyActor(pol, _Identity(), slots=4)
    g = torch.Generator().manual_seed(5)
    decision = Decision("agent_0", 0, torch.randn(F, generator=g).numpy(), np.ones(K, dtype=bool), frozenset(), -1,
                        0.0, None)
    with torch.no_grad():
        probs = torch.softmax(actor.logits([0], torch.from_numpy(decision.observation[None]), torch.tensor([0]),
                                           torch.ones(1, K, dtype=torch.bool)), -1)[0].numpy()
    assert probs.max() > 0.25
    missed_independent = 0
    for version in range(200):
        for stratified in (True, False):
            for task in _group(4, seed=100 + version, version=version):
                actor.begin(task.episode, NoiseSetting(), task.manager_seed(version),
                            lead=task.lead(version) if stratified else None)
            counts = np.bincount([c.option for c in actor.decide([0, 1, 2, 3], [decision] * 4)], minlength=K)
            if stratified:
                assert np.all(counts >= np.floor(4 * probs - 1e-6)) and np.all(counts <= np.ceil(4 * probs + 1e-6))
            else:
                missed_independent += bool(np.any((counts == 0) & (probs >= 0.25)))
    assert missed_independent > 10


def test_the_loop_stratifies_its_training_groups_under_the_key():
    from gyre_ma.loop import Gyre

    base = {"seed": 0, "env": {"id": "techtree_v0"}, "train": {"iterations": 1, "episodes_per_iteration": 8}}
    assert {t.strata for t in Gyre(parse_config(base)).tasks(0)} == {0}
    stratified = Gyre(parse_config(base | {"roles": {"stratify": True}})).tasks(0)
    assert {t.strata for t in stratified} == {4} and len(stratified) == 8
