"""run_episode: a dead end of the library cuts the episode as a truncation, counted."""

from __future__ import annotations

import numpy as np
import pytest

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.envs.minigrid_doorkey import make_env
from gyre_ma.metrics import episode_metrics
from gyre_ma.options.decision import Choice
from gyre_ma.options.library import OptionLibrary
from gyre_ma.options.option import Option
from gyre_ma.rollout import run_episode, trajectory_from_state, trajectory_to_state

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_a_library_dead_end_cuts_the_episode_instead_of_raising():
    """No always-eligible fallback: the one option open at the start may be taken once, the
    others need milestones it never verifies. Before, the rollout raised and ended training."""
    env = make_env(max_cycles=100)
    library = OptionLibrary("no_fallback", env.task_graph())
    calls = {"n": 0}

    def once(ctx):
        calls["n"] += 1
        return calls["n"] <= 1

    library.add(Option("stall", lambda ctx: 0, milestone="has_key", max_steps=3, initiation=once))
    library.add(Option("open_door", lambda ctx: 5, milestone="door_open", max_steps=3))
    library.add(Option("go_to_goal", lambda ctx: 2, milestone="reached_goal", max_steps=3))
    traj = run_episode(env, library, RandomManager(seed=0), seed=0)
    agent = env.possible_agents[0]
    assert traj.dead_ends == [agent] and not traj.success
    assert traj.length == 3 and len(traj.calls) == 1 and not traj.calls[-1].terminated  # cut, so bootstrapped
    assert episode_metrics([traj], ())["dead_ends"] == 1.0
    assert trajectory_from_state(trajectory_to_state(traj)).dead_ends == [agent]


# ---------------------------------------------------------------------- options that fit real tasks
def _doorkey_library(*options: Option) -> OptionLibrary:
    from gyre_ma.envs import minigrid_doorkey as dk

    library = OptionLibrary("doorkey", dk.task_graph())
    for option in options:
        library.add(option)
    return library


class FirstEligible:
    def decide(self, decisions):
        from gyre_ma.options.decision import Choice

        return [Choice(int(d.mask.nonzero()[0][0])) for d in decisions]


def test_a_dropped_key_can_be_picked_up_again_by_an_option_that_restores_its_milestone():
    """Measurement 6: a latched one-shot get_key was masked for good once the key was dropped."""
    from minigrid.core.actions import Actions

    from gyre_ma.envs import minigrid_doorkey as dk

    env = make_env(max_cycles=120)
    library = _doorkey_library(
        Option("get_key", dk.get_key, milestone="has_key", repeatable=True, max_steps=60),
        Option("drop", lambda ctx: int(Actions.drop), done=lambda ctx: ctx.steps >= 1, max_steps=1),
        Option("open_door", dk.open_door, milestone="door_open", max_steps=60),
        Option("go_to_goal", dk.go_to_goal, milestone="reached_goal", max_steps=60),
    )
    assert library["get_key"].restores

    class DropOnceThenPlan:
        dropped = False

        def decide(self, decisions):
            from gyre_ma.options.decision import Choice

            d = decisions[0]
            if "has_key" in d.achieved and not self.dropped:
                self.dropped = True
                return [Choice(library.index("drop"))]
            order = ("get_key", "open_door", "go_to_goal")
            return [Choice(next(library.index(n) for n in order if d.mask[library.index(n)]))]

    traj = run_episode(env, library, DropOnceThenPlan(), seed=3)
    names = [library[c.option].name for c in traj.calls]
    assert names[:3] == ["get_key", "drop", "get_key"] and traj.success
    # while the key is held, get_key is not eligible; once dropped it is again
    assert not traj.calls[1].mask[library.index("get_key")] and traj.calls[2].mask[library.index("get_key")]


