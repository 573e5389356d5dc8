"""What the default learner learns on MPE ``simple_spread``: an assignment, or geometry.

Trains the DEFAULT learner on an MPE entry of ``generalisation.py`` (one run seed, that
entry's budget), then plays ``--eval-episodes`` held-out task seeds, sampled and greedy,
and reads each episode's step-0 choices (agent 0's, then agent 1's seeing it, then agent
2's) against the start layout:

- ``patterns``: the commonest step-0 choices as landmark triples (-1: ``stay``);
- ``top_pattern_share``: the share of the commonest one (a learner that ignores the layout
  plays one permutation everywhere, as the fixed assignment does);
- ``permutation``: each agent took a different landmark; ``duplicate``: two took one;
- ``agent0_nearest``: agent 0 took its nearest landmark (1/3 by chance), ``agent0_oracle``:
  the landmark the oracle's assignment (least longest drive) gives it, ``oracle_match``:
  all three did.

The references play the same seeds: the oracle, the fixed assignment (agent k → landmark
k), and nearest-free (each agent in turn takes its nearest landmark no earlier agent took).

``cloned``: whether the manager's network can represent the layout at all. The default
network (the config's ``manager.hidden`` and ``layers``, the same features) is fitted by
cross-entropy to the oracle's choices on ``--clone-episodes`` training seeds (Adam, lr
1e-3, 60 epochs) and plays the held-out seeds greedily. If it plays near the oracle, what
the learner lacks is signal, not capacity or inputs.

    python benchmarks/mpe_assignment.py --env mpe_spread_hold --seed 0

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
from generalisation import ENVS, candidate_argument, env_and_library, parsed_overrides, trained


def _layout(env: Any, seed: int) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """Agent and landmark positions at the start of task seed ``seed``, and the oracle's assignment."""
    from gyre_ma.envs.mpe_tasks import _assignment, _world

    env.reset(seed=seed)
    world = _world(env.unwrapped)
    agents = np.array([a.state.p_pos for a in world.agents])
    marks = np.array([m.state.p_pos for m in world.landmarks])
    return agents, marks, _assignment(world)


def first_choices(trajectory: Any, library: Any, n: int) -> tuple[int, ...]:
    """Each agent's step-0 landmark (-1: any other option, or none)."""
    picks = {}
    for c in trajectory.calls:
        if c.start_step == 0 and c.agent not in picks:
            picks[c.agent] = library[c.option].name
    names = [picks.get(f"agent_{i}", "") for i in range(n)]
    return tuple(int(p.rsplit("_", 1)[1]) if p.startswith("go_to_") else -1 for p in names)


def summarise(trajectories: Sequence[Any], library: Any, layouts: dict[int, Any]) -> dict[str, Any]:
    patterns: Counter[tuple[int, ...]] = Counter()
    rows = []
    for t in trajectories:
        agents, marks, oracle = layouts[t.task_seed]
        ks = first_choices(t, library, len(agents))
        patterns[ks] += 1
        chosen = [k for k in ks if k >= 0]
        rows.append({"success": t.success, "length": t.length,
                     "permutation": len(set(ks)) == len(ks) and -1 not in ks,
                     "duplicate": len(set(chosen)) < len(chosen),
                     "agent0_nearest": ks[0] == int(np.argmin(np.linalg.norm(marks - agents[0], axis=1))),
                     "agent0_oracle": ks[0] == oracle[0], "oracle_match": ks == tuple(oracle)})
    out = {key: round(float(np.mean([r[key] for r in rows])), 4) for key in rows[0]}
    out["top_pattern_share"] = round(patterns.most_common(1)[0][1] / len(rows), 4)
    out["patterns"] = [[list(p), c] for p, c in patterns.most_common(8)]
    return out


