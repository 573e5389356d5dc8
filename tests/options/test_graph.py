from __future__ import annotations

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre_ma.options import Option, OptionLibrary, TaskGraph


def chain_spec() -> dict:
    return {
        "goals": ["d"],
        "milestones": {
            "a": {"duration": 2},
            "b": {"requires": ["a"], "duration": 3},
            "c": {"requires": ["a"], "duration": 10},
            "d": {"any_of": [["b", "c"]], "duration": 1},
        },
    }


def test_frontier_and_or_prerequisites():
    g = TaskGraph.from_spec(chain_spec())
    assert g.frontier(set()) == {"a"}
    assert g.frontier({"a"}) == {"b", "c"}
    assert g.frontier({"a", "b"}) == {"c", "d"}  # d needs b OR c
    assert not g.unlocked("d", {"a"})


def test_critical_path_takes_cheapest_alternative():
    g = TaskGraph.from_spec(chain_spec())
    assert g.critical_path("d") == (6.0, ("a", "b", "d"))


def test_required_for_and_topological_orders():
    g = TaskGraph.from_spec(chain_spec())
    assert set(g.required_for("b")) == {"a", "b"}
    orders = list(g.topological_orders())
    assert all(o[0] == "a" and o[-1] == "d" for o in orders) and len(orders) == 2


def test_cycle_is_named():
    spec = chain_spec()
    spec["milestones"]["a"]["requires"] = ["d"]
    with pytest.raises(ValueError, match=r"cycle: .*a"):
        TaskGraph.from_spec(spec)


def test_dangling_prerequisite_and_unknown_goal():
    spec = chain_spec()
    spec["milestones"]["b"]["requires"] = ["ghost"]
    with pytest.raises(ValueError, match="'b' requires 'ghost'"):
        TaskGraph.from_spec(spec)
    spec = chain_spec()
    spec["goals"] = ["nowhere"]
    with pytest.raises(ValueError, match="goal 'nowhere' is not a milestone"):
        TaskGraph.from_spec(spec)


def test_unknown_attribute_lists_accepted():
    spec = chain_spec()
    spec["milestones"]["a"]["weight"] = 3
    with pytest.raises(ValueError, match=r"milestones.a: unknown key\(s\) \['weight'\]; accepted"):
        TaskGraph.from_spec(spec)


def test_spec_roundtrip():
    g = TaskGraph.from_spec(chain_spec())
    assert TaskGraph.from_spec(g.to_spec()) == g


def test_dot_and_png(tmp_path):
    g = TaskGraph.from_spec(chain_spec())
    dot = g.to_dot({"a"})
    assert '"a" -> "b";' in dot and 'style=dashed' in dot and '"d" [fillcolor="#d9d9d9", peripheries=2]' in dot
    g.draw(str(tmp_path / "g.png"), achieved={"a"})
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- properties over random DAGs
@st.composite
def random_dags(draw):
    """A random DAG spec: node i may require nodes < i, in AND edges and OR groups."""
    n = draw(st.integers(2, 12))
    names = [f"m{i}" for i in range(n)]
    milestones = {}
    for i, name in enumerate(names):
        earlier = names[:i]
        requires = draw(st.lists(st.sampled_from(earlier), unique=True, max_size=3)) if earlier else []
        groups = []
        if len(earlier) >= 2 and draw(st.booleans()):
            groups = [draw(st.lists(st.sampled_from(earlier), unique=True, min_size=2, max_size=3))]
        milestones[name] = {"requires": requires, "any_of": groups, "duration": draw(st.integers(1, 9))}
    return {"goals": [names[-1]], "milestones": milestones}


def _policy(ctx):
    return 0


def _library(g: TaskGraph) -> OptionLibrary:
    return OptionLibrary("prop", g, [Option(name=f"do_{m}", policy=_policy, milestone=m) for m in g.names])


@settings(max_examples=150, deadline=None)
@given(random_dags(), st.data())
def test_mask_never_enables_unmet_prerequisites(spec, data):
    g = TaskGraph.from_spec(spec)
    lib = _library(g)
    achieved = frozenset(data.draw(st.sets(st.sampled_from(list(g.names)))))
    mask = g.mask(lib, achieved)
    for opt, enabled in zip(lib, mask, strict=True):
        m = g.milestone(opt.milestone)
        met = all(r in achieved for r in m.requires) and all(any(r in achieved for r in grp) for grp in m.any_of)
        if enabled:
            assert met and opt.milestone not in achieved


