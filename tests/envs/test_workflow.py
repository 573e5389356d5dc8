from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import pytest
from pettingzoo.test import (
    api_test,
    max_cycles_test,
    parallel_api_test,
    parallel_seed_test,
    seed_test,
)

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.checks import manager_rates
from gyre_ma.envs import workflow_v0
from gyre_ma.envs.base import GyreEnv
from gyre_ma.envs.workflow import workflow as wf
from gyre_ma.envs.workflow.options import make_library
from gyre_ma.envs.workflow.oracle import OracleManager, needed_milestones
from gyre_ma.options.decision import Choice, Decision
from gyre_ma.options.library import resolve
from gyre_ma.rollout import run_episode


def calm_env(seed: int = 0, **kwargs) -> wf.WorkflowEnv:
    """An env without tool failures, reset."""
    env = workflow_v0.parallel_env(failure_scale=0.0, **kwargs)
    env.reset(seed=seed)
    return env


def call(env: wf.WorkflowEnv, tool: int, arg: int = 0, agent: str = "agent_0"):
    """Send one call from ``agent`` (the others noop) and step until it is over."""
    out = env.step({agent: np.array([tool, arg])})
    while env.agents and env.workspace.agents[agent].job is not None:
        out = env.step({})
    return out


def obs_of(env: wf.WorkflowEnv, agent: str = "agent_0") -> np.ndarray:
    return env.observe(agent)


# ---------------------------------------------------------------------------- PettingZoo
def test_pettingzoo_api() -> None:
    api_test(workflow_v0.env(), num_cycles=200)


def test_pettingzoo_parallel_api() -> None:
    parallel_api_test(workflow_v0.parallel_env(), num_cycles=200)


def test_pettingzoo_seed() -> None:
    seed_test(lambda: workflow_v0.env(max_cycles=150), num_cycles=150)
    parallel_seed_test(lambda: workflow_v0.parallel_env(max_cycles=150), num_cycles=150)


def test_pettingzoo_max_cycles() -> None:
    max_cycles_test(workflow_v0)


def test_protocol_spaces_and_render() -> None:
    env = workflow_v0.parallel_env(render_mode="ansi")
    assert isinstance(env, GyreEnv)
    assert env.metadata["name"] == "workflow_v0" and env.metadata["is_parallelizable"]
    obs, infos = env.reset(seed=3)
    for a in env.agents:
        assert obs[a].dtype == np.float32 and env.observation_space(a).contains(obs[a])
    state = env.state()
    assert state.dtype == np.float32 and env.state_space.contains(state)
    for a in env.agents:
        env.action_space(a).seed(3)
    for _ in range(60):
        if not env.agents:
            break
        obs, *_ = env.step({a: env.action_space(a).sample() for a in env.agents})
        assert all(env.observation_space(a).contains(o) for a, o in obs.items())
        assert env.state_space.contains(env.state())
    text = env.render()
    assert text.startswith("step ") and "agent_2" in text
    assert workflow_v0.raw_env().unwrapped.__class__ is wf.WorkflowEnv


def test_bad_config_and_action_are_named() -> None:
    with pytest.raises(ValueError, match="n_agents"):
        workflow_v0.parallel_env(n_agents=0)
    with pytest.raises(ValueError, match="unknown option.*'horizon'"):
        workflow_v0.parallel_env(horizon=5)
    env = calm_env()
    with pytest.raises(ValueError, match="agent_1"):
        env.step({"agent_1": np.array([42, 0])})


def test_task_graph_spec() -> None:
    env = workflow_v0.parallel_env()
    graph = env.task_graph()
    assert graph.goals == ("submission_verified",)
    assert graph.milestone("issues_inspected").any_of == (("warehouse_extract", "api_extract"),)
    for name in graph.names:
        m = graph.milestone(name)
        assert m.description and m.duration > 0
        assert resolve(m.verifier, name).__name__ == name
    assert 200 <= graph.critical_path()[0] <= 600
    # the planner takes the cheaper source and needs only one of them
    needed = needed_milestones(graph, frozenset())
    assert "api_extract" in needed and "warehouse_extract" not in needed
    assert "api_extract" not in needed_milestones(graph, frozenset({"warehouse_extract"}))


