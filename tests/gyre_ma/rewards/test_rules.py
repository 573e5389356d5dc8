from __future__ import annotations

import pytest

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.envs.workflow.options import make_library
from gyre_ma.envs.workflow.oracle import OracleManager
from gyre_ma.envs.workflow.workflow import parallel_env
from gyre_ma.options.errors import UserCodeError
from gyre_ma.rewards.rules import (
    Rule,
    RuleContext,
    RuleEngine,
    RuleSpec,
    StateView,
    UnknownStateKey,
    default_snapshot,
    extended_snapshot,
    load_rules,
    rule_metrics,
    state_check,
)
from gyre_ma.rollout import run_episode


class FakeEnv:
    """Just enough of a gyre env for snapshots: verified milestones and surface flags."""

    def __init__(self, graph, verified=(), **flags):
        self.graph, self.verified, self.flags = graph, frozenset(verified), flags

    def task_graph(self):
        return self.graph

    def verified_milestones(self):
        return self.verified

    def surface_flags(self):
        return dict(self.flags)


def engine_with_states(rules, graph, traj, states, final_env):
    """Engine whose option-end states are given per call (as the rollout hook would)."""
    engine = RuleEngine(rules, graph=graph)
    for c, s in zip(traj.calls, states):
        engine.record(c, s)
    return engine, engine.end_episode(traj, final_env)


def ctx(state):
    return RuleContext("episode_end", StateView(state), trajectory=None)


# ---------------------------------------------------------------- declarative checks
def test_state_check_requires_where_given_holds():
    check = state_check(require={"compliance_passed": True}, given={"submitted": True})
    assert check(ctx({"submitted": False, "compliance_passed": False}))  # vacuous
    assert check(ctx({"submitted": True, "compliance_passed": True}))
    assert not check(ctx({"submitted": True, "compliance_passed": False}))
    with pytest.raises(UnknownStateKey, match="unknown state key 'submited'; known: \\['a'\\]"):
        state_check({"submited": True})(ctx({"a": 1}))


