from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre_ma.options import Option, OptionContext, OptionLibrary, TaskGraph, Termination

ROOT = Path(__file__).resolve().parents[2]


# module-level callables so the library can be dumped by reference
def step_right(ctx):
    return 2


def three_steps(ctx):
    return ctx.steps >= 3


def has_key(ctx):
    return bool(ctx.memory.get("key"))


def two_args(ctx, extra):
    return 0


GRAPH = {
    "goals": ["door"],
    "milestones": {"key": {"duration": 5}, "door": {"requires": ["key"], "reward": 2.0}},
}


def small_library() -> OptionLibrary:
    lib = OptionLibrary("doors", TaskGraph.from_spec(GRAPH))

    @lib.option(milestone="key", max_steps=20)
    def get_key(ctx):
        return 1

    lib.add(Option("open_door", step_right, milestone="door", initiation=has_key))
    lib.add(Option("gather", step_right, milestone="key", repeatable=True, done=three_steps))
    lib.add(Option("wait", step_right, done=three_steps, max_steps=3))
    return lib


def test_mask_one_shot_repeatable_upkeep_and_initiation():
    lib = small_library()
    assert lib.mask(frozenset()).tolist() == [True, False, True, True]  # gather: key is unlocked
    after_key = frozenset({"key"})
    # one-shot get_key is done; repeatable gather stays eligible; open_door's graph prereq met
    assert lib.mask(after_key).tolist() == [False, True, True, True]
    ctx = OptionContext(agent="a", env=None, observation=None, achieved=after_key)
    assert lib.mask(after_key, ctx).tolist() == [False, False, True, True]  # no key in memory
    ctx.memory["key"] = True
    assert lib.mask(after_key, ctx)[1]


def test_termination_reasons():
    lib = small_library()
    ctx = OptionContext(agent="a", env=None, observation=None, achieved=frozenset())
    assert lib["get_key"].termination(ctx, frozenset()) is None
    assert lib["get_key"].termination(ctx, frozenset({"key"})) is Termination.MILESTONE
    ctx.steps = 3
    assert lib["gather"].termination(ctx, frozenset({"key"})) is Termination.DONE
    ctx.steps = 20
    assert lib["get_key"].termination(ctx, frozenset()) is Termination.MAX_STEPS


def test_duplicate_names_and_unknown_milestone_rejected():
    lib = small_library()
    with pytest.raises(ValueError, match="duplicate option name 'wait'"):
        lib.add(Option("wait", step_right, done=three_steps))
    with pytest.raises(ValueError, match="milestone 'window', which is not a node"):
        lib.add(Option("smash", step_right, milestone="window"))


def test_wrong_signatures_rejected():
    with pytest.raises(TypeError, match="policy must take exactly one argument"):
        Option("bad", two_args, milestone="key")
    with pytest.raises(TypeError, match="policy must be callable"):
        Option("bad", 3, milestone="key")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="repeatable option needs a 'done'"):
        Option("bad", step_right, repeatable=True)
    assert Option("regain", step_right, milestone="key", repeatable=True).restores  # re-achieves a lost key


def test_unreachable_goal_names_missing_milestones():
    lib = OptionLibrary("half", TaskGraph.from_spec(GRAPH), [Option("k", step_right, milestone="key")])
    with pytest.raises(ValueError, match=r"goal 'door' is unreachable: no option achieves milestone\(s\) \['door'\]"):
        lib.validate()


def test_yaml_roundtrip(tmp_path):
    lib = OptionLibrary("doors", TaskGraph.from_spec(GRAPH))
    mod = __name__
    lib.add(Option("get_key", step_right, milestone="key", max_steps=20))
    lib.add(Option("open_door", step_right, milestone="door", initiation=has_key))
    lib.add(Option("wait", step_right, done=three_steps, max_steps=3))
    path = tmp_path / "lib.yaml"
    lib.dump(path)
    spec = yaml.safe_load(path.read_text())
    assert spec["options"][1]["initiation"] == f"{mod}:has_key"
    again = OptionLibrary.load(path)
    assert again.to_spec() == lib.to_spec()


class _Named:
    """A callable object that names itself like a module attribute but is not one."""

    __module__ = __name__

    def __init__(self) -> None:
        self.__qualname__ = "step_right_copy"

    def __call__(self, ctx):
        return 1