# ---------------------------------------------------------------------------- mechanics
def test_timeout_blocks_until_retry() -> None:
    env = workflow_v0.parallel_env()
    for seed in range(200):  # the first seed whose API fetch times out
        env.reset(seed=seed)
        call(env, wf.FETCH, 1)
        if env.workspace.agents["agent_0"].failed is not None:
            break
    else:
        pytest.fail("no timeout in 200 seeds at a 40% timeout rate")
    st = env.workspace.agents["agent_0"]
    assert st.failed == (wf.FETCH, 1) and env.workspace.dataset is None
    assert st.last_result == wf.R_TIMEOUT
    assert obs_of(env)[env.config.n_agents + 2 + 2 * len(wf.TOOLS)] == 1.0  # failed bit
    _, _, _, _, infos = call(env, wf.INSPECT, 0)
    assert infos["agent_0"]["event"].startswith("rejected")
    for _ in range(20):  # retries eventually get through
        call(env, wf.RETRY, 0)
        if st.failed is None:
            break
    assert st.failed is None and env.workspace.dataset is not None
    assert env.workspace.dataset.source == 1 and "api_extract" in env.verified_milestones()


def test_abandon_clears_the_failure() -> None:
    env = workflow_v0.parallel_env(failure_scale=1e6)
    env.reset(seed=0)
    call(env, wf.FETCH, 0)
    assert env.workspace.agents["agent_0"].failed == (wf.FETCH, 0)
    call(env, wf.RETRY, 1)
    assert env.workspace.agents["agent_0"].failed is None and env.workspace.dataset is None


def test_failures_are_seeded() -> None:
    def timeouts(seed):
        env = workflow_v0.parallel_env()
        env.reset(seed=seed)
        out = []
        for _ in range(15):
            call(env, wf.FETCH, 1)
            out.append(env.workspace.agents["agent_0"].failed is not None)
            env.workspace.agents["agent_0"].failed = None
        return out

    assert timeouts(5) == timeouts(5)
    assert any(timeouts(5)) and not all(timeouts(5))


def test_issues_hidden_until_inspected() -> None:
    env = calm_env(seed=11)
    call(env, wf.FETCH, 0)
    ds = env.workspace.dataset
    assert ds.problems, "every source has at least one problem"
    start = env.config.n_agents + env._own_size
    first = start + 1 + len(wf.SOURCES)  # after "data loaded" and the source one-hot
    inspected = slice(first, first + len(wf.ISSUES))
    known = slice(first + len(wf.ISSUES), first + 2 * len(wf.ISSUES))
    assert not obs_of(env)[known].any() and env.workspace.known_issues() == frozenset()
    hidden = env.state()[env.config.n_agents * env._own_size + env._ws_size:][: len(wf.ISSUES)]
    assert set(np.flatnonzero(hidden)) == set(env.workspace.source_issues[0])
    for c in range(len(wf.ISSUES)):
        call(env, wf.INSPECT, c)
        assert obs_of(env)[inspected][c] == 1.0
        assert obs_of(env)[known][c] == float(c in ds.problems)
    assert env.workspace.known_issues() == frozenset(ds.problems)
    assert "issues_inspected" in env.verified_milestones()


def test_validated_only_when_no_problem_left() -> None:
    for seed in range(100):
        env = calm_env(seed=seed)
        if len(env.workspace.source_issues[1]) >= 2 and wf.UNITS not in env.workspace.source_issues[1]:
            break
    call(env, wf.FETCH, 1)
    for c in range(len(wf.ISSUES)):
        call(env, wf.INSPECT, c)
    problems = sorted(env.workspace.dataset.problems)
    absent = next(c for c in range(len(wf.ISSUES)) if c not in problems)
    _, _, _, _, infos = call(env, wf.CLEAN, absent)  # wasteful, harmless
    assert infos["agent_0"]["wasted"] == 1
    for c in problems[:-1]:
        call(env, wf.CLEAN, c)
        assert not wf.data_validated(env) and "data_validated" not in env.verified_milestones()
    call(env, wf.CLEAN, problems[-1])
    assert wf.data_validated(env) and "data_validated" in env.verified_milestones()


