"""ScienceWorld as a gyre env (issue #21, part 4): three task graphs (the find families,
mixing a secondary paint, the longest-lived animal), milestones from the simulator's own
goal progress, text observations and actions, scripted libraries with a trap, an oracle,
and libraries mixing scripted and LLM-backed options trained end to end."""

from __future__ import annotations

import textwrap

import pytest
import torch

pytest.importorskip("scienceworld", reason="the scienceworld extra is not installed")

from gyre_ma.envs import scienceworld_env as sw  # noqa: E402
from gyre_ma.envs import scienceworld_v0  # noqa: E402
from gyre_ma.envs.checks import check_env  # noqa: E402
from gyre_ma.envs.registry import make_env, make_library, make_oracle  # noqa: E402
from gyre_ma.roles import TRAINING_SEEDS, VALIDATION_SEEDS  # noqa: E402
from gyre_ma.rollout import run_episode  # noqa: E402


@pytest.mark.parametrize("family", ["find-animal", sw.PAINT_FAMILY, sw.LIFESPAN_FAMILY])
def test_check_env_passes(family):
    report = check_env(lambda: sw.make_env(family, max_cycles=12), seeds=(0,), n_steps=8,
                       library=sw.make_library(family=family), module=scienceworld_v0)
    assert report.unverifiable == ()  # every milestone is re-verified on the simulator's state
    assert {"parallel_seed_test", "max_cycles_test"} <= set(report.pettingzoo_tests)


def test_the_pettingzoo_entry_points_truncate_at_max_cycles():
    par = scienceworld_v0.parallel_env(family="find-animal", max_cycles=3)
    par.reset(seed=0)
    steps = 0
    while par.agents:
        _, _, terminations, truncations, _ = par.step({"agent_0": "look around"})
        steps += 1
    assert steps == 3 and truncations["agent_0"] and not terminations["agent_0"]
    aec = scienceworld_v0.env(family="find-animal", max_cycles=3)
    aec.reset(seed=0)
    turns = 0
    for agent in aec.agent_iter():
        done = aec.terminations[agent] or aec.truncations[agent]
        aec.step(None if done else "look around")
        turns += 1
    assert turns == 4  # three commands, then the truncated agent's last turn


def test_the_new_families_have_their_own_task_graphs_and_options():
    graphs = {f: frozenset(sw.make_env(f).task_graph().names) for f in (sw.FIND_FAMILIES[0], sw.PAINT_FAMILY,
                                                                  sw.LIFESPAN_FAMILY)}
    assert len(set(graphs.values())) == 3
    assert graphs[sw.PAINT_FAMILY] == {"at_paints", "combined", "mixed", "focused"}
    assert graphs[sw.LIFESPAN_FAMILY] == {"at_animals", "focused"}
    find = set(sw.make_library(family="find-plant").names)
    for family in (sw.PAINT_FAMILY, sw.LIFESPAN_FAMILY):
        names = set(sw.make_library(family=family).names)
        assert names - find and names & find == {"look_around", "wander"}
    with pytest.raises(ValueError, match="family 'boil' is not wrapped; expected one of"):
        sw.make_library(family="boil")


@pytest.mark.parametrize(("family", "seeds"), [*((f, (0, 5)) for f in sw.FIND_FAMILIES),
                                               (sw.PAINT_FAMILY, (1, 6)), (sw.LIFESPAN_FAMILY, (3, 5))])
def test_the_oracle_completes_held_out_variations(family, seeds):
    env = make_env("scienceworld_v0", family=family)
    library = make_library("scienceworld_v0", env)
    oracle = make_oracle("scienceworld_v0", env, library)
    order = sw.ORDERS[sw.GRAPH_OF[family]]
    for seed in seeds:
        assert sw.variation(family, seed) in sw.variation_splits(family)["test"]
        traj = run_episode(env, library, oracle, seed=seed)
        raw = env.unwrapped
        assert traj.success and raw.completed and raw.score == 100
        assert env.verified_milestones() == set(env.task_graph().names)
        assert [library.names[c.option] for c in traj.calls] == list(order)
        assert traj.length <= 20