def test_an_option_that_cannot_proceed_ends_without_a_step_and_the_agent_decides_again():
    from gyre_ma.envs import minigrid_doorkey as dk
    from gyre_ma.options.option import CANNOT_PROCEED, Termination

    env = make_env(max_cycles=100)
    library = _doorkey_library(
        Option("blocked", lambda ctx: CANNOT_PROCEED, milestone="has_key", max_steps=60),
        Option("get_key", dk.get_key, milestone="has_key", max_steps=60),
        Option("open_door", dk.open_door, milestone="door_open", max_steps=60),
        Option("go_to_goal", dk.go_to_goal, milestone="reached_goal", max_steps=60),
    )
    traj = run_episode(env, library, FirstEligible(), seed=0)
    first, second = traj.calls[:2]
    assert library[first.option].name == "blocked" and first.termination is Termination.BLOCKED
    assert first.duration == 0 and second.start_step == 0 and not second.mask[first.option]
    assert library[second.option].name == "get_key" and traj.success


def test_a_behaviour_class_gets_a_fresh_instance_per_call_started_before_its_first_action():
    from gyre_ma.envs import minigrid_doorkey as dk
    from gyre_ma.options.option import Behaviour, Termination

    starts = []

    class CountedTurns(Behaviour):
        def start(self, ctx):
            self.turns = 0
            starts.append(self)  # kept alive: a freed instance's id() can be reused

        def act(self, ctx):
            self.turns += 1
            return 0

        def done(self, ctx):
            return self.turns >= 2

    env = make_env(max_cycles=6)
    library = _doorkey_library(Option("turn_twice", CountedTurns, max_steps=10),
                               Option("get_key", dk.get_key, milestone="has_key", max_steps=60),
                               Option("open_door", dk.open_door, milestone="door_open", max_steps=60),
                               Option("go_to_goal", dk.go_to_goal, milestone="reached_goal", max_steps=60))
    traj = run_episode(env, library, FirstEligible(), seed=0)
    assert [c.duration for c in traj.calls] == [2, 2, 2]
    assert all(c.termination is Termination.DONE for c in traj.calls) and len({id(s) for s in starts}) == 3
    with pytest.raises(TypeError, match="without an act"):
        Option("bad", type("NoAct", (Behaviour,), {}), done=lambda ctx: True)


def test_decisions_are_made_one_agent_after_another_each_seeing_what_the_others_run():
    """Measurement 3: a shared manager deciding all agents at once could not break symmetry."""
    from gyre_ma.envs.techtree.options import make_library
    from gyre_ma.envs.techtree_v0 import parallel_env

    seen = []

    class Recording(RandomManager):
        def decide(self, decisions):
            assert len(decisions) == 1
            choices = super().decide(decisions)
            seen.append((decisions[0].agent, decisions[0].others, choices[0].option))
            return choices

    env = parallel_env(n_agents=3, max_cycles=30)
    run_episode(env, make_library(), Recording(0), seed=0)
    (a0, o0, c0), (a1, o1, c1), (a2, o2, _) = seen[:3]
    assert (a0, a1, a2) == tuple(env.possible_agents) and o0 == () and o1 == (c0,) and o2 == (c0, c1)


def test_an_exclusive_option_another_agent_runs_is_not_eligible():
    """A landmark one agent heads for is closed to the others (those deciding later in the
    same step included), and opens again when that call ends; a plain option stays open."""
    from gyre_ma.envs.coverage.options import make_library
    from gyre_ma.envs.coverage_v0 import parallel_env

    env = parallel_env()
    library = make_library(env=env)
    go_to = [library.index(f"go_to_{k}") for k in range(3)]
    stay = library.index("stay")
    seen = []

    class FirstGoTo(RandomManager):
        def decide(self, decisions):
            d = decisions[0]
            seen.append((d.agent, d.others, tuple(bool(d.mask[o]) for o in go_to), bool(d.mask[stay])))
            open_ = [o for o in go_to if d.mask[o]]
            return [Choice(open_[0] if open_ else stay)]

    run_episode(env, library, FirstGoTo(0), seed=3)
    assert seen[:3] == [
        ("agent_0", (), (True, True, True), True),
        ("agent_1", (go_to[0],), (False, True, True), True),
        ("agent_2", (go_to[0], go_to[1]), (False, False, True), True),
    ]
    assert not library[stay].exclusive and all(library[o].exclusive for o in go_to)
    again = OptionLibrary.from_spec(library.to_spec())
    assert [o.exclusive for o in again] == [o.exclusive for o in library]
    for bad in ("yes", 0, -1, 1.5):
        with pytest.raises(ValueError, match=r"exclusive must be true, false or how many agents may run it at once"):
            Option("bad", lambda ctx: 0, milestone=None, done=lambda ctx: True, exclusive=bad)