def test_clipping_mixed_units_loses_data_until_refetch() -> None:
    for seed in range(100):
        env = calm_env(seed=seed)
        if wf.UNITS in env.workspace.source_issues[0]:
            break
    call(env, wf.FETCH, 0)
    for c in range(len(wf.ISSUES)):
        call(env, wf.INSPECT, c)
    call(env, wf.CLEAN, wf.OUTLIERS)
    for c in range(len(wf.ISSUES)):
        call(env, wf.CLEAN, c)
    assert env.workspace.dataset.data_loss and not wf.data_validated(env)
    call(env, wf.FETCH, 0)  # a fresh copy: problems back, inspections gone
    ds = env.workspace.dataset
    assert not ds.data_loss and ds.problems == set(env.workspace.source_issues[0]) and not ds.inspected


def test_exclusive_calls_and_busy_agents() -> None:
    env = calm_env()
    _, _, _, _, infos = env.step({"agent_0": np.array([wf.FETCH, 0]), "agent_1": np.array([wf.FETCH, 1])})
    assert infos["agent_0"]["event"].startswith("started")
    assert infos["agent_1"]["event"].startswith("rejected")
    _, _, _, _, infos = env.step({"agent_0": np.array([wf.SUBMIT, 0])})
    assert "ignored" in infos["agent_0"]["event"]
    assert env.workspace.agents["agent_0"].job.remaining == wf.duration(wf.FETCH, 0) - 2


# ---------------------------------------------------------------------------- the shortcut
class AlwaysShortcut:
    """Picks submit_report whenever it can (wait otherwise)."""

    def __init__(self, library) -> None:
        self.submit = library.index("submit_report")
        self.wait = library.index("wait")

    def decide(self, decisions: Sequence[Decision]) -> list[Choice]:
        return [Choice(self.submit if d.mask[self.submit] else self.wait) for d in decisions]


def test_shortcut_passes_the_surface_check_only() -> None:
    library = make_library()
    env = workflow_v0.parallel_env(shortcut_reward=0.5)
    traj = run_episode(env, library, AlwaysShortcut(library), seed=4)
    flags = env.surface_flags()
    assert flags["report_submitted"] and flags["submitted"]
    assert not flags["submission_verified"] and not traj.success
    assert "submission_verified" not in env.verified_milestones()
    assert "data_validated" not in env.verified_milestones()
    assert traj.length < 120 and traj.calls[-1].terminated
    assert traj.total_reward == pytest.approx(0.5 * env.config.n_agents)  # the naive grader's pay
    state = env.state()
    assert state[-1 - len(wf.MILESTONES) - 2] == 1.0 and state[-1 - len(wf.MILESTONES) - 1] == 0.0


def test_surface_reward_in_info_and_no_reward_by_default() -> None:
    env = calm_env()
    call(env, wf.WRITE, 0)
    _, rewards, terms, _, infos = call(env, wf.SUBMIT)
    assert all(terms.values()) and not env.agents
    assert rewards["agent_0"] == 0.0 and infos["agent_0"]["surface_reward"] == 0.0  # 1 of 4 sections
    env = calm_env()
    for s in range(len(wf.SECTIONS)):
        call(env, wf.WRITE, s)
    _, rewards, _, _, infos = call(env, wf.SUBMIT)
    assert rewards["agent_0"] == 0.0 and infos["agent_0"]["surface_reward"] == 1.0
    assert env.surface_flags() == {"report_submitted": True, "submitted": True, "submission_verified": False}


