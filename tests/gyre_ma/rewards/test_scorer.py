from __future__ import annotations

import math

import pytest
import torch

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.agents.manager import Featurizer
from gyre_ma.envs.workflow.options import make_library
from gyre_ma.envs.workflow.oracle import OracleManager
from gyre_ma.envs.workflow.workflow import parallel_env
from gyre_ma.rewards import RewardConfig, RewardScorer, apply_breakdowns
from gyre_ma.rollout import run_episode

RULES = [
    {"name": "report_complete_when_written", "kind": "process", "when": "option_end",
     "milestone": "report_written", "require": {"report_submitted": False}, "weight": 0.5},
    {"name": "compliance_before_submit", "kind": "guard", "given": {"submitted": True},
     "require": {"compliance_passed": True}},
]


@pytest.fixture(scope="module")
def setup():
    env, lib = parallel_env(), make_library()
    feat = Featurizer(env.observation_space(env.possible_agents[0]), lib)
    return env, lib, feat


def make_scorer(setup, seed=0, **overrides):
    env, lib, feat = setup
    cfg = RewardConfig.model_validate({
        "rules": RULES, "snapshot": "gyre_ma.envs.workflow.workflow:WorkflowEnv.surface_flags",
        "drift": {"min_samples": 4}, "prm": {"enabled": True}, **overrides,
    })
    return RewardScorer(cfg, lib.graph, featurizer=feat, n_options=len(lib), option_names=lib.names, seed=seed)


def collect(setup, scorer, n=8, seed=0):
    """Half oracle (succeeds), half random (shortcut-submits): both outcomes present."""
    env, lib, _ = setup
    trajs = []
    for i in range(n):
        manager = OracleManager(library=lib) if i % 2 == 0 else RandomManager(seed=seed + i)
        traj = run_episode(env, lib, manager, seed=seed + i, on_option_end=scorer.on_option_end)
        traj.rule_results = scorer.end_episode(traj, env)
        trajs.append(traj)
    return trajs


def test_scores_every_call_traceably_and_applies_the_totals(setup):
    scorer = make_scorer(setup)
    trajs = collect(setup, scorer)
    scored = scorer.score(trajs, iteration=0)
    assert [len(b) for b in scored.breakdowns] == [len(t.calls) for t in trajs]
    for t, bds in zip(trajs, scored.breakdowns):
        total = sum(b.total for b in bds)
        if t.success:
            assert total > 5.0 and not any(b.guard for b in bds)
            assert sum("rule:report_complete_when_written" in b.sources for b in bds) >= 1
        else:  # the random manager submits without compliance: vetoed and penalised
            assert all(b.guard for b in bds) and total < 0
    apply_breakdowns(trajs, scored.breakdowns, gamma=1.0)
    assert all(c.reward == c.breakdown.total for t in trajs for c in t.calls)
    m = scored.metrics
    assert m["reward/vetoed_episodes"] == 0.5 and m["rules/violation_rate"] == 0.5
    assert m["rules/pass_rate/report_complete_when_written"] == 1.0
    assert m["rule_pay_rate"] == 0.5 and "prm_loss" in m and m["prm/heldout_calls"] > 0


def test_prm_weight_is_zero_until_agreement_is_shown_then_capped(setup):
    scorer = make_scorer(setup, prm_weight=0.4, prm_weight_cap=0.3)
    assert scorer.prm_weight == 0.0
    first = scorer.score(collect(setup, scorer), iteration=0)
    assert all(b.prm == 0.0 for bds in first.breakdowns for b in bds)
    for it in range(1, 6):  # labels are easy to learn here: oracle vs random
        scored = scorer.score(collect(setup, scorer, seed=10 * it), iteration=it)
        if scorer.drift.trusted:
            break
    assert scorer.drift.trusted and scorer.prm_weight == 0.3
    scored = scorer.score(collect(setup, scorer, seed=99), iteration=9)
    prm = [b.prm for bds in scored.breakdowns for b in bds]
    assert max(abs(p) for p in prm) <= 0.3 and any(p != 0 for p in prm)


def test_missing_rule_results_and_bad_prm_cap_are_reported(setup):
    scorer = make_scorer(setup)
    trajs = collect(setup, scorer, n=2)
    for t in trajs:
        del t.rule_results
    with pytest.raises(ValueError, match="trajectory 0 has no rule results; call end_episode"):
        scorer.score(trajs)
    with pytest.raises(ValueError, match="prm_weight_cap .* must be below the smallest milestone reward"):
        make_scorer(setup, prm_weight_cap=0.5)