def test_rule_specs_validate_and_load_from_yaml(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(
        "rules:\n"
        "  - name: compliance_before_submit\n"
        "    kind: guard\n"
        "    given: {submitted: true}\n"
        "    require: {compliance_passed: true}\n"
        "  - name: surface\n"
        "    when: episode_end\n"
        "    weight: 2.5\n"
        "    milestone: b\n"
        "    check: gyre_ma.envs.workflow.workflow:report_submitted\n"
    )
    guard, surface = load_rules(path)
    assert (guard.kind, guard.when, guard.weight) == ("guard", "episode_end", 1.0)
    assert (surface.kind, surface.weight, surface.milestone) == ("process", 2.5, "b")
    assert surface.check.__name__ == "report_submitted"
    with pytest.raises(ValueError, match=r"rules\[0\].*exactly one of `check`"):
        load_rules([{"name": "x", "check": "a:b", "require": {"k": 1}}])
    with pytest.raises(ValueError, match=r"rules\[1\]\.wieght: Extra inputs"):
        load_rules([{"name": "ok", "require": {"k": 1}}, {"name": "x", "require": {"k": 1}, "wieght": 1}])
    with pytest.raises(ValueError, match=r"rules\[0\]\.check: cannot import module 'no_such_mod'"):
        load_rules([{"name": "x", "check": "no_such_mod:f"}])
    with pytest.raises(ValueError, match="does not exist"):
        load_rules(tmp_path / "missing.yaml")
    assert RuleSpec(name="n", require={"k": 1}).build().name == "n"


def test_rule_and_engine_validation_name_the_rule(graph):
    ok = state_check({"a": True})
    with pytest.raises(ValueError, match="rule 'g': a guard applies to the whole episode"):
        Rule("g", ok, kind="guard", milestone="a")
    with pytest.raises(ValueError, match="rule 'w': weight must be a finite number >= 0"):
        Rule("w", ok, weight=-1.0)
    with pytest.raises(ValueError, match="rule 'k': kind must be one of"):
        Rule("k", ok, kind="bonus")
    with pytest.raises(ValueError, match="rule 'm': milestone 'nope' is not a node of the task graph"):
        RuleEngine([Rule("m", ok, milestone="nope")], graph=graph)
    with pytest.raises(ValueError, match="rule name 'd' is used twice"):
        RuleEngine([Rule("d", ok), Rule("d", ok)])


# ---------------------------------------------------------------- when rules pay
def test_process_rules_pay_only_where_their_milestone_progressed(graph, two_agent_episode):
    traj = two_agent_episode()  # a first verified in calls 0, 1; b in calls 1, 2
    passes = state_check({"ok": True})
    rules = [
        Rule("free", passes, when="option_end", weight=1.0),
        Rule("bound_b", passes, when="option_end", weight=2.0, milestone="b"),
        Rule("end_bound_a", passes, when="episode_end", weight=3.0, milestone="a"),
        Rule("end_free", passes, when="episode_end", weight=4.0),
    ]
    states = [{"ok": True}, {"ok": False}, {"ok": True}, {"ok": True}]
    engine, res = engine_with_states(rules, graph, traj, states, FakeEnv(graph, ok=True))
    assert res.process == (1.0 + 3.0, 3.0, 1.0 + 2.0 + 4.0, 1.0 + 4.0)
    assert res.paid[1] == ("end_bound_a",)  # bound_b was checked on call 1 and failed there
    assert res.evaluated == {"free": 4, "bound_b": 2, "end_bound_a": 1, "end_free": 1}
    assert res.passed["bound_b"] == 1 and not res.vetoed
    # a milestone not verified in this episode: its episode-end rule is not even checked
    _, res = engine_with_states(rules, graph, two_agent_episode(steps={"b": 20}), states, FakeEnv(graph, ok=True))
    assert res.evaluated["end_bound_a"] == 0 and all("end_bound_a" not in p for p in res.paid)


def test_guards_veto_and_name_the_violating_calls(graph, two_agent_episode):
    traj = two_agent_episode()
    rules = [
        Rule("no_x_at_option_end", state_check({"x": False}), kind="guard", when="option_end"),
        Rule("compliance_before_submit", state_check({"compliance_passed": True}, {"submitted": True}),
             kind="guard", when="episode_end"),
    ]
    states = [{"x": False}, {"x": True}, {"x": False}, {"x": False}]
    final = FakeEnv(graph, verified={"a"}, submitted=True, compliance_passed=False)
    _, res = engine_with_states(rules, graph, traj, states, final)
    assert res.vetoed and res.violations == ("no_x_at_option_end", "compliance_before_submit")
    assert res.penalized == ((), ("no_x_at_option_end",), ("compliance_before_submit",), ("compliance_before_submit",))
    final = FakeEnv(graph, submitted=True, compliance_passed=True)
    _, res = engine_with_states(rules, graph, traj, [{"x": False}] * 4, final)
    assert not res.vetoed and res.passed == {"no_x_at_option_end": 4, "compliance_before_submit": 1}


# ---------------------------------------------------------------- broken rules
@pytest.mark.parametrize("check, error, why", [
    (state_check({"no_such_key": True}), ValueError,
     "unknown state key 'no_such_key'; known: \\['a', 'b', 'goal', 'verified'\\]"),
    (lambda c: 1 / 0, UserCodeError, "raised ZeroDivisionError: division by zero \\(at "),
    (lambda c: "yes", ValueError, "returned 'yes', expected a bool"),
])
def test_a_broken_rule_stops_with_its_name_and_the_users_line(graph, two_agent_episode, check, error, why):
    """A rule that cannot be evaluated is a user error, not a rule quietly switched off:
    a guard that stopped checking would let what it forbids be paid for (issue #18, 4)."""
    rules = [Rule("fine", state_check({"a": True}), when="episode_end"),
             Rule("broken_one", check, when="episode_end", weight=9.0)]
    engine = RuleEngine(rules, graph=graph)
    with pytest.raises(error, match=f"rule 'broken_one' \\(episode_end\\) check .*{why}") as got:
        engine.end_episode(two_agent_episode(), FakeEnv(graph, verified={"a"}))
    if error is UserCodeError:
        assert f"{__file__}:" in str(got.value)
    assert engine.evaluated["broken_one"] == 0


def test_option_end_rules_without_recorded_states_fail_loudly(graph, two_agent_episode):
    engine = RuleEngine([Rule("r", state_check({"a": True}), when="option_end")], graph=graph)
    with pytest.raises(RuntimeError, match=r"pass the engine.s on_option_end to run_episode\(on_option_end=...\)"):
        engine.end_episode(two_agent_episode(), FakeEnv(graph))


def test_a_workflow_verifier_is_a_valid_episode_end_check_but_breaks_at_option_end():
    env = parallel_env()
    lib = make_library()
    report = load_rules([{"name": "surface", "check": "gyre_ma.envs.workflow.workflow:report_submitted"}])[0]
    engine = RuleEngine([report, Rule("at_end", report.check, when="option_end")], graph=lib.graph)
    traj = run_episode(env, lib, RandomManager(seed=0), seed=0, on_option_end=engine.on_option_end)
    with pytest.raises(UserCodeError, match="rule 'at_end' \\(option_end\\) check .*report_submitted raised TypeError"):
        engine.end_episode(traj, env)
    engine = RuleEngine([report], graph=lib.graph)
    traj = run_episode(env, lib, RandomManager(seed=0), seed=0, on_option_end=engine.on_option_end)
    res = engine.end_episode(traj, env)
    assert res.passed["surface"] == int(env.surface_flags()["report_submitted"])


# ---------------------------------------------------------------- the option-end hook
@pytest.mark.parametrize("manager", ["oracle", "random"])
def test_option_end_snapshots_are_the_state_each_call_ended_in(manager):
    """Rules at option_end see the env exactly at step start_step + duration."""
    env = parallel_env()
    lib = make_library()
    snapshot = extended_snapshot(lambda e: {"step": e.workspace.step})
    seen = []

    def at_end(c: RuleContext) -> bool:
        seen.append((c.call, c.option, dict(c.state)))
        return c.state["step"] == c.call.start_step + c.call.duration

    engine = RuleEngine([Rule("aligned", at_end, when="option_end")], graph=lib.graph, snapshot=snapshot,
                        option_names=lib.names)
    for seed in range(3):
        base = OracleManager(library=lib) if manager == "oracle" else RandomManager(seed=seed)
        traj = run_episode(env, lib, base, seed=seed, on_option_end=engine.on_option_end)
        res = engine.end_episode(traj, env)
        assert res.evaluated["aligned"] == len(traj.calls) == res.passed["aligned"]
    call, option, state = seen[-1]
    assert option == lib.names[call.option]
    for m in traj.milestone_steps:  # milestone keys of the snapshot come from verification
        assert state[m] is (traj.milestone_steps[m] <= call.start_step + call.duration)


def test_default_snapshot_reads_verified_milestones_and_surface_flags():
    env = parallel_env()
    lib = make_library()
    run_episode(env, lib, RandomManager(seed=1), seed=1)
    state = default_snapshot(env)
    assert state["verified"] == env.verified_milestones()
    assert set(lib.graph.names) <= set(state) and {"report_submitted", "submitted", "submission_verified"} <= set(state)


def test_rule_metrics_and_state_round_trip(graph, two_agent_episode):
    rules = [Rule("p", state_check({"a": True})), Rule("g", state_check({"b": True}), kind="guard")]
    engine = RuleEngine(rules, graph=graph)
    r1 = engine.end_episode(two_agent_episode(), FakeEnv(graph, verified={"a", "b"}))
    r2 = engine.end_episode(two_agent_episode(), FakeEnv(graph, verified=set()))
    m = rule_metrics(rules, [r1, r2])
    assert m["rules/pass_rate/p"] == 0.5 and m["rules/pay_rate/p"] == 0.5
    assert m["rules/pass_rate/g"] == 0.5 and m["rules/violation_rate"] == 0.5
    assert m["rule_pay_rate"] == 0.5 and "rules/pay_rate/g" not in m
    fresh = RuleEngine(rules, graph=graph)
    fresh.load_state_dict(engine.state_dict())
    assert fresh.pass_rates() == engine.pass_rates() == {"p": 0.5, "g": 0.5}
