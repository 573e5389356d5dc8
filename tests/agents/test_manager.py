from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre_ma.agents.manager import Critic, Featurizer, ManagerPolicy
from gyre_ma.agents.noise import NoisyManager
from gyre_ma.envs.minigrid_doorkey import make_env, make_library
from gyre_ma.options.decision import Decision


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(2, 9), st.data())
def test_masked_options_get_exactly_zero_probability(batch, options, data):
    torch.manual_seed(0)
    policy = ManagerPolicy(5, options, 3, hidden=16)
    mask = torch.tensor(data.draw(st.lists(st.lists(st.booleans(), min_size=options, max_size=options),
                                           min_size=batch, max_size=batch)))
    mask[:, data.draw(st.integers(0, options - 1))] = True
    dist = policy.distribution(torch.randn(batch, 5) * 100, torch.zeros(batch, dtype=torch.long), mask)
    assert torch.all(dist.probs[~mask] == 0)
    assert torch.allclose(dist.probs.sum(-1), torch.ones(batch))


def test_hidden_layers_are_layer_normalised_and_agents_embedded():
    policy = ManagerPolicy(4, 3, 2, hidden=8, layers=3)
    assert sum(isinstance(m, torch.nn.LayerNorm) for m in policy.body) == 3
    x, mask = torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool)
    with torch.no_grad():
        policy.agent_embedding.weight.normal_()
    logits = policy(x, torch.tensor([0, 1]), mask)
    assert not torch.allclose(logits[0], logits[1])  # same features, different agents


def decision(env, library, achieved=frozenset(), last=-1, t=0.0):
    obs, _ = env.reset(seed=0)
    a = env.possible_agents[0]
    return Decision(a, 0, obs[a], library.mask(achieved), achieved, last, t, env)


def test_featurizer_encodes_milestones_last_option_and_time():
    env, library = make_env(), make_library()
    f = Featurizer(env.observation_space(env.possible_agents[0]), library)
    base = f(decision(env, library))
    later = f(decision(env, library, frozenset({"has_key"}), last=0, t=0.5))
    assert base.shape == (f.dim,) and base.dtype == np.float32
    diff = np.flatnonzero(base != later)
    assert len(diff) == 4  # one milestone bit, last-option slot moved (two entries), time
    assert later[-1] == 0.5


def test_featurizer_many_stacks_what_single_calls_give():
    env, library = make_env(), make_library()
    f = Featurizer(env.observation_space(env.possible_agents[0]), library)
    items = [decision(env, library), decision(env, library, frozenset({"has_key"}), last=2, t=0.25),
             decision(env, library, frozenset({"has_key", "door_open"}), last=0, t=0.9)]
    many = f.many(items)
    assert many.shape == (3, f.dim) and many.dtype == np.float32
    assert all(np.array_equal(row, f(d)) for row, d in zip(many, items, strict=True))
    assert not np.array_equal(many[0], many[1]) and not np.array_equal(many[1], many[2])


def test_manager_respects_mask_and_is_seeded():
    env, library = make_env(), make_library()
    f = Featurizer(env.observation_space(env.possible_agents[0]), library)
    policy = ManagerPolicy(f.dim, len(library), 1, hidden=16)
    critic = Critic(f.dim, 1, hidden=16)
    d = decision(env, library)
    allowed = set(np.flatnonzero(d.mask))
    picks = [c.option for c in NoisyManager(policy, f, critic=critic, seed=3).decide([d] * 50)]
    assert set(picks) <= allowed
    again = [c.option for c in NoisyManager(policy, f, critic=critic, seed=3).decide([d] * 50)]
    assert picks == again


def test_featurizer_keeps_small_inventory_counts_visible():
    """Inventory slots span 0..255: a linear scale would show 3 iron as 0.01; the log scale
    keeps few units apart, stays monotone and in [0, 1]; narrow dimensions stay linear."""
    from gyre_ma.envs.techtree import make_library as techtree_library
    from gyre_ma.envs.techtree import parallel_env
    from gyre_ma.envs.techtree.techtree import ITEM_INDEX

    env = parallel_env(size=16)
    library = techtree_library(env=env)
    f = Featurizer(env.observation_space(env.possible_agents[0]), library)
    obs, _ = env.reset(seed=0)
    a = env.possible_agents[0]
    iron = env.obs_layout["inventory"].start + ITEM_INDEX["iron"]
    health = env.obs_layout["vitals"].start
    values = []
    for n in (0, 1, 3, 8, 255):
        o = obs[a].copy()
        o[iron] = n
        values.append(f(Decision(a, 0, o, library.mask(frozenset()), frozenset(), -1, 0.0, env))[iron])
    assert values[0] == 0.0 and values[-1] == 1.0
    assert all(lo < hi for lo, hi in zip(values, values[1:]))
    assert values[2] > 0.2  # 3 units: log1p(3) / log1p(255) = 0.25
    o = obs[a].copy()
    o[health] = 3
    got = f(Decision(a, 0, o, library.mask(frozenset()), frozenset(), -1, 0.0, env))[health]
    assert got == np.float32(3 / env.config.max_vital)


def test_a_shared_managers_input_shows_the_options_the_other_agents_run():
    """Coordination (#17): the manager deciding for one agent sees which options the others
    run or just chose (``Decision.others``), one slot per option, each other agent weighing
    1 / (agents - 1); its logits move with them. A featurizer for one agent has no slots."""
    env, library = make_env(), make_library()
    space = env.observation_space(env.possible_agents[0])
    f = Featurizer(space, library, n_agents=3)
    assert f.dim == Featurizer(space, library).dim + len(library)
    d = decision(env, library)
    alone = f(d)
    one, two = (f(Decision(d.agent, 0, d.observation, d.mask, d.achieved, d.last_option, d.time_fraction, env,
                           others)) for others in ((2,), (2, 0)))
    slots = slice(f.time_column - len(library), f.time_column)
    assert not alone[slots].any()
    assert list(one[slots]) == [0.0, 0.0, 0.5] + [0.0] * (len(library) - 3)
    assert list(two[slots]) == [0.5, 0.0, 0.5] + [0.0] * (len(library) - 3)
    rest = np.ones(f.dim, dtype=bool)
    rest[slots] = False
    assert np.array_equal(alone[rest], two[rest])  # nothing else moves
    torch.manual_seed(0)
    policy = ManagerPolicy(f.dim, len(library), 3, hidden=16)
    logits = policy(torch.from_numpy(np.stack([alone, two])), torch.zeros(2, dtype=torch.long),
                    torch.ones(2, len(library), dtype=torch.bool))
    assert not torch.allclose(logits[0], logits[1])
