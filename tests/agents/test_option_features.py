"""Options that describe themselves to the manager (``Option.features``): the featurizer lays
every option's features out after the manager's own inputs, the policy scores them with one
network shared by all options, the batched row-by-row forward pass (parameter noise per
episode) computes exactly what the module does, and a user's feature function that raises
or returns nonsense is named."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from gyre_ma.agents.manager import Critic, Featurizer, ManagerPolicy
from gyre_ma.agents.noise import NoiseSetting, NoisyManager, PolicyActor, perturb
from gyre_ma.envs.minigrid_doorkey import make_env, make_library
from gyre_ma.options.decision import Decision
from gyre_ma.options.errors import UserCodeError
from gyre_ma.options.library import OptionLibrary
from gyre_ma.options.option import Option
from tests.agents.test_noise import _Identity

F, K, A, S = 8, 5, 2, 3
"""Manager inputs before the options' features, options, agents, features per option."""


def policy(seed: int = 0, option_features: int = S) -> ManagerPolicy:
    torch.manual_seed(seed)
    return ManagerPolicy(F + K * option_features, K, A, hidden=16, option_features=option_features)


def states(n: int = 64, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(n, K, generator=g) < 0.6
    mask[:, 0] = True
    return torch.randn(n, F + K * S, generator=g), torch.randint(0, A, (n,), generator=g), mask


def test_one_scorer_serves_every_option_from_its_own_features():
    pol = policy()
    with torch.no_grad():
        pol.head.weight.zero_()
        pol.head.bias.zero_()
        pol.option_head.weight.normal_()
    x, agent, mask = states(8)
    mask[:] = True
    swapped = x.clone()
    own = slice(F, F + K * S)
    blocks = swapped[:, own].reshape(8, K, S)
    blocks[:, [1, 3]] = blocks[:, [3, 1]]  # options 1 and 3 trade features
    with torch.no_grad():
        logits, traded = pol(x, agent, mask), pol(swapped, agent, mask)
    assert torch.allclose(traded[:, [1, 3]], logits[:, [3, 1]], atol=1e-6)
    assert torch.allclose(traded[:, [0, 2, 4]], logits[:, [0, 2, 4]], atol=1e-6)
    assert not torch.allclose(logits[:, 1], logits[:, 3])


def test_the_scorer_runs_on_eligible_options_alone_and_gives_what_scoring_all_would():
    """The learner's batches score only the eligible options (the rest are masked): the
    scorer sees one row per eligible option, and the logits are those of scoring every
    option, to float round-off."""
    pol = policy()
    x, agent, mask = states()
    rows = []
    hook = pol.option_body.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[0]))
    logits = pol(x, agent, mask)
    hook.remove()
    assert rows == [int(mask.sum())] and rows[0] < mask.numel()
    with torch.no_grad():
        own = x[:, F:].reshape(len(x), K, S)
        every = pol.head(pol.body(torch.cat([x, pol.agent_embedding(agent)], -1)))
        every = every + pol.option_head(pol.option_body(own)).squeeze(-1)
    assert torch.allclose(logits[mask], every[mask], atol=1e-6)
    assert (logits[~mask] == torch.finfo(logits.dtype).min).all()


def test_without_option_features_the_policy_has_no_scorer():
    pol = ManagerPolicy(F, K, A, hidden=16)
    assert not any(name.startswith("option_") for name, _ in pol.named_parameters())


