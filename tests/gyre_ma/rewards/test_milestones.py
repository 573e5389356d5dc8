from __future__ import annotations

import numpy as np
import pytest

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.envs.workflow.options import make_library
from gyre_ma.envs.workflow.oracle import OracleManager
from gyre_ma.envs.workflow.workflow import parallel_env
from gyre_ma.options.graph import TaskGraph
from gyre_ma.rewards.milestones import (
    calls_at_end,
    covers,
    declined,
    first_verified,
    last_calls,
    milestone_rewards,
    milestone_weights,
)
from gyre_ma.rollout import run_episode
from tests.gyre_ma.rewards.conftest import call, trajectory


def test_each_milestone_pays_the_calls_running_at_its_first_verification(graph, two_agent_episode):
    traj = two_agent_episode()
    assert first_verified(traj) == [("a",), ("a", "b"), ("b", "goal"), ("goal",)]
    paid = milestone_rewards(traj, graph)
    assert [p for p, _ in paid] == [0.5, 1.5, 1.0, 0.0]  # goals are the outcome's, not a milestone's
    assert [names for _, names in paid] == [("a",), ("a", "b"), ("b",), ()]
    assert milestone_rewards(traj, graph, scale=2.0, include_goals=True)[3] == (10.0, ("goal",))


def test_interval_boundaries_and_step_zero():
    from gyre_ma.rollout import OptionCall

    c = OptionCall("agent_0", 0, 0, None, np.ones(1, bool), frozenset(), -1, 0.0, 0.0, 0.0,
                   start_step=10, policy_version=0, task_seed=0, duration=5)
    assert not covers(c, 10) and covers(c, 11) and covers(c, 15) and not covers(c, 16)


def test_only_verified_steps_pay_never_the_calls_claims(graph, two_agent_episode):
    traj = two_agent_episode(steps={"a": 0})  # held at reset: nobody achieved it
    for c in traj.calls:
        c.milestones = ("a", "b", "goal")  # what a call (or an agent) might claim
    assert all(p == 0.0 for p, _ in milestone_rewards(traj, graph))


def test_paid_once_per_episode_and_unknown_names_ignored(graph, two_agent_episode):
    traj = two_agent_episode(steps={"a": 5, "not_a_node": 6})
    total = sum(p for p, _ in milestone_rewards(traj, graph))
    assert total == pytest.approx(0.5 * 2)  # a: one call of each agent covered step 5


def test_last_calls_are_each_agents_final_call(two_agent_episode):
    assert last_calls(two_agent_episode()) == [2, 3]
    assert calls_at_end(two_agent_episode()) == [2, 3]


def test_an_agent_that_died_has_no_call_at_the_end(make_call, make_traj):
    died = make_traj([make_call("agent_0", 0, 10), make_call("agent_1", 0, 25), make_call("agent_1", 25, 5)], {})
    assert last_calls(died) == [0, 2]
    assert calls_at_end(died) == [2]


@pytest.mark.parametrize("manager", ["oracle", "random"])
def test_matches_the_env_own_milestone_rewards_on_workflow(manager):
    """The env pays every agent each milestone's graph weight on its first verification
    (milestone_rewards=True): per agent, our credit must sum to exactly that."""
    env = parallel_env(milestone_rewards=True, goal_reward=0.0)
    lib = make_library()
    graph = lib.graph
    for seed in range(3):
        m = OracleManager(library=lib) if manager == "oracle" else RandomManager(seed=seed)
        traj = run_episode(env, lib, m, seed=seed)
        paid = milestone_rewards(traj, graph, include_goals=True)
        for agent in env.possible_agents:
            ours = sum(p for (p, _), c in zip(paid, traj.calls) if c.agent == agent)
            env_paid = sum(c.raw_reward for c in traj.agent_calls(agent))
            assert ours == pytest.approx(env_paid), (seed, agent)
        assert sum(p for p, _ in paid) > 0


