"""coverage_v0: PettingZoo conformance, dynamics, layouts, options, assignment, oracle and baselines."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from pettingzoo.test import parallel_api_test

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.checks import check_setup, manager_rates
from gyre_ma.envs import coverage_v0
from gyre_ma.envs.base import GyreEnv
from gyre_ma.envs.coverage import assignment
from gyre_ma.envs.coverage import coverage as cv
from gyre_ma.envs.coverage.options import make_library
from gyre_ma.envs.coverage.oracle import FixedAssignment, NearestFirst, OracleManager
from gyre_ma.options.decision import Decision
from gyre_ma.options.library import OptionLibrary
from gyre_ma.options.option import OptionContext, Termination
from gyre_ma.rollout import run_episode


def placed(agents, landmarks, **kwargs) -> cv.CoverageEnv:
    env = coverage_v0.parallel_env(**kwargs)
    env.reset(seed=0)
    env.place(agents, landmarks)
    return env


def moves(env: cv.CoverageEnv, *acts: int):
    return env.step({a: act for a, act in zip(env.possible_agents, acts, strict=True)})


def decision(env: cv.CoverageEnv, library: OptionLibrary, agent: str) -> Decision:
    obs = env._observe(env.agent_index[agent])
    done = env.verified_milestones()
    mask = library.mask(done, OptionContext(agent, env, obs, done))
    return Decision(agent, env.agent_index[agent], obs, mask, done, -1, 0.0, env)


# ---------------------------------------------------------------------------- PettingZoo
def test_pettingzoo_parallel_api() -> None:
    parallel_api_test(coverage_v0.parallel_env(), num_cycles=200)


def test_check_setup_passes() -> None:
    """check_env's gyre checks driven by the library, plus every PettingZoo test."""
    report = check_setup(coverage_v0.parallel_env, make_library(), seeds=(0, 1, 2), module=coverage_v0)
    assert report.milestones == {"covered_0", "covered_1", "covered_2"}
    assert "max_cycles_test" in report.pettingzoo_tests


def test_entry_points_and_metadata() -> None:
    par = coverage_v0.parallel_env()
    assert isinstance(par, cv.CoverageEnv) and isinstance(par, GyreEnv)
    assert par.metadata["name"] == "coverage_v0" == str(par)
    assert par.max_cycles == 9 and par.config.makespan_bound == 8
    assert coverage_v0.raw_env().possible_agents == ["agent_0", "agent_1", "agent_2"]
    graph = par.task_graph()
    assert set(graph.goals) == set(graph.names) == {"covered_0", "covered_1", "covered_2"}
    assert all(not m.requires and not m.any_of for m in graph.milestones)


def test_config_errors_name_the_key() -> None:
    for kwargs, key in ((dict(n_agents=9), "n_agents"), (dict(size=1), "size"), (dict(max_cycles=0), "max_cycles"),
                        (dict(max_makespan=0), "max_makespan"), (dict(milestone_rewards=1), "milestone_rewards")):
        with pytest.raises(ValueError, match=key):
            coverage_v0.parallel_env(**kwargs)
    with pytest.raises(ValueError, match="unknown option"):
        coverage_v0.parallel_env(walls=True)
    with pytest.raises(ValueError, match="cannot hold"):
        coverage_v0.parallel_env(n_agents=3, size=2)


# ---------------------------------------------------------------------------- dynamics
def test_moves_clip_at_the_border_and_claiming_freezes() -> None:
    env = placed([(0, 0), (4, 4), (8, 8)], [(0, 2), (6, 6), (2, 8)])
    moves(env, cv.UP, cv.DOWN, cv.RIGHT)  # agents 0 and 2 bump into the border
    assert env.agent_pos.tolist() == [[0, 0], [5, 4], [8, 8]]
    moves(env, cv.RIGHT, cv.STAY, cv.STAY)
    _, rewards, terms, truncs, _ = moves(env, cv.RIGHT, cv.STAY, cv.STAY)
    assert env.verified_milestones() == {"covered_0"}
    assert env.claim.tolist() == [0, -1, -1] and env.covered_by.tolist() == [0, -1, -1]
    assert not any(terms.values()) and not any(truncs.values()) and rewards["agent_0"] == 0.0
    moves(env, cv.DOWN, cv.STAY, cv.STAY)  # frozen: ignored
    assert env.agent_pos[0].tolist() == [0, 2] and env.frozen.tolist() == [True, False, False]