def test_without_prm_the_prm_part_is_zero(setup):
    scorer = make_scorer(setup, prm={"enabled": False})
    assert scorer.prm is None
    scored = scorer.score(collect(setup, scorer, n=4))
    assert all(b.prm == 0.0 for bds in scored.breakdowns for b in bds)
    assert not any(k.startswith("prm") for k in scored.metrics)


def test_same_seed_same_scores_and_state_round_trips(setup, tmp_path):
    a, b = make_scorer(setup, seed=3), make_scorer(setup, seed=3)
    torch.manual_seed(0)
    ta = collect(setup, a)
    torch.manual_seed(0)
    tb = collect(setup, b)
    sa, sb = a.score(ta, iteration=0), b.score(tb, iteration=0)
    assert sa.breakdowns == sb.breakdowns
    assert {k: v for k, v in sa.metrics.items() if not math.isnan(v)} == {
        k: v for k, v in sb.metrics.items() if not math.isnan(v)}
    a.alarms(sa.metrics | {"success_rate": 0.5, "option_choices": 20.0}, 0)
    torch.save(a.state_dict(), tmp_path / "rewards.pt")
    c = make_scorer(setup, seed=3)
    c.load_state_dict(torch.load(tmp_path / "rewards.pt", weights_only=True))
    for p, q in zip(a.prm.parameters(), c.prm.parameters()):
        assert torch.equal(p, q)
    assert c.drift.trusted == a.drift.trusted and repr(c.monitor.history) == repr(a.monitor.history)
    assert c.prm_updates == a.prm_updates == 1
    assert c.engine.pass_rates() == a.engine.pass_rates()


def test_rules_file_adds_rules_and_names_clashes(setup, tmp_path):
    env, lib, feat = setup
    path = tmp_path / "rules.yaml"
    path.write_text("- name: surface\n  check: gyre_ma.envs.workflow.workflow:report_submitted\n")
    cfg = RewardConfig.model_validate({"rules": RULES, "rules_file": str(path)})
    scorer = RewardScorer(cfg, lib.graph, featurizer=feat, n_options=len(lib))
    assert [r.name for r in scorer.engine.rules] == [r["name"] for r in RULES] + ["surface"]
    path.write_text("- name: compliance_before_submit\n  require: {submitted: false}\n")
    with pytest.raises(ValueError, match="rule name 'compliance_before_submit' is used twice"):
        RewardScorer(cfg, lib.graph)


def test_a_success_a_guard_vetoed_counts_as_a_failure_for_the_learner(setup):
    """A session-53 user's guards vetoed 99.5 % of episodes (a faked report that fooled the
    milestone detectors) and the default learner still converged on the cheat: its outcome,
    and so self-imitation's group best, counted the vetoed episodes as successes. A guard
    veto ranks above the outcome: the learner counts such an episode a failure."""
    import dataclasses

    from gyre_ma.config import CreditConfig
    from gyre_ma.rewards.breakdown import summarize
    from gyre_ma.trainers.self_imitation import group_best
    from gyre_ma.training_batch import outcomes

    scorer = make_scorer(setup)
    trajs = collect(setup, scorer, n=4)
    scored = scorer.score(trajs, iteration=0)
    breakdowns = [list(b) for b in scored.breakdowns]
    assert trajs[0].success and trajs[2].success  # the oracle's
    breakdowns[2] = [dataclasses.replace(b, guard=True) for b in breakdowns[2]]  # a success the guards caught
    apply_breakdowns(trajs, breakdowns, gamma=1.0)
    assert [t.vetoed for t in trajs] == [any(b.guard for b in bds) for bds in breakdowns]
    assert trajs[2].success and trajs[2].vetoed and not trajs[2].counted_success and trajs[0].counted_success
    outcome = outcomes(trajs, CreditConfig())
    assert outcome[0] > 0 and outcome[2] == 0 and outcome[1] == outcome[3] == 0
    best = group_best(outcome[[0, 2]], torch.tensor([7, 7]))  # the two as one group: only the clean one wins
    assert best.tolist() == [1.0, 0.0]
    metrics = summarize(breakdowns, success=[t.success for t in trajs])
    assert metrics["reward/vetoed_successes"] == 0.25