def test_a_filled_in_reward_pays_only_while_the_goals_still_need_its_milestone():
    """Either campfire or farm feeds the colony: the first of them pays, the second and the
    field only the farm route needed do not, nor does a milestone verified after what needed
    it; a reward the user gave pays whenever, and milestones of one step are judged together."""
    spec = {"goals": ["hall"], "milestones": {
        "wood": {}, "campfire": {"requires": ["wood"]}, "field": {}, "farm": {"requires": ["field"]},
        "food": {"any_of": [["campfire", "farm"]]}, "hall": {"requires": ["food", "wood"]}}}
    graph = TaskGraph.from_spec(spec)
    calls = [call("agent_0", 10 * k, 10) for k in range(6)]
    steps = {"wood": 5, "campfire": 15, "food": 16, "field": 25, "farm": 35}
    traj = trajectory(calls, steps)
    assert declined(traj, graph) == {"field", "farm"}
    assert [names for _, names in milestone_rewards(traj, graph)] == [("wood",), ("campfire", "food"), (), (), (), ()]
    same_step = trajectory(calls, {"wood": 5, "campfire": 15, "farm": 15})
    assert declined(same_step, graph) == frozenset()  # both verified at once: neither was redundant before
    given = TaskGraph.from_spec({**spec, "milestones": {**spec["milestones"], "farm": {"requires": ["field"],
                                                                                        "reward": 0.5}}})
    assert declined(traj, given) == {"field"}  # farm's reward was given: it pays
    assert milestone_rewards(traj, given)[3] == (0.5, ("farm",))


def test_every_route_to_the_goals_pays_the_same_in_total():
    """A session-55 user's MiniHack vault opens by a key (fetch it, then unlock) or by a kick.
    The key route paid two milestones, the kick one, and the learner kept the longer route: a
    filled-in reward now pays no more than its verification lowers the least reward the goals
    still need (``remaining_pay``), so each route pays the same in total; a given reward pays
    as given."""
    spec = {"goals": ["on_stairs"], "milestones": {
        "got_key": {}, "door_unlocked": {"requires": ["got_key"]}, "door_kicked": {},
        "vault_open": {"any_of": [["door_unlocked", "door_kicked"]], "side_effect": True},
        "on_stairs": {"requires": ["vault_open"]}}}
    graph = TaskGraph.from_spec(spec)
    assert graph.remaining_pay(()) == 2.0  # the kick's route and the vault (the goal is the outcome's)
    assert graph.remaining_pay({"got_key"}) == 2.0 and graph.remaining_pay({"door_kicked"}) == 1.0
    calls = [call("agent_0", 10 * k, 10) for k in range(4)]
    key = trajectory(calls, {"got_key": 5, "door_unlocked": 15, "vault_open": 15, "on_stairs": 25})
    kick = trajectory(calls, {"door_kicked": 5, "vault_open": 5, "on_stairs": 15})
    both = trajectory(calls, {"got_key": 5, "door_kicked": 15, "vault_open": 15, "on_stairs": 25})
    assert milestone_weights(key, graph) == {"got_key": 0.0, "door_unlocked": 1.0, "vault_open": 1.0,
                                             "on_stairs": 1.0}
    assert milestone_weights(kick, graph) == {"door_kicked": 1.0, "vault_open": 1.0, "on_stairs": 1.0}
    assert milestone_weights(both, graph)["got_key"] == 0.0
    assert [sum(p for p, _ in milestone_rewards(t, graph)) for t in (key, kick, both)] == [2.0, 2.0, 2.0]
    assert [names for _, names in milestone_rewards(key, graph)] == [(), ("door_unlocked", "vault_open"), (), ()]

    given = TaskGraph.from_spec({**spec, "milestones": {**spec["milestones"], "got_key": {"reward": 0.5}}})
    assert milestone_weights(key, given)["got_key"] == 0.5  # the user's own reward: paid whenever
    hall = TaskGraph.from_spec({"goals": ["hall"], "milestones": {  # a route whose alternatives pay alike
        "wood": {}, "campfire": {}, "farm": {}, "food": {"any_of": [["campfire", "farm"]]},
        "hall": {"requires": ["food", "wood"]}}})
    alike = trajectory(calls, {"farm": 5, "campfire": 15, "wood": 25, "food": 5})
    assert milestone_weights(alike, hall) == {"farm": 1.0, "campfire": 0.0, "wood": 1.0, "food": 1.0}