def test_the_lower_index_claims_on_a_tie_and_covering_all_at_the_cap_terminates() -> None:
    env = placed([(1, 0), (1, 2), (8, 8)], [(1, 1), (0, 8), (8, 7)], milestone_rewards=True)
    _, rewards, _, _, _ = moves(env, cv.RIGHT, cv.LEFT, cv.LEFT)
    assert env.covered_by.tolist() == [0, -1, 2] and env.claim.tolist() == [0, -1, 2]
    assert rewards["agent_1"] == pytest.approx(2 / 3)  # two claims at 1/3 each, paid to every agent
    moves(env, cv.STAY, cv.UP, cv.STAY)
    for _ in range(6):
        moves(env, cv.STAY, cv.RIGHT, cv.STAY)
    _, rewards, terms, truncs, _ = moves(env, cv.STAY, cv.RIGHT, cv.STAY)
    assert env.t == env.max_cycles == 9
    assert all(terms.values()) and not any(truncs.values())
    assert rewards["agent_0"] == pytest.approx(1 / 3 + 1.0)


def test_termination_and_truncation() -> None:
    env = placed([(0, 0), (4, 4), (8, 8)], [(0, 1), (4, 5), (8, 7)])
    _, rewards, terms, truncs, _ = moves(env, cv.RIGHT, cv.RIGHT, cv.LEFT)
    assert all(terms.values()) and not any(truncs.values()) and env.agents == []
    assert set(rewards.values()) == {1.0}
    env = placed([(0, 0), (4, 4), (8, 8)], [(0, 1), (4, 5), (8, 7)], max_cycles=3)
    for _ in range(3):
        _, _, terms, truncs, _ = moves(env, cv.STAY, cv.STAY, cv.STAY)
    assert all(truncs.values()) and not any(terms.values()) and env.agents == []
    with pytest.raises(ValueError, match="no live agents"):
        moves(env, cv.STAY, cv.STAY, cv.STAY)


def test_observation_layout_and_bounds() -> None:
    env = placed([(0, 0), (8, 8), (4, 4)], [(0, 8), (8, 0), (4, 5)])
    moves(env, cv.STAY, cv.STAY, cv.RIGHT)
    obs = env._observe(0)
    lay = env.obs_layout
    assert env.observation_space("agent_0").contains(obs)
    assert obs[lay["position"]].tolist() == [0.0, 0.0]
    assert obs[lay["landmarks"]].tolist() == [0.0, 1.0, 1.0, 0.0, 0.5, 0.625]
    assert obs[lay["covered"]].tolist() == [0.0, 0.0, 1.0]
    assert obs[lay["others"]].tolist() == [1.0, 1.0, 0.5, 0.625]
    assert obs[lay["frozen"]].tolist() == [0.0] and obs[lay["others_frozen"]].tolist() == [0.0, 1.0]
    assert env._observe(2)[lay["frozen"]].tolist() == [1.0]
    assert env.state_space.contains(env.state())