def test_task_seeds_map_to_the_simulator_splits():
    assert (sw.TRAINING_SEEDS, sw.VALIDATION_SEEDS) == (TRAINING_SEEDS, VALIDATION_SEEDS)
    splits = sw.variation_splits("find-plant")
    assert sw.variation("find-plant", TRAINING_SEEDS + 7) in splits["train"]
    assert sw.variation("find-plant", VALIDATION_SEEDS + 7) in splits["dev"]
    assert sw.variation("find-plant", 7) in splits["test"]
    assert not set(splits["train"]) & (set(splits["dev"]) | set(splits["test"]))


def test_milestones_come_from_the_simulator_not_the_agent_text():
    env = sw.make_env("find-living-thing")
    obs, _ = env.reset(seed=1)
    assert set(obs["agent_0"]) == {"text", "room"} and "called the" in obs["agent_0"]["text"]
    env.step({"agent_0": "focus on a living thing"})  # claiming it in text verifies nothing
    env.step({"agent_0": "pick up object"})
    assert env.verified_milestones() == frozenset()
    progress = sw.parse_goal_progress(env.unwrapped._server.getGoalProgressStr())
    assert [d for d, _ in progress["sequential"]] == ["focus on a living thing", "move living thing to answer box"]
    assert ("Pick up object", False) in progress["optional"]


@pytest.mark.parametrize(("family", "trap", "seed"), [("find-animal", "focus_first", 2),
                                                       (sw.PAINT_FAMILY, "focus_ingredient", 0)])
def test_the_trap_fails_the_task_and_bad_input_is_named(family, trap, seed):
    env = sw.make_env(family)
    library = sw.make_library(env)
    trap = library.index(trap)

    class Careless:
        def decide(self, decisions):
            from gyre_ma.options.decision import Choice
            return [Choice(trap if d.mask[trap] else int(d.mask.nonzero()[0][0])) for d in decisions]

    traj = run_episode(env, library, Careless(), seed=seed)
    assert not traj.success and env.unwrapped.failed and traj.length == 1
    with pytest.raises(ValueError, match="family 'boil' is not wrapped; expected one of"):
        sw.make_env("boil")
    with pytest.raises(ValueError, match="max_cycles must be an int >= 1"):
        sw.make_env(max_cycles=0)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action of 'agent_0' must be a command string"):
        env.step({"agent_0": 3})


def test_a_library_mixing_scripted_and_llm_options_trains_end_to_end(tmp_path):
    pytest.importorskip("transformers", reason="the llm extra (transformers) is not installed")
    from gyre_ma.config import parse_config
    from gyre_ma.llm.tiny import build_tiny_model
    from gyre_ma.loop import Gyre

    words = "open door to go the kitchen hallway outside greenhouse bedroom living room bathroom workshop art " \
            "studio foundry look around task observation admissible actions action".split()
    model = build_tiny_model(tmp_path / "tiny", words + [":", ",", "."], layers=1, width=16)
    library = tmp_path / "library.yaml"
    m = "gyre_ma.envs.scienceworld_env"
    library.write_text(textwrap.dedent(f"""\
        name: scienceworld_mixed
        graph: {m}:find_graph
        options:
          - {{name: focus_thing, milestone: focused, policy: {m}:focus_thing, max_steps: 12}}
          - {{name: pick_up_thing, milestone: picked_up, policy: {m}:pick_up_thing, max_steps: 12}}
          - {{name: put_in_box, milestone: in_box, policy: {m}:put_in_box, max_steps: 12}}
          - name: go_to_box
            kind: llm
            milestone: at_box
            max_steps: 4
            llm: {{model: '{model}', actions: {m}:door_actions, to_action: {m}:action_text,
                   render: {m}:observation_text, mode: score}}
        """))
    cfg = parse_config({
        "seed": 0, "run_root": str(tmp_path / "runs"),
        "env": {"id": "scienceworld_v0", "kwargs": {"family": "find-animal", "max_cycles": 24}},
        "library": str(library), "manager": {"hidden": 16},
        "train": {"iterations": 2, "episodes_per_iteration": 4}, "rollout": {"num_envs": 4},
    })
    gyre = Gyre(cfg)
    from gyre_ma.llm.option import LLMPolicy
    assert isinstance(gyre.library["go_to_box"].policy, LLMPolicy)
    before = [p.detach().clone() for p in gyre.policy.parameters()]
    history = []
    for i in range(2):
        metrics, trajectories = gyre.iteration(i, return_trajectories=True)
        history.append(metrics)
        assert len(trajectories) == 4
    llm = gyre.library.index("go_to_box")
    assert any(c.option == llm for t in trajectories for c in t.calls)  # the manager ran the LLM option
    assert sum(t.llm_requests for t in trajectories) > 0
    assert all(c.breakdown is not None for t in trajectories for c in t.calls)
    assert any(not torch.equal(p, q) for p, q in zip(before, gyre.policy.parameters(), strict=True))
    assert history[-1]["policy_version"] == 2
    gyre.close()


