"""How many layouts does a policy gradient need to learn a layout-aware assignment?

MPE ``simple_spread``'s learner (``mpe_assignment.py``) plays one fixed permutation: agent 0's
first choice matches the oracle's on a third of the layouts, chance, after 600 iterations
(about 1,200 task seeds), while the same network cloned from the oracle on 2,000 layouts
matches it on two thirds. This asks whether that is the pipeline (features, credit, noise,
PPO details) or the sample count, on the cleanest form of the decision: a contextual bandit
with the manager's network shape (two tanh layers of 128, LayerNorm), the agent's
observation as MPE lays it out (own velocity and position, the landmarks' and the other
agents' positions relative to it, the silent channel), and an exact reward: choice k is
worth −(the time the team needs when agent 0 takes landmark k and the others are assigned
as well as they can be), time as distance at a constant speed (the bottleneck assignment
the oracle solves). Layouts are drawn as MPE draws them (every position uniform in
[−1, 1]²); 3,000 held-out layouts judge each policy (greedy): how often it takes the
oracle's landmark, and its regret in distance units.

Arms: behaviour cloning on the oracle's choices (cross-entropy, exact labels) at several
numbers of layouts; the policy gradient as the default learner applies it (PPO's clipped
objective, 4 epochs, advantages normalised within a group of 4 choices sampled on the
same layout — exact rewards, so the group compares the choices themselves), with 2
layouts an update (the benchmark's 8 episodes an iteration in groups of 4) and with 16,
judged after the same numbers of layouts; and the policy gradient at 2 layouts an update on
the network the manager has when options describe themselves (``Option.features``, session
44): each landmark scored from its own features by one network shared by the three, alone
(``option_scorer``) and added to the per-landmark head over the observation, as
``ManagerPolicy`` adds them (``head_and_option_scorer``); with session 44's features (the
landmark's column of the distance table: where it lies, how far, how far the other agents
are from it, nearest first) and, ``..._table``, with today's ``LandmarkFeatures`` (the whole
table seen from the landmark, session 45). ``--arms`` runs some of the arms. Prints one
JSON object.

    python benchmarks/assignment_bandit.py > benchmarks/results/assignment_bandit.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

AGENTS = 3
GROUP = 4
EPOCHS = 4


def layouts(rng: np.random.Generator, n: int) -> tuple[Tensor, Tensor]:
    """``n`` layouts: agent 0's observations [n, 18] and each first choice's reward [n, 3]."""
    agents, marks = rng.uniform(-1, 1, (n, AGENTS, 2)), rng.uniform(-1, 1, (n, AGENTS, 2))
    dist = np.linalg.norm(agents[:, :, None] - marks[:, None], axis=-1)  # [n, agent, landmark]
    reward = np.full((n, AGENTS), -np.inf)
    for k in range(AGENTS):
        for rest in itertools.permutations([j for j in range(AGENTS) if j != k]):
            time_ = np.maximum(dist[:, 0, k], np.max([dist[:, i + 1, j] for i, j in enumerate(rest)], axis=0))
            reward[:, k] = np.maximum(reward[:, k], -time_)
    obs = np.concatenate([np.zeros((n, 2)), agents[:, 0], (marks - agents[:, :1]).reshape(n, -1),
                          (agents[:, 1:] - agents[:, :1]).reshape(n, -1), np.zeros((n, 4))], axis=1)
    return torch.from_numpy(obs.astype(np.float32)), torch.from_numpy(reward.astype(np.float32))


def network(inputs: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(inputs, 128), nn.LayerNorm(128), nn.Tanh(), nn.Linear(128, 128), nn.LayerNorm(128),
                         nn.Tanh(), nn.Linear(128, AGENTS))


def table_features(obs: Tensor) -> Tensor:
    """Today's ``LandmarkFeatures`` (``gyre_ma.envs.mpe_tasks``), per landmark [n, landmark,
    11]: where it lies from agent 0, how far, how far the other agents are from it, nearest
    first (its column of the distance table); then how far each of those agents is from
    each other landmark (nearest to agent 0 first), then agent 0's distances to those."""
    n = len(obs)
    marks = obs[:, 4:4 + 2 * AGENTS].reshape(-1, AGENTS, 2)
    others = obs[:, 4 + 2 * AGENTS:4 * AGENTS + 2].reshape(-1, AGENTS - 1, 2)
    theirs = (others[:, :, None] - marks[:, None]).norm(dim=-1)  # [n, other, landmark]
    mine = marks.norm(dim=-1)  # [n, landmark]
    per_landmark = []
    for k in range(AGENTS):
        rest = torch.tensor([j for j in range(AGENTS) if j != k]).expand(n, -1)
        rest = rest.gather(1, mine.gather(1, rest).argsort(dim=-1, stable=True))
        order = theirs[:, :, k].argsort(dim=-1, stable=True)
        table = theirs.gather(1, order[:, :, None].expand(-1, -1, AGENTS))
        table = table.gather(2, rest[:, None].expand(-1, AGENTS - 1, -1))  # [n, other by k, landmark by agent 0]
        per_landmark.append(torch.cat([marks[:, k], mine[:, k:k + 1], theirs[:, :, k].gather(1, order),
                                       table.reshape(n, -1), mine.gather(1, rest)], -1))
    return torch.stack(per_landmark, 1)


def column_features(obs: Tensor) -> Tensor:
    """Session 44's ``LandmarkFeatures``, per landmark [n, landmark, 5]: the table's first
    numbers (where it lies from agent 0, how far, how far the other agents are from it,
    nearest first)."""
    return table_features(obs)[..., :2 + AGENTS]