# ---------------------------------------------------------------------------- layouts
def test_layouts_are_seeded_distinct_and_solvable_in_time() -> None:
    env, other = coverage_v0.parallel_env(), coverage_v0.parallel_env()
    for seed in range(40):
        env.reset(seed=seed)
        other.reset(seed=seed)
        assert np.array_equal(env.agent_pos, other.agent_pos) and np.array_equal(env.landmark_pos, other.landmark_pos)
        cells = {tuple(c) for c in np.concatenate([env.agent_pos, env.landmark_pos]).tolist()}
        assert len(cells) == 6
        cost = cv.travel_costs(9, env.agent_pos, env.landmark_pos, [True] * 3)
        assert assignment.bottleneck(cost) <= env.config.makespan_bound
    env.reset(seed=1)
    first = env.landmark_pos.copy()
    env.reset()  # unseeded: the seed's stream goes on
    assert not np.array_equal(first, env.landmark_pos)


def test_route_field_avoids_other_uncovered_landmarks() -> None:
    field = cv.route_field(5, np.array([[0, 4], [0, 2]]), [True, True], 0)
    assert field[0, 0] == 6  # around landmark 1, which stands in the way
    assert field[0, 2] == -1
    assert cv.route_field(5, np.array([[0, 4], [0, 2]]), [True, False], 0)[0, 0] == 4
    boxed = cv.route_field(3, np.array([[0, 0], [0, 1], [1, 0]]), [True, True, True], 0)
    assert (boxed == -1).sum() == 8  # a cornered landmark is cut off


# ---------------------------------------------------------------------------- options
def test_library_masks_and_round_trip() -> None:
    env = placed([(0, 0), (4, 4), (8, 8)], [(0, 1), (6, 6), (2, 8)])
    lib = make_library(env=env)
    assert lib.names == ["go_to_0", "go_to_1", "go_to_2", "stay"]
    assert lib["go_to_0"].max_steps == 18
    moves(env, cv.RIGHT, cv.STAY, cv.STAY)
    assert decision(env, lib, "agent_0").mask.tolist() == [False, False, False, True]
    assert decision(env, lib, "agent_1").mask.tolist() == [False, True, True, True]
    again = OptionLibrary.from_spec(lib.to_spec())
    assert again.names == lib.names and again["go_to_2"].policy is lib["go_to_2"].policy
    with pytest.raises(ValueError, match="n_agents"):
        make_library(n_agents=2, env=env)


def test_go_to_detours_round_another_landmark_and_ends_on_its_milestone() -> None:
    env = placed([(0, 0), (8, 8), (8, 0)], [(0, 4), (0, 2), (5, 5)])
    lib = make_library(env=env)
    ctx = OptionContext("agent_0", env, None, frozenset())
    option = lib["go_to_0"]
    for _ in range(6):
        actions = dict.fromkeys(env.possible_agents, cv.STAY)
        actions["agent_0"] = option.policy(ctx)
        env.step(actions)
        ctx.steps += 1
    assert env.claim.tolist() == [0, -1, -1]  # reached in 6, not claiming landmark 1 on the way
    assert option.termination(ctx, env.verified_milestones()) is Termination.MILESTONE


def test_a_landmark_claimed_first_by_another_ends_the_walk() -> None:
    env = placed([(0, 0), (0, 3), (8, 8)], [(0, 4), (5, 5), (8, 0)])
    lib = make_library(env=env)
    go_to_0 = lib["go_to_0"]
    ctx = OptionContext("agent_0", env, None, frozenset())
    moves(env, go_to_0.policy(ctx), cv.RIGHT, cv.STAY)
    ctx.steps = 1
    assert env.covered_by.tolist() == [1, -1, -1]
    assert go_to_0.termination(ctx, env.verified_milestones()) is Termination.MILESTONE
    assert go_to_0.can_start(ctx) and not go_to_0.can_start(OptionContext("agent_1", env, None, frozenset()))


# ---------------------------------------------------------------------------- assignment
def _brute(cost: np.ndarray) -> tuple[float, float]:
    best = None
    for perm in itertools.permutations(range(cost.shape[1]), cost.shape[0]):
        picked = cost[range(cost.shape[0]), perm]
        key = (picked.max(), picked.sum())
        best = key if best is None or key < best else best
    return best


