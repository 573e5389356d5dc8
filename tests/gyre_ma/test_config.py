from __future__ import annotations

import contextlib
import io
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from gyre_ma.cli import main
from gyre_ma.config import ConfigError, ExperimentConfig, dump_config, load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_validate_and_derived_values_are_properties():
    cfg = parse_config({"name": "x", "train": {"episodes_per_iteration": 12},
                        "roles": {"explorers": 1, "executors": 3}})
    assert cfg.group_size == 4 and cfg.groups_per_iteration == 3
    assert str(cfg.run_dir) == "runs/x"
    with pytest.raises(Exception):
        cfg.train.lr = 1.0  # frozen
    # the blend weight: the measured default of the outcome credit unless given
    assert cfg.credit.outcome_weight is None and cfg.credit.blend_weight == 1.0
    assert parse_config({"credit": {"outcome_credit": "episode"}}).credit.blend_weight == 0.5
    assert parse_config({"credit": {"outcome_weight": 0.25}}).credit.blend_weight == 0.25
    with pytest.raises(ConfigError, match=r"'credit.outcome_weight': Input should be less than or equal to 1"):
        parse_config({"credit": {"outcome_weight": 1.5}})


def test_the_least_validation_episodes_fit_the_window(tmp_path):
    """A session-57 user lowered roles.evaluators to 2, as the README advises for a slow env: a
    window then held 16 episodes, checkpoints.min_validation_episodes was 32, and no best.pt
    was ever written, without a word."""
    assert parse_config({}).min_validation_episodes == 32  # 4 evaluators × 2 modes × a window of 4
    assert parse_config({"roles": {"evaluators": 2}}).min_validation_episodes == 16
    assert parse_config({"roles": {"evaluators": 1}, "checkpoints": {"validation_window": 2}}) \
        .min_validation_episodes == 4
    assert parse_config({"roles": {"evaluators": 0}}).min_validation_episodes == 32  # 16 training episodes × 4
    assert parse_config({"checkpoints": {"min_validation_episodes": 8}}).min_validation_episodes == 8
    with pytest.raises(ConfigError, match=r"`checkpoints.min_validation_episodes` is 40, but a validation window "
                                          r"holds 32 episodes \(`roles.evaluators` 4 × 2 \(sampled and greedy\) × "
                                          r"`checkpoints.validation_window` 4\), so no best.pt would ever be written"):
        parse_config({"checkpoints": {"min_validation_episodes": 40}})
    parse_config({"checkpoints": {"min_validation_episodes": 40, "enabled": False}})  # nothing judged: no matter


def test_a_run_with_few_evaluators_keeps_a_best(tmp_path):
    config = tmp_path / "few.yaml"
    config.write_text(f"name: few\nrun_root: {tmp_path}\nenv: {{id: coverage_v0}}\nroles: {{evaluators: 1}}\n"
                      "checkpoints: {validation_window: 2}\n")
    assert main(["train", str(config), "--iterations", "3", "--quiet"]) == 0
    assert (tmp_path / "few" / "checkpoints" / "best.pt").is_file()


def test_every_field_has_a_docstring():
    """Every field of every section, including the sections behind ``X | None``, ``list[X]``
    and ``dict[str, X]``."""
    seen: set[type[BaseModel]] = set()

    def models(ann: Any) -> list[type[BaseModel]]:
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            return [ann]
        return [m for arg in typing.get_args(ann) for m in models(arg)]

    def walk(model: type[BaseModel]):
        seen.add(model)
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"
            for inner in models(field.annotation):
                if inner not in seen:
                    walk(inner)

    walk(ExperimentConfig)
    assert {"LLMBuildConfig", "LLMManagerConfig", "RuleSpec"} <= {m.__name__ for m in seen}


def test_errors_name_path_value_and_expectation():
    with pytest.raises(ConfigError, match=r"'train.lr': Input should be greater than 0 \(got -1\)"):
        parse_config({"train": {"lr": -1}})
    with pytest.raises(ConfigError, match=r"unknown key 'credit.lamda'; accepted keys here: "
                                          r"\['anchor_prior', 'gamma', 'gigpo_step_weight', 'lam'"):
        parse_config({"credit": {"lamda": 0.9}})
    with pytest.raises(ConfigError, match=r"unknown key 'rewards.rules.0.bogus'; accepted keys here: "
                                          r"\['check', 'description', 'given', 'kind', 'milestone', 'name'"):
        parse_config({"rewards": {"rules": [{"name": "x", "bogus": 1}]}})  # an item of a list: its keys, not []
    with pytest.raises(ConfigError, match=r"`train.episodes_per_iteration` \(10\) must be a multiple of the group "
                                          r"size, `roles.explorers` \(1\) \+ `roles.executors` \(3\) = 4"):
        parse_config({"train": {"episodes_per_iteration": 10}})
    with pytest.raises(ConfigError, match=r"`group_size` is not a key: .*`roles.explorers` \+ `roles.executors`"):
        parse_config({"train": {"group_size": 4}})
    with pytest.raises(ConfigError, match=r"`roles.explorers` \+ `roles.executors` must be >= 1: .* \(got 0 \+ 0\)"):
        parse_config({"roles": {"explorers": 0, "executors": 0}})


