"""techtree_v0: PettingZoo conformance, rules, verifiers, options, oracle and baselines."""

from __future__ import annotations

import time
from types import SimpleNamespace

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
from gyre_ma.envs import techtree_v0
from gyre_ma.envs.base import GyreEnv
from gyre_ma.envs.techtree import options as tt_options
from gyre_ma.envs.techtree import techtree as tt
from gyre_ma.envs.techtree.options import make_library
from gyre_ma.envs.techtree.oracle import OracleManager
from gyre_ma.options.library import OptionLibrary, resolve
from gyre_ma.options.option import OptionContext, Termination
from gyre_ma.rollout import run_episode

N_SEEDS = 100


# ---------------------------------------------------------------------------- helpers
def blank(**kwargs) -> tt.TechTreeEnv:
    """An env on an all-grass map: agent i at (5 + 2i, 5) facing right, empty inventory."""
    env = tt.TechTreeEnv(**kwargs)
    env.reset(seed=0)
    env.grid[:] = tt.GRASS
    for i in range(env.config.n_agents):
        env.pos[i] = [5 + 2 * i, 5]
        env.facing[i] = 1
    return env


def act(env: tt.TechTreeEnv, action: int, times: int = 1, agent: str = "agent_0"):
    out = None
    for _ in range(times):
        out = env.step({a: (action if a == agent else tt.NOOP) for a in env.agents})
    return out


def inv(env: tt.TechTreeEnv, **items: int) -> list[int]:
    inventory = env.inventory(0)
    for name, n in items.items():
        inventory[tt.ITEM_INDEX[name]] = n
    return inventory


# ---------------------------------------------------------------------------- PettingZoo
def test_pettingzoo_api():
    api_test(techtree_v0.env(), num_cycles=1000)


def test_pettingzoo_parallel_api():
    parallel_api_test(techtree_v0.parallel_env(), num_cycles=1000)


def test_pettingzoo_seed():
    seed_test(techtree_v0.env)
    parallel_seed_test(techtree_v0.parallel_env)


def test_pettingzoo_max_cycles():
    max_cycles_test(techtree_v0)


def test_entry_points_and_metadata():
    par = techtree_v0.parallel_env()
    assert isinstance(par, tt.TechTreeEnv)
    assert isinstance(par, GyreEnv)
    assert par.metadata["name"] == "techtree_v0"
    assert par.metadata["is_parallelizable"] is True
    assert set(par.metadata["render_modes"]) == {"ansi", "rgb_array"}
    aec = techtree_v0.raw_env()
    assert aec.unwrapped.metadata["name"] == "techtree_v0"
    assert techtree_v0.env().unwrapped.metadata["name"] == "techtree_v0"


@pytest.mark.parametrize("kwargs", [{}, {"n_agents": 1}, {"n_agents": 8, "size": 48},
                                    {"shared_inventory": False, "view": 7}])
def test_observations_and_state_lie_in_their_spaces(kwargs):
    env = techtree_v0.parallel_env(**kwargs)
    obs, infos = env.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(300):
        for a, o in obs.items():
            assert o.dtype == np.uint8 and env.observation_space(a).contains(o), a
        state = env.state()
        assert state.dtype == np.uint8 and env.state_space.contains(state)
        if not env.agents:
            break
        obs, *_ = env.step({a: int(rng.integers(len(tt.ACTIONS))) for a in env.agents})


def test_observation_layout():
    env = blank()
    inv(env, wood=300)
    obs = act(env, tt.NOOP)[0]["agent_0"]
    lay = env.obs_layout
    view = obs[lay["view"]].reshape(9, 9)
    assert view[4, 4] == tt.GRASS and view[6, 4] == tt.AGENT  # agent_1 two rows below
    assert obs[lay["inventory"]][tt.WOOD] == 255  # clipped
    assert list(obs[lay["vitals"]]) == [9, 9, 9, 9]
    assert list(obs[lay["position"]]) == [5, 5]