@pytest.mark.parametrize("scipy", [True, False])
def test_assign_is_lexicographically_optimal(monkeypatch, scipy: bool) -> None:
    if not scipy:
        monkeypatch.setattr(assignment, "linear_sum_assignment", None)
    rng = np.random.default_rng(0)
    for _ in range(60):
        rows, cols = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        cost = rng.integers(0, 12, size=(rows, cols)).astype(float)
        pairs = assignment.assign(cost)
        assert len(pairs) == min(rows, cols) and len({c for _, c in pairs}) == len(pairs)
        picked = np.array([cost[r, c] for r, c in pairs])
        ref = _brute(cost if rows <= cols else cost.T)
        assert (picked.max(), picked.sum()) == ref
        total = assignment.assign(cost, objective="total")
        assert sum(cost[r, c] for r, c in total) == _brute_total(cost)
    blocked = np.array([[1.0, np.inf], [np.inf, np.inf]])
    assert assignment.assign(blocked) == [(0, 0)]
    assert assignment.assign(np.array([[9.0, 1.0]]), floor=10) == [(0, 1)]
    with pytest.raises(ValueError, match="objective"):
        assignment.assign(blocked, objective="fastest")


def _brute_total(cost: np.ndarray) -> float:
    m = cost if cost.shape[0] <= cost.shape[1] else cost.T
    return min(m[range(m.shape[0]), p].sum() for p in itertools.permutations(range(m.shape[1]), m.shape[0]))


# ---------------------------------------------------------------------------- managers
def test_oracle_plans_one_assignment_whether_asked_together_or_one_by_one() -> None:
    env = placed([(0, 0), (0, 8), (8, 4)], [(7, 4), (1, 1), (1, 7)])
    lib = make_library(env=env)
    together = OracleManager(library=lib).decide([decision(env, lib, a) for a in env.possible_agents])
    oracle = OracleManager(library=lib)
    one_by_one = [oracle.decide([decision(env, lib, a)])[0] for a in env.possible_agents]
    names = [lib[c.option].name for c in together]
    assert names == [lib[c.option].name for c in one_by_one] == ["go_to_1", "go_to_2", "go_to_0"]
    assert [lib[c.option].name for c in FixedAssignment(library=lib).decide(
        [decision(env, lib, a) for a in env.possible_agents])] == ["go_to_0", "go_to_1", "go_to_2"]


def test_nearest_first_takes_the_nearest_landmark_even_where_that_loses_the_race() -> None:
    # agent 0 is 2 steps from landmark 0 and 3 from landmark 1; agent 1 is 3 from landmark 0
    # and 8 from landmark 1: nearest first has a makespan of 8, the assignment one of 3
    env = placed([(0, 3), (2, 0)], [(0, 1), (0, 6)], n_agents=2)
    lib = make_library(env=env)
    asked = [decision(env, lib, a) for a in env.possible_agents]
    assert [lib[c.option].name for c in NearestFirst(library=lib).decide(asked)] == ["go_to_0", "go_to_1"]
    assert [lib[c.option].name for c in OracleManager(library=lib).decide(asked)] == ["go_to_1", "go_to_0"]


def test_oracle_solves_essentially_every_layout() -> None:
    env = coverage_v0.parallel_env()
    lib = make_library(env=env)
    runs = [run_episode(env, lib, OracleManager(library=lib), seed=seed) for seed in range(50)]
    assert np.mean([t.success for t in runs]) >= 0.95
    assert all(t.length <= env.config.makespan_bound for t in runs if t.success)


