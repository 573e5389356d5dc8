"""A multi-agent Gymnasium env, its spaces ``Tuple``\\ s with an entry per agent (Level-Based
Foraging from PyPI, as a session-55 user brought it): ``from_gymnasium(env, agents=n)``. The
user found no way in but writing a PettingZoo wrapper of their own; ``check`` had said only
that the reward ``[0.0, 0]`` was not a number."""

from __future__ import annotations

import re

import gymnasium
import numpy as np
import pytest
from lbforaging.foraging.environment import Action, ForagingEnv

from gyre_ma.agents.baselines import RandomManager
from gyre_ma.cli import main
from gyre_ma.envs.adapters import from_gymnasium
from gyre_ma.envs.checks import EnvCheckError, check_env
from gyre_ma.options.library import OptionLibrary
from gyre_ma.rollout import run_episode

FOODS = 2
GRAPH = {"goals": [f"food_{k}" for k in range(FOODS)],
         "milestones": {f"food_{k}": {"duration": 6, "reward": 1.0} for k in range(FOODS)}}


class Foraging(ForagingEnv):
    """Two level-2 foragers, two level-1 foods on 6×6: either forager loads a food alone.
    Each food keeps the number it had at reset (LBF's observation renumbers them as they go)."""

    def __init__(self) -> None:
        super().__init__(players=2, min_player_level=2, max_player_level=2, min_food_level=1, max_food_level=1,
                         field_size=(6, 6), max_num_food=FOODS, sight=6, max_episode_steps=60, force_coop=False)

    def reset(self, seed=None, options=None):
        for player in self.players:  # LBF places each forager clear of the others' places in the last episode:
            player.position = None   # a reset that depends on the episode before (gyre-ma check's replay caught it)
        out = super().reset(seed=seed, options=options)
        self.foods = [tuple(map(int, p)) for p in zip(*np.nonzero(self.field))]
        return out


def eaten(k: int):
    return lambda lbf: bool(lbf.field[lbf.foods[k]] == 0)


def fetch(k: int):
    """Walk next to food ``k`` and load it (a move that brings the forager nearer, else any legal one)."""
    def policy(ctx):
        lbf = ctx.env.unwrapped
        me = lbf.players[int(ctx.agent.rsplit("_", 1)[1])]
        (r, c), (fr, fc) = me.position, lbf.foods[k]
        if abs(r - fr) + abs(c - fc) == 1:
            return Action.LOAD.value
        legal = [a for a in lbf._valid_actions[me] if a not in (Action.NONE, Action.LOAD)]
        step = {Action.NORTH: (-1, 0), Action.SOUTH: (1, 0), Action.WEST: (0, -1), Action.EAST: (0, 1)}
        nearer = [a for a in legal if abs(r + step[a][0] - fr) + abs(c + step[a][1] - fc) < abs(r - fr) + abs(c - fc)]
        pick = nearer or legal
        return pick[int(ctx.rng.integers(len(pick)))].value if pick else Action.NONE.value
    return policy


def make(**kwargs):
    return from_gymnasium(Foraging(), agents=2, milestones={f"food_{k}": eaten(k) for k in range(FOODS)},
                          graph=GRAPH, **kwargs)


def library(env) -> OptionLibrary:
    lib = OptionLibrary("foraging", env.task_graph())
    for k in range(FOODS):
        lib.option(f"fetch_{k}", milestone=f"food_{k}", max_steps=20)(fetch(k))
    return lib.validate()


