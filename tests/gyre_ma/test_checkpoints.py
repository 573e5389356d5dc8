"""CheckpointManager: atomic slots under SIGKILL, hash-checked loads, rollback, NaN guard."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import time

import numpy as np
import pytest
import torch
from torch import nn

from gyre_ma.checkpoints import (
    CheckpointManager,
    NanGuard,
    apply_lr_scale,
    from_storable,
    load_checkpoint,
    parameter_step_size,
    restore_rng,
    rng_snapshot,
    save_checkpoint,
    to_storable,
)


def test_single_file_checkpoints_still_round_trip(tmp_path):
    model = nn.LayerNorm(2)
    state = {"policy": model.state_dict(), "config": {"a": 1}, "obs": np.arange(3, dtype=np.float32)}
    path = save_checkpoint(tmp_path / "ck" / "final.pt", state)
    back = load_checkpoint(path)
    assert back["policy"]._metadata == model.state_dict()._metadata and (back["obs"] == state["obs"]).all()
    nn.LayerNorm(2).load_state_dict(back["policy"])
    assert not [p for p in path.parent.iterdir() if p.name != "final.pt"]
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(ValueError, match="cannot be read"):
        load_checkpoint(path)


def test_nested_state_and_rng_states_round_trip_with_weights_only(tmp_path):
    gen = np.random.default_rng(7)
    tgen = torch.Generator().manual_seed(3)
    state = {
        "policy": {"w": torch.randn(3, 2), "step": torch.tensor(4)},
        "ints": [1, 2**70, -3], "floats": (0.5, math.inf), "name": "run", "flag": True, "none": None,
        "arrays": [np.arange(6, dtype=np.uint32).reshape(2, 3), np.array(2.5), np.zeros(0, np.int8),
                   np.array([True, False])],
        "scalar": np.float32(1.5), "generator": gen, 3: {"nested": [{"deep": np.int64(9)}]},
        "rng": rng_snapshot(torch_generators={"minibatch": tgen}, numpy_generators={"env": gen}),
    }
    manager = CheckpointManager(tmp_path)
    manager.save("latest", state, step=4)
    back = manager.load("latest")
    assert torch.equal(back["policy"]["w"], state["policy"]["w"]) and back["policy"]["step"].item() == 4
    assert back["ints"] == [1, 2**70, -3] and back["floats"] == (0.5, math.inf) and back["name"] == "run"
    assert back["flag"] is True and back["none"] is None and back["scalar"] == 1.5
    for a, b in zip(back["arrays"], state["arrays"], strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and (a == b).all()
    assert back[3]["nested"][0]["deep"] == 9
    expected_draws = (gen.random(3), torch.rand(2), torch.rand(2, generator=tgen), random.random(),
                      np.random.rand())
    assert back["generator"].random(3).tolist() == expected_draws[0].tolist()
    restore_rng(back["rng"], torch_generators={"minibatch": tgen}, numpy_generators={"env": gen})
    again = (gen.random(3), torch.rand(2), torch.rand(2, generator=tgen), random.random(), np.random.rand())
    assert again[0].tolist() == expected_draws[0].tolist()
    assert torch.equal(again[1], expected_draws[1]) and torch.equal(again[2], expected_draws[2])
    assert again[3:] == expected_draws[3:]
    with pytest.raises(TypeError, match=r"state\.bad\.x: cannot store a set"):
        to_storable({"bad": {"x": {1, 2}}})
    assert from_storable(to_storable({"t": (np.int16(2),)})) == {"t": (2,)}


def test_corrupt_missing_or_unknown_slots_are_errors_naming_the_slot(tmp_path):
    manager = CheckpointManager(tmp_path)
    with pytest.raises(ValueError, match="slot 'best' is empty"):
        manager.load("best")
    with pytest.raises(ValueError, match=r"slot 'newest' does not exist; expected one of \['latest'"):
        manager.save("newest", {})
    path = manager.save("latest", {"w": torch.zeros(100)})
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert manager.verify() == {"latest": False}
    with pytest.raises(ValueError, match="slot 'latest'.*SHA-256.*corrupt or replaced"):
        manager.load("latest")
    manager.save("best", {"w": torch.ones(1)})
    manager.path("best").unlink()
    with pytest.raises(ValueError, match="slot 'best'.*cannot be read"):
        CheckpointManager(tmp_path).load("best")
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="manifest.*cannot be read"):
        CheckpointManager(tmp_path)


def _save_forever(directory, start: int) -> None:
    """Child process: save in a loop until killed. numpy builds the tensors (no OpenMP after fork)."""
    manager = CheckpointManager(directory)
    step = start
    while True:
        step += 1
        state = {"policy": torch.from_numpy(np.full(1 << 20, step, dtype=np.float32)), "step": step,
                 "rng": rng_snapshot()}
        manager.save("latest", state, step=step)
        if step % 3 == 0:
            manager.save("best", state, step=step)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_sigkill_during_saves_always_leaves_a_loadable_latest_that_agrees_with_the_manifest(tmp_path):
    CheckpointManager(tmp_path).save("latest", {"policy": torch.zeros(1 << 20), "step": 0}, step=0)
    rng = random.Random(0)
    last_step, interrupted = 0, 0
    for kills in range(1, 201):  # 24 kills, or more until some landed mid-save (a busy machine starves the child)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            try:
                _save_forever(tmp_path, last_step)
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.005, 0.08))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        manifest = json.loads((tmp_path / "manifest.json").read_text())
        named = {rec["file"] for rec in manifest["slots"].values()}
        stable = {f"{slot}.pt" for slot in manifest["slots"]}
        interrupted += any(p.name.endswith(".tmp") or (p.suffix == ".pt" and p.name not in named | stable)
                           for p in tmp_path.iterdir())
        manager = CheckpointManager(tmp_path)  # removes the leftovers, re-points the stable names
        assert all(manager.verify().values())
        assert {p.name for p in tmp_path.iterdir()} == named | stable | {"manifest.json"}
        for slot in manifest["slots"]:
            assert (tmp_path / f"{slot}.pt").read_bytes() == manager.path(slot).read_bytes()
        state = manager.load("latest")
        step = state["step"]
        assert step >= last_step and bool((state["policy"] == step).all())
        assert manager.manifest["slots"]["latest"]["step"] == step
        if manager.has("best"):
            assert manager.load("best")["step"] % 3 == 0
        last_step = step
        if kills >= 24 and last_step > 0 and interrupted > 0:
            break
    assert last_step > 0 and interrupted > 0  # the kills did land mid-save


def _policy(seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(4, 2)


def _state(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    return {"policy": model.state_dict(), "optimizer": opt.state_dict()}


def test_validation_drop_rolls_back_to_exactly_the_best_and_cuts_the_lr(tmp_path):
    model = _policy(0)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    manager = CheckpointManager(tmp_path, rollback_threshold=0.1, lr_cut=0.5)
    assert manager.validate(0.5, _state(model, opt), step=1).action == "improved"
    best = {k: v.clone() for k, v in model.state_dict().items()}
    for step, score in ((2, 0.45), (3, 0.3)):
        model(torch.randn(8, 4)).pow(2).sum().backward()
        opt.step()
        decision = manager.validate(score, _state(model, opt), step=step)
    assert decision.rolled_back and decision.purge_latest_batch and decision.lr_scale == 0.5
    model.load_state_dict(decision.state["policy"])
    opt.load_state_dict(decision.state["optimizer"])
    apply_lr_scale(opt, decision.lr_scale)
    assert all(torch.equal(best[k], v) for k, v in model.state_dict().items())
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    assert manager.load("latest")["policy"]["weight"].equal(best["weight"])  # resume from the restored state
    decision = manager.validate(float("nan"), _state(model, opt), step=4)  # a broken score rolls back too
    apply_lr_scale(opt, decision.lr_scale)
    assert decision.rolled_back and opt.param_groups[0]["lr"] == pytest.approx(0.025)
    reopened = CheckpointManager(tmp_path)
    assert [r.step for r in reopened.rollbacks] == [3, 4] and reopened.lr_scale == 0.25
    assert reopened.best_score == 0.5 and "0.3 < best 0.5" in reopened.rollbacks[0].reason
    assert reopened.validate(0.7, _state(model, opt)).action == "improved" and reopened.best_score == 0.7


def test_large_updates_keep_the_pre_update_state(tmp_path):
    manager = CheckpointManager(tmp_path, large_update_kl=0.05, large_update_step=0.1)
    model = _policy(1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert not manager.after_update({"policy": before}, kl=0.01, step_size=0.01)
    assert not manager.has("pre_update")
    with torch.no_grad():
        model.weight.mul_(1.5)
    step = parameter_step_size(before, model.state_dict())
    assert step > 0.1
    assert manager.after_update({"policy": before}, kl=0.01, step_size=step, step=7)
    assert torch.equal(manager.load("pre_update")["policy"]["weight"], before["weight"])
    assert manager.is_large_update(kl=float("nan")) and manager.is_large_update(kl=0.2)


def test_nan_guard_skips_and_asks_for_a_rollback_after_k_in_a_row(tmp_path):
    manager = CheckpointManager(tmp_path)
    model = _policy(2)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    manager.validate(1.0, _state(model, opt))
    good = {k: v.clone() for k, v in model.state_dict().items()}
    guard = NanGuard(max_consecutive=3)
    assert not guard.check(loss=torch.tensor(0.3), rewards=np.ones(3)).skip
    assert guard.check(loss=torch.tensor(0.3), rewards=[1.0, math.nan]).skip
    assert not guard.check(loss=1.0).skip  # a finite update resets the count
    decisions = [guard.check(loss=torch.tensor(math.inf), advantages=torch.zeros(2)) for _ in range(3)]
    assert [d.consecutive for d in decisions] == [1, 2, 3]
    assert [d.rollback for d in decisions] == [False, False, True]
    assert "non-finite loss (3 in a row)" == decisions[-1].reason
    with torch.no_grad():
        model.weight.fill_(math.nan)
    rollback = manager.rollback(reason=decisions[-1].reason, step=9)
    model.load_state_dict(rollback.state["policy"])
    apply_lr_scale(opt, rollback.lr_scale)
    assert all(torch.equal(good[k], v) for k, v in model.state_dict().items())
    assert opt.param_groups[0]["lr"] == 0.5 and guard.consecutive == 0 and guard.total_skipped == 4
    with pytest.raises(ValueError, match="cannot roll back.*all empty"):
        CheckpointManager(tmp_path / "empty").rollback(reason="nan")


def test_slots_judged_as_latest_are_copied_not_serialised_again(tmp_path, monkeypatch):
    model = _policy(3)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    manager = CheckpointManager(tmp_path, large_update_kl=0.05)
    with pytest.raises(ValueError, match="cannot copy checkpoint slot 'latest' to 'best': 'latest' is empty"):
        manager.promote("latest", "best")
    manager.save("latest", _state(model, opt), step=4)
    saves = []
    monkeypatch.setattr(torch, "save", lambda *a, **k: saves.append(a) or pytest.fail("serialised again"))
    assert manager.validate(0.5, None, step=5).action == "improved"          # best ← the latest file
    assert manager.after_update(None, kl=0.2, step=5)                          # pre_update ← it too
    slots = manager.manifest["slots"]
    assert slots["best"]["sha256"] == slots["latest"]["sha256"] == slots["pre_update"]["sha256"]
    assert manager.path("best").read_bytes() == manager.path("latest").read_bytes()
    for slot in ("best", "latest", "pre_update"):  # each slot under a stable name, for gyre-ma eval
        assert (tmp_path / f"{slot}.pt").read_bytes() == manager.path(slot).read_bytes()
    assert manager.validate(0.45, None, step=6).action == "kept" and slots["latest"]["step"] == 4
    assert not saves and manager.verify() == {"latest": True, "best": True, "pre_update": True}


def test_one_serialisation_fills_several_slots(tmp_path, monkeypatch):
    model = _policy(4)
    manager = CheckpointManager(tmp_path)
    calls = []
    real = torch.save
    monkeypatch.setattr(torch, "save", lambda *a, **k: calls.append(1) or real(*a, **k))
    manager.save(("best", "latest"), {"policy": model.state_dict()}, step=1)
    assert len(calls) == 1 and manager.has("best") and manager.has("latest")
    assert torch.equal(manager.load("best")["policy"]["weight"], model.weight)


def test_a_large_first_update_before_any_latest_slot_does_not_fail(tmp_path):
    """The generalisation benchmark crashed ('latest' is empty) on a run whose very first
    update was large: there is no earlier state to keep, and that is no error."""
    manager = CheckpointManager(tmp_path, large_update_kl=0.01)
    assert manager.after_update(None, kl=1.0, step=0) is True
    assert not manager.has("pre_update")
    manager.save("latest", {"w": torch.zeros(1)}, step=0)
    assert manager.after_update(None, kl=1.0, step=1) and manager.has("pre_update")


def _strict(text: str):
    def refuse(token):
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def test_a_rollback_on_a_nan_score_writes_a_strict_json_manifest(tmp_path):
    """``json.loads`` accepts ``NaN``; other readers do not: the manifest records null."""
    from gyre_ma.files import strict_json

    ck = CheckpointManager(tmp_path)
    ck.save("latest", {"w": torch.zeros(1)}, step=0)
    ck.validate(0.5, None, step=0)
    decision = ck.validate(float("nan"), None, step=1)
    assert decision.rolled_back
    manifest = _strict((tmp_path / "manifest.json").read_text())
    assert manifest["rollbacks"][0]["score"] is None
    assert CheckpointManager(tmp_path).rollbacks[0].score is None  # and it reads back
    assert _strict(strict_json({"a": [float("inf"), 1.0]})) == {"a": [None, 1.0]}


def test_loading_a_slot_by_its_file_or_link_checks_the_manifest_hash(tmp_path):
    """A session-54 user corrupted ``latest.pt`` in place: ``train --resume`` refused it (the
    manifest's hash), ``gyre-ma eval`` of the same file evaluated it."""
    from gyre_ma.checkpoints import load_checkpoint

    manager = CheckpointManager(tmp_path)
    slot = manager.save("latest", {"policy": {"w": torch.zeros(100)}, "config": {}})
    link = tmp_path / "latest.pt"
    assert link.is_file() and os.path.samefile(link, slot)
    assert torch.equal(load_checkpoint(link)["policy"]["w"], torch.zeros(100))
    data = bytearray(slot.read_bytes())
    data[len(data) // 2] ^= 0xFF
    with open(link, "r+b") as f:  # in place: the slot file is the same file
        f.write(bytes(data))
    for path in (link, slot):
        with pytest.raises(ValueError, match=r"is the run's 'latest' slot, but its SHA-256 is not the one the "
                                             r"folder's manifest.json records"):
            load_checkpoint(path)
    copy = tmp_path / "elsewhere" / "latest.pt"  # a file with no manifest beside it is not checked
    copy.parent.mkdir()
    copy.write_bytes(CheckpointManager(tmp_path / "fresh").save("latest", {"policy": {}, "config": {}}).read_bytes())
    assert load_checkpoint(copy)["config"] == {}


def test_a_final_checkpoint_recorded_in_the_manifest_is_checked_when_loaded(tmp_path):
    """``final.pt``, what ``gyre-ma eval RUN_DIR`` takes, had no hash: flipped in place it
    evaluated as if whole."""
    from gyre_ma.checkpoints import load_checkpoint, save_checkpoint

    manager = CheckpointManager(tmp_path)
    manager.save("latest", {"policy": {}, "config": {}})
    final = save_checkpoint(tmp_path / "final.pt", {"policy": {"w": torch.ones(50)}, "config": {}})
    manager.record_file(final)
    assert torch.equal(load_checkpoint(final)["policy"]["w"], torch.ones(50))
    assert CheckpointManager(tmp_path).verify() == {"latest": True}  # the slots are as they were
    data = bytearray(final.read_bytes())
    data[len(data) // 2] ^= 0xFF
    final.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"is the run's final.pt, but its SHA-256 is not the one the folder's "
                                         r"manifest.json records"):
        load_checkpoint(final)
