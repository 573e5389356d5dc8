"""Adapters on environments gyre-ma did not write: MiniGrid, CartPole, PettingZoo RPS."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from minigrid.core.actions import Actions
from minigrid.core.world_object import Door
from pettingzoo.classic import rps_v2, tictactoe_v3

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.envs.adapters import GyreAdapter, from_gymnasium, from_pettingzoo
from gyre_ma.envs.base import GyreEnv, unwrap
from gyre_ma.envs.minigrid_doorkey import has_key, make_env, make_library
from gyre_ma.options.decision import Choice, Decision
from gyre_ma.options.errors import UserCodeError
from gyre_ma.options.graph import TaskGraph
from gyre_ma.options.library import OptionLibrary
from gyre_ma.options.option import Option, OptionContext
from gyre_ma.rollout import run_episode

CHAIN = ("has_key", "door_open", "reached_goal")


class FirstEligible:
    """Always the first eligible option: the library's own order, a competent plan."""

    def decide(self, decisions: Sequence[Decision]) -> list[Choice]:
        return [Choice(int(np.flatnonzero(d.mask)[0])) for d in decisions]


# ---------------------------------------------------------------------- MiniGrid
@pytest.mark.parametrize("seed", range(6))
def test_minigrid_doorkey_random_manager_reaches_the_goal(seed: int) -> None:
    env, library = make_env(), make_library()
    traj = run_episode(env, library, RandomManager(seed), seed=seed)
    assert traj.success
    assert "reached_goal" in env.verified_milestones()
    steps = [traj.milestone_steps[m] for m in CHAIN]
    assert steps == sorted(steps) and steps[0] > 0
    assert traj.length < env.max_cycles


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_minigrid_doorkey_6x6_in_library_order(seed: int) -> None:
    env, library = make_env("MiniGrid-DoorKey-6x6-v0"), make_library()
    traj = run_episode(env, library, FirstEligible(), seed=seed)
    assert traj.success
    assert [library[c.option].name for c in traj.calls] == ["get_key", "open_door", "go_to_goal"]
    assert traj.calls[-1].terminated and not traj.calls[-1].truncated
    assert traj.total_reward > 0  # MiniGrid's own reward passes through


def test_minigrid_adapter_is_a_gyre_env_with_state_and_render() -> None:
    env = make_env(render_mode="rgb_array")
    assert isinstance(env, GyreEnv) and isinstance(env, GyreAdapter)
    assert unwrap(env) is env
    obs, infos = env.reset(seed=3)
    assert env.possible_agents == ["agent_0"] and set(obs) == {"agent_0"} == set(infos)
    assert env.verified_milestones() == frozenset()
    assert env.max_cycles == env.unwrapped.max_steps  # MiniGrid's own step cap
    assert env.observation_space("agent_0") is env.observation_space("agent_0")
    state = env.state()
    assert env.state_space.contains(state)
    frame = env.render()
    assert isinstance(frame, np.ndarray) and frame.ndim == 3
    graph = env.task_graph()
    assert graph.goals == ("reached_goal",)
    assert graph.milestone("has_key").verifier == "gyre_ma.envs.minigrid_doorkey:has_key"
    env.close()


def test_minigrid_milestone_stays_verified_after_the_door_closes_again() -> None:
    env, library = make_env(), make_library()
    env.reset(seed=0)
    for name in ("get_key", "open_door"):
        ctx = OptionContext("agent_0", env, None, env.verified_milestones())
        for _ in range(30):
            if library[name].milestone in env.verified_milestones():
                break
            env.step({"agent_0": library[name].policy(ctx)})
    door = env.unwrapped.grid.get(*env.unwrapped.front_pos)
    assert isinstance(door, Door) and door.is_open
    env.step({"agent_0": int(Actions.toggle)})
    assert not door.is_open
    assert env.verified_milestones() == {"has_key", "door_open"}


def test_minigrid_max_cycles_truncates_and_keeps_terminated_apart() -> None:
    env = make_env(max_cycles=3)
    env.reset(seed=0)
    for _ in range(2):
        _, _, term, trunc, _ = env.step({"agent_0": int(Actions.left)})
        assert term == {"agent_0": False} and trunc == {"agent_0": False}
    _, _, term, trunc, _ = env.step({"agent_0": int(Actions.left)})
    assert term == {"agent_0": False} and trunc == {"agent_0": True}
    assert env.agents == []
    with pytest.raises(ValueError, match="call reset"):
        env.step({"agent_0": 0})