def test_render_modes():
    env = techtree_v0.parallel_env(render_mode="ansi")
    env.reset(seed=1)
    text = env.render()
    assert isinstance(text, str) and "agent_0" in text and len(text.splitlines()) > 32
    env = techtree_v0.parallel_env(render_mode="rgb_array")
    env.reset(seed=1)
    img = env.render()
    assert img.shape == (32 * 8, 32 * 8, 3) and img.dtype == np.uint8


def test_config_errors_name_the_key():
    with pytest.raises(ValueError, match="unknown option.*'n_agent'"):
        techtree_v0.parallel_env(n_agent=3)
    with pytest.raises(ValueError, match="n_agents"):
        techtree_v0.parallel_env(n_agents=9)
    with pytest.raises(ValueError, match="goal"):
        techtree_v0.parallel_env(goal="win")
    with pytest.raises(ValueError, match="costs.*'spaceship'"):
        techtree_v0.parallel_env(costs={"spaceship": {"wood": 1}})
    with pytest.raises(ValueError, match="render_mode"):
        techtree_v0.parallel_env(render_mode="human")


def test_maps_are_seeded_and_playable():
    a, b = techtree_v0.parallel_env(), techtree_v0.parallel_env()
    a.reset(seed=7)
    b.reset(seed=7)
    assert np.array_equal(a.grid, b.grid)
    b.reset(seed=8)
    assert not np.array_equal(a.grid, b.grid)
    for seed in range(20):
        a.reset(seed=seed)
        assert (a.grid == tt.IRON).sum() == a.config.n_iron
        assert (a.grid == tt.DIAMOND).sum() == a.config.n_diamond
        assert (a.grid == tt.WATER).any() and (a.grid == tt.BUSH).sum() == a.config.n_bushes


# ---------------------------------------------------------------------------- rules
@pytest.mark.parametrize(
    "tile, tool, item",
    [(tt.STONE, "wood_pickaxe", "stone"), (tt.COAL, "wood_pickaxe", "coal"),
     (tt.IRON, "stone_pickaxe", "iron"), (tt.DIAMOND, "iron_pickaxe", "diamond")],
)
def test_mining_needs_the_tool_and_its_hits(tile, tool, item):
    env = blank()
    env.grid[5, 6] = tile
    hits = env.hits_by_tile[tile]
    act(env, tt.DO, hits + 2)
    assert env.grid[5, 6] == tile and env.inventory(0)[tt.ITEM_INDEX[item]] == 0
    inv(env, **{tool: 1})
    act(env, tt.DO, hits - 1)
    assert env.grid[5, 6] == tile
    act(env, tt.DO)
    assert env.grid[5, 6] == tt.PATH
    assert env.inventory(0)[tt.ITEM_INDEX[item]] == 1
    assert f"collect_{item}" in env.verified_milestones()


def test_trees_water_and_bushes():
    env = blank(bush_regrow=5)
    env.grid[5, 6] = tt.TREE
    act(env, tt.DO, env.hits_by_tile[tt.TREE])
    assert env.grid[5, 6] == tt.GRASS and env.inventory(0)[tt.WOOD] == 1
    env.grid[5, 6] = tt.WATER
    act(env, tt.DO, 3)
    assert env.grid[5, 6] == tt.WATER and env.inventory(0)[tt.WATER_I] == 3
    env.grid[5, 6] = tt.BUSH
    act(env, tt.DO, 2)
    assert env.grid[5, 6] == tt.BUSH_EMPTY and env.inventory(0)[tt.FOOD] == 1
    act(env, tt.NOOP, 5)
    assert env.grid[5, 6] == tt.BUSH


def test_moving_is_blocked_by_obstacles_and_turns():
    env = blank()
    env.grid[5, 6] = tt.TREE
    act(env, tt.RIGHT)
    assert env.pos[0] == [5, 5] and env.facing[0] == 1
    act(env, tt.UP)
    assert env.pos[0] == [4, 5] and env.facing[0] == 2


def test_table_costs_wood():
    env = blank()
    cost = env.config.costs["table"]["wood"]
    inv(env, wood=cost - 1)
    act(env, tt.PLACE_TABLE)
    assert not (env.grid == tt.TABLE).any()
    inv(env, wood=cost)
    act(env, tt.PLACE_TABLE)
    assert env.grid[5, 6] == tt.TABLE  # the facing tile
    assert env.inventory(0)[tt.WOOD] == 0
    assert "place_table" in env.verified_milestones()


