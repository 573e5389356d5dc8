from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from gyre_ma.agents.noise import NO_NOISE, ActionNoise, AnnealSchedule, NoiseSetting, ParamNoise, RoleNoise
from gyre_ma.backends.worker import RolloutKit, RolloutWorker, policy_weights
from gyre_ma.config import load_config, parse_config
from gyre_ma.roles import (
    Evaluator,
    Explorer,
    RoleTrajectory,
    RolloutTask,
    evaluation_tasks,
    iteration_tasks,
    milestone_score,
    validation_tasks,
)
from gyre_ma.rollout import Trajectory

ROOT = Path(__file__).resolve().parents[2]
DOORKEY = load_config(ROOT / "configs" / "minigrid_doorkey.yaml")
WORKFLOW_ORACLE = parse_config({"env": {"id": "workflow_v0"}, "manager": {"kind": "oracle"}})


def fingerprint(t: Trajectory) -> tuple:
    calls = tuple((c.agent, c.option, c.log_prob, c.value, c.duration, c.reward, c.milestones, c.termination)
                  for c in t.calls)
    return (t.task_seed, t.policy_version, t.length, tuple(sorted(t.milestone_steps.items())), t.success,
            t.total_reward, calls)


@pytest.fixture(scope="module")
def doorkey():
    worker = RolloutWorker(DOORKEY)
    torch.manual_seed(0)
    with torch.no_grad():  # a policy with opinions, so noise and greed show
        for p in worker.kit.policy.parameters():
            p.normal_(0, 0.5)
    return worker, policy_weights(worker.kit.policy, worker.kit.critic)


@pytest.fixture(scope="module")
def workflow():
    return RolloutWorker(WORKFLOW_ORACLE)


def test_an_evaluation_stream_seeds_apart_from_the_version_and_from_training():
    task = RolloutTask("executor", 7, stream=0)
    assert task.manager_seed(0) == task.manager_seed(99)
    assert RolloutTask("executor", 7, stream=1).manager_seed(0) != task.manager_seed(0)
    assert RolloutTask("executor", 7, greedy=True, stream=0).manager_seed(0) != task.manager_seed(0)
    assert task.manager_seed(0) not in {RolloutTask("executor", 7).manager_seed(v) for v in range(1000)}
    assert evaluation_tasks(range(3), greedy=True, stream=2) == [RolloutTask("executor", s, greedy=True, stream=2)
                                                                 for s in range(3)]
    with pytest.raises(ValueError, match="task stream must be None or an int >= 0, got -1"):
        RolloutTask("executor", 7, stream=-1)


def test_held_out_evaluation_plays_the_same_weights_alike_whatever_their_version(doorkey):
    """Evaluation tasks draw from their stream, not the policy version: two versions of the
    same weights play the same episodes (and two policies share their random numbers), while
    training tasks draw afresh at each version."""
    worker, weights = doorkey

    def play(tasks, version):
        return [fingerprint(worker.run(t, weights, version))[2:] for t in tasks]  # all but seed and version

    seeds = range(40, 52)
    paired = evaluation_tasks(seeds)
    assert play(paired, 5) == play(paired, 6)
    training = [RolloutTask("executor", s) for s in seeds]
    assert play(training, 5) != play(training, 6)
    assert play(evaluation_tasks(seeds, stream=1), 5) != play(paired, 5)


def test_a_role_plays_whole_episodes_with_its_version_and_metadata(doorkey):
    worker, weights = doorkey
    task = RolloutTask("executor", 11, 2, NoiseSetting("param", 0.3))
    traj = worker.run(task, weights, 5)
    assert isinstance(traj, RoleTrajectory) and isinstance(traj, Trajectory)
    assert traj.policy_version == 5 and all(c.policy_version == 5 for c in traj.calls)
    assert (traj.role, traj.episode, traj.noise, traj.task_seed) == ("executor", 2, task.noise, 11)
    assert traj.step_cap == 100 and traj.calls[-1].termination is not None


def test_same_task_same_trajectory_other_episode_other_perturbation(doorkey):
    worker, weights = doorkey
    task = RolloutTask("explorer", 3, 0, NoiseSetting("param", 1.0))
    first, again = worker.run(task, weights, 1), worker.run(task, weights, 1)
    assert fingerprint(first) == fingerprint(again)
    others = {fingerprint(worker.run(dataclasses.replace(task, episode=e), weights, 1)) for e in range(1, 5)}
    assert len(others | {fingerprint(first)}) > 1


def test_weights_are_loaded_from_the_state_dict(doorkey):
    worker, weights = doorkey
    fresh = RolloutWorker(DOORKEY)
    fresh.run(RolloutTask("executor", 0), weights, 9)
    for p, q in zip(fresh.kit.policy.parameters(), worker.kit.policy.parameters(), strict=True):
        assert torch.equal(p, q)
    with pytest.raises(ValueError, match="needs weights with a 'policy'"):
        fresh.run(RolloutTask("executor", 0), None, 10)