# ---------------------------------------------------------------------- Gymnasium CartPole
def _cartpole(**kwargs) -> GyreAdapter:
    return from_gymnasium(
        "CartPole-v1",
        milestones={"pushed_right": lambda env: bool(env.state[1] > 0.1)},
        graph={"goals": ["pushed_right"], "milestones": {"pushed_right": {}}},
        **kwargs,
    )


def test_cartpole_rewards_pass_through_and_termination_is_not_truncation() -> None:
    env = _cartpole()
    assert env.max_cycles == 500  # the registered TimeLimit
    obs, _ = env.reset(seed=0)
    assert env.verified_milestones() == frozenset()
    np.testing.assert_array_equal(env.state(), obs["agent_0"])
    total, steps = 0.0, 0
    while env.agents:
        _, reward, term, trunc, _ = env.step({"agent_0": 1})
        total += reward["agent_0"]
        steps += 1
    assert term == {"agent_0": True} and trunc == {"agent_0": False}
    assert total == steps  # CartPole pays 1 per step
    assert env.verified_milestones() == {"pushed_right"}


def test_cartpole_max_cycles_and_run_episode() -> None:
    env = _cartpole(max_cycles=4)
    library = OptionLibrary("cartpole", env.task_graph(), [
        Option("push", lambda ctx: 1, milestone="pushed_right"),
        Option("nudge", lambda ctx: 0, done=lambda ctx: True),
    ])
    traj = run_episode(env, library, FirstEligible(), seed=1)
    # the goal is verified after the first push: the task is done and the episode ends there
    assert traj.success and traj.length == 1
    assert [library[c.option].name for c in traj.calls] == ["push"] and traj.calls[0].terminated
    env.reset(seed=1)
    for _ in range(4):
        _, _, term, trunc, _ = env.step({"agent_0": 0})
    assert term == {"agent_0": False} and trunc == {"agent_0": True}


def test_a_discrete_observation_returned_as_an_int_becomes_the_spaces_integer() -> None:
    from gyre_ma.envs.checks import check_env

    def frozen_lake() -> GyreAdapter:
        return from_gymnasium("FrozenLake-v1", milestones={"left_start": lambda e: int(e.s) != 0},
                              graph={"goals": ["left_start"], "milestones": {"left_start": {}}}, is_slippery=False)

    env = frozen_lake()
    assert type(gymnasium.make("FrozenLake-v1").reset(seed=0)[0]) is int  # what Gymnasium gives
    obs, _ = env.reset(seed=0)
    assert type(obs["agent_0"]) is np.int64 and obs["agent_0"] == 0
    obs, *_ = env.step({"agent_0": 2})  # right
    assert type(obs["agent_0"]) is np.int64 and obs["agent_0"] == 1
    assert env.verified_milestones() == {"left_start"}
    assert "api_test" in check_env(frozen_lake, n_steps=50).pettingzoo_tests  # failed on the int's missing dtype


# ---------------------------------------------------------------------- PettingZoo RPS (AEC)
RPS_GRAPH = {
    "goals": ["five_rounds"],
    "milestones": {"first_round": {}, "five_rounds": {"requires": ["first_round"]}},
}


def _rps() -> GyreAdapter:
    return from_pettingzoo(
        rps_v2.env(),
        milestones={"first_round": lambda e: e.num_moves >= 1, "five_rounds": lambda e: e.num_moves >= 5},
        graph=RPS_GRAPH,
    )


def _rps_library(env: GyreAdapter) -> OptionLibrary:
    return OptionLibrary("rps", env.task_graph(), [
        Option("open", lambda ctx: 0, milestone="first_round", max_steps=1),
        Option("rounds", lambda ctx: int(ctx.rng.integers(3)), milestone="five_rounds", max_steps=10),
        Option("any", lambda ctx: int(ctx.rng.integers(3)), done=lambda ctx: True),
    ])


def test_rps_aec_env_is_converted_and_verified_on_its_state() -> None:
    env = _rps()
    assert env.possible_agents == ["player_0", "player_1"]
    assert env.max_cycles == 15  # rps's own max_cycles
    env.reset(seed=0)
    assert env.state_space.contains(env.state())
    for round_ in range(1, 6):
        _, rewards, term, trunc, _ = env.step({"player_0": 0, "player_1": 1})
        assert rewards == {"player_0": -1, "player_1": 1}  # paper beats rock
        assert not any(term.values()) and not any(trunc.values())
        assert ("five_rounds" in env.verified_milestones()) == (round_ >= 5)
    assert env.verified_milestones() == {"first_round", "five_rounds"}


