"""Loading never executes code: malicious checkpoints are refused and no marker file appears.

Each payload tries to create a marker file when loaded (``gyre-ma eval``, ``--resume``'s
buffer revive, a pickle's ``__reduce__``); every test asserts the refusal and that the
marker was never written.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from gyre_ma.checkpoints import from_storable, load_checkpoint, save_checkpoint, to_storable
from gyre_ma.cli import main
from gyre_ma.config import code_references, load_config
from gyre_ma.loop import Gyre
from gyre_ma.rollout import OptionCall, Trajectory, record_types, trajectory_from_state, trajectory_to_state

ROOT = Path(__file__).resolve().parents[2]
DOORKEY = ROOT / "configs" / "minigrid_doorkey.yaml"


class _Touch:
    """A pickle payload: unpickling it runs ``touch marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    cfg = load_config(DOORKEY, {"run_root": str(tmp_path_factory.mktemp("runs"))})
    gyre = Gyre(cfg)
    try:
        return gyre.state_dict()
    finally:
        gyre.close()


def _evil_config(state, marker: Path) -> dict:
    config = dict(state["config"])
    config["env"] = {"id": "subprocess:run", "kwargs": {"args": ["touch", str(marker)]}}
    return dict(state, config=config)


def test_eval_refuses_a_checkpoint_whose_config_names_code(state, tmp_path, capsys):
    marker = tmp_path / "MARKER"
    evil = save_checkpoint(tmp_path / "evil.pt", _evil_config(state, marker))
    assert main(["eval", str(evil), "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert "subprocess:run" in err and "--trust-config" in err and "env.id" in err
    assert not marker.exists()


def test_code_references_lists_every_key_that_imports_code(state):
    from gyre_ma.config import parse_config

    raw = dict(state["config"], library="my_pkg.libs:make", manager={"kind": "scripted", "policy": "pkg:Oracle"},
               env={"id": "techtree_v0", "kwargs": {"size": 8}})
    refs = dict(code_references(parse_config(raw)))
    assert refs == {"library": "my_pkg.libs:make", "manager.policy": "pkg:Oracle"}
    assert code_references(parse_config(dict(state["config"], env={"id": "techtree_v0"}, library=None))) == []


@pytest.mark.parametrize("where", ["class", "breakdown"])
def test_a_stored_trajectory_cannot_name_a_callable(tmp_path, where):
    marker = tmp_path / "MARKER"
    call = OptionCall(agent="agent_0", agent_index=0, option=0, observation=[0.0], mask=[True], achieved=frozenset(),
                      last_option=-1, time_fraction=0.0, log_prob=0.0, value=0.0, start_step=0, policy_version=0,
                      task_seed=1)
    good = trajectory_to_state(Trajectory(task_seed=1, policy_version=0, calls=[call]))
    assert isinstance(trajectory_from_state(good), Trajectory)
    payload = {"dataclass": "subprocess:run", "fields": {"args": ["touch", str(marker)]}}
    bad = dict(good, **{"class": "subprocess:run"}) if where == "class" else dict(
        good, calls=[dict(good["calls"][0], breakdown=payload)])
    with pytest.raises(ValueError, match="not one of gyre-ma's record types"):
        trajectory_from_state(bad)
    # the breakdown payload would run `touch` if revived; the class one is refused by name (built
    # with the trajectory's own fields, subprocess.run would fail before running anything)
    assert not marker.exists()
    assert "gyre_ma.rollout:Trajectory" in record_types()


def test_buffer_revive_in_a_checkpoint_is_refused_on_resume(state, tmp_path):
    marker = tmp_path / "MARKER"
    cfg = load_config(DOORKEY, {"run_root": str(tmp_path), "buffer.enabled": True, "train.iterations": 1})
    gyre = Gyre(cfg)
    try:
        gyre.iteration(0)
        saved = gyre.state_dict()
    finally:
        gyre.close()
    stored = repr(saved["buffer"])  # trajectories and their calls' breakdowns stored by record type
    assert "gyre_ma.roles:RoleTrajectory" in stored and "gyre_ma.rewards.breakdown:RewardBreakdown" in stored
    touch = {"dataclass": "subprocess:run", "fields": {"args": ["touch", str(marker)]}}
    for evil in (_replace_class(saved, "gyre_ma.roles:RoleTrajectory", "subprocess:run"),
                 _replace_first_record(saved, "gyre_ma.rewards.breakdown:RewardBreakdown", touch)):
        assert repr(evil["buffer"]) != stored
        gyre = Gyre(cfg)
        try:
            with pytest.raises(ValueError, match="record types"):
                gyre.load_state_dict(from_storable(to_storable(evil)))
        finally:
            gyre.close()
    assert not marker.exists()  # the touch, had the breakdown been revived


def _replace_first_record(node, name: str, payload: dict):
    """``node`` with the first stored record of type ``name`` replaced by ``payload``."""
    done = False

    def walk(n):
        nonlocal done
        if done:
            return n
        if isinstance(n, dict):
            if n.get("dataclass") == name and set(n) == {"dataclass", "fields"}:
                done = True
                return payload
            return {k: walk(v) for k, v in n.items()}
        if isinstance(n, list):
            return [walk(v) for v in n]
        return n

    return walk(node)


def _replace_class(node, old: str, new: str):
    if isinstance(node, dict):
        return {k: (new if isinstance(v, str) and v == old else _replace_class(v, old, new)) for k, v in node.items()}
    if isinstance(node, list):
        return [_replace_class(v, old, new) for v in node]
    return node


@pytest.mark.parametrize("kind", ["zip", "legacy", "raw_pickle"])
def test_pickle_payloads_are_refused_without_advising_weights_only_false(tmp_path, kind):
    marker = tmp_path / "MARKER"
    path = tmp_path / "evil.pt"
    payload = {"policy": _Touch(marker), "config": {}}
    if kind == "raw_pickle":
        path.write_bytes(pickle.dumps(payload))
    else:
        torch.save(payload, path, _use_new_zipfile_serialization=kind == "zip")
    with pytest.raises(ValueError) as info:
        load_checkpoint(path)
    assert "weights_only" not in str(info.value) and str(path) in str(info.value)
    assert not marker.exists()


def test_random_bytes_or_a_cut_file_are_called_damaged_and_code_is_called_refused(tmp_path):
    """Random bytes read as a pickle the weights-only loader refuses: they were called
    "refused ... would run code" rather than damaged."""
    good = tmp_path / "good.pt"
    torch.save({"policy": {"w": torch.ones(3)}, "config": {}}, good)
    files = {"random.pt": np.random.default_rng(0).bytes(4000), "cut.pt": good.read_bytes()[:200],
             "empty.pt": b""}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match=f"checkpoint '.*{name}' cannot be read: it is damaged or not a "
                                             "checkpoint"):
            load_checkpoint(tmp_path / name)
    evil = tmp_path / "evil.pt"
    torch.save({"policy": _Touch(tmp_path / "MARKER"), "config": {}}, evil)
    with pytest.raises(ValueError, match="was refused: it holds objects other than tensors"):
        load_checkpoint(evil)
    assert load_checkpoint(good)["policy"]["w"].sum() == 3


def test_a_stored_random_generator_names_only_numpy_bit_generators():
    with pytest.raises(ValueError, match="random generator"):
        from_storable({"__gyre_numpy_generator__": {"bit_generator": "seed", "state": {}}})


def test_eval_finds_the_checkpoint_of_a_run_directory_or_config(tmp_path, capsys):
    assert main(["train", str(DOORKEY), "--iterations", "1", "--run-root", str(tmp_path), "--quiet"]) == 0
    run_dir = tmp_path / "minigrid_doorkey"
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "1"]) == 2  # its config names gyre-ma's minigrid factories
    assert "--trust-config" in capsys.readouterr().err
    assert main(["eval", str(run_dir), "--episodes", "1", "--trust-config"]) == 0
    out = capsys.readouterr().out
    assert f"evaluating {run_dir / 'checkpoints' / 'final.pt'}" in out
    assert "trusting the config" in out and "gyre_ma.envs.minigrid_doorkey:make_env" in out
    assert main(["eval", str(run_dir / "checkpoints" / "latest.pt"), "--episodes", "1", "--config", str(DOORKEY)]) == 0
    assert "trusting" not in capsys.readouterr().out  # the user's own config: nothing to trust
    own = tmp_path / "own.yaml"
    own.write_text(DOORKEY.read_text() + f"\nrun_root: '{tmp_path}'\n")
    assert main(["eval", str(own), "--episodes", "1"]) == 0  # a config: its run's checkpoint, with that config
    out = capsys.readouterr().out
    assert f"evaluating {run_dir / 'checkpoints' / 'final.pt'}" in out and "trusting" not in out
    assert main(["eval", str(tmp_path), "--episodes", "1"]) == 2
    assert "holds no checkpoint" in capsys.readouterr().err
    # held-out seeds stay below 2^30, where validation's and training's begin
    assert main(["eval", str(own), "--episodes", "5", "--seed", str((1 << 30) - 2)]) == 2
    assert "--seed: held-out task seeds 1073741822..1073741826 must lie in [0, 2^30" in capsys.readouterr().err