def test_the_row_by_row_forward_is_the_modules_perturbed_or_not():
    pol = policy()
    x, agent, mask = states(16)
    actor = PolicyActor(pol, _Identity(), slots=16)
    for slot in range(16):
        actor.begin(slot, NoiseSetting("param", 0.4) if slot % 2 else NoiseSetting(), 50 + slot)
    with torch.no_grad():
        together = actor.logits(list(range(16)), x, agent, mask)
        alone = torch.cat([actor.logits([k], x[k:k + 1], agent[k:k + 1], mask[k:k + 1]) for k in range(16)])
        assert torch.equal(together, alone)  # a row's result does not depend on its batch
        for slot in range(16):
            module = perturb(pol, sigma=0.4, generator=torch.Generator().manual_seed(50 + slot)) if slot % 2 else pol
            want = module(x[slot:slot + 1], agent[slot:slot + 1], mask[slot:slot + 1])
            assert torch.allclose(together[slot:slot + 1], want, atol=1e-5)
    noisy = dict(perturb(pol, sigma=0.4, generator=torch.Generator().manual_seed(51)).named_parameters())
    assert torch.equal(actor._stacks["option_head.weight"][1], noisy["option_head.weight"])  # the scorer is perturbed


def test_batched_decisions_are_each_episodes_own():
    pol, critic = policy(), Critic(F + K * S, A, hidden=16)
    settings = [NoiseSetting("param", 0.5), NoiseSetting("epsilon", 0.2), NoiseSetting()]
    actor = PolicyActor(pol, _Identity(), critic=critic, slots=len(settings))
    alone = []
    for slot, setting in enumerate(settings):
        actor.begin(slot, setting, 10 + slot)
        alone.append(NoisyManager(pol, _Identity(), setting, critic=critic, seed=10 + slot))
    for r in range(4):
        x, agent, mask = states(len(settings), seed=r)
        ds = [Decision(f"agent_{int(a)}", int(a), f.numpy(), m.numpy(), frozenset(), -1, 0.0, None)
              for f, a, m in zip(x, agent, mask, strict=True)]
        for d, manager, got in zip(ds, alone, actor.decide(list(range(len(ds))), ds), strict=True):
            want = manager.decide([d])[0]
            assert got.option == want.option and got.log_prob == pytest.approx(want.log_prob, abs=1e-5)


# ---------------------------------------------------------------------- the featurizer
def _direction(k: int):
    def features(observation):
        return np.array([observation["direction"] == k, k / 4, 1.0], dtype=np.float32)

    return features


def featured_library(**features) -> OptionLibrary:
    base = make_library()
    return OptionLibrary(base.name, base.graph, [dataclasses.replace(opt, features=features.get(opt.name))
                                                 for opt in base])


def decision(env, library, observation=None):
    obs, _ = env.reset(seed=0)
    a = env.possible_agents[0]
    return Decision(a, 0, obs[a] if observation is None else observation, library.mask(frozenset()), frozenset(),
                    -1, 0.5, env)


def test_options_features_follow_the_managers_inputs_option_by_option():
    env = make_env()
    space = env.observation_space(env.possible_agents[0])
    plain = Featurizer(space, make_library())
    library = featured_library(get_key=_direction(0), go_to_goal=_direction(2))
    f = Featurizer(space, library)
    assert f.option_features == 3 and plain.option_features == 0
    assert f.dim == plain.dim + len(library) * 3 and f.options_at == plain.dim
    d = decision(env, library)
    row = f(d)
    assert np.array_equal(row[:plain.dim], plain(d))  # the manager's own inputs are unchanged
    assert row[f.time_column] == 0.5
    block = row[f.options_at:].reshape(len(library), 3)
    assert np.array_equal(block[library.index("get_key")], _direction(0)(d.observation))
    assert np.array_equal(block[library.index("go_to_goal")], _direction(2)(d.observation))
    assert not block[library.index("open_door")].any() and not block[library.index("turn")].any()
    policy = ManagerPolicy(f.dim, len(library), 1, hidden=8, option_features=f.option_features)
    mask = torch.ones(1, len(library), dtype=torch.bool)
    assert torch.isfinite(policy(torch.from_numpy(f.many([d])), torch.zeros(1, dtype=torch.long), mask)).all()


