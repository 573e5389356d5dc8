"""Player: a stored policy played on fresh episodes, without the learner.

``gyre-ma eval`` and an experiment's held-out evaluation need the rollout side of a run and
nothing that trains it: the env and option library, the manager's policy and critic holding
a checkpoint's weights, the backend that plays them, and the reward pipeline that prices
what was played. A whole :class:`~gyre_ma.loop.Gyre` also builds the Learner and so imports
Lightning, which took 3 of the 8 seconds of a 200-episode ``gyre-ma eval`` of the
quickstart; a Player does not import it (unless the run trains a PRM, whose trainer is a
Lightning module). It plays exactly what the Gyre the checkpoint came from would play on
the same tasks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gyre_ma.backends import make_backend
from gyre_ma.backends.worker import RolloutKit, policy_weights
from gyre_ma.checkpoints import load_weights
from gyre_ma.config import ExperimentConfig
from gyre_ma.rewards.scorer import RewardScorer
from gyre_ma.roles import RolloutTask
from gyre_ma.rollout import Trajectory


class Player:
    """The rollout side of ``config``'s run, with ``state``'s weights (a checkpoint's
    contents, :func:`~gyre_ma.checkpoints.load_checkpoint`; None: the untrained policy).
    Close it (or use it as a context manager) to release the backend's workers."""

    def __init__(self, config: ExperimentConfig, state: Mapping[str, Any] | None = None) -> None:
        self.config = config
        kit = RolloutKit.from_config(config)  # the construction every rollout worker and the learner use
        self.env, self.library = kit.env, kit.library
        self.featurizer, self.policy, self.critic = kit.modules()
        self.rewards = RewardScorer(config.rewards, self.library.graph, featurizer=self.featurizer,
                                    n_options=len(self.library), option_names=self.library.names, seed=config.seed)
        self.version = self.iteration = 0
        if state is not None:
            self.load_state_dict(state)
        self.backend = make_backend(config.backend.name, config, **config.backend.options)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The policy, critic and reward models of a checkpoint written by
        :meth:`~gyre_ma.loop.Gyre.state_dict`; the optimisers and the rest are not needed."""
        missing = [key for key in ("policy", "critic", "version") if key not in state]
        if missing:
            raise ValueError(f"checkpoint has no {missing}; expected the contents of a gyre-ma run's checkpoint")
        load_weights(self.policy, state["policy"], "policy")
        load_weights(self.critic, state["critic"], "critic")
        self.version, self.iteration = int(state["version"]), int(state.get("next_iteration", 0))
        if state.get("rewards") is not None:
            self.rewards.load_state_dict(state["rewards"])

    def weights(self) -> Any:
        return policy_weights(self.policy, self.critic) if self.config.manager.learns else None

    def play(self, tasks: Sequence[RolloutTask]) -> list[Trajectory]:
        """Play ``tasks`` (e.g. :func:`~gyre_ma.roles.evaluation_tasks`) with the loaded policy."""
        return self.backend.collect(self.weights(), self.version, list(tasks))

    def arbitrate(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """Each call's arbitrated reward, as the run priced its own episodes, and the reward
        metrics; the PRM, if any, is not trained on them."""
        return self.rewards.arbitrate(trajectories, iteration=self.iteration, gamma=self.config.credit.gamma,
                                      train=False)

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> Player:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