def test_each_agent_gets_its_entry_of_the_tuple_spaces_and_the_episode_ends_with_the_env():
    env = make()
    assert env.possible_agents == ["agent_0", "agent_1"]
    assert env.action_space("agent_1") == env.unwrapped.action_space[1]
    assert env.observation_space("agent_0") == env.unwrapped.observation_space[0]
    lib = library(env)
    check_env(make, library=lib)  # PettingZoo's parallel API test among its checks
    for seed in range(4):
        t = run_episode(env, lib, RandomManager(seed), seed=seed)
        assert t.success and set(t.milestone_steps) == {"food_0", "food_1"}
        assert not env.agents  # LBF's done (no food left) ended the episode
        scores = [p.score for p in env.unwrapped.players]  # what LBF paid each forager, entry by entry
        for k, agent in enumerate(env.possible_agents):
            assert sum(c.raw_reward for c in t.calls if c.agent == agent) == pytest.approx(scores[k])
        assert sum(scores) == pytest.approx(1.0)  # LBF's rewards are normalised: the foods' sum is 1
    first = env.reset(seed=0)[0]
    assert (first["agent_0"] == env.unwrapped._make_gym_obs()[0]).all()


def test_a_tuple_env_without_agents_is_named_in_check_and_a_plain_env_with_agents_refused():
    plain = from_gymnasium(Foraging(), milestones={f"food_{k}": eaten(k) for k in range(FOODS)}, graph=GRAPH)
    with pytest.raises(EnvCheckError, match=r"(?s)reward for agent 'agent_0' after step 1 is \[0, 0\], expected a "
                       r"finite number.*adapt it with from_gymnasium\(env, agents=2, \.\.\.\)"):
        check_env(lambda: plain, pettingzoo_tests=False)
    with pytest.raises(ValueError, match=r"from_gymnasium\(agents=2\): CartPole-v1's observation_space is Box.*"
                                         r"expected a Tuple with one entry per agent \(2\)"):
        from_gymnasium(gymnasium.make("CartPole-v1"), agents=2, milestones={}, graph={"goals": ["up"],
                                                                                     "milestones": {"up": {}}})
    with pytest.raises(ValueError, match=r"agents must be a count >= 1 or distinct names, got \['a', 'a'\]"):
        from_gymnasium(Foraging(), agents=["a", "a"], milestones=None, graph=GRAPH)


def exclusive_library(env) -> OptionLibrary:
    lib = OptionLibrary("foraging", env.task_graph())
    for k in range(FOODS):
        lib.option(f"fetch_{k}", milestone=f"food_{k}", max_steps=20, exclusive=True)(fetch(k))
    return lib.validate()


def test_a_dead_end_says_why_an_agent_had_no_option(tmp_path, capsys):
    """Exclusive fetches, two foragers and one food left: the forager without a food had no
    option and the episode was cut after a step; neither check nor train said so, let alone
    why (found writing this file)."""
    env = make()
    lib = exclusive_library(env)
    cut = [t for t in (run_episode(env, lib, RandomManager(s), seed=s) for s in range(6)) if t.dead_ends]
    assert cut and not any(t.success for t in cut)
    assert re.fullmatch(r"agent 'agent_\d' at step \d+: every option it could run is exclusive and run by the other "
                        r"agents \(\{'fetch_\d': 'agent_\d'\}\); for an agent with nothing to do, give the library an "
                        r"option that is always eligible, e\.g\. stay: one step of a no-op, repeatable",
                        cut[0].dead_end_why), cut[0].dead_end_why

    config = tmp_path / "lbf.yaml"
    config.write_text(f"name: lbf\nenv: {{id: '{__name__}:make'}}\nlibrary: '{__name__}:exclusive_library'\n"
                      f"run_root: {tmp_path}\ntrain: {{iterations: 1, episodes_per_iteration: 8}}\n")
    assert main(["check", str(config), "--play", "6"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert re.search(r"note: \d of 6 episodes were cut at a dead end, an agent with no eligible option \(task seed "
                     r"\d, agent 'agent_\d' at step \d+: every option it could run is exclusive", out), out
    assert main(["train", str(config)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert re.search(r"warning: iteration 0: \d of \d+ episodes were cut at a dead end.*\(metric dead_ends; warned "
                     r"once\)", out), out
