from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from gyre_ma.checkpoints import load_checkpoint, save_checkpoint
from gyre_ma.config import load_config
from gyre_ma.loop import Gyre
from gyre_ma.metrics import anchor_metrics, episode_metrics, option_shares
from gyre_ma.rollout import OptionCall, Trajectory
from gyre_ma.training_batch import anchor_inputs, build_batch, segment

ROOT = Path(__file__).resolve().parents[2]
DOORKEY = ROOT / "configs" / "minigrid_doorkey.yaml"


def run(config_path, iterations, **overrides):
    cfg = load_config(config_path, {"train.iterations": iterations, **overrides})
    gyre = Gyre(cfg)
    return gyre, [gyre.iteration(i) for i in range(iterations)]


def strip_times(history):
    """Without wall-clock times, and NaN (e.g. the reward of failed episodes when none
    failed) as a string, so that equal histories compare equal."""
    return [{k: "nan" if v != v else v for k, v in m.items() if not k.endswith("seconds")} for m in history]


def test_same_config_and_seed_give_identical_metrics_and_weights():
    g1, h1 = run(DOORKEY, 2)
    g2, h2 = run(DOORKEY, 2)
    assert strip_times(h1) == strip_times(h2)
    for p, q in zip(g1.policy.parameters(), g2.policy.parameters(), strict=True):
        assert torch.equal(p, q)
    _, h3 = run(DOORKEY, 2, seed=1)
    assert strip_times(h3) != strip_times(h1)


def test_every_call_carries_version_and_update_changes_policy():
    gyre, _ = run(DOORKEY, 1)
    before = [p.clone() for p in gyre.policy.parameters()]
    trajectories, _ = gyre.rollout(1)
    assert all(c.policy_version == 1 for t in trajectories for c in t.calls)
    gyre.arbitrate(trajectories)
    calls = [c for t in trajectories for c in t.calls]
    assert all(c.breakdown is not None for c in calls)
    # the option reward is the breakdown's total, discounted inside the option (SMDP)
    gamma = gyre.config.credit.gamma
    for c in calls:
        total = c.breakdown.total
        discounted = total * gamma ** (c.duration - 1)
        assert min(total, discounted) - 1e-9 <= c.reward <= max(total, discounted) + 1e-9
        if c.duration == 1:
            assert c.reward == pytest.approx(total)
    batch = gyre.batch(trajectories)
    assert batch["advantage"].shape == batch["option"].shape
    assert all(torch.isfinite(v).all() for v in batch.values() if v.is_floating_point())
    gyre.update(batch, trajectories)
    assert any(not torch.equal(a, b) for a, b in zip(before, gyre.policy.parameters(), strict=True))
    assert gyre.version == 2


def test_nan_loss_skips_the_update():
    gyre, _ = run(DOORKEY, 1)
    trajectories, _ = gyre.rollout(1)
    batch = gyre.batch(trajectories)
    batch["advantage"] = torch.full_like(batch["advantage"], math.nan)
    before = [p.clone() for p in gyre.policy.parameters()]
    metrics = gyre.learner.fitter.fit(gyre.learner.manager_module, batch, epochs=1, minibatch_size=64,
                                      generator=torch.Generator())
    assert metrics["skipped"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, gyre.policy.parameters(), strict=True))


def test_centralised_critic_values_the_global_state():
    gyre, history = run(DOORKEY, 2, **{"manager.centralised_critic": True})
    assert gyre.critic.body[0].in_features == gyre.state_scaler.dim + gyre.config.manager.agent_embedding
    trajectories, _ = gyre.rollout(2)
    assert all(c.state is not None and c.state.shape == (gyre.state_scaler.dim,) for t in trajectories for c in t.calls)
    batch = gyre.batch(trajectories)
    assert batch["state"].shape == (batch["option"].shape[0], gyre.state_scaler.dim)
    assert math.isfinite(history[-1]["value_loss"])


@pytest.mark.parametrize("kind", ["random", "flat"])
def test_baseline_kinds_run_in_the_same_loop(kind):
    gyre, history = run(DOORKEY, 1, **{"manager.kind": kind})
    assert history[0]["env_steps"] > 0
    assert ("policy_loss" in history[0]) == (kind == "flat")