def test_evaluator_runs_greedy_noise_free_validation(doorkey):
    worker, weights = doorkey
    noisy = RolloutTask("evaluator", 4, 0, NoiseSetting("param", 5.0), greedy=True)
    val = worker.run(noisy, weights, 2)
    plain = worker.run(RolloutTask("evaluator", 4, greedy=True), weights, 2)
    assert fingerprint(val) == fingerprint(plain) and val.greedy
    sampled = worker.run(RolloutTask("evaluator", 4, 0, NoiseSetting("param", 5.0)), weights, 2)
    assert not sampled.greedy and sampled.noise == plain.noise  # sampled validation: noise-free too
    kit = worker.kit
    # every choice was the unperturbed policy's argmax among the options the agent had not
    # tried since its milestones last changed (the greedy manager's rule against stalling)
    tried: set[int] = set()
    achieved = None
    for c in val.calls:
        if c.achieved != achieved:
            tried, achieved = set(), c.achieved
        allowed = c.mask.copy()
        allowed[list(tried)] = False
        if not allowed.any():
            allowed, tried = c.mask, set()
        x = torch.from_numpy(kit.featurizer(c))[None]
        with torch.no_grad():
            logits = kit.policy(x, torch.tensor([c.agent_index]), torch.from_numpy(allowed)[None])
        assert c.option == int(logits.argmax())
        tried.add(c.option)
    assert validation_tasks([1, 2]) == [RolloutTask("evaluator", 1, 0, NO_NOISE, True),
                                        RolloutTask("evaluator", 2, 0, NO_NOISE, True)]


def test_explorer_marks_good_trajectories_elite(workflow):
    explorer = workflow.run(RolloutTask("explorer", 0), None, 0)
    executor = workflow.run(RolloutTask("executor", 0), None, 0)
    assert explorer.success and explorer.elite and explorer.score == 1.0
    assert executor.success and not executor.elite
    short = RolloutTask("explorer", 0, max_steps=40)
    assert not workflow.run(short, None, 0).elite
    lenient = workflow.kit.play(short, 0, role=Explorer(elite_min_score=0.01))
    assert not lenient.success and lenient.elite and 0 < lenient.score < 1


def test_evaluator_verifies_claims_on_environment_state(workflow):
    kit = workflow.kit
    traj = workflow.run(RolloutTask("explorer", 1), None, 0)
    assert Evaluator.verify(kit, traj).ok

    forged = dataclasses.replace(traj, milestone_steps={**traj.milestone_steps, "model_fit": 1})
    v = Evaluator.verify(kit, forged)
    assert not v.ok and "model_fit" in v.problem  # claimed at a step it was not verified

    partial = RolloutTask("explorer", 1, max_steps=60)
    cut = workflow.run(partial, None, 0)
    cut_claims = dataclasses.replace(cut, milestone_steps={**cut.milestone_steps, "submission_verified": 50},
                                     success=True)
    v = Evaluator.verify(kit, cut_claims)
    assert not v.ok and "submission_verified" in v.problem and "submission_verified" not in v.verified

    swapped = dataclasses.replace(traj, calls=[dataclasses.replace(c, option=kit.library.index("wait"))
                                               for c in traj.calls])
    assert not Evaluator.verify(kit, swapped).ok


def test_evaluator_check_clears_elite_on_failed_verification(workflow):
    good = workflow.run(RolloutTask("explorer", 2), None, 0)
    bad = dataclasses.replace(workflow.run(RolloutTask("explorer", 3), None, 0), calls=[])
    plain = workflow.run(RolloutTask("executor", 2), None, 0)
    assert good.elite and bad.elite
    counts = Evaluator().check(workflow.kit, [good, bad, plain])
    assert counts == {"evaluator/verified": 2.0, "evaluator/rejected": 1.0}
    assert good.elite and good.verified and not bad.elite and bad.verified is False and plain.verified is None


def test_milestone_score_is_a_share_of_the_graph_reward(workflow):
    graph = workflow.kit.library.graph
    t = Trajectory(task_seed=0, policy_version=0, milestone_steps={"api_extract": 3})
    total = sum(graph.milestone(m).reward for m in graph.names)
    assert milestone_score(t, graph) == pytest.approx(graph.milestone("api_extract").reward / total)