def test_rps_run_episode_two_agents() -> None:
    env = _rps()
    traj = run_episode(env, _rps_library(env), RandomManager(0), seed=0)
    assert traj.success
    assert {c.agent for c in traj.calls} == {"player_0", "player_1"}
    # five rounds verify the goal: the episode ends there, each agent's last call terminated
    assert traj.length == 5 and all(c.terminated and not c.truncated for c in traj.calls[-2:])


def test_a_user_attribution_credits_a_milestone_to_one_agents_call() -> None:
    """An outside env can say who achieved a milestone, as built-in ones do: the
    milestone then pays that agent's call only, not every call running when it held."""
    from gyre_ma.rewards.milestones import first_verified

    def credited(env: GyreAdapter) -> dict[str, set[str]]:
        traj = run_episode(env, _rps_library(env), RandomManager(0), seed=0)
        out: dict[str, set[str]] = {}
        for call, got in zip(traj.calls, first_verified(traj), strict=True):
            out.setdefault(call.agent, set()).update(got)
        return out

    team = credited(_rps())
    assert team["player_0"] >= {"first_round"} and team["player_1"] >= {"first_round"}
    asked = []

    def second_player(raw, milestone: str) -> str | None:
        asked.append((type(raw).__name__, milestone))
        return "player_1" if milestone == "first_round" else None

    env = from_pettingzoo(rps_v2.env(), milestones={"first_round": lambda e: e.num_moves >= 1,
                                                    "five_rounds": lambda e: e.num_moves >= 5},
                          graph=RPS_GRAPH, milestone_agent=second_player)
    own = credited(env)
    assert "first_round" in own["player_1"] and "first_round" not in own["player_0"]
    assert "five_rounds" in own["player_0"] and "five_rounds" in own["player_1"]  # None: the team's
    assert [m for _, m in asked] == ["first_round", "five_rounds"] and asked[0][0] != "GyreAdapter"


def test_a_bad_attribution_names_the_milestone_and_what_was_expected() -> None:
    detectors = {"first_round": lambda e: e.num_moves >= 1, "five_rounds": lambda e: e.num_moves >= 5}
    with pytest.raises(TypeError, match="milestone_agent must be a callable"):
        from_pettingzoo(rps_v2.env(), milestones=detectors, graph=RPS_GRAPH, milestone_agent="player_0")
    env = from_pettingzoo(rps_v2.env(), milestones=detectors, graph=RPS_GRAPH,
                          milestone_agent=lambda raw, m: "nobody")
    with pytest.raises(UserCodeError, match=r"milestone 'first_round'.*'nobody'.*\['player_0', 'player_1'\]"):
        run_episode(env, _rps_library(env), RandomManager(0), seed=0)

    def broken(raw, milestone):
        raise KeyError(milestone)

    env = from_pettingzoo(rps_v2.env(), milestones=detectors, graph=RPS_GRAPH, milestone_agent=broken)
    with pytest.raises(UserCodeError, match="milestone_agent .*broken.* for milestone 'first_round'"):
        run_episode(env, _rps_library(env), RandomManager(0), seed=0)


def test_turn_based_aec_needs_the_flag() -> None:
    graph = {"goals": ["moved"], "milestones": {"moved": {}}}
    detectors = {"moved": lambda e: any(v != 0 for v in e.board.squares)}
    with pytest.raises(ValueError, match="is_parallelizable.*turn_based=True"):
        from_pettingzoo(tictactoe_v3.env(), milestones=detectors, graph=graph)
    env = from_pettingzoo(tictactoe_v3.env(), milestones=detectors, graph=graph, turn_based=True)
    env.reset(seed=0)
    mover = env.agents[0]
    others = {a: 0 for a in env.agents if a != mover}
    env.step({mover: 4, **others})
    assert env.verified_milestones() == {"moved"}