def test_crafting_needs_a_table_nearby():
    env = blank()
    cost = env.config.costs["wood_pickaxe"]["wood"]
    inv(env, wood=cost)
    env.grid[5, 5 + env.config.nearby + 1] = tt.TABLE
    act(env, tt.MAKE_WOOD_PICKAXE)
    assert env.inventory(0)[tt.WOOD_PICKAXE] == 0
    act(env, tt.RIGHT)
    act(env, tt.MAKE_WOOD_PICKAXE)
    assert env.inventory(0)[tt.WOOD_PICKAXE] == 1 and env.inventory(0)[tt.WOOD] == 0
    assert "make_wood_pickaxe" in env.verified_milestones()


def test_furnace_needs_a_table_and_iron_tools_need_both():
    env = blank()
    inv(env, stone=50, coal=10, wood=10, iron=4)
    act(env, tt.PLACE_FURNACE)
    assert not (env.grid == tt.FURNACE).any()
    env.grid[4, 4] = tt.TABLE
    act(env, tt.MAKE_IRON_PICKAXE)
    assert env.inventory(0)[tt.IRON_PICKAXE] == 0  # no furnace yet
    act(env, tt.PLACE_FURNACE)
    assert env.grid[5, 6] == tt.FURNACE
    act(env, tt.MAKE_IRON_PICKAXE)
    cost = env.config.costs["iron_pickaxe"]
    assert env.inventory(0)[tt.IRON_PICKAXE] == 1
    assert env.inventory(0)[tt.IRON_I] == 4 - cost["iron"]
    assert env.inventory(0)[tt.COAL_I] == 10 - env.config.costs["furnace"]["coal"] - cost["coal"]


def test_scarce_iron_makes_the_sword_a_trap():
    cfg = tt.TechTreeConfig()
    pick, sword = cfg.costs["iron_pickaxe"]["iron"], cfg.costs["iron_sword"]["iron"]
    assert pick <= cfg.n_iron < pick + sword
    env = blank()
    inv(env, wood=10, coal=10, iron=cfg.n_iron)
    env.grid[4, 4], env.grid[6, 4] = tt.TABLE, tt.FURNACE
    act(env, tt.MAKE_IRON_SWORD)
    act(env, tt.MAKE_IRON_PICKAXE)
    assert env.inventory(0)[tt.IRON_SWORD] == 1 and env.inventory(0)[tt.IRON_PICKAXE] == 0


def test_shared_and_separate_inventories():
    env = blank()
    env.grid[7, 6] = tt.TREE
    act(env, tt.DO, env.hits_by_tile[tt.TREE], agent="agent_1")
    assert env.inventory(0)[tt.WOOD] == 1 and env.inventory(0) is env.inventory(1)
    env = blank(shared_inventory=False)
    env.grid[7, 6] = tt.TREE
    act(env, tt.DO, env.hits_by_tile[tt.TREE], agent="agent_1")
    assert env.inventory(0)[tt.WOOD] == 0 and env.inventory(1)[tt.WOOD] == 1


# ---------------------------------------------------------------------------- vitals
def test_vitals_drain_and_are_restored():
    env = blank(food_decay=4, drink_decay=5, energy_decay=6, sleep_steps=2)
    act(env, tt.NOOP, 12)
    assert env.vitals[0][1:] == [6, 7, 7]
    inv(env, food=1, water=1)
    act(env, tt.EAT)
    act(env, tt.DRINK)
    assert env.vitals[0][tt.FOOD_V] == 9 and env.vitals[0][tt.DRINK_V] == 9
    assert {"eat_food", "drink_water"} <= env.verified_milestones()
    assert env.inventory(0)[tt.FOOD] == 0 and env.inventory(0)[tt.WATER_I] == 0
    act(env, tt.EAT)  # nothing left to eat: no effect
    energy = env.vitals[0][tt.ENERGY_V]
    act(env, tt.SLEEP, 4)
    assert env.vitals[0][tt.ENERGY_V] == min(9, energy + 2)