def test_tasks_are_validated_and_planned_per_role():
    with pytest.raises(ValueError, match=r"one of \['explorer', 'executor', 'evaluator'\], got 'critic'"):
        RolloutTask("critic", 0)
    assert RolloutTask.coerce(("explorer", 5, 2)) == RolloutTask("explorer", 5, 2)
    noise = {"explorer": NoiseSetting("param", 0.5), "executor": NoiseSetting("param", 0.05)}
    tasks = iteration_tasks(seeds=[10, 20], explorers=1, executors=3, noise=noise)
    assert [(t.role, t.task_seed, t.episode) for t in tasks[:4]] == [
        ("executor", 10, 0), ("executor", 10, 1), ("executor", 10, 2), ("explorer", 10, 3)]
    assert {t.noise for t in tasks if t.role == "explorer"} == {noise["explorer"]}
    assert len({t.manager_seed(0) for t in tasks}) == len(tasks)


def test_kit_builds_baseline_managers_too():
    random_kit = RolloutKit.from_config(parse_config({"env": {"id": "workflow_v0"}, "manager": {"kind": "random"}}))
    assert not random_kit.learns
    a = random_kit.play(RolloutTask("executor", 0), 0)
    b = random_kit.play(RolloutTask("executor", 0), 0)
    assert fingerprint(a) == fingerprint(b)


def test_role_noise_updates_each_role_and_logs_per_role(doorkey):
    worker, _ = doorkey
    policy = worker.kit.policy
    noise = RoleNoise({"explorer": ParamNoise(AnnealSchedule(0.3, 0.1, 2), seed=1, adaptation=1.01, adapt_steps=1),
                       "executor": ActionNoise("epsilon", AnnealSchedule(0.1, 0.01, 2))})
    traj = worker.run(RolloutTask("executor", 5), None, worker.kit.version)
    features = torch.from_numpy(np.stack([worker.kit.featurizer(c) for c in traj.calls]))
    agent = torch.tensor([c.agent_index for c in traj.calls])
    mask = torch.from_numpy(np.stack([c.mask for c in traj.calls]))
    noise.observe(features, agent, mask)
    before = noise.settings()
    metrics = noise.update(policy)
    assert set(metrics) == {"noise/explorer/sigma", "noise/explorer/delta", "noise/explorer/distance",
                            "noise/executor/epsilon", "noise/executor/distance"}
    assert before["executor"] == NoiseSetting("epsilon", 0.1)
    assert noise.settings()["executor"].scale == pytest.approx(0.055)
    assert noise.settings()["explorer"].scale != before["explorer"].scale
    restored = RoleNoise({"explorer": ParamNoise(AnnealSchedule(0.3, 0.1, 2), seed=9, adaptation=1.01, adapt_steps=1),
                          "executor": ActionNoise("epsilon", AnnealSchedule(0.1, 0.01, 2))})
    restored.load_state_dict(noise.state_dict())
    assert restored.settings() == noise.settings() and restored.metrics() == noise.metrics()
    with pytest.raises(ValueError, match="unknown roles"):
        RoleNoise({"critic": ParamNoise(0.05, adaptation=1.01, adapt_steps=1)})


def test_building_a_worker_leaves_the_callers_torch_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    RolloutWorker(DOORKEY)
    assert torch.equal(torch.rand(3), expected)


def test_a_user_supplies_the_reference_manager_for_any_env(tmp_path, capsys):
    """manager.kind: scripted with manager.policy: module:callable (before, only the two
    built-in envs had an oracle, and `gyre-ma check` said ok on a config training then refused)."""
    from gyre_ma.cli import main
    from gyre_ma.config import ConfigError
    from gyre_ma.loop import Gyre

    cfg = parse_config({"env": {"id": "workflow_v0"}, "train": {"episodes_per_iteration": 4},
                        "manager": {"kind": "scripted", "policy": "gyre_ma.envs.workflow.oracle:OracleManager"}})
    gyre = Gyre(cfg)
    metrics = gyre.iteration(0)
    assert metrics["success_rate"] >= 0.75 and "policy_loss" not in metrics
    with pytest.raises(ConfigError, match="'scripted' needs `policy`"):
        parse_config({"manager": {"kind": "scripted"}})
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: {id: workflow_v0}\nmanager: {kind: scripted, policy: 'builtins:dict'}\n")
    capsys.readouterr()
    assert main(["check", str(bad)]) == 2
    said = " ".join("".join(capsys.readouterr()).split())
    assert "manager.policy: 'builtins:dict' built dict, which has no decide(decisions)" in said
    missing = tmp_path / "missing.yaml"
    missing.write_text("env: {id: 'gyre_ma.envs.minigrid_doorkey:make_env'}\n"
                       "library: 'gyre_ma.envs.minigrid_doorkey:make_library'\nmanager: {kind: oracle}\n")
    assert main(["check", str(missing)]) == 2
    said = " ".join("".join(capsys.readouterr()).split())
    assert "manager.kind: environment 'gyre_ma.envs.minigrid_doorkey:make_env' has no built-in oracle manager" in said