def test_assignment_beats_nearest_first_beats_fixed_beats_random() -> None:
    env = coverage_v0.parallel_env()
    lib = make_library(env=env)
    rates = manager_rates(env, lib, {
        "oracle": lambda s: OracleManager(library=lib),
        "nearest": lambda s: NearestFirst(library=lib),
        "fixed": lambda s: FixedAssignment(library=lib),
        "random": RandomManager,
    }, seeds=100)
    assert rates["oracle_success"] > rates["nearest_success"] > rates["fixed_success"] > rates["random_success"]
    assert 0.5 <= rates["fixed_success"] <= 0.8, rates
    assert rates["random_success"] <= rates["fixed_success"] - 0.1, rates  # exclusive go_to: no duplicates


def test_episodes_are_deterministic() -> None:
    env = coverage_v0.parallel_env()
    lib = make_library(env=env)
    for build in (lambda: OracleManager(library=lib), lambda: RandomManager(3)):
        a, b = (run_episode(env, lib, build(), seed=7) for _ in range(2))
        assert [(c.agent, c.option, c.start_step, c.duration) for c in a.calls] == \
            [(c.agent, c.option, c.start_step, c.duration) for c in b.calls]
        assert (a.length, a.success, a.milestone_steps) == (b.length, b.success, b.milestone_steps)


def test_a_claim_is_the_claiming_agents_achievement_not_the_teams() -> None:
    """With ``milestone_agent`` the rollout credits a milestone to the agent that made it hold:
    the calls of agents that were walking to the same landmark get neither its reward nor
    its anchored credit (before, every call running at the claim was credited with it)."""
    import dataclasses

    from gyre_ma.options.decision import Choice
    from gyre_ma.options.library import OptionLibrary
    from gyre_ma.rewards.milestones import first_verified

    env = coverage_v0.parallel_env()
    lib = OptionLibrary("shared_targets", make_library(env=env).graph)
    for opt in make_library(env=env):  # go_to_k made non-exclusive, so that all three may head for one
        lib.add(dataclasses.replace(opt, exclusive=False))

    class AllToLandmarkZero:
        def decide(self, decisions):
            return [Choice(lib.index("go_to_0") if d.mask[lib.index("go_to_0")] else int(d.mask.nonzero()[0][-1]))
                    for d in decisions]

    traj = run_episode(env, lib, AllToLandmarkZero(), seed=5)
    claimer = traj.milestone_agents["covered_0"]
    first = [c for c in traj.calls if c.start_step == 0]
    assert len(first) == 3 and all(lib[c.option].name == "go_to_0" for c in first)
    assert [("covered_0" in c.milestones) for c in first] == [c.agent == claimer for c in first]
    paid = first_verified(traj)
    assert [("covered_0" in paid[i]) for i in range(3)] == [c.agent == claimer for c in first]


def test_a_lost_episode_pays_each_claim_to_its_claimer_and_nothing_to_idle_calls() -> None:
    """coverage's three landmarks are all goals: before ``rewards.partial_goals`` a failure paid
    nothing at all, so a claim and an idle ``stay`` in a lost episode were both worth 0."""
    from gyre_ma.rewards.arbiter import RewardConfig, score_trajectory

    env = coverage_v0.parallel_env()
    lib = make_library(env=env)
    lost = next(t for t in (run_episode(env, lib, FixedAssignment(library=lib), seed=s) for s in range(100))
                if not t.success and t.milestone_steps)
    paid = score_trajectory(lost, lib.graph, RewardConfig())
    for call, reward in zip(lost.calls, paid, strict=True):
        claimed = [m for m in call.milestones if lost.milestone_agents.get(m) == call.agent]
        assert reward.milestone == pytest.approx(len(claimed) / 3)
        assert reward.outcome == 0.0
    assert sum(r.milestone for r in paid) == pytest.approx(len(lost.milestone_steps) / 3)
    assert all(r.total == 0.0 for r in score_trajectory(lost, lib.graph, RewardConfig(partial_goals=False)))
    won = run_episode(env, lib, OracleManager(library=lib), seed=0)
    assert won.success and all(r.milestone == 0.0 for r in score_trajectory(won, lib.graph, RewardConfig()))