def test_zero_vitals_hurt_and_death_terminates_the_agent():
    env = blank(hurt_period=3, n_agents=2)
    env.vitals[0][tt.DRINK_V] = 0
    act(env, tt.NOOP, 3)
    assert env.vitals[0][tt.HEALTH] == 8 and env.vitals[1][tt.HEALTH] == 9
    env.vitals[0][tt.HEALTH] = 1
    for _ in range(3):
        obs, rewards, terms, truncs, _ = act(env, tt.NOOP)
    assert terms == {"agent_0": True, "agent_1": False} and not any(truncs.values())
    assert env.agents == ["agent_1"] and not env.alive[0]
    env.vitals[1][tt.FOOD_V] = 0
    env.vitals[1][tt.HEALTH] = 1
    for _ in range(3):
        act(env, tt.NOOP, agent="agent_1")
    assert env.agents == []


def test_health_recovers_when_fed():
    env = blank(heal_period=2)
    env.vitals[0][tt.HEALTH] = 5
    act(env, tt.NOOP, 4)
    assert env.vitals[0][tt.HEALTH] == 7


# ---------------------------------------------------------------------------- milestones, rewards
def test_task_graph():
    env = techtree_v0.parallel_env()
    graph = env.task_graph()
    assert graph.goals == ("collect_diamond",)
    assert len(graph) >= 12 and set(graph.names) == set(tt.MILESTONES)
    for name in graph:
        m = graph.milestone(name)
        assert m.verifier == f"gyre_ma.envs.techtree.techtree:verify_{name}"
        assert callable(resolve(m.verifier, name)) and m.duration > 0 and m.description
    _, path = graph.critical_path()
    assert path[0] == "collect_wood" and path[-1] == "collect_diamond"
    assert {"place_table", "make_stone_pickaxe", "make_iron_pickaxe"} <= set(path)
    assert techtree_v0.parallel_env(goal="place_furnace").task_graph().goals == ("place_furnace",)


def test_verifiers_read_state_counters_only():
    for name in tt.MILESTONES:
        verifier = resolve(tt.task_graph().milestone(name).verifier, name)
        kind, key = tt._MILESTONE_EVENTS[name]
        stats = {k: dict.fromkeys(v, 0) for k, v in tt.TechTreeEnv().stats.items()}
        fake = SimpleNamespace(stats=stats)
        assert verifier(fake) is False
        stats[kind][key] = 2
        assert verifier(fake) is True and verifier(fake) is True


def test_verified_milestones_match_verifiers_and_are_monotone():
    env = techtree_v0.parallel_env()
    library = make_library()
    verifiers = {m: resolve(env.task_graph().milestone(m).verifier, m) for m in tt.MILESTONES}
    step = env.step
    seen: list[frozenset[str]] = []

    def checked_step(actions):
        out = step(actions)
        verified = env.verified_milestones()
        assert verified == frozenset(m for m, f in verifiers.items() if f(env))
        assert not seen or seen[-1] <= verified
        seen.append(verified)
        return out

    env.step = checked_step
    traj = run_episode(env, library, OracleManager(library), seed=5)
    assert traj.success and len(seen) == traj.length
    assert seen[-1] >= {"collect_diamond", "make_iron_pickaxe", "place_furnace"}
    assert traj.horizon == env.max_cycles  # the cap the episode ran under, for the outcome's length term


def test_a_trajectory_records_the_step_cap_it_ran_under():
    env = tt.parallel_env()
    library = make_library(env=env)
    short = run_episode(env, library, OracleManager(library), seed=5, max_steps=40)
    assert (short.horizon, short.length) == (40, 40)
    assert run_episode(env, library, OracleManager(library), seed=5, max_steps=10**6).horizon == env.max_cycles


def test_rewards_sparse_by_default():
    env = blank(goal="collect_wood")
    env.grid[5, 6] = tt.TREE
    _, rewards, terms, _, _ = act(env, tt.DO, env.hits_by_tile[tt.TREE] - 1)
    assert rewards == {"agent_0": 0.0, "agent_1": 0.0}
    _, rewards, terms, truncs, _ = act(env, tt.DO)
    assert rewards == {"agent_0": 1.0, "agent_1": 1.0}
    assert all(terms.values()) and not any(truncs.values()) and env.agents == []


