from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre_ma.agents.manager import Critic, Featurizer, ManagerPolicy
from gyre_ma.agents.noise import NoisyManager
from gyre_ma.envs.minigrid_doorkey import make_env, make_library
from gyre_ma.rollout import Decision


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