# ---------------------------------------------------------------------- bad input
def test_detector_names_must_match_graph_nodes() -> None:
    graph = {"goals": ["b"], "milestones": {"a": {}, "b": {"requires": ["a"]}}}
    with pytest.raises(ValueError, match=r"node\(s\) \['b'\] have no detector"):
        from_gymnasium("CartPole-v1", milestones={"a": lambda e: True}, graph=graph)
    with pytest.raises(ValueError, match=r"detector\(s\) for \['c'\] name no task-graph node"):
        from_gymnasium(
            "CartPole-v1", milestones={"a": lambda e: True, "b": lambda e: True, "c": lambda e: True},
            graph=graph,
        )


def test_detector_that_raises_names_the_milestone() -> None:
    env = from_gymnasium(
        "CartPole-v1", milestones={"boom": lambda e: e.no_such_attribute},
        graph={"goals": ["boom"], "milestones": {"boom": {}}},
    )
    with pytest.raises(UserCodeError, match=r"reset: detector .*<lambda> for milestone 'boom' .*raised AttributeError"
                                             r".*test_adapters.py:\d+"):
        env.reset(seed=0)


def test_detector_must_return_a_bool() -> None:
    env = from_gymnasium(
        "CartPole-v1", milestones={"vague": lambda e: None},
        graph={"goals": ["vague"], "milestones": {"vague": {}}},
    )
    with pytest.raises(UserCodeError, match=r"milestone 'vague' returned None \(NoneType\); expected a bool "
                                             r"\(defined at .*test_adapters.py:\d+\)$"):
        env.reset(seed=0)


class _Drifting(gymnasium.Env):
    """Emits observations that leave their declared Box at the second step."""

    observation_space = spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.full(2, 0.6 * self.t, np.float32), 0.0, False, False, {}


def test_observation_outside_its_space_names_the_agent() -> None:
    graph = {"goals": ["g"], "milestones": {"g": {}}}
    env = from_gymnasium(_Drifting(), milestones={"g": lambda e: False}, graph=graph, agent="walker")
    env.reset(seed=0)
    env.step({"walker": 0})
    with pytest.raises(ValueError, match=r"step 2: the wrapped env's observation for agent 'walker' does not fit "
                                         r"its observation_space: it\[0\] = 1.2\d* is outside \[0.0, 1.0\] "
                                         r".*\(the space: Box\(.*\)\) \(defined at .*test_adapters.py:\d+\)$"):
        env.step({"walker": 0})
    wide = _Drifting()
    wide.reset = lambda seed=None, options=None: (np.zeros(2), {})  # float64 where the space says float32
    env = from_gymnasium(wide, milestones={"g": lambda e: False}, graph=graph, agent="walker")
    with pytest.raises(UserCodeError, match=r"reset: the wrapped env's observation for agent 'walker' does not fit "
                                            r"its observation_space: it has dtype float64, which does not cast "
                                            r"safely to float32"):
        env.reset(seed=0)
    wordy = spaces.Dict({f"counter_{i:02d}": spaces.Box(0, 9, (3,), np.int64) for i in range(12)})
    typo = _Drifting()
    typo.observation_space = wordy
    typo.reset = lambda seed=None, options=None: ({k: np.zeros(3, np.int64) for k in list(wordy.spaces)[1:]}, {})
    env = from_gymnasium(typo, milestones={"g": lambda e: False}, graph=graph, agent="walker")
    with pytest.raises(UserCodeError) as caught:  # the problem first, the long space cut short after it
        env.reset(seed=0)
    message = str(caught.value)
    assert "its observation_space: it['counter_00'] is missing (the space: Dict(" in message, message
    assert len(message) < 400 and "…)" in message, message
    lax = from_gymnasium(_Drifting(), milestones={"g": lambda e: False}, graph=graph, check_observations=False)
    lax.reset(seed=0)
    lax.step({"agent_0": 0})
    lax.step({"agent_0": 0})


def test_actions_must_cover_live_agents() -> None:
    env = _rps()
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"missing \['player_1'\]"):
        env.step({"player_0": 0})
    with pytest.raises(ValueError, match=r"unknown agent\(s\) \['ghost'\]"):
        env.step({"player_0": 0, "player_1": 0, "ghost": 0})