def test_the_shipped_paint_library_with_llm_options_trains_end_to_end(tmp_path):
    pytest.importorskip("transformers", reason="the llm extra (transformers) is not installed")
    from gyre_ma.config import parse_config
    from gyre_ma.llm.option import LLMPolicy
    from gyre_ma.llm.tiny import build_tiny_model
    from gyre_ma.loop import Gyre
    from gyre_ma.options.library import OptionLibrary

    words = "pour mix focus on in red blue yellow violet green orange paint glass cup jug bowl wood containing " \
            "nothing and look around task observation admissible actions action".split()
    model = build_tiny_model(tmp_path / "tiny", words + [":", ",", "."], layers=1, width=16)
    shipped = "configs/libraries/scienceworld_paint_llm.yaml"
    with pytest.raises(ValueError, match=r"variable \$\{model\} has no value; set library_kwargs.model"):
        OptionLibrary.load(shipped)
    with pytest.raises(ValueError, match=r"has no variable\(s\) \['modle'\]; its variables: \['model'\]"):
        OptionLibrary.load(shipped, model=str(model), modle="x")
    cfg = parse_config({
        "seed": 0, "run_root": str(tmp_path / "runs"),
        "env": {"id": "scienceworld_v0", "kwargs": {"family": sw.PAINT_FAMILY, "max_cycles": 16}},
        "library": shipped, "library_kwargs": {"model": str(model)}, "manager": {"hidden": 16},
        "train": {"iterations": 2, "episodes_per_iteration": 4}, "rollout": {"num_envs": 4},
    })
    gyre = Gyre(cfg)
    llm_options = [o.name for o in gyre.library if isinstance(o.policy, LLMPolicy)]
    assert llm_options == ["pour_paints", "mix_paints", "focus_result"]
    before = [p.detach().clone() for p in gyre.policy.parameters()]
    for i in range(2):
        metrics, trajectories = gyre.iteration(i, return_trajectories=True)
    assert sum(t.llm_requests for t in trajectories) > 0  # the model chose primitive actions
    assert any(not torch.equal(p, q) for p, q in zip(before, gyre.policy.parameters(), strict=True))
    assert metrics["policy_version"] == 2
    gyre.close()


def test_the_llm_helpers_list_the_commands_of_each_milestone():
    env = sw.make_env(sw.PAINT_FAMILY)
    env.reset(seed=0)  # starts in the art studio, a glass cup on the table
    library = sw.make_library(env)
    from gyre_ma.options.option import OptionContext
    ctx = OptionContext(agent="agent_0", env=env, observation=None, achieved=frozenset())
    assert "pour red paint in glass cup containing nothing" in sw.pour_actions(ctx)
    assert "mix glass cup containing nothing" in sw.mix_actions(ctx)
    assert {"focus on red paint", "focus on blue paint"} <= set(sw.focus_actions(ctx))
    assert library.names[:4] == ["go_to_paints", "pour_paints", "mix_paints", "focus_result"]


def test_the_shipped_lifespan_library_builds_its_llm_focus(tmp_path):
    pytest.importorskip("transformers", reason="the llm extra (transformers) is not installed")
    from gyre_ma.llm.option import LLMPolicy
    from gyre_ma.llm.tiny import build_tiny_model
    from gyre_ma.options.library import OptionLibrary

    model = build_tiny_model(tmp_path / "tiny", "focus on wolf mouse crocodile".split(), layers=1, width=16)
    library = OptionLibrary.load("configs/libraries/scienceworld_lifespan_llm.yaml", model=str(model))
    assert set(library.graph.names) == {"at_animals", "focused"}
    assert [o.name for o in library if isinstance(o.policy, LLMPolicy)] == ["focus_longest_lived"]