@settings(max_examples=150, deadline=None)
@given(random_dags(), st.randoms(use_true_random=False))
def test_any_sequence_of_frontier_choices_reaches_goal(spec, rnd):
    g = TaskGraph.from_spec(spec)
    achieved: set[str] = set()
    for _ in range(len(g)):
        front = sorted(g.frontier(achieved))
        if not front:
            break
        achieved.add(rnd.choice(front))
    assert set(g.goals) <= achieved


@settings(max_examples=150, deadline=None)
@given(random_dags(), st.data())
def test_graph_with_a_cycle_is_rejected_naming_a_node_on_it(spec, data):
    names = list(spec["milestones"])
    i = data.draw(st.integers(0, len(names) - 2))
    j = data.draw(st.integers(i + 1, len(names) - 1))
    # force a path names[i] -> names[j] and a back edge names[j] -> names[i]
    spec["milestones"][names[j]]["requires"] = sorted({*spec["milestones"][names[j]]["requires"], names[i]})
    spec["milestones"][names[i]]["requires"] = sorted({*spec["milestones"][names[i]]["requires"], names[j]})
    with pytest.raises(ValueError, match="cycle") as info:
        TaskGraph.from_spec(spec)
    raw = nx.DiGraph()
    for v, attrs in spec["milestones"].items():
        raw.add_node(v)
        for u in attrs["requires"] + [u for grp in attrs["any_of"] for u in grp]:
            raw.add_edge(u, v)
    on_cycles = {n for comp in nx.strongly_connected_components(raw) if len(comp) > 1 for n in comp}
    named = str(info.value).split("cycle: ")[1].split(" -> ")
    assert set(named) <= on_cycles and named


@settings(max_examples=100, deadline=None)
@given(random_dags())
def test_spec_roundtrip_property(spec):
    g = TaskGraph.from_spec(spec)
    assert TaskGraph.from_spec(g.to_spec()) == g


def test_a_milestone_no_goal_needs_pays_nothing_unless_its_reward_is_given():
    """Every milestone paid 1.0 by default: a new user's Crafter graph declared four side
    achievements to see them verified, and the default learner detoured for all four on
    97 % of greedy episodes (paths 2.4x the oracle's). A milestone a goal needs (through
    requires or any_of) still pays 1.0; one no goal needs pays 0 unless given a reward."""
    spec = {"goals": ["serve"], "milestones": {
        "eggs": {}, "tea": {}, "coffee": {}, "drink": {"any_of": [["tea", "coffee"]]},
        "serve": {"requires": ["eggs", "drink"], "reward": 5},
        "sapling": {}, "sword": {"requires": ["eggs"]}, "coal": {"reward": 0.25}}}
    graph = TaskGraph.from_spec(spec)
    rewards = {m.name: m.reward for m in graph.milestones}
    assert rewards == {"eggs": 1.0, "tea": 1.0, "coffee": 1.0, "drink": 1.0, "serve": 5.0,
                       "sapling": 0.0, "sword": 0.0, "coal": 0.25}
    assert graph.unneeded == ("sapling", "sword", "coal")
    assert graph.implicit_rewards == {"eggs", "tea", "coffee", "drink", "sapling", "sword"}
    assert graph.to_spec() == {"goals": ["serve"], "milestones": {k: {a: v for a, v in attrs.items()}
                                                                  for k, attrs in spec["milestones"].items()}
                               | {"serve": {"requires": ["eggs", "drink"], "reward": 5.0}}}
    assert TaskGraph.from_spec(graph.to_spec()) == graph
    other_goal = TaskGraph.from_spec({**spec, "goals": ["sword"]})  # filled in from the goals of this graph
    assert {m.name: m.reward for m in other_goal.milestones}["sword"] == 1.0
    assert {m.name: m.reward for m in other_goal.milestones}["tea"] == 0.0
    assert graph.graph.nodes["sapling"]["milestone"].reward == 0.0  # the node payload is the filled-in one


def test_what_the_goals_still_need_drops_the_other_alternative_and_its_route():
    """A new user's colony built both routes of each either-or (campfire or farm), each paid
    1.0 by default, and took ~68 steps more than the oracle on a 576-step task. What the
    goals still need, given what is verified, is what an implicit reward pays for."""
    graph = TaskGraph.from_spec({"goals": ["hall"], "milestones": {
        "wood": {}, "campfire": {"requires": ["wood"]}, "field": {}, "farm": {"requires": ["field"]},
        "food": {"any_of": [["campfire", "farm"]]}, "hall": {"requires": ["food", "wood"]}, "tower": {}}})
    assert graph.still_needed(()) == {"wood", "campfire", "field", "farm", "food", "hall"}
    assert graph.still_needed({"wood"}) == {"campfire", "field", "farm", "food", "hall"}
    assert graph.still_needed({"wood", "campfire"}) == {"food", "hall"}  # the farm route is no longer needed
    assert graph.still_needed({"field"}) == {"wood", "campfire", "farm", "food", "hall"}
    assert graph.still_needed({"food"}) == {"wood", "hall"}  # a verified milestone's prerequisites are behind it
    assert graph.still_needed({"hall"}) == frozenset()