def test_graph_verifier_refs_are_detectors_and_must_agree() -> None:
    spec = {"goals": ["has_key"], "milestones": {"has_key": {"verifier": "gyre_ma.envs.minigrid_doorkey:has_key"}}}
    env = from_gymnasium("MiniGrid-DoorKey-5x5-v0", milestones=None, graph=spec)
    env.reset(seed=0)
    assert env.verified_milestones() == frozenset()
    assert from_gymnasium("MiniGrid-DoorKey-5x5-v0", milestones={"has_key": has_key}, graph=spec)
    with pytest.raises(ValueError, match=r"milestone 'has_key': the graph's verifier .* differ"):
        from_gymnasium("MiniGrid-DoorKey-5x5-v0", milestones={"has_key": lambda e: False}, graph=spec)
    with pytest.raises(ValueError, match=r"milestone 'x' has no detector"):
        from_gymnasium("CartPole-v1", milestones=None, graph=TaskGraph.from_spec(
            {"goals": ["x"], "milestones": {"x": {}}}))


def test_make_kwargs_need_an_env_id() -> None:
    with pytest.raises(TypeError, match="gymnasium.make arguments"):
        from_gymnasium(
            gymnasium.make("CartPole-v1"), milestones={"g": lambda e: True},
            graph={"goals": ["g"], "milestones": {"g": {}}}, render_mode="rgb_array",
        )


def test_single_agent_view_is_a_gymnasium_env_sb3_can_train_on() -> None:
    from gymnasium.utils.env_checker import check_env as gym_check_env
    from stable_baselines3 import PPO

    from gyre_ma.envs.adapters import to_gymnasium
    from gyre_ma.envs.minigrid_doorkey import make_env

    view = to_gymnasium(make_env(max_cycles=30))
    gym_check_env(view, skip_render_check=True)
    obs, info = view.reset(seed=0)
    assert view.observation_space.contains(obs) and info["success"] is False
    model = PPO("MlpPolicy", view, n_steps=32, batch_size=16, n_epochs=1, seed=0, device="cpu")
    model.learn(64)
    with pytest.raises(ValueError, match="needs a one-agent env"):
        to_gymnasium(_rps())


def test_the_managers_numeric_view_drops_text_members_of_a_dict_observation():
    """A session-54 user's support desk observed ``Dict(state=Box(19), text=Text(4000))``:
    Gymnasium flattens a ``Text`` to one character code per position, and the 4,000 codes
    swamped the 19 flags that said which request the episode had (held-out 45 % and 22 %,
    against 89–95 % without the text)."""
    from gyre_ma.agents.manager import Featurizer
    from gyre_ma.envs.base import NumericView

    space = spaces.Dict({"state": spaces.Box(0.0, 1.0, (19,), np.float32), "text": spaces.Text(4000)})
    view = NumericView(space)
    assert view.keys == ["state"] and view.flat_space.shape == (19,)
    state = np.linspace(0, 1, 19, dtype=np.float32)
    assert np.array_equal(view({"state": state, "text": "refund please"}), state)
    assert np.array_equal(view.many([{"state": state, "text": "a"}] * 2), np.stack([state, state]))
    library = make_library()
    assert Featurizer(space, library).obs_dim == 19  # the manager's input: the numbers, not the characters


def test_an_old_gym_api_or_another_packages_spaces_are_named_as_such() -> None:
    """A session-56 user's Crafter had gym's old API (reset → the observation alone, step →
    four values, no seed) and, without gym installed, spaces of its own: from_gymnasium said
    only "expected a gymnasium.Env", or nothing until an AttributeError deep inside."""
    spec = {"goals": ["out"], "milestones": {"out": {}}}
    never = {"out": lambda u: False}

    class Old:  # not a gymnasium.Env at all
        observation_space, action_space = spaces.Box(0.0, 1.0, (2,), np.float32), spaces.Discrete(2)

        def reset(self):
            return np.zeros(2, np.float32)

        def step(self, action):
            return np.zeros(2, np.float32), 0.0, True, {}

    with pytest.raises(TypeError, match="Old has reset and step but is not a gymnasium.Env; an old gym env's API"):
        from_gymnasium(Old(), milestones=never, graph=spec)

    class OldApi(gymnasium.Env):  # a gymnasium.Env whose methods keep the old API
        observation_space, action_space = Old.observation_space, Old.action_space

        def reset(self, seed=None, options=None):
            return np.zeros(2, np.float32)  # two numbers: unpacked as (obs, info) they would pass unnoticed

        def step(self, action):
            return np.zeros(2, np.float32), 0.0, True, {}

    env = from_gymnasium(OldApi(), milestones=never, graph=spec)
    with pytest.raises(ValueError, match=r"OldApi.reset returned array\(\[0., 0.\], dtype=float32\); expected "
                                         r"\(observation, info\).*README: Old gym environments"):
        env.reset(seed=0)

    class OldStep(OldApi):
        def reset(self, seed=None, options=None):
            return np.zeros(2, np.float32), {}

    env = from_gymnasium(OldStep(), milestones=never, graph=spec)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"OldStep.step returned .*; expected five values \(observation, reward, "
                                         r"terminated, truncated, info\)"):
        env.step({"agent_0": 0})

    class OwnSpaces(OldStep):
        observation_space = (2,)  # e.g. a namedtuple of shape and dtype

    with pytest.raises(TypeError, match=r"OwnSpaces.observation_space is \(2,\) \(tuple\); expected a "
                                        r"gymnasium.spaces.Space"):
        from_gymnasium(OwnSpaces(), milestones=never, graph=spec)