def test_a_manifest_pointing_outside_the_run_directory_is_refused(tmp_path):
    import json

    from gyre_ma.checkpoints import CheckpointManager

    outside = tmp_path / "outside.pt"
    save_checkpoint(outside, {"policy": {}, "config": {}})
    folder = tmp_path / "run" / "checkpoints"
    manager = CheckpointManager(folder)
    manager.save("latest", {"policy": {}, "config": {}}, step=0)
    manifest = json.loads((folder / "manifest.json").read_text())
    for evil in ("../../outside.pt", str(outside), "latest.pt/../../outside.pt"):
        manifest["slots"]["latest"]["file"] = evil
        (folder / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(ValueError, match="not a slot file of this folder"):
            CheckpointManager(folder)
    assert outside.is_file()  # a crafted manifest made nothing delete or move it


def test_a_checkpoint_zip_with_extra_members_runs_none_of_them(state, tmp_path):
    import zipfile

    marker = tmp_path / "MARKER"
    path = save_checkpoint(tmp_path / "ck.pt", state)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("archive/evil.py", f"import os; os.system('touch {marker}')\n")
        archive.writestr("archive/data.pkl.bak", pickle.dumps(_Touch(marker)))
    try:
        load_checkpoint(path)  # torch reads the members it knows; loading may succeed or refuse
    except ValueError:
        pass
    assert not marker.exists()