def test_milestone_rewards_use_graph_weights():
    env = blank(milestone_rewards=True)
    env.grid[5, 6] = tt.TREE
    _, rewards, terms, _, _ = act(env, tt.DO, env.hits_by_tile[tt.TREE])
    weight = env.task_graph().milestone("collect_wood").reward
    assert rewards["agent_1"] == pytest.approx(weight) and not any(terms.values())
    env.grid[5, 6] = tt.TREE
    _, rewards, _, _, _ = act(env, tt.DO, env.hits_by_tile[tt.TREE])
    assert rewards["agent_0"] == 0.0  # first achievement only
    assert blank().step({"agent_0": tt.NOOP, "agent_1": tt.NOOP})[1]["agent_0"] == 0.0


def test_truncation_at_max_cycles():
    env = techtree_v0.parallel_env(max_cycles=5, n_agents=1)
    env.reset(seed=0)
    for _ in range(4):
        _, _, terms, truncs, _ = env.step({"agent_0": tt.NOOP})
        assert not truncs["agent_0"]
    _, _, terms, truncs, _ = env.step({"agent_0": tt.NOOP})
    assert truncs == {"agent_0": True} and terms == {"agent_0": False} and env.agents == []
    assert techtree_v0.parallel_env().max_cycles == 3000
    assert techtree_v0.parallel_env(n_agents=1).max_cycles == 4500
    assert techtree_v0.parallel_env(max_cycles=10_000).max_cycles == 10_000


# ---------------------------------------------------------------------------- option library
def test_library_covers_every_milestone_and_upkeep(tmp_path):
    library = make_library()
    covered = {o.milestone for o in library if o.milestone}
    assert covered == set(tt.MILESTONES)
    assert {"eat", "drink", "sleep", "wait", "gather_wood", "gather_iron"} <= set(library.names)
    assert all(library[n].repeatable for n in ("gather_wood", "gather_stone", "gather_iron"))
    env = techtree_v0.parallel_env()
    obs, _ = env.reset(seed=0)
    ctx = OptionContext("agent_0", env, obs["agent_0"], frozenset())
    mask = library.mask(frozenset(), ctx)
    assert mask[library.index("wait")] and mask[library.index("gather_wood")]
    assert not mask[library.index("make_iron_pickaxe")]
    library.dump(tmp_path / "techtree.yaml")
    loaded = OptionLibrary.load(tmp_path / "techtree.yaml")
    assert loaded.names == library.names
    assert loaded["gather_iron"].policy is library["gather_iron"].policy


def _drive_to(env, library, seed: int, milestones: tuple[str, ...]) -> None:
    """Replay the oracle on ``seed`` up to the step where ``milestones`` are all verified."""
    full = run_episode(env, library, OracleManager(library), seed=seed)
    stop = max((full.milestone_steps[m] for m in milestones), default=0)
    if stop:
        run_episode(env, library, OracleManager(library), seed=seed, max_steps=stop)
    else:
        env.reset(seed=seed)
    assert set(milestones) <= env.verified_milestones()


def _run_option(env, library, name: str, agent: str = "agent_0") -> Termination:
    """Run one option alone (teammates idle, vitals held up) until it terminates."""
    option = library[name]
    i = env.agent_index[agent]
    ctx = OptionContext(agent, env, None, env.verified_milestones())
    assert library.mask(env.verified_milestones(), ctx)[library.index(name)], name
    while True:
        env.vitals[i][1:] = [env.config.max_vital] * 3
        action = option.policy(ctx)
        env.step({a: (action if a == agent else tt.NOOP) for a in env.agents})
        ctx.steps += 1
        ctx.achieved = env.verified_milestones()
        reason = option.termination(ctx, ctx.achieved)
        if reason is not None:
            return reason


ONE_SHOT = [
    "place_table", "make_wood_pickaxe", "make_wood_sword", "place_furnace", "make_stone_pickaxe",
    "make_stone_sword", "make_iron_pickaxe", "make_iron_sword", "mine_diamond",
]
REPEATABLE = ["gather_wood", "gather_stone", "gather_coal", "gather_iron", "gather_food",
              "gather_water"]