def test_check_notes_milestones_credited_to_every_agents_call() -> None:
    """A session-57 user's VMAS transport credited ``p0_halfway``, which agent_1 reached, to
    agent_0's running call too: without ``milestone_agent`` every running call is credited,
    one clause of the README said so, and nothing else did."""
    from gyre_ma.cli import _shared_credit

    env = _rps()
    library = _rps_library(env)
    played = [run_episode(env, library, RandomManager(seed), seed=seed) for seed in range(2)]
    assert all(t.success for t in played)  # both agents act at every step: each milestone is both calls'
    note = _shared_credit(played, library, env)
    assert re.match(r"4 milestone verifications were credited to the running calls of several agents at once "
                    r"\(e\.g\. 'first_round' to player_0's \w+ and player_1's \w+\)", note), note
    assert "pass milestone_agent=(unwrapped, milestone) -> agent to from_pettingzoo" in note
    told = from_pettingzoo(rps_v2.env(), milestones={"first_round": lambda e: e.num_moves >= 1,
                                                    "five_rounds": lambda e: e.num_moves >= 5},
                           graph=RPS_GRAPH, milestone_agent=lambda raw, m: None)  # the user's word: shared
    assert _shared_credit([run_episode(told, library, RandomManager(0), seed=0)], library, told) == ""


# ---------------------------------------------------------------------- a step cap per episode
class _Budgeted(gymnasium.Env):
    """An instance per seed, each with its own budget of steps (a routing instance's 1.1 times
    its heuristic route, as a session-59 user's CVRP had)."""

    observation_space = spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.budget, self.t = 3 + (seed or 0) % 5, 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(1, np.float32), 0.0, False, False, {}


def make_budgeted(cap=lambda u: u.budget) -> GyreAdapter:
    return from_gymnasium(_Budgeted(), milestones={"far": lambda u: u.t >= 100},
                          graph={"goals": ["far"], "milestones": {"far": {}}}, max_cycles=cap)


def budgeted_library(env=None) -> OptionLibrary:
    return OptionLibrary("budgeted", TaskGraph.from_spec({"goals": ["far"], "milestones": {"far": {}}}),
                         [Option("walk", lambda ctx: 1, milestone="far"), Option("rest", lambda ctx: 0, done=bool)])


def test_max_cycles_may_be_each_episodes_own_cap_asked_after_its_reset(tmp_path, monkeypatch, capsys) -> None:
    env = make_budgeted()
    for seed in (1, 4):
        traj = run_episode(env, budgeted_library(), FirstEligible(), seed=seed)
        assert traj.length == traj.horizon == 3 + seed and not traj.success  # truncated at its own cap
        assert traj.calls[0].time_fraction == 0.0 and env.max_cycles == 3 + seed
    from gyre_ma.envs.checks import check_env

    check_env(lambda: make_budgeted(lambda u: 40), pettingzoo_tests=False)  # its cap of 5 holds past reset
    assigned = make_budgeted()
    assigned.max_cycles = 2  # as PettingZoo's tests assign one: it holds for every later episode
    assert run_episode(assigned, budgeted_library(), FirstEligible(), seed=4).length == 2
    for cap, expected in ((lambda u: 0, r"max_cycles .* returned 0; expected an int >= 1, the episode's step cap"),
                          (lambda u: u.missing, r"max_cycles .* raised AttributeError")):
        with pytest.raises(UserCodeError, match=expected):
            make_budgeted(cap).reset(seed=0)

    from gyre_ma.cli import main

    monkeypatch.syspath_prepend(str(tmp_path))  # the rollout workers' path: a config naming this module
    (tmp_path / "budgeted_user.py").write_text("from tests.envs.test_adapters import budgeted_library, make_budgeted\n")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    config = tmp_path / "budgeted.yaml"
    config.write_text("name: budgeted\nenv: {id: 'budgeted_user:make_budgeted'}\n"
                      "library: 'budgeted_user:budgeted_library'\nmanager: {kind: random}\n")
    assert main(["eval", str(config), "--episodes", "6", "--json", str(tmp_path / "e.json")]) == 0
    episodes = json.loads((tmp_path / "e.json").read_text())["episodes"]
    assert [e["length"] for e in episodes] == [3 + e["task_seed"] % 5 for e in episodes]  # each its own cap
    assert len({e["length"] for e in episodes}) > 1
    capsys.readouterr()
    (tmp_path / "budgeted_reset.py").write_text(  # a factory that resets: its env's cap is then seed 0's
        "from tests.envs.test_adapters import make_budgeted\n"
        "def make():\n    env = make_budgeted()\n    env.reset(seed=0)\n    return env\n")
    config.write_text(config.read_text().replace("budgeted_user:make_budgeted", "budgeted_reset:make"))
    assert main(["check", str(config), "--play", "4"]) == 0
    assert "played 4 episodes by a random order of the library's options: 18 steps in all" in capsys.readouterr().out