# ---------------------------------------------------------------------------- verifiers
class CheckedWorkflow(wf.WorkflowEnv):
    """Checks every verifier after every step of a real rollout."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        graph = self.task_graph()
        self.fns = {n: resolve(graph.milestone(n).verifier, n) for n in graph.names}
        self.history: list[frozenset[str]] = []

    def step(self, actions):
        out = super().step(actions)
        ws_copy = copy.deepcopy(self.workspace)
        now = {n for n, fn in self.fns.items() if fn(self.workspace)}
        assert now == {n for n, fn in self.fns.items() if fn(ws_copy)}
        assert now == {n for n, fn in self.fns.items() if fn(self)}
        verified = self.verified_milestones()
        assert now <= verified
        assert not self.history or self.history[-1] <= verified, "milestones must be monotone"
        self.history.append(verified)
        return out


def test_verifiers_are_deterministic_state_predicates_and_latched() -> None:
    library = make_library()
    for seed, manager in ((8, OracleManager(library=library)), (9, RandomManager(9))):
        env = CheckedWorkflow()
        traj = run_episode(env, library, manager, seed=seed)
        assert len(env.history) == traj.length
    assert traj.length > 0
    assert "submission_verified" in CheckedWorkflow().task_graph().names
    assert resolve(library.graph.milestone("data_validated").verifier, "v")(workflow_v0.env()) is False


def test_milestone_rewards_follow_the_graph() -> None:
    library = make_library()
    env = workflow_v0.parallel_env(milestone_rewards=True)
    traj = run_episode(env, library, OracleManager(library=library), seed=2)
    assert traj.success
    graph = env.task_graph()
    expected = sum(graph.milestone(m).reward for m in env.verified_milestones()) + 1.0
    assert traj.total_reward == pytest.approx(expected * env.config.n_agents)
    sparse = run_episode(workflow_v0.parallel_env(), library, OracleManager(library=library), seed=2)
    assert sparse.total_reward == pytest.approx(env.config.n_agents)


# ---------------------------------------------------------------------------- managers
def test_oracle_beats_random() -> None:
    library = make_library()
    rates = manager_rates(workflow_v0.parallel_env(), library, {"oracle": lambda _: OracleManager(library=library),
                                                               "random": lambda seed: RandomManager(seed=seed)},
                          seeds=100)
    assert rates["oracle_success"] >= 0.95, rates
    assert rates["random_success"] <= 0.30, rates
    assert 200 <= rates["oracle_mean_length"] <= 600, rates


def test_same_seed_same_trajectory() -> None:
    library = make_library()

    def signature(manager_factory, seed):
        env = workflow_v0.parallel_env()
        traj = run_episode(env, library, manager_factory(), seed=seed)
        calls = [(c.agent, c.option, c.start_step, c.duration, c.termination) for c in traj.calls]
        return calls, traj.length, traj.milestone_steps, env.state().tobytes()

    def oracle():
        return OracleManager(library=library)

    for seed in (0, 7):
        assert signature(oracle, seed) == signature(oracle, seed)
        assert signature(lambda s=seed: RandomManager(s), seed) == signature(
            lambda s=seed: RandomManager(s), seed
        )
    assert signature(oracle, 0) != signature(oracle, 1)


def test_library_covers_every_milestone_and_never_masks_everything() -> None:
    library = make_library()
    graph = library.graph
    covered = {o.milestone for o in library if o.milestone}
    assert covered == set(graph.names)
    assert {"retry_tool", "wait", "submit_report"} <= set(library.names)
    assert library.mask(frozenset())[library.index("wait")]
    assert library.to_spec()["options"]  # every callable is importable by reference


def test_trajectories_count_the_tool_calls_the_env_made() -> None:
    library = make_library()
    env = workflow_v0.parallel_env()
    traj = run_episode(env, library, OracleManager(library=library), seed=3)
    assert traj.tool_calls == env.tool_calls() == sum(st.tool_calls for st in env.workspace.agents.values())
    assert traj.tool_calls >= len({c.option for c in traj.calls})  # at least as many calls as options used