@pytest.mark.parametrize("name", ONE_SHOT + REPEATABLE)
def test_options_are_competent_once_their_prerequisites_hold(name):
    env = techtree_v0.parallel_env()
    library = make_library()
    milestone = library[name].milestone
    _drive_to(env, library, seed=1, milestones=library.graph.milestone(milestone).requires)
    before = env.stats["collected"].copy()
    reason = _run_option(env, library, name)
    if name in ONE_SHOT:
        assert reason is Termination.MILESTONE and milestone in env.verified_milestones()
    else:
        assert reason is Termination.DONE
        assert sum(env.stats["collected"].values()) > sum(before.values())


@pytest.mark.parametrize("name, vital, item", [("eat", tt.FOOD_V, "food"),
                                                ("drink", tt.DRINK_V, "water")])
def test_upkeep_options_fetch_and_restore(name, vital, item):
    env = techtree_v0.parallel_env()
    library = make_library()
    source = "collect_food" if item == "food" else "collect_drink"
    _drive_to(env, library, seed=2, milestones=(source,))
    env.inventory(0)[tt.ITEM_INDEX[item]] = 0
    option = library[name]
    ctx = OptionContext("agent_0", env, None, env.verified_milestones())
    env.vitals[0][:] = [env.config.max_vital] * len(tt.VITALS)  # no other vital interrupts it
    env.vitals[0][vital] = 1
    for _ in range(option.max_steps):
        env.step({a: (option.policy(ctx) if a == "agent_0" else tt.NOOP) for a in env.agents})
        ctx.steps += 1
        reason = option.termination(ctx, env.verified_milestones())
        if reason is not None:
            break
    assert reason is Termination.DONE and env.vitals[0][vital] >= 6


def test_jobs_yield_when_a_vital_falls_into_danger_and_upkeep_is_spared():
    env = techtree_v0.parallel_env()
    library = make_library()
    env.reset(seed=0)

    def run(name, vital, level, own=None):
        env.vitals[0][:] = [env.config.max_vital] * len(tt.VITALS)
        if own is not None:  # the vital an upkeep option restores starts low, so it works
            env.vitals[0][own] = 3
        option = library[name]
        ctx = OptionContext("agent_0", env, None, env.verified_milestones())
        env.step({a: (option.policy(ctx) if a == "agent_0" else tt.NOOP) for a in env.agents})
        ctx.steps += 1
        first = option.termination(ctx, env.verified_milestones())
        env.vitals[0][vital] = level
        return first, option.termination(ctx, env.verified_milestones())

    assert run("gather_wood", tt.FOOD_V, tt_options.DANGER) == (None, Termination.FAILURE)
    assert run("gather_wood", tt.FOOD_V, tt_options.DANGER + 1) == (None, None)
    assert run("sleep", tt.DRINK_V, 0, own=tt.ENERGY_V) == (None, Termination.FAILURE)
    assert run("eat", tt.FOOD_V, 0, own=tt.FOOD_V) == (None, None)  # its own vital: it keeps at it
    plain = make_library(yield_in_danger=False)["gather_wood"]
    ctx = OptionContext("agent_0", env, None, env.verified_milestones())
    plain.policy(ctx)
    env.vitals[0][tt.FOOD_V] = 0
    assert plain.termination(ctx, env.verified_milestones()) is None