def test_dump_refuses_what_it_could_not_load_back_and_names_the_option():
    lib = OptionLibrary("doors", TaskGraph.from_spec(GRAPH))
    lib.add(Option("get_key", step_right, milestone="key"))
    lib.add(Option("open_door", _Named(), milestone="door"))
    with pytest.raises(ValueError, match=r"library 'doors': option 'open_door': its policy is a _Named object, which "
                                         r"has no reference to import"):
        lib.to_spec()
    lib = OptionLibrary("doors", TaskGraph.from_spec(GRAPH))
    lib.add(Option("get_key", step_right, milestone="key", initiation=lambda ctx: True))
    with pytest.raises(ValueError, match=r"option 'get_key': <function .*<lambda>.* is not importable by reference"):
        lib.to_spec()


def test_yaml_errors_name_the_entry(tmp_path):
    spec = {
        "name": "x", "graph": GRAPH,
        "options": [
            {"name": "get_key", "milestone": "key", "policy": f"{__name__}:step_right"},
            {"name": "open", "milestone": "door", "policy": f"{__name__}:no_such_fn"},
        ],
    }
    with pytest.raises(ValueError, match=r"options\[1\]\.policy: module .* has no attribute 'no_such_fn'"):
        OptionLibrary.from_spec(spec)
    spec["options"][1] = {"name": "open", "milestone": "door", "policy": f"{__name__}:two_args"}
    with pytest.raises(ValueError, match=r"options\[1\]: option 'open': policy must take exactly one"):
        OptionLibrary.from_spec(spec)
    spec["options"][1] = {"name": "open", "milestone": "door", "policy": f"{__name__}:step_right", "colour": 1}
    with pytest.raises(ValueError, match=r"options\[1\]: unknown key\(s\) \['colour'\]"):
        OptionLibrary.from_spec(spec)


names = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)


@settings(max_examples=100, deadline=None)
@given(st.lists(names, min_size=1, max_size=6, unique=True), st.data())
def test_yaml_load_dump_load_is_identity(tmp_path_factory, milestone_names, data):
    milestones = {}
    for i, m in enumerate(milestone_names):
        reqs = data.draw(st.lists(st.sampled_from(milestone_names[:i]), unique=True)) if i else []
        milestones[m] = {"requires": reqs, "duration": data.draw(st.integers(1, 50)),
                         "reward": data.draw(st.floats(0, 10, allow_nan=False))}
    options = [
        {"name": f"do_{m}", "milestone": m, "policy": f"{__name__}:step_right",
         "max_steps": data.draw(st.integers(1, 500))}
        for m in milestone_names
    ]
    options.append({"name": "idle", "policy": f"{__name__}:step_right", "done": f"{__name__}:three_steps"})
    spec = {"name": "gen", "graph": {"goals": [milestone_names[-1]], "milestones": milestones}, "options": options}
    path = tmp_path_factory.mktemp("lib") / "lib.yaml"
    path.write_text(yaml.safe_dump(spec))
    first = OptionLibrary.load(path)
    first.dump(path)
    second = OptionLibrary.load(path)
    assert second.to_spec() == first.to_spec()
    assert second.graph == first.graph and second.names == first.names


def test_readme_worked_example_is_the_shipped_one_and_short(tmp_path):
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```python\n(# options/examples.py\n.*?)```", readme, re.S)
    assert block, "README must show options/examples.py in a python block"
    code = block.group(1)
    shipped = (ROOT / "options" / "examples.py").read_text()
    body = code.split("\n", 1)[1]
    assert body.strip() in shipped
    assert len(body.strip().splitlines()) < 40
    namespace: dict = {}
    exec(compile(body, "README", "exec"), namespace)
    lib = namespace["breakfast"]()
    assert len(lib) >= 6
    lib.graph.draw(str(tmp_path / "b.png"))


def test_a_librarys_options_are_a_public_tuple_in_index_order():
    """A new user tried ``library.options`` (AttributeError) before finding ``for o in library``."""
    from gyre_ma.options.examples import breakfast

    library = breakfast()
    assert library.options == tuple(library) and [o.name for o in library.options] == list(library.names)
    assert [library.index(o.name) for o in library.options] == list(range(len(library)))