def test_a_features_function_that_raises_or_returns_nonsense_is_named():
    env = make_env()
    space = env.observation_space(env.possible_agents[0])

    def broken(observation):
        raise KeyError("no such part")

    with pytest.raises(UserCodeError, match=r"features \S*broken of option 'get_key' raised KeyError"):
        Featurizer(space, featured_library(get_key=broken))
    with pytest.raises(ValueError, match=r"one length.*'get_key': 3.*'turn': 2"):
        Featurizer(space, featured_library(get_key=_direction(0), turn=lambda o: [1.0, 2.0]))
    with pytest.raises(ValueError, match=r"option 'turn': features returned an array of shape \(2, 2\)"):
        Featurizer(space, featured_library(turn=lambda o: np.eye(2)))
    with pytest.raises(ValueError, match=r"option 'turn': features returned str"):
        Featurizer(space, featured_library(turn=lambda o: "near"))
    calls = {"n": 0}

    def drifting(observation):  # right at the sample, then a value that is not finite
        calls["n"] += 1
        return [1.0, 0.0] if calls["n"] == 1 else [np.nan, 0.0]

    library = featured_library(turn=drifting)
    f = Featurizer(space, library)
    with pytest.raises(ValueError, match=r"option 'turn': features returned a value that is not finite for agent"):
        f(decision(env, library))
    with pytest.raises(TypeError, match=r"option 'turn': features must take exactly one argument \(the deciding "
                                        r"agent's observation\)"):
        Option("turn", lambda ctx: 0, done=lambda ctx: True, features=lambda a, b: 0)


SEEN: list = []


def _recording_library(env=None) -> OptionLibrary:
    def seen(observation):
        SEEN.append(observation)
        return [1.0, 0.0, 0.0]

    return featured_library(get_key=seen)


def test_the_features_length_is_read_off_an_observation_the_env_gave():
    """A session-56 user's Sokoban features planned on the observation they were given; sized
    on a sample of the space (a grid with no walls), the plan never ended and train hung."""
    from gymnasium.utils.env_checker import data_equivalence

    from gyre_ma.backends.worker import RolloutKit
    from gyre_ma.config import parse_config

    SEEN.clear()
    kit = RolloutKit.from_config(parse_config({"env": {"id": "gyre_ma.envs.minigrid_doorkey:make_env"},
                                               "library": "tests.agents.test_option_features:_recording_library"}))
    assert kit.featurizer.option_features == 3 and SEEN
    obs, _ = make_env().reset(seed=RolloutKit.FEATURE_SEED)
    assert data_equivalence(SEEN[0], obs[kit.env.possible_agents[0]])


HANGS_AFTER = 3


def _hanging_library(env=None) -> OptionLibrary:
    calls = {"n": 0}

    def plan(observation):  # sizes fine, then a search that never ends on some state
        calls["n"] += 1
        while calls["n"] > HANGS_AFTER:
            pass
        return [1.0, 0.0, 0.0]

    return featured_library(get_key=plan)


def test_a_features_function_that_never_returns_stops_the_run_naming_the_option(tmp_path, capsys):
    """A session-56 user's Sokoban planner never returned on a state it was given: ``train``
    hung without a word while memory grew. ``backend.option_timeout_s`` bounds a features
    call as it bounds a sub-policy's."""
    import time

    from gyre_ma.cli import main

    config = tmp_path / "hang.yaml"
    config.write_text(f"name: hang\nrun_root: {tmp_path}\nenv: {{id: gyre_ma.envs.minigrid_doorkey:make_env}}\n"
                      "library: tests.agents.test_option_features:_hanging_library\n"
                      "train: {iterations: 1}\nbackend: {option_timeout_s: 0.5}\n")
    start = time.perf_counter()
    assert main(["train", str(config), "--quiet"]) == 2
    assert time.perf_counter() - start < 60
    err = " ".join(capsys.readouterr().err.split())
    assert "features tests.agents.test_option_features._hanging_library.<locals>.plan of option 'get_key' raised " \
           "TimeoutError: no answer within backend.option_timeout_s=0.5 s" in err, err