def test_train_and_eval_cli_write_logs_checkpoint_and_report(tmp_path, capsys):
    """``gyre-ma train`` and ``gyre-ma eval`` as real commands; the further evals and plots go
    through the same ``main`` in this process (each command in a process of its own cost
    ~10 s of imports on a 2-core machine, most of this test's time)."""
    from gyre_ma.cli import main

    cmd = [sys.executable, "-m", "gyre_ma.cli", "train", str(DOORKEY), "--iterations", "2",
           "--run-root", str(tmp_path), "--quiet"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    run_dir = tmp_path / "minigrid_doorkey"
    metrics = pd.read_csv(run_dir / "metrics.csv")
    assert len(metrics) == 2 and {"success_rate", "env_steps", "policy_loss"} <= set(metrics.columns)
    assert any((run_dir / "tensorboard").iterdir())
    assert "summary" in out.stdout and "success_rate" in out.stdout
    assert "checkpoint/rollbacks" in out.stdout and "checkpoint/lr_scale" in out.stdout  # #17: never silent
    ckpt = run_dir / "checkpoints" / "final.pt"
    # 16 episodes are too few to judge (checkpoints.min_validation_episodes): no best yet
    assert {"latest.pt", "final.pt"} <= {p.name for p in (run_dir / "checkpoints").iterdir()}
    # eval plays the checkpoint without the learner: Lightning (3 s of imports) stays out
    probe = (f"import sys\nfrom gyre_ma.cli import main\ncode = main(['eval', {str(ckpt)!r}, '--episodes', '3', "
             f"'--trust-config', '--json', {str(tmp_path / 'eval.json')!r}])\n"
             "print('code', code, 'lightning imported', 'lightning' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "code 0 lightning imported False" in out.stdout, out.stdout[-500:]
    assert "verified completion" in out.stdout and "milestone has_key" in out.stdout and "95 % CI" in out.stdout
    result = json.loads((tmp_path / "eval.json").read_text())
    assert 0.0 <= result["success_rate"] <= 1.0 and result["episode_length"] > 0
    assert result["success_ci95_low"] <= result["success_rate"] <= result["success_ci95_high"]
    assert "steps to the goal" in out.stdout and "calls_to_goal" in result
    assert "agents lost per episode" in out.stdout and "episodes cut at a dead end" in out.stdout
    assert {"agents_lost", "dead_ends"} <= set(result)
    episodes = result["episodes"]  # each held-out episode's own figures, and the mean length's interval
    assert [e["task_seed"] for e in episodes] == [1_000_000, 1_000_001, 1_000_002]  # the default --seed on
    assert sum(e["length"] for e in episodes) / 3 == pytest.approx(result["episode_length"])
    assert sum(e["success"] for e in episodes) / 3 == pytest.approx(result["success_rate"])
    assert result["episode_length_ci95_low"] <= result["episode_length"] <= result["episode_length_ci95_high"]

    def cli(*argv: str) -> tuple[int, str]:
        capsys.readouterr()
        code = main(list(argv))
        return code, capsys.readouterr().err

    code, err = cli("eval", str(run_dir / "checkpoints" / "latest.pt"), "--episodes", "2", "--config", str(DOORKEY))
    assert code == 0, err
    # the same weights under another version: the same held-out figures (evaluation draws from its stream)
    state = load_checkpoint(ckpt)
    state["version"] += 7
    save_checkpoint(tmp_path / "bumped.pt", state)
    code, err = cli("eval", str(tmp_path / "bumped.pt"), "--episodes", "3", "--trust-config", "--json",
                    str(tmp_path / "bumped.json"))
    assert code == 0, err
    bumped = json.loads((tmp_path / "bumped.json").read_text())
    assert bumped.pop("played")["checkpoint"].endswith("bumped.pt") and result.pop("played")["mode"] == "sampled"
    assert bumped == result
    code, err = cli("eval", str(ckpt), "--stream", "-1")
    assert code == 2 and "--stream must be >= 0, got -1" in err
    code, err = cli("plot", str(run_dir))
    assert code == 0, err
    assert (run_dir / "curves.png").read_bytes()[:4] == b"\x89PNG"
    code, err = cli("plot", str(tmp_path))
    assert code == 2 and "no metrics.csv" in err
    code, err = cli("eval", str(tmp_path / "nope.pt"))
    assert code == 2 and "does not exist" in err and "Traceback" not in err


def test_a_player_plays_and_prices_a_checkpoint_as_the_learner_that_wrote_it():
    from gyre_ma.player import Player
    from gyre_ma.roles import evaluation_tasks

    gyre, _ = run(DOORKEY, 2, **{"checkpoints.enabled": False})
    tasks = evaluation_tasks(range(500, 506), greedy=False) + evaluation_tasks(range(500, 503), greedy=True)
    expected = gyre.backend.collect(gyre.weights(), gyre.version, tasks)
    with Player(gyre.config, gyre.state_dict()) as player:
        played = player.play(tasks)
        assert player.version == gyre.version == 2
        assert player.arbitrate(played) == gyre.arbitrate(expected)

    def trace(trajectories):
        return [(t.success, t.length, [(c.option, c.log_prob, c.value, c.reward) for c in t.calls])
                for t in trajectories]

    assert trace(played) == trace(expected)
    with pytest.raises(ValueError, match=r"checkpoint has no \['critic'\]"):
        Player(gyre.config, {"policy": gyre.policy.state_dict(), "version": 0})


def test_a_rule_broken_in_a_rollout_worker_stops_the_run_naming_it():
    rule = {"name": "needs_ghost_key", "kind": "process", "when": "episode_end", "require": {"ghost": True}}
    with pytest.raises(ValueError, match=r"rule 'needs_ghost_key' \(episode_end\) .*unknown state key 'ghost'"):
        run(DOORKEY, 1, **{"rewards.rules": [rule]})


def test_linear_lr_schedule_decays_both_learning_rates_to_the_final_fraction():
    gyre, history = run(DOORKEY, 3, **{"train.lr_schedule": "linear", "train.lr_final": 0.25,
                                       "checkpoints.enabled": False})
    assert [h["lr_scale"] for h in history] == pytest.approx([1.0, 0.625, 0.25])
    t = gyre.config.train
    manager_lr = gyre.learner.manager_module.optimizers().optimizer.param_groups[0]["lr"]
    critic_lr = gyre.learner.critic_module.optimizers().optimizer.param_groups[0]["lr"]
    assert manager_lr == pytest.approx(0.25 * t.lr) and critic_lr == pytest.approx(0.25 * t.critic_lr)
    _, constant = run(DOORKEY, 2, **{"checkpoints.enabled": False})
    assert [h["lr_scale"] for h in constant] == [1.0, 1.0]


def test_inverse_sqrt_lr_schedule_depends_on_the_iteration_not_the_run_length():
    _, history = run(DOORKEY, 3, **{"train.lr_schedule": "inverse_sqrt", "train.lr_timescale": 2.0,
                                    "checkpoints.enabled": False})
    assert [h["lr_scale"] for h in history] == pytest.approx([1.0, 1.5 ** -0.5, 2.0 ** -0.5])
    gyre, longer = run(DOORKEY, 4, **{"train.lr_schedule": "inverse_sqrt", "train.lr_timescale": 2.0,
                                      "checkpoints.enabled": False})
    assert [h["lr_scale"] for h in longer[:3]] == pytest.approx([h["lr_scale"] for h in history])
    critic_lr = gyre.learner.critic_module.optimizers().optimizer.param_groups[0]["lr"]
    assert critic_lr == pytest.approx(2.5 ** -0.5 * gyre.config.train.critic_lr)


def test_an_entropy_schedule_moves_the_bonus_linearly_to_its_final_weight():
    gyre, history = run(DOORKEY, 3, **{"train.entropy_coef": 0.02, "train.entropy_final": 0.0,
                                       "checkpoints.enabled": False})
    assert [h["entropy_coef"] for h in history] == pytest.approx([0.02, 0.01, 0.0])
    assert gyre.learner.manager_module.module.entropy_coef == 0.0
    _, default = run(DOORKEY, 2, **{"checkpoints.enabled": False})  # the default: 0.01 down to 0
    assert [h["entropy_coef"] for h in default] == pytest.approx([0.01, 0.0])
    _, constant = run(DOORKEY, 2, **{"checkpoints.enabled": False, "train.entropy_final": None})
    assert [h["entropy_coef"] for h in constant] == [0.01, 0.01]


def test_agents_lost_counts_agents_whose_last_call_ended_before_the_episode():
    def call(agent: str, start: int, duration: int) -> OptionCall:
        return OptionCall(agent=agent, agent_index=int(agent[-1]), option=0, observation=None, mask=None,
                          achieved=frozenset(), last_option=-1, time_fraction=0.0, log_prob=0.0, value=0.0,
                          start_step=start, policy_version=0, task_seed=0, duration=duration)

    died = Trajectory(0, 0, calls=[call("agent_0", 0, 10), call("agent_1", 0, 25), call("agent_1", 25, 5)], length=30)
    both = Trajectory(1, 0, calls=[call("agent_0", 0, 30), call("agent_1", 0, 30)], length=30)
    assert episode_metrics([died, both], ())["agents_lost"] == 0.5
    assert episode_metrics([both], ())["agents_lost"] == 0.0
    died.calls[0].milestones = ("arrived_0",)  # a session-59 user's train left on arriving: its work done, not lost
    assert episode_metrics([died, both], ())["agents_lost"] == 0.0
    both.milestone_steps.update({"key": 3, "door": 20, "not_in_graph": 25})
    assert episode_metrics([died, both], ("key", "door", "goal"))["milestones_verified"] == 1.0
    died.milestone_steps.update({"key": 0, "goal": 30})  # the key held at reset: the seed's luck, not progress
    assert episode_metrics([died, both], ("key", "door", "goal"))["milestones_verified"] == 1.5


def test_option_shares_say_which_options_the_iterations_calls_ran():
    """A session-58 user asked which options the policy leaned on as it trained (metrics.csv had none)."""
    def call(option: int) -> OptionCall:
        return OptionCall(agent="agent_0", agent_index=0, option=option, observation=None, mask=None,
                          achieved=frozenset(), last_option=-1, time_fraction=0.0, log_prob=0.0, value=0.0,
                          start_step=0, policy_version=0, task_seed=0, duration=1)

    played = [Trajectory(0, 0, calls=[call(2), call(0), call(2)], length=3),
              Trajectory(1, 0, calls=[call(2)], length=1)]
    assert option_shares(played, ("mine", "build", "convert")) == {
        "option/mine/share": 0.25, "option/build/share": 0.0, "option/convert/share": 0.75}
    assert option_shares([Trajectory(2, 0, calls=[], length=0)], ("mine",)) == {"option/mine/share": 0.0}


def test_anchored_outcome_credit_sits_on_milestone_and_final_calls():
    """With anchored credit a call that verified no milestone and did not run at the end gets
    its share of local credit and its duration's share of the time credit; a call that
    verified milestones gets their anchor steps besides, and a call running at the end its
    episode's residual; the anchors read the trajectories' own records."""
    from gyre_ma.credit import episode_outcomes
    from gyre_ma.rewards.milestones import calls_at_end

    cfg = load_config(ROOT / "configs" / "quickstart.yaml", {"train.iterations": 1})
    assert cfg.credit.mode == "blend" and cfg.credit.outcome_credit == "anchored" and cfg.credit.anchored
    gyre = Gyre(cfg)
    trajectories, _ = gyre.rollout(0)
    gyre.arbitrate(trajectories)
    names = gyre.library.graph.names
    seg = segment(trajectories, gyre.env.possible_agents)
    anchors = anchor_inputs(trajectories, seg, names)
    for e, t in enumerate(trajectories):
        assert {names[m]: s for m, s in enumerate(anchors["verified_at"][e].tolist()) if s >= 0} == t.milestone_steps
    ending = {id(t.calls[i]) for t in trajectories for i in calls_at_end(t)}
    for r, row in enumerate(seg.calls):
        for i, c in enumerate(row):
            verified = anchors["call_milestones"][r, i].nonzero().flatten().tolist()
            assert {names[m] for m in verified} == set(c.milestones)
            assert bool(anchors["at_end"][r, i]) == (id(c) in ending)
    quiet = torch.tensor([not c.milestones and id(c) not in ending for row in seg.calls for c in row])
    parts = dict(featurizer=gyre.featurizer, state_scaler=None, names=names)
    anchored = build_batch(trajectories, seg, config=cfg, **parts)["advantage"]
    segmented = cfg.model_copy(update={"credit": cfg.credit.model_copy(update={"mode": "segmented"})})
    local = build_batch(trajectories, seg, config=segmented, **parts)["advantage"]
    outcomes = episode_outcomes(success=torch.tensor([t.success for t in trajectories]),
                                length=torch.tensor([t.length for t in trajectories]),
                                horizon=torch.tensor([t.horizon for t in trajectories]),
                                length_weight=cfg.credit.outcome_length_weight)
    assert outcomes.max() > outcomes.min()                      # seed 0's first batch has both (else w = 0)
    all_won = all(t.success for t in trajectories)  # only the length term separates them: w shrinks
    w = cfg.credit.outcome_weight_succeeded if all_won else cfg.credit.blend_weight
    # a quiet call keeps its local credit and pays its duration's share of its episode's time credit
    from gyre_ma.credit import anchored_outcome_credit

    success = torch.tensor([t.success for t in trajectories])
    _, _, time = anchored_outcome_credit(outcomes=outcomes, verified_at=anchors["verified_at"],
                                         prior=cfg.credit.anchor_prior, success=success)
    share = torch.tensor([c.duration / sum(x.duration for x in row) * time[seg.episode[r]].item()
                          for r, row in enumerate(seg.calls) for c in row])
    assert quiet.any() and (~quiet).any() and share.abs().max() > 0
    assert torch.allclose(anchored[quiet], local[quiet] + w * share[quiet], atol=1e-5)
    # the milestone and final calls carry anchored credit besides: a call gets the anchor step
    # of each milestone it verified, and a call running at the end its episode's residual
    steps, residual, _ = anchored_outcome_credit(outcomes=outcomes, verified_at=anchors["verified_at"],
                                                 prior=cfg.credit.anchor_prior, success=success)
    expected = torch.tensor([float(anchors["call_milestones"][r, i].to(steps.dtype) @ steps[seg.episode[r]])
                             + float(anchors["at_end"][r, i]) * residual[seg.episode[r]].item()
                             for r, row in enumerate(seg.calls) for i in range(len(row))])
    extra = anchored - local - w * share
    assert expected[~quiet].abs().max() > 0.1 and torch.allclose(extra, w * expected, atol=1e-4)
    # the logged anchor values: per milestone, the shrunk mean outcome of the episodes that
    # verified it, less the batch's mean outcome (0 for a milestone no episode verified)
    logged = anchor_metrics(trajectories, cfg.credit, names)
    assert set(logged) == {f"anchor/{m}" for m in names}
    mean, prior = outcomes.mean().item(), cfg.credit.anchor_prior
    for m in names:
        won = [o for o, t in zip(outcomes.tolist(), trajectories, strict=True) if m in t.milestone_steps]
        expected = (sum(won) + prior * mean) / (len(won) + prior) - mean
        assert logged[f"anchor/{m}"] == pytest.approx(expected, abs=1e-6)
    assert any(v != 0 for v in logged.values())
    trajectories[0].milestone_steps["find_unicorn"] = 3                 # e.g. a trajectory of another library
    with pytest.raises(ValueError, match=r"verified milestone 'find_unicorn', which is not in the task graph"):
        anchor_inputs(trajectories, seg, names)


def test_a_learner_in_another_precision_than_the_rollouts_trains_through_the_whole_loop():
    """The learner's modules in float64 while rollouts, noise states and the PRM's inputs stay
    float32 on the CPU: every place the two meet converts (as it must for a GPU learner)."""
    gyre, history = run(DOORKEY, 2, **{"trainer.precision": "64-true", "rewards.prm.enabled": True,
                                        "roles.explorers": 1, "roles.executors": 3})
    assert all(p.dtype == torch.float64 for p in gyre.policy.parameters())
    assert history[-1]["update_skipped"] == 0.0 and math.isfinite(history[-1]["policy_loss"])
    assert math.isfinite(history[-1]["noise/explorer/distance"])
    assert all(v.device.type == "cpu" for v in gyre.weights()["policy"].values())  # what rollouts load


def test_wilson_interval_matches_known_values():
    from gyre_ma.metrics import wilson_interval

    low, high = wilson_interval(77, 100)
    assert low == pytest.approx(0.6784, abs=1e-3) and high == pytest.approx(0.8416, abs=1e-3)
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == 1.0
    assert wilson_interval(20, 20)[0] == pytest.approx(0.8389, abs=1e-3)
    with pytest.raises(ValueError, match="successes <= n"):
        wilson_interval(5, 4)


def test_the_learner_pins_torch_threads_so_core_count_does_not_change_results():
    import torch

    before = torch.get_num_threads()
    histories = []
    try:
        for threads in (2, 1):  # as on machines with 2 cores and with 1
            torch.set_num_threads(threads)
            gyre, history = run(DOORKEY, 2)
            assert torch.get_num_threads() == 1  # trainer.threads' default
            gyre.close()
            histories.append(strip_times(history))
    finally:
        torch.set_num_threads(before)
    assert histories[0] == histories[1]