def test_an_any_of_group_of_one_milestone_is_refused_with_how_to_write_either_or():
    """The same user wrote any_of: [[campfire], [farm]] meaning either; it means both, and
    check said ok. A group of one alternative is a requirement written the long way."""
    with pytest.raises(ValueError, match=r"milestone 'food': any_of group 0 \['campfire'\] holds one milestone; "
                                         r"a group lists alternatives.*any_of: \[\[a, b\]\]; for a milestone "
                                         r"that is needed, requires: \[campfire\]"):
        TaskGraph.from_spec({"goals": ["food"], "milestones": {
            "campfire": {}, "farm": {}, "food": {"any_of": [["campfire"], ["farm"]]}}})


def test_milestones_verified_before_their_prerequisites_are_counted_and_named():
    """A session-53 user's fake report fooled the env's detectors: 'report_submitted' was
    verified without 'bench_cleaned', check failed the env, and training paid it in silence."""
    from gyre_ma.metrics import out_of_order
    from gyre_ma.rollout import Trajectory

    g = TaskGraph.from_spec(chain_spec())
    in_order = Trajectory(task_seed=1, policy_version=0, milestone_steps={"a": 2, "c": 9, "d": 9})  # same step: ok
    either = Trajectory(task_seed=2, policy_version=0, milestone_steps={"a": 1, "b": 4, "d": 5})
    skipped = Trajectory(task_seed=3, policy_version=0, milestone_steps={"a": 1, "d": 3})
    early = Trajectory(task_seed=4, policy_version=0, milestone_steps={"b": 2, "a": 5})
    assert out_of_order([in_order, either], g) == (0.0, None)
    share, example = out_of_order([in_order, skipped, early, either], g)
    assert share == 0.5 and example == "'d' at step 3 before one of b / c (task seed 3)"
    assert out_of_order([early], g)[1] == "'b' at step 2 before a (task seed 4)"


def test_an_alternative_the_goals_need_anyway_leaves_the_others_of_its_group_unneeded():
    """A session-54 user's kitchen: a shared ``plate`` asks for one dish part (chop,
    cook_pasta or bake), and each episode's goal is one dish. A cake needs ``bake`` anyway,
    so chop and cook_pasta (and their routes) are not needed in a cake episode: they were,
    and a learner was paid for a salad's chopping while baking a cake."""
    graph = TaskGraph.from_spec({"goals": ["salad_served", "pasta_served", "cake_served"], "milestones": {
        "wash_veg": {}, "chop": {"requires": ["wash_veg"]},
        "boil_water": {}, "cook_pasta": {"requires": ["boil_water"]},
        "make_sauce": {}, "mix_batter": {}, "bake": {"requires": ["mix_batter"]},
        "plate": {"any_of": [["chop", "cook_pasta", "bake"]]}, "serve": {"requires": ["plate"]},
        "salad_served": {"requires": ["chop", "serve"]},
        "pasta_served": {"requires": ["cook_pasta", "make_sauce", "serve"]},
        "cake_served": {"requires": ["bake", "serve"]}}})
    assert graph.still_needed((), ["cake_served"]) == {"mix_batter", "bake", "plate", "serve", "cake_served"}
    assert graph.still_needed((), ["pasta_served"]) == {"boil_water", "cook_pasta", "make_sauce", "plate", "serve",
                                                       "pasta_served"}
    assert graph.still_needed({"mix_batter", "bake"}, ["cake_served"]) == {"plate", "serve", "cake_served"}
    assert graph.still_needed((), ["salad_served", "cake_served"]) == {
        "wash_veg", "chop", "mix_batter", "bake", "plate", "serve", "salad_served", "cake_served"}
    loose = TaskGraph.from_spec({"goals": ["served"], "milestones": {  # no goal needs one part: each still may
        "chop": {}, "bake": {}, "plate": {"any_of": [["chop", "bake"]]}, "served": {"requires": ["plate"]}}})
    assert loose.still_needed(()) == {"chop", "bake", "plate", "served"}