def clone(env: Any, library: Any, oracle: Any, *, episodes: int, hidden: int, layers: int) -> Any:
    """A manager network fitted to ``oracle``'s choices on task seeds 0 .. ``episodes`` - 1;
    returns a greedy manager playing it."""
    import torch

    from gyre_ma.agents.manager import Featurizer, ManagerPolicy
    from gyre_ma.options.decision import Choice
    from gyre_ma.rollout import run_episode

    featurize = Featurizer(env.observation_space(env.possible_agents[0]), library, n_agents=len(env.possible_agents))
    rows: list[tuple[np.ndarray, int, np.ndarray, int]] = []

    class Recorder:
        def decide(self, decisions: Sequence[Any]) -> list[Any]:
            choices = oracle.decide(decisions)
            rows.extend((featurize(d), d.agent_index, d.mask.copy(), c.option) for d, c in zip(decisions, choices))
            return choices

    for seed in range(episodes):
        run_episode(env, library, Recorder(), seed=seed)
    x, agent, mask, target = (torch.tensor(np.stack(col)) for col in zip(*rows))
    with torch.random.fork_rng():
        torch.manual_seed(0)
        policy = ManagerPolicy(featurize.dim, len(library), len(env.possible_agents), hidden=hidden, layers=layers,
                               option_features=featurize.option_features)
        optimiser = torch.optim.Adam(policy.parameters(), lr=1e-3)
        for _ in range(60):
            order = torch.randperm(len(target))
            for at in range(0, len(target), 256):
                b = order[at:at + 256]
                loss = torch.nn.functional.cross_entropy(policy(x[b], agent[b], mask[b]), target[b])
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()

    class Greedy:
        @torch.no_grad()
        def decide(self, decisions: Sequence[Any]) -> list[Any]:
            logits = policy(torch.tensor(np.stack([featurize(d) for d in decisions])),
                            torch.tensor([d.agent_index for d in decisions]),
                            torch.tensor(np.stack([d.mask for d in decisions])))
            return [Choice(int(k)) for k in logits.argmax(-1)]

    return Greedy()


class NearestFree:
    """Each agent in turn heads for its nearest landmark that no agent before it runs to."""

    def __init__(self, *, library: Any) -> None:
        self.library = library

    def decide(self, decisions: Sequence[Any]) -> list[Any]:
        from gyre_ma.envs.mpe_tasks import _world
        from gyre_ma.options.decision import Choice

        out = []
        for d in decisions:
            world = _world(d.env.unwrapped)
            me = world.agents[d.agent_index].state.p_pos
            free = [(float(np.linalg.norm(m.state.p_pos - me)), i) for k, m in enumerate(world.landmarks)
                    if d.mask[i := self.library.index(f"go_to_{k}")] and i not in d.others]
            out.append(Choice(min(free)[1] if free else self.library.index("stay")))
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="mpe_spread_hold", choices=[k for k in ENVS if k.startswith("mpe_")])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=None, help="default: the entry's budget")
    parser.add_argument("--eval-episodes", type=int, default=300)
    parser.add_argument("--eval-seed", type=int, default=2_000_000)
    parser.add_argument("--clone-episodes", type=int, default=2000, help="oracle episodes to clone (0: no clone)")
    candidate_argument(parser)
    args = parser.parse_args()
    overrides = parsed_overrides(args)

    from gyre_ma.envs.mpe_tasks import FixedAssignment
    from gyre_ma.envs.registry import make_oracle
    from gyre_ma.roles import evaluation_tasks
    from gyre_ma.rollout import run_episode

    started = time.perf_counter()
    seeds = list(range(args.eval_seed, args.eval_seed + args.eval_episodes))
    cfg, env, library = env_and_library(args.env, overrides)
    layouts = {s: _layout(env, s) for s in seeds}
    references = {"oracle": make_oracle(cfg.env.id, env, library, ENVS[args.env]["oracle"]),
                  "fixed": FixedAssignment(library=library), "nearest_free": NearestFree(library=library)}
    if args.clone_episodes:
        references["cloned"] = clone(env, library, references["oracle"], episodes=args.clone_episodes,
                                     hidden=cfg.manager.hidden, layers=cfg.manager.layers)
    out: dict[str, Any] = {"benchmark": "mpe_assignment", "env": args.env, "seed": args.seed,
                           "overrides": overrides, "eval_episodes": args.eval_episodes,
                           "clone_episodes": args.clone_episodes,
                           "references": {name: summarise([run_episode(env, library, m, seed=s) for s in seeds],
                                                          library, layouts) for name, m in references.items()}}
    with trained(args.env, args.seed, args.iterations, overrides) as (gyre, seconds):
        out |= {"iterations": gyre.config.train.iterations, "env_steps": gyre.env_steps,
                "train_seconds": round(seconds, 1)}
        for mode, greedy in (("sampled", False), ("greedy", True)):
            played = gyre.backend.collect(gyre.weights(), gyre.version, evaluation_tasks(seeds, greedy=greedy))
            out[mode] = summarise(played, gyre.library, layouts)
    out["wall_seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