def test_jobs_cannot_start_while_a_vital_is_in_danger_but_upkeep_can():
    env = techtree_v0.parallel_env()
    env.reset(seed=0)
    for tool in ("wood_pickaxe", "stone_pickaxe", "iron_pickaxe"):  # the jobs' own initiations hold
        env.inventory(0)[tt.ITEM_INDEX[tool]] = 1
    # all but two one-shot milestones: their options' prerequisites hold and they are not done
    everything = frozenset(make_library().graph.names) - {"place_table", "collect_diamond"}
    jobs = ["gather_wood", "gather_stone", "gather_iron", "place_table", "mine_diamond"]
    upkeep = ["eat", "drink", "gather_food", "gather_water", "wait"]

    def eligible(library, vital, level):
        env.vitals[0][:] = [env.config.max_vital] * len(tt.VITALS)
        env.vitals[0][vital] = level
        ctx = OptionContext("agent_0", env, None, everything)
        mask = library.mask(everything, ctx)
        return {name: bool(mask[library.index(name)]) for name in jobs + upkeep}

    gated, ungated = make_library(), make_library(jobs_in_danger=True)
    assert all(eligible(gated, tt.FOOD_V, tt_options.DANGER + 1)[j] for j in jobs)
    for vital in (tt.FOOD_V, tt.DRINK_V, tt.ENERGY_V):
        in_danger = eligible(gated, vital, tt_options.DANGER)
        assert not any(in_danger[j] for j in jobs), vital
        assert in_danger["wait"] and in_danger["gather_food"] and in_danger["gather_water"]
    assert eligible(gated, tt.FOOD_V, 0)["eat"] and eligible(gated, tt.DRINK_V, 0)["drink"]
    assert all(eligible(ungated, tt.DRINK_V, 0)[j] for j in jobs)  # the old library: the manager's call


def test_sleep_option_restores_energy():
    env = blank()
    library = make_library()
    env.vitals[0][tt.ENERGY_V] = 2
    ctx = OptionContext("agent_0", env, None, frozenset())
    while library["sleep"].termination(ctx, frozenset()) is None:
        act(env, library["sleep"].policy(ctx))
        ctx.steps += 1
    assert env.vitals[0][tt.ENERGY_V] == 9 and ctx.steps == 7 * env.config.sleep_steps


# ---------------------------------------------------------------------------- managers
@pytest.fixture(scope="module")
def baselines():
    env = techtree_v0.parallel_env()
    library = make_library()
    oracle = [run_episode(env, library, OracleManager(library), seed=s) for s in range(N_SEEDS)]
    rand = [run_episode(env, library, RandomManager(seed=s), seed=s) for s in range(N_SEEDS)]
    return oracle, rand


def test_oracle_succeeds(baselines):
    oracle, _ = baselines
    rate = np.mean([t.success for t in oracle])
    assert rate >= 0.95, f"oracle success {rate:.2f} over {N_SEEDS} seeds"


def test_random_manager_mostly_fails(baselines):
    _, rand = baselines
    rate = np.mean([t.success for t in rand])
    assert rate <= 0.30, f"random success {rate:.2f} over {N_SEEDS} seeds"


def test_oracle_path_is_long(baselines):
    oracle, _ = baselines
    lengths = np.array([t.length for t in oracle if t.success])
    assert lengths.mean() >= 1000, lengths.mean()
    assert (lengths >= 1000).mean() >= 0.95, np.sort(lengths)[:10]


def test_oracle_never_makes_the_iron_sword(baselines):
    oracle, _ = baselines
    library = make_library()
    assert not any(library[c.option].name == "make_iron_sword" for t in oracle for c in t.calls)


def test_same_seed_same_trajectory():
    env = techtree_v0.parallel_env()
    library = make_library()

    def summary(traj):
        return [(c.agent, c.option, c.start_step, c.duration, c.termination) for c in traj.calls]

    for manager in (lambda: OracleManager(library), lambda: RandomManager(seed=4)):
        a = run_episode(env, library, manager(), seed=11)
        b = run_episode(techtree_v0.parallel_env(), library, manager(), seed=11)
        assert summary(a) == summary(b) and a.length == b.length
        assert a.milestone_steps == b.milestone_steps


def test_one_agent_variant():
    env = techtree_v0.parallel_env(n_agents=1)
    library = make_library()
    traj = run_episode(env, library, OracleManager(library), seed=0)
    assert traj.success and env.possible_agents == ["agent_0"]


def test_raw_step_throughput():
    env = techtree_v0.parallel_env()
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 5, size=4000).tolist()
    steps, start = 0, time.perf_counter()
    for k in range(0, len(actions), 2):
        if not env.agents:
            env.reset(seed=k)
        env.step({a: actions[k + j] for j, a in enumerate(env.agents)})
        steps += 1
    rate = steps / (time.perf_counter() - start)
    assert rate > 3000, f"{rate:.0f} steps/s"