def test_an_option_exclusive_to_k_agents_is_open_until_k_others_run_it():
    """A station with two units to fetch: two robots may head for it at once, a third not
    (exclusivity was one agent at a time, so a user's warehouse robots waited)."""
    from gyre_ma.envs.coverage.options import make_library
    from gyre_ma.envs.coverage_v0 import parallel_env

    env = parallel_env(n_agents=4, size=9)
    library = make_library(env=env)
    stay = library.index("stay")
    shared = OptionLibrary.from_spec(library.to_spec() | {"options": [
        o | {"exclusive": 2} if o["name"] == "stay" else o for o in library.to_spec()["options"]]})
    assert shared[stay].exclusive == 2 and shared[stay].capacity == 2 and library[stay].capacity is None
    seen = []

    class AllStay(RandomManager):
        def decide(self, decisions):
            d = decisions[0]
            seen.append((d.agent, bool(d.mask[stay])))
            return [Choice(stay if d.mask[stay] else int(np.flatnonzero(d.mask)[0]))]

    run_episode(env, shared, AllStay(0), seed=3)
    assert seen[:4] == [("agent_0", True), ("agent_1", True), ("agent_2", False), ("agent_3", False)]
    assert OptionLibrary.from_spec(shared.to_spec())[stay].exclusive == 2  # dumped and read back


def test_manager_hooks_run_at_episode_start_and_at_each_option_end():
    from gyre_ma.envs import minigrid_doorkey as dk

    events = []

    class Hooked(FirstEligible):
        def episode_start(self, env, seed):
            events.append(("start", seed))

        def option_end(self, call, env):
            events.append(("end", call.option, call.duration))

    env = make_env(max_cycles=100)
    traj = run_episode(env, dk.make_library(), Hooked(), seed=4)
    assert events[0] == ("start", 4)
    assert events[1:] == [("end", c.option, c.duration) for c in traj.calls]


def test_a_side_effect_milestone_needs_no_option_of_its_own():
    """Measurement 6: one toggle that unlocks and opens was rejected as 'unreachable'."""
    from gyre_ma.options.graph import TaskGraph

    spec = {"goals": ["open"], "milestones": {"unlocked": {}, "open": {"requires": ["unlocked"]}}}
    library = OptionLibrary("door", TaskGraph.from_spec(spec))
    library.add(Option("toggle", lambda ctx: 0, milestone="unlocked"))
    with pytest.raises(ValueError, match="declare 'side_effect: true'"):
        library.validate()
    spec["milestones"]["open"]["side_effect"] = True
    library = OptionLibrary("door", TaskGraph.from_spec(spec))
    library.add(Option("toggle", lambda ctx: 0, milestone="unlocked"))
    assert library.validate() is library
    assert TaskGraph.from_spec(library.graph.to_spec()).milestone("open").side_effect
    with pytest.raises(ValueError, match="milestones.open.side_effect must be true or false"):
        TaskGraph.from_spec({"goals": ["open"], "milestones": {"open": {"side_effect": "yes"}}})


def test_each_decision_says_how_its_agents_previous_call_ended():
    from gyre_ma.envs.registry import make_env as make_registered
    from gyre_ma.envs.techtree.options import make_library

    env = make_registered("techtree_v0", size=16, goal="make_stone_pickaxe", max_cycles=300)
    library = make_library(env=env)
    seen = []

    class Recording(RandomManager):
        def decide(self, decisions):
            seen.extend(decisions)
            return super().decide(decisions)

    traj = run_episode(env, library, Recording(0), seed=3)
    for agent in env.possible_agents:
        calls = [c for c in traj.calls if c.agent == agent]
        decisions = [d for d in seen if d.agent == agent]
        assert len(decisions) == len(calls) > 2
        assert decisions[0].last_termination is None
        assert [d.last_termination for d in decisions[1:]] == [c.termination for c in calls[:-1]]