# ---------------------------------------------------------------------- the task's own figures
def make_scored(scores=None) -> GyreAdapter:
    return from_gymnasium(_Budgeted(), milestones={"far": lambda u: u.t >= 100},
                          graph={"goals": ["far"], "milestones": {"far": {}}}, max_cycles=lambda u: u.budget,
                          scores=scores or {"budget": lambda u: u.budget,
                                            "half_of_even": lambda u: None if u.budget % 2 else u.budget / 2})


def test_scores_are_each_episodes_own_figures_reported_by_eval_and_compare(tmp_path, monkeypatch, capsys) -> None:
    """A session-60 user's job shop wanted each schedule's makespan against the best rule's,
    and a session-59 user's routes their length against a heuristic's: figures eval could not
    report, since every episode ran to its own cap and lengths said nothing."""
    env = make_scored()
    first = run_episode(env, budgeted_library(), FirstEligible(), seed=1)
    assert first.scores == {"budget": 4.0, "half_of_even": 2.0}
    assert run_episode(env, budgeted_library(), FirstEligible(), seed=2).scores == {"budget": 5.0}  # None: left out
    for scores, expected in (({"x": lambda u: u.missing}, r"score 'x' \(.*\) raised AttributeError"),
                             ({"x": lambda u: "fast"}, r"score 'x' is 'fast' \(str\); expected a finite number"),
                             ({"x": lambda u: float("nan")},
                              r"score 'x' is 'nan' \(float\); expected a finite number")):
        with pytest.raises((UserCodeError, ValueError), match=expected):
            run_episode(make_scored(scores), budgeted_library(), FirstEligible(), seed=0)
    with pytest.raises(TypeError, match=r"scores must map names to callables"):
        make_scored({"x": 3})

    from gyre_ma.cli import main

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "scored_user.py").write_text("from tests.envs.test_adapters import budgeted_library, make_scored\n")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    config = tmp_path / "scored.yaml"
    config.write_text("name: scored\nenv: {id: 'scored_user:make_scored'}\n"
                      "library: 'scored_user:budgeted_library'\nmanager: {kind: random}\n")
    capsys.readouterr()
    assert main(["eval", str(config), "--episodes", "10", "--json", str(tmp_path / "a.json")]) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    result = json.loads((tmp_path / "a.json").read_text())
    budgets = [3 + e["task_seed"] % 5 for e in result["episodes"]]
    assert [e["scores"]["budget"] for e in result["episodes"]] == budgets
    assert result["score/budget"] == pytest.approx(np.mean(budgets))
    even = [b / 2 for b in budgets if b % 2 == 0]
    assert result["score/half_of_even"] == pytest.approx(np.mean(even))
    assert f"score half_of_even (the env's, mean of the {len(even)} episodes that gave it) " in out
    assert result["score/budget_ci95_low"] <= result["score/budget"] <= result["score/budget_ci95_high"]
    # compare pairs them seed by seed: the same seeds, so the same budgets
    (tmp_path / "b.json").write_text((tmp_path / "a.json").read_text())
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "score budget, a − b: +0 (95 % CI +0 to +0, bootstrap over those seeds)" in out