class OptionScorer(nn.Module):
    """Each landmark's logit from its own features (``features``: :func:`column_features` or
    :func:`table_features`, read off agent 0's observation) by one network shared by every
    landmark; with ``head``, plus the per-landmark logits of :func:`network` over the
    observation (``ManagerPolicy`` with option features)."""

    def __init__(self, seed: int, head: bool, features: Any = column_features) -> None:
        super().__init__()
        self.head = network(18, seed) if head else None
        self.features = features
        width = features(torch.zeros(1, 18)).shape[-1]
        torch.manual_seed(seed + 1)
        self.scorer = nn.Sequential(nn.Linear(width, 128), nn.LayerNorm(128), nn.Tanh(), nn.Linear(128, 128),
                                    nn.LayerNorm(128), nn.Tanh(), nn.Linear(128, 1))

    def forward(self, obs: Tensor) -> Tensor:
        logits = self.scorer(self.features(obs)).squeeze(-1)
        return logits if self.head is None else logits + self.head(obs)


def judge(policy: nn.Module, held_out: tuple[Tensor, Tensor]) -> dict[str, float]:
    obs, reward = held_out
    with torch.no_grad():
        pick = policy(obs).argmax(1)
    best = reward.max(1)
    return {"oracle_match": round(float((pick == best.indices).float().mean()), 3),
            "regret": round(float((best.values - reward.gather(1, pick[:, None])[:, 0]).mean()), 4)}


def clone(rng: np.random.Generator, n: int, held_out: tuple[Tensor, Tensor], seed: int) -> dict[str, float]:
    obs, reward = layouts(rng, n)
    labels = reward.argmax(1)
    policy = network(obs.shape[1], seed)
    opt = torch.optim.Adam(policy.parameters(), 1e-3)
    for _ in range(200):
        for idx in torch.randperm(n).split(256):
            loss = nn.functional.cross_entropy(policy(obs[idx]), labels[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return judge(policy, held_out)


def policy_gradient(rng: np.random.Generator, per_update: int, checkpoints: list[int], held_out: tuple[Tensor, Tensor],
                    seed: int, lr: float, policy: nn.Module | None = None) -> dict[int, dict[str, float]]:
    """Judged after each of ``checkpoints`` layouts; ``policy``: the network (default :func:`network`)."""
    policy = policy if policy is not None else network(held_out[0].shape[1], seed)
    opt = torch.optim.Adam(policy.parameters(), lr)
    curve, seen = {}, 0
    while seen < checkpoints[-1]:
        obs, reward = layouts(rng, per_update)
        with torch.no_grad():
            probs = torch.softmax(policy(obs), -1)
        chosen = torch.multinomial(probs, GROUP, replacement=True)  # [layouts, group]
        got = reward.gather(1, chosen)
        advantage = (got - got.mean(1, keepdim=True)) / (got.std(1, keepdim=True) + 1e-6)
        old = torch.log(probs.gather(1, chosen))
        for _ in range(EPOCHS):
            ratio = (torch.log_softmax(policy(obs), -1).gather(1, chosen) - old).exp()
            loss = -torch.min(ratio * advantage, ratio.clamp(0.8, 1.2) * advantage).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        seen += per_update
        if seen in checkpoints:
            curve[seen] = judge(policy, held_out)
    return curve


SCORERS = {"option_scorer": (False, column_features), "head_and_option_scorer": (True, column_features),
           "option_scorer_table": (False, table_features), "head_and_option_scorer_table": (True, table_features)}
"""The option-scorer arms: (with the per-landmark head too, the features)."""
ARMS = ("cloned", "head_2", "head_16", *SCORERS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layouts", default="1200,2400,6000,12000", help="checkpoints of the policy gradient arms")
    parser.add_argument("--clone", default="500,2000,8000", help="layouts the cloned arms train on")
    parser.add_argument("--lr", type=float, default=3e-4, help="the policy gradient's (the manager's default)")
    parser.add_argument("--arms", default="all", help=f"comma-separated, of {', '.join(ARMS)}; or all")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    held_out = layouts(rng, 3000)
    best = held_out[1].max(1).values
    arms = ARMS if args.arms == "all" else args.arms.split(",")
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        parser.error(f"--arms: unknown arm(s) {unknown}; expected some of {list(ARMS)} or 'all'")
    out: dict[str, Any] = {
        "benchmark": "assignment_bandit", "seed": args.seed, "held_out_layouts": 3000, "group": GROUP,
        "epochs": EPOCHS, "lr": args.lr,
        "chance": {"oracle_match": round(1 / AGENTS, 3),
                   "regret": round(float((best - held_out[1].mean(1)).mean()), 4)},
    }
    if "cloned" in arms:
        out["cloned"] = {n: clone(rng, n, held_out, args.seed) for n in map(int, args.clone.split(","))}
    checkpoints = [int(n) for n in args.layouts.split(",")]
    for per in (2, 16):
        if f"head_{per}" in arms:
            out[f"policy_gradient_{per}_layouts_an_update"] = policy_gradient(rng, per, checkpoints, held_out,
                                                                              args.seed, args.lr)
    for name, (head, features) in SCORERS.items():
        if name in arms:
            out[f"policy_gradient_2_layouts_an_update_{name}"] = policy_gradient(
                rng, 2, checkpoints, held_out, args.seed, args.lr, OptionScorer(args.seed, head, features))
    out["wall_seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