def test_yaml_roundtrip_and_overrides(tmp_path):
    cfg = parse_config({"name": "rt", "seed": 3, "credit": {"mode": "plain"}, "env": {"kwargs": {"size": 16}}})
    path = tmp_path / "c.yaml"
    path.write_text(dump_config(cfg))
    assert load_config(path) == cfg
    assert load_config(path, {"train.iterations": 7}).train.iterations == 7


# ---------------------------------------------------------------- generated invalid configs
def _fields(model: type[BaseModel]) -> dict:
    return model.model_fields


SECTIONS = {name: f.annotation for name, f in ExperimentConfig.model_fields.items()
            if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)}

bad_values = {
    "int": st.one_of(st.text(min_size=1, max_size=5).filter(lambda s: not s.strip().lstrip("-").isdigit()),
                     st.integers(max_value=-1), st.lists(st.integers(), min_size=1, max_size=2)),
    "float": st.one_of(st.just("fast"), st.floats(min_value=1.5, max_value=1e6),
                       st.floats(max_value=-1e-3, min_value=-1e6)),
}


@st.composite
def invalid_configs(draw):
    """(config mapping, text the error must contain)."""
    kind = draw(st.sampled_from(["unknown_top", "unknown_nested", "bad_value", "bad_literal", "not_mapping", "groups"]))
    if kind == "unknown_top":
        key = draw(st.from_regex(r"[a-z]{3,10}", fullmatch=True)
                   .filter(lambda k: k not in ExperimentConfig.model_fields))
        return {key: 1}, f"unknown key '{key}'"
    section = draw(st.sampled_from(sorted(SECTIONS)))
    model = SECTIONS[section]
    if kind == "unknown_nested":
        key = draw(st.from_regex(r"[a-z_]{3,12}", fullmatch=True).filter(lambda k: k not in model.model_fields))
        return {section: {key: draw(st.integers())}}, f"unknown key '{section}.{key}'"
    if kind == "not_mapping":
        return ({section: draw(st.one_of(st.integers(), st.text(max_size=4), st.lists(st.integers(), max_size=2)))},
                f"'{section}'")
    if kind == "groups":
        g = draw(st.integers(2, 9))
        return {"roles": {"explorers": 1, "executors": g - 1},
                "train": {"episodes_per_iteration": g * draw(st.integers(1, 5)) + 1}}, "episodes_per_iteration"
    numeric = {n: f for n, f in model.model_fields.items()
               if f.annotation in (int, float) or str(f.annotation) in ("int | None",)}
    literal = {n: f for n, f in model.model_fields.items() if "Literal" in str(f.annotation)}
    if kind == "bad_literal" and literal:
        name = draw(st.sampled_from(sorted(literal)))
        return {section: {name: draw(st.sampled_from(["nope", "PPO", 3, "gae"]))}}, f"'{section}.{name}'"
    if not numeric:
        return {section: {"zz_unknown": 1}}, f"unknown key '{section}.zz_unknown'"
    name = draw(st.sampled_from(sorted(numeric)))
    is_int = numeric[name].annotation is not float
    value = draw(bad_values["int" if is_int else "float"])
    if not is_int and isinstance(value, float):
        # a positive float breaks a field only above its upper bound; a negative one, every float field
        above = [m for m in numeric[name].metadata
                 if (getattr(m, "le", None) is not None and value > m.le)
                 or (getattr(m, "lt", None) is not None and value >= m.lt)]
        if value > 0 and not above:
            value = -abs(value) - 1
    return {section: {name: value}}, f"'{section}.{name}'"


@pytest.fixture(scope="module")
def counted():
    seen = []
    yield seen
    assert len(seen) >= 200, f"only {len(seen)} invalid configs were generated"


@settings(max_examples=240, deadline=None)
@given(invalid_configs())
def test_generated_invalid_configs_exit_2_naming_the_key(tmp_path_factory, counted, case):
    data, expected = case
    path = tmp_path_factory.mktemp("cfg") / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["check", str(path)])
    text = err.getvalue()
    assert rc == 2, (data, text)
    assert "Traceback" not in text
    assert expected in text, (data, text)
    assert len(text.strip().splitlines()) == 1 or text.count("error:") == 1
    counted.append(1)


def test_train_defaults_are_consistent():
    config = ExperimentConfig()
    assert config.train.episodes_per_iteration % config.group_size == 0