def test_a_pickled_trajectory_keeps_every_call_and_ships_its_arrays_as_columns():
    """Ray ships trajectories from actors to the driver by pickle: every call comes back
    equal, field by field and type by type, with one observation and one mask array per
    trajectory (stacked) instead of two arrays per call; calls whose observations differ
    in shape fall back to a list."""
    import pickle

    import numpy as np

    from gyre_ma.envs.registry import make_env as make_registered
    from gyre_ma.envs.registry import make_library

    env = make_registered("techtree_v0", max_cycles=300)
    traj = run_episode(env, make_library("techtree_v0", env), RandomManager(seed=3), seed=3)
    assert len(traj.calls) > 5
    back = pickle.loads(pickle.dumps(traj))
    assert type(back) is type(traj) and {k: v for k, v in vars(back).items() if k != "calls"} == {
        k: v for k, v in vars(traj).items() if k != "calls"}
    for got, want in zip(back.calls, traj.calls, strict=True):
        assert vars(got).keys() == vars(want).keys()
        for name, value in vars(want).items():
            assert type(vars(got)[name]) is type(value), name
            if isinstance(value, np.ndarray):
                assert vars(got)[name].dtype == value.dtype and np.array_equal(vars(got)[name], value), name
            else:
                assert vars(got)[name] == value, name
    for field in ("observation", "mask"):  # each a row of one stacked array, not an array of its own
        stacked = getattr(back.calls[0], field).base
        assert isinstance(stacked, np.ndarray) and stacked.shape[0] == len(back.calls), field
        assert all(getattr(c, field).base is stacked for c in back.calls), field

    traj.calls[1].observation = {"text": "a dict observation"}
    mixed = pickle.loads(pickle.dumps(traj))
    assert mixed.calls[1].observation == {"text": "a dict observation"}
    assert np.array_equal(mixed.calls[0].observation, traj.calls[0].observation)


def test_failed_episodes_are_told_apart_by_how_they_ended():
    """A new user's Crafter agent died at night and the env ended the episode; eval showed
    0 agents lost and 0 % dead ends, and nothing else about why 35 % of episodes failed."""
    from gyre_ma.envs.registry import make_env as make_registered
    from gyre_ma.metrics import episode_metrics

    env = make_registered("coverage_v0", max_cycles=6)
    library = OptionLibrary("idle", env.task_graph())
    for name in env.task_graph().names:
        library.add(Option(f"go_{name}", lambda ctx: 0, milestone=name, max_steps=2))
    capped = run_episode(env, library, RandomManager(seed=0), seed=0)  # standing still: the cap cuts it
    assert not capped.success and capped.length == capped.horizon == 6

    class Dies:  # the env itself ends the episode at step 2: every agent terminated
        def __init__(self, inner):
            self.inner, self.steps = inner, 0

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def reset(self, seed=None, options=None):
            self.steps = 0
            return self.inner.reset(seed=seed, options=options)

        def step(self, actions):
            observations, rewards, terms, truncs, infos = self.inner.step(actions)
            self.steps += 1
            if self.steps >= 2:
                terms = dict.fromkeys(terms, True)
                self.inner.agents = []
            return observations, rewards, terms, truncs, infos

    died = run_episode(Dies(make_registered("coverage_v0", max_cycles=6)), library, RandomManager(seed=0), seed=0)
    assert not died.success and died.length == 2
    metrics = episode_metrics([capped, died, died, capped, died], ())
    assert metrics["failed_env_ended"] == 0.6 and metrics["failed_step_cap"] == 0.4 and metrics["dead_ends"] == 0