def test_trainer_section_builds_the_learners_fabric(tmp_path):
    cfg = parse_config({})
    assert (cfg.trainer.accelerator, cfg.trainer.devices, cfg.trainer.precision, cfg.trainer.strategy,
            cfg.trainer.threads) == ("cpu", 1, "32-true", "auto", 1)
    path = tmp_path / "c.yaml"
    path.write_text(dump_config(cfg))
    gpu = load_config(path, {"trainer.accelerator": "cuda", "trainer.devices": yaml.safe_load("[1]")})
    assert gpu.trainer.accelerator == "cuda" and gpu.trainer.devices == [1]
    with pytest.raises(ConfigError, match=r"'trainer.devices': must name one device .* \(got 2\)"):
        parse_config({"trainer": {"devices": 2}})
    with pytest.raises(ConfigError, match=r"'trainer.strategy': not a Fabric strategy; expected 'auto' or one of "
                                          r"\[.*'ddp'.*\(got 'dpp'\)"):
        parse_config({"trainer": {"strategy": "dpp"}})
    with pytest.raises(ConfigError, match=r"'trainer.precision': Input should be '32-true', '64-true'"):
        parse_config({"trainer": {"precision": "fp8"}})


def _leaves(data: dict, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        out += _leaves(value, path + ".") if isinstance(value, dict) and value else [(path, value)]
    return out


@pytest.mark.parametrize("config_file", ["quickstart.yaml", "minigrid_doorkey.yaml"])
def test_an_override_changes_exactly_the_key_it_names_in_every_nested_section(config_file):
    """Setting any key to the value it has leaves the whole config as it was (before, a key of a
    nested section rebuilt the section from its class defaults: roles.executor_noise.start reset
    end and schedule); setting one to a new value changes that key alone."""
    path = ROOT / "configs" / config_file
    base = load_config(path).model_dump(mode="json")
    leaves = [(k, v) for k, v in _leaves(base) if isinstance(v, (int, float, str)) and not isinstance(v, bool)]
    sections = {k.rsplit(".", 1)[0] for k, _ in leaves if "." in k}
    assert {"roles.executor_noise", "roles.explorer_noise", "credit", "train", "rewards.prm"} <= sections
    for key, value in leaves:
        assert load_config(path, {key: value}).model_dump(mode="json") == base, key
    changed = load_config(path, {"roles.executor_noise.anneal_iterations": 50}).model_dump(mode="json")
    diff = {k for (k, v), (_, w) in zip(_leaves(base), _leaves(changed), strict=True) if v != w}
    assert diff == {"roles.executor_noise.anneal_iterations"}


def test_library_factories_take_library_kwargs():
    from gyre_ma.backends.worker import RolloutKit

    single = RolloutKit.from_config(parse_config({"env": {"id": "workflow_v0"}, "manager": {"kind": "random"}}))
    merged = RolloutKit.from_config(parse_config({"env": {"id": "workflow_v0"}, "manager": {"kind": "random"},
                                                  "library_kwargs": {"single_cleaners": False}}))
    assert set(single.library.names) != set(merged.library.names)
    with pytest.raises(ValueError, match=r"library_kwargs: the workflow_v0 library rejected the arguments \['nope'\]"):
        RolloutKit.from_config(parse_config({"env": {"id": "workflow_v0"}, "manager": {"kind": "random"},
                                             "library_kwargs": {"nope": 1}}))


def test_code_files_follow_the_users_modules_beside_the_ones_a_config_names(tmp_path, monkeypatch):
    """``eval`` warns when the user's code changed since training; session 58 hashed only the
    modules the config names, so an edit to the helpers they import went unsaid."""
    from gyre_ma.config import code_files

    project = tmp_path / "project"
    (project / "parts").mkdir(parents=True)
    (project / "userlib.py").write_text("import numpy\nimport helpers\nfrom parts.doors import door\n"
                                        "def make():\n    pass\n")
    (project / "helpers.py").write_text("from . import unused_name\nimport json\n")
    (project / "parts" / "__init__.py").write_text("")
    (project / "parts" / "doors.py").write_text("from .keys import key\ndoor = 1\n")
    (project / "parts" / "keys.py").write_text("key = 1\n")
    (project / "broken.py").write_text("this is not python\n")
    monkeypatch.syspath_prepend(str(project))
    config = parse_config({"env": {"id": "coverage_v0"}, "library": "userlib:make"})
    hashed = code_files(config)
    assert set(hashed) == {str((project / f).resolve()) for f in (
        "userlib.py", "helpers.py", "parts/__init__.py", "parts/doors.py", "parts/keys.py")}
    (project / "parts" / "keys.py").write_text("key = 2\n")  # an edit two imports away
    assert {f for f, digest in code_files(config).items() if hashed[f] != digest} == {
        str((project / "parts" / "keys.py").resolve())}
