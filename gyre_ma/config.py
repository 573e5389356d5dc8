"""Experiment configuration: YAML → a tree of typed, frozen, validated models.

Every field has a docstring (shown by ``gyre-ma check --explain``); unknown keys are
rejected with the accepted ones listed; errors name the dotted path and the bad value.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gyre_ma.options.yaml_file import read_yaml
from gyre_ma.rewards.arbiter import RewardConfig

_RUN_NAME = re.compile(r"^[A-Za-z0-9_+=-][A-Za-z0-9_.+=-]*$")


class ConfigError(ValueError):
    """A user mistake in a config: one line naming the key, the value and what was expected."""


MAX_COUNT = 10**7
"""The largest count or size a config may give (iterations, episodes, widths, windows): a
larger one is a typo, and would hang or exhaust memory rather than fail."""
_LARGE_INTS = {"seed": 2**63 - 1, "store_max_bytes": 2**50}
"""Integer keys with a larger range than :data:`MAX_COUNT`."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True, allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _bounded(cls, value: Any, info: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            limit = _LARGE_INTS.get(info.field_name, MAX_COUNT)
            if abs(value) > limit:
                raise ValueError(f"must be at most {limit:,}")
        return value


class EnvConfig(_Section):
    id: str = "techtree_v0"
    """A registered environment id (``techtree_v0``, ``workflow_v0``) or ``module:callable``."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments passed to the environment's ``parallel_env``."""


class LLMBuildConfig(_Section):
    """A small GPT-2 built from this config (no model directory needed): its vocabulary is
    every word the manager's prompts can hold."""

    layers: int = Field(2, ge=1, le=48)
    """Transformer blocks."""
    width: int = Field(64, ge=4, le=8192)
    """Embedding width (divisible by ``heads``)."""
    heads: int = Field(2, ge=1, le=128)
    """Attention heads."""
    context: int = Field(512, ge=16, le=32768)
    """Positions: the longest prompt plus an option's name."""
    seed: int = 0
    """Seed of the initial weights: the same model for every run seed, as a model loaded
    from a directory would be (the run seed varies tasks, sampling and minibatches)."""
    vocabulary: list[str] = Field(default_factory=list)
    """More words for the built model's vocabulary: those ``manager.llm.render`` writes
    (the built vocabulary holds the prompt's own words, the options' names and descriptions,
    and no others: any other word reads as unknown)."""

    @model_validator(mode="after")
    def _heads_divide_width(self) -> LLMBuildConfig:
        if self.width % self.heads:
            raise ValueError(f"`width` ({self.width}) must be divisible by `heads` ({self.heads})")
        return self


class LLMManagerConfig(_Section):
    """The LLM manager (``manager.kind: llm``): a causal LM that picks among the eligible
    options by the log-probability of their names after a text view of the decision."""

    model: str | None = None
    """A local model directory (``save_pretrained`` of a causal LM and its tokenizer); never a hub name."""
    build: LLMBuildConfig | None = None
    """Build a small GPT-2 from this config instead of loading ``model``."""
    engine: Literal["transformers", "vllm"] = "transformers"
    """Who scores the options in rollouts: the policy's own torch module (``transformers``), or
    vLLM on a GPU, its weights replaced at each policy version."""
    ref_kl_coef: float = Field(0.05, ge=0.0)
    """Weight of KL(π ‖ π_ref) in the loss, π_ref the frozen initial model, over the eligible options."""
    descriptions: bool = True
    """List each eligible option's description in the prompt, not only its name."""
    render: str | None = None
    """``module:callable`` of a decision (or recorded call) → text, added to the prompt (the
    observation as text; default: none)."""
    max_prompt_tokens: int = Field(480, ge=8, le=32768)
    """Longer prompts keep their last tokens (the eligible options and the cue)."""

    @model_validator(mode="after")
    def _one_model(self) -> LLMManagerConfig:
        if (self.model is None) == (self.build is None):
            raise ValueError("give exactly one of `model` (a local model directory) and `build` (a small model "
                             f"built from config); got model={self.model!r}, build={self.build!r}")
        return self


class ManagerConfig(_Section):
    hidden: int = Field(128, ge=4, le=4096)
    """Width of each layer-normalised hidden layer."""
    layers: int = Field(2, ge=1, le=8)
    """Number of hidden layers."""
    agent_embedding: int = Field(8, ge=1, le=256)
    """Size of the agent-id embedding shared parameters use to tell agents apart."""
    centralised_critic: bool = False
    """Value the global ``state()`` (shared by all agents) instead of each agent's features."""
    kind: Literal["learned", "flat", "llm", "random", "oracle", "scripted"] = "learned"
    """``learned`` trains the manager over options; ``flat`` trains the same policy over
    primitive actions (the flat-PPO baseline); ``llm`` trains a causal LM over options
    (``llm``); ``random``, ``oracle`` (a built-in env's) and ``scripted`` (``policy``) do not learn."""
    policy: str | None = None
    """``module:callable`` building a reference manager (anything with ``decide``) from any of
    ``env``, ``library`` by name: the ``scripted`` manager, or an oracle for any env."""
    llm: LLMManagerConfig | None = None
    """The LLM manager's model and prompt (``kind: llm``)."""

    @model_validator(mode="after")
    def _scripted_has_a_policy(self) -> ManagerConfig:
        if self.kind == "scripted" and self.policy is None:
            raise ValueError("`kind` 'scripted' needs `policy`: a 'module:callable' that builds the manager")
        if self.kind == "llm" and self.llm is None:
            raise ValueError("`kind` 'llm' needs `llm`: a `model` directory or a `build` config")
        return self

    @property
    def learns(self) -> bool:
        """Whether this manager is trained (``learned``, ``flat``, ``llm``)."""
        return self.kind in ("learned", "flat", "llm")


class CreditConfig(_Section):
    mode: Literal["plain", "segmented", "blend", "grpo", "gigpo"] = "blend"
    """Option-level GAE (``plain``), GAE cut at verified milestones (``segmented``),
    segmented GAE blended with the verified outcome (``blend``, see ``outcome_credit``), or
    one of the critic-free peers: every call gets its episode's group-normalised outcome
    (``grpo``), plus a step-level group advantage among the decisions taken from the same
    state of the same task seed (``gigpo``, Feng et al. 2025; see ``gigpo_step_weight``)."""
    gamma: float = Field(0.99, gt=0.0, le=1.0)
    """Per-primitive-step discount; an option of τ steps is discounted by γ^τ."""
    lam: float = Field(0.95, ge=0.0, le=1.0)
    """GAE λ."""
    outcome_weight: float | None = Field(None, ge=0.0, le=1.0)
    """Largest weight w in [0, 1] of the global outcome credit: ``episode`` blends it,
    (1 − w) · local + w · outcome; ``anchored`` adds it, local + w · anchored. None: the
    default of ``outcome_credit`` (:attr:`blend_weight`)."""
    outcome_length_weight: float = Field(0.5, ge=0.0, lt=1.0)
    """κ in [0, 1): a verified success's outcome is 1 − κ · length / horizon (a failure's stays
    0), so a group whose episodes all succeed still prefers its faster ones; 0 judges on
    verified success alone. Used by ``blend`` and the GRPO objective."""
    outcome_credit: Literal["anchored", "episode"] = "anchored"
    """How ``blend`` spreads the outcome over an episode's calls: ``anchored`` credits it to the
    calls whose verified milestones moved the expected outcome (each milestone's value is the
    batch's mean outcome after it; :mod:`gyre_ma.credit.anchors`), with weight
    ``outcome_weight`` while the batch's outcomes differ and 0 while they do not; ``episode``
    gives every call its episode's group-normalised outcome advantage (GRPO)."""
    anchor_prior: float = Field(1.0, ge=0.0)
    """Pseudo-episodes (≥ 0) at the batch's mean outcome added to each milestone's anchor
    value, so a milestone few episodes verified is not given an extreme value."""
    gigpo_step_weight: float = Field(1.0, ge=0.0, le=10.0)
    """ω of ``gigpo``: the weight of the step-level (anchor-state) advantage beside the
    episode-level one (1 in the paper)."""
    outcome_weight_succeeded: float = Field(0.5, ge=0.0, le=1.0)
    """Weight in [0, 1] of anchored credit when every episode of the batch succeeded, so that
    only the outcome's length term (κ) separates them: the local credit, which prices each
    call's time, weighs more while the policy is refined."""

    @property
    def anchored(self) -> bool:
        """Whether the manager's credit is the blend with milestone-anchored outcome credit."""
        return self.mode == "blend" and self.outcome_credit == "anchored"

    @property
    def blend_weight(self) -> float:
        """``outcome_weight``, or where it is None the default of ``outcome_credit``: 1 for
        ``anchored`` (while verified success differs within the batch its credit is added
        to the local term at full weight), 0.5 for ``episode`` (every call of an episode gets the same outcome
        advantage, and the local term tells them apart). The measurements behind these
        defaults are in ``benchmarks/results/README.md``."""
        if self.outcome_weight is not None:
            return self.outcome_weight
        return 1.0 if self.outcome_credit == "anchored" else 0.5


class TrainConfig(_Section):
    iterations: int = Field(50, ge=1)
    """Gyre iterations (rollout → segment → score → update)."""
    episodes_per_iteration: int = Field(8, ge=1)
    """Episodes collected per iteration (grouped by task seed for the outcome advantage)."""
    lr: float = Field(3e-4, gt=0.0, le=1.0)
    """Manager learning rate."""
    critic_lr: float = Field(1e-3, gt=0.0, le=1.0)
    """Critic learning rate."""
    lr_schedule: Literal["constant", "linear", "inverse_sqrt"] = "constant"
    """``linear``: both learning rates decay linearly from their value at iteration 0 to
    ``lr_final`` × it at the last iteration; ``inverse_sqrt``: they are scaled by
    (1 + t / ``lr_timescale``)^-1/2 at iteration t, whatever the run's length, so a run
    extended by a resume goes on where it was. A rollback's cut multiplies on top."""
    lr_final: float = Field(0.1, ge=0.0, le=1.0)
    """Fraction of the learning rates left at the last iteration under ``linear``."""
    lr_timescale: float = Field(100.0, gt=0.0)
    """Iterations τ of ``inverse_sqrt``: the learning rates are halved at iteration 3τ."""
    epochs: int = Field(4, ge=1, le=100)
    """Passes over each iteration's batch."""
    minibatch_size: int = Field(256, ge=1)
    """Option calls per gradient step."""
    clip: float = Field(0.2, gt=0.0, lt=1.0)
    """PPO ratio clip ε."""
    proximal: Literal["behaviour", "learner"] = "behaviour"
    """What the PPO ratio is clipped against. ``behaviour``: the policy that chose, as it
    chose (its episode's parameter noise, temperature, version). ``learner``: decoupled PPO
    (Hilton et al. 2021): the learner's unperturbed policy before the update, each row
    weighted by its probability ÷ the behaviour policy's (capped at ``importance_cap``).
    Under parameter noise the two differ: an explorer perturbed KL 0.05-0.3 away makes
    ratios against it start far from 1, where PPO's clip zeroes the gradient of some rows
    and leaves others unbounded."""
    importance_cap: float = Field(1.0, gt=0.0)
    """The largest behaviour weight under ``proximal: learner`` (V-trace's ρ̄)."""
    kl_coef: float = Field(0.0, ge=0.0)
    """Weight of the KL penalty to the pre-update policy."""
    entropy_coef: float = Field(0.01, ge=0.0)
    """Entropy bonus weight (at iteration 0, where ``entropy_final`` is set)."""
    entropy_final: float | None = Field(0.0, ge=0.0)
    """The entropy bonus weight at the last iteration, reached linearly from ``entropy_coef``;
    None: ``entropy_coef`` throughout. 0 by default: the bonus explores early, and the policy a
    run ends with is not held stochastic once the signal that would sharpen it is noise. Once
    nearly every episode succeeds, a constant bonus outweighs what is left of the policy
    gradient, and sampled success sags below greedy. Measured at 0 against None on every env
    (``benchmarks/results/README.md``, session 28)."""
    temperature_final: float = Field(1.0, gt=0.0, le=1.0)
    """The manager policy's sampling temperature at the last iteration, reached linearly
    from 1 at iteration 0 (its logits are divided by it, in the rollouts and in the update
    alike); 1: no schedule (the MLP manager; the LLM manager has none). Off by default: at
    0.5, Pursuit's 50-iteration runs end with sharper sampled policies (held-out sampled
    success 0.931 against 0.912, every run >= 0.9), but coverage's 1,200-iteration runs
    commit early and learn worse assignments (sampled 0.815 against 0.878, greedy 0.863
    against 0.903), and one LockedRoom run's sampled paths grow longer than a random
    order's (``benchmarks/results/README.md``, session 34)."""
    average_last: float = Field(0.1, ge=0.0, lt=1.0)
    """Fraction of the run's iterations, its last, over which the manager's weights (after
    each update) are averaged uniformly into the policy the run ends with
    (:mod:`gyre_ma.trainers.averaging`); 0: the last update's weights. At a constant step
    size a policy near its optimum keeps moving with each update's noise, so the last
    update's weights are one draw of that walk and their average is its centre. 0.1 by
    default: on coverage's 1,200-iteration runs, paired against the last policy on 12 run
    seeds it had not been tried on, it lifts held-out sampled success from 0.866 to 0.893
    (the worst run from 0.792 to 0.882) and greedy from 0.894 to 0.918, greedy ≥ 0.9 on
    every run; on 40- and 50-iteration runs (Pursuit, the quickstart, the tech tree, the
    MiniGrid and Overcooked envs) it moves success and path lengths little, every target
    still met. Longer windows help coverage more and lengthen short runs' sampled paths,
    whose policy is still sharpening at the end (``benchmarks/results/README.md``, sessions
    30, 31 and 38)."""
    critic_replay: int = Field(0, ge=0)
    """Rows of earlier updates the critic also fits on, the newest (a ring, in the
    checkpoint), ``epochs`` passes over them and the current batch together; 0: the current
    batch only. A value regressed on one iteration's few dozen decisions cannot learn which
    assignments win. 4096 helps plain GAE on the tech tree but slows the default credit there
    a little and costs a fifth more training time; on coverage it ranks assignments better,
    yet its success gain on run seeds 0-5 did not repeat on seeds 6-11, and 8192 does no
    better than 0, so it is off (``benchmarks/results/README.md``, sessions 23 and 24)."""
    self_imitation: float | None = Field(None, ge=0.0)
    """Weight of the self-imitation term (:mod:`gyre_ma.trainers.self_imitation`): each update
    also raises the log-probability of replayed decisions of its own that did well, the ones
    ``self_imitation_rows`` picks; 0 turns it off. None: 1 for the option manager
    (``manager.kind: learned``), 0 for flat PPO (kept the plain baseline) and the LLM manager
    (which has no decision features to replay). See :attr:`ExperimentConfig.imitation_weight`."""
    self_imitation_rows: Literal["group_best", "beat_critic"] = "group_best"
    """Which replayed decisions are imitated: ``group_best``, those of each task seed's best
    episode (the highest verified outcome of its group, where the group's outcomes differ),
    drawn uniformly, the term weighted by ``self_imitation`` alone; ``beat_critic``, those
    whose return beat the critic's current value, drawn by how much (Oh et al. 2018). The
    episodes of a group play the same task seed, so the best of them is judged against
    what the others did there, not against a critic's guess: on the assignment tasks, where
    a choice's worth depends on the layout and the policy gradient alone learned none of it
    in 1,200 task seeds (``benchmarks/assignment_bandit.py``), it is what made the learner
    read the layout (``benchmarks/results/README.md``, session 42)."""
    self_imitation_window: float = Field(1.0, gt=0.0, le=1.0)
    """Age bound of the self-imitation replay, as a fraction of the run's iterations: only
    the decisions of the last ``max(1, round(window · iterations))`` updates are imitated
    (:attr:`self_imitation_updates`); 1: no bound but the ring's ``self_imitation_capacity``.
    A winner is a sample of the policy that played it, so an old one pulls the policy back
    toward that policy, and where a group's best is partly luck nothing else comes with the
    pull. The decisions an update brings range from a few dozen (coverage, late in a run) to
    7,000 (the tech tree), so the 4,096-decision ring reaches back over the whole of a
    50-iteration Pursuit run but a tenth of a 1,200-iteration coverage run. Off by default
    (``self_imitation_trust`` is the default's answer). Measured without trust, at 0.1
    Pursuit's sampled success rises from 0.917 to 0.938 (run seed 4 from 0.880 to 0.941,
    every run ≥ 0.9) and the MiniGrid and Overcooked paths shorten, but the long runs lose
    what their winners taught them: MPE's greedy paths lengthen from 1.21× to 1.23–1.26×
    the oracle's, coverage's sampled success falls on both run seeds tried (0.926 / 0.932
    against 0.934 / 0.950) and the quickstart's run seed 4 from 0.98 to 0.91
    (``benchmarks/results/README.md``, session 43)."""
    self_imitation_trust: bool = True
    """Trust a replayed winner by how far the policy still stands behind its choice: a
    ``group_best`` row is drawn ∝ τ = min(1, π_now(a | s) / π_then(a | s)) and the term
    scaled by the mean τ over the winners (:mod:`gyre_ma.trainers.self_imitation`). A winner
    is a sample of the policy that played it; where a group's best is partly luck (Pursuit's
    evaders walk at random) imitating it pulls the policy back toward that older policy, and
    the 4,096-decision ring holds the whole of a 50-iteration Pursuit run, so session 42's
    plain imitation cost Pursuit's sampled success (0.917 against 0.938; run seed 4 0.880).
    With trust: Pursuit 0.934–0.956 (mean 0.948), coverage, the MiniGrid and Overcooked
    envs, the quickstart, Taxi and the tech tree hold or improve; MPE's paths are longer
    (greedy 1.20–1.30× the oracle's against 1.17–1.24×), the policy having drifted from some
    informative winners by chance (``benchmarks/results/README.md``, session 43)."""
    self_imitation_capacity: int = Field(4096, ge=1)
    """Decisions the self-imitation replay keeps at most (the newest), imitated or not."""
    objective: Literal["ppo", "grpo"] = "ppo"
    """Manager objective: ``grpo`` is the clipped objective on GRPO advantages, the same as
    ``credit.mode: grpo`` (kept for configs written before that mode existed)."""
    max_steps: int | None = Field(None, ge=1)
    """Primitive step cap per episode; defaults to the environment's ``max_cycles``."""

    @model_validator(mode="before")
    @classmethod
    def _group_size_is_derived(cls, data: Any) -> Any:
        if isinstance(data, dict) and "group_size" in data:
            raise ValueError("`group_size` is not a key: a group is the episodes sharing a task seed, one per "
                             "explorer and executor (`roles.explorers` + `roles.executors`); remove it")
        return data

    def progress(self, iteration: int) -> float:
        """How far through the run ``iteration`` is, from 0 (the first) to 1 (the last), the
        schedules' common clock; 0 throughout a run of one iteration."""
        if self.iterations < 2:
            return 0.0
        return min(max(iteration, 0) / (self.iterations - 1), 1.0)

    @property
    def self_imitation_updates(self) -> int:
        """How many of the newest updates' decisions self-imitation draws from
        (``self_imitation_window`` of the run's iterations, at least one)."""
        return max(1, round(self.self_imitation_window * self.iterations))

    @property
    def average_start(self) -> int:
        """The first iteration whose updated weights enter the tail average (``iterations``
        where it averages nothing)."""
        return self.iterations - int(self.average_last * self.iterations)

    def linear(self, start: float, end: float, iteration: int) -> float:
        """A schedule's value at ``iteration``, going linearly from ``start`` at the first
        iteration to ``end`` at the last (held there after it)."""
        return start + (end - start) * self.progress(iteration)

    def entropy_at(self, iteration: int) -> float:
        """The entropy bonus weight at ``iteration``."""
        if self.entropy_final is None:
            return self.entropy_coef
        return self.linear(self.entropy_coef, self.entropy_final, iteration)

    def temperature_at(self, iteration: int) -> float:
        """The manager policy's sampling temperature at ``iteration``."""
        return self.linear(1.0, self.temperature_final, iteration)

    def lr_factor(self, iteration: int) -> float:
        """The schedule's multiplier of the learning rates at ``iteration``."""
        if self.lr_schedule == "constant":
            return 1.0
        if self.lr_schedule == "inverse_sqrt":
            return (1.0 + max(iteration, 0) / self.lr_timescale) ** -0.5
        return self.linear(1.0, self.lr_final, iteration)


class BufferConfig(_Section):
    enabled: bool = False
    """Route rollouts through the TrajectoryBuffer (dedup, elite mix, staleness); off: train
    on each iteration's rollouts as collected."""
    capacity: int = Field(4096, ge=1)
    """Fresh-pool size in option calls; must exceed the option calls of the longest episode."""
    eviction: Literal["fifo", "random_oldest"] = "fifo"
    """Evict the oldest trajectory, or one at random among the oldest ``eviction_window``."""
    eviction_window: int = Field(16, ge=1)
    """How many of the oldest trajectories ``random_oldest`` picks among."""
    dedup: bool = True
    """Reject a trajectory whose every segment (calls up to a verified milestone) is held."""
    elite_size: int = Field(8, ge=0)
    """Top-k trajectories by verified outcome, then return, kept past eviction."""
    max_turning_points: int = Field(8, ge=0)
    """First trajectories to verify a new milestone, kept past eviction."""
    elite_ratio: float = Field(0.0, ge=0.0, le=1.0)
    """Share of each training batch drawn from the elite pool."""
    max_staleness: int | None = Field(1, ge=0)
    """Drop fresh trajectories older than this many policy versions (None: never)."""
    store: bool = True
    """Write admitted trajectories to ``<run_dir>/buffer/store/`` as Parquet tables
    (``steps/``, ``calls/``, ``trajectories/``; no observations), readable by pandas,
    polars and duckdb."""
    store_max_bytes: int | None = Field(1 << 30, ge=1)
    """Bound on the store's files, in bytes (>= 1; default 1 GiB; None: unbounded). Past it
    the oldest chunks are deleted; the newest chunk always stays."""


MIN_VALIDATION_EPISODES = 32
"""The episodes a validation window must hold to set a best or roll back, where the window
holds as many (``checkpoints.min_validation_episodes`` None)."""


class CheckpointConfig(_Section):
    enabled: bool = True
    """Keep the three slots (latest, pre_update, best) in ``<run_dir>/checkpoints``."""
    rollback_threshold: float = Field(0.25, ge=0.0)
    """Roll back to ``best`` when validation falls below it by more than this."""
    lr_cut: float = Field(0.5, gt=0.0, le=1.0)
    """Learning-rate factor applied at each rollback (cumulative)."""
    min_lr_scale: float = Field(1e-3, gt=0.0, le=1.0)
    """Floor of the cumulative learning-rate scale."""
    large_update_kl: float | None = Field(0.05, gt=0.0)
    """An update with KL above this saves the pre-update state to ``pre_update``."""
    nan_max_consecutive: int = Field(3, ge=1)
    """Non-finite updates in a row before a rollback."""
    validation_window: int = Field(4, ge=1)
    """Validation judges the success pooled over this many recent iterations' validation
    episodes (one iteration's are too few to roll back on); a rollback needs the drop on
    ``validation_window + 1`` validations in a row, two windows that share no episode."""
    min_validation_episodes: int | None = Field(None, ge=1)
    """Validation sets a best or rolls back only on a score measured over at least this many
    episodes (the window's); after a rollback the window starts empty, so no best comes from
    one small sample. None: :data:`MIN_VALIDATION_EPISODES`, or the whole window where it holds
    fewer (:attr:`ExperimentConfig.validation_window_episodes`: a session-57 user's 2 evaluators
    filled 16, and with 32 no ``best.pt`` was ever written); a value the window cannot reach is
    refused."""
    rollback_confidence: float = Field(0.99, ge=0.5, lt=1.0)
    """A drop below the best rolls back only when it is significant at this confidence (the
    score's upper Wilson bound below the best's lower bound, each one-sided, on the episodes
    behind each), besides exceeding ``rollback_threshold``. 0.99: at 0.95 an unchanged
    policy at 30 % success, 8 validation episodes an iteration, still rolled back in 4 of 20
    50-iteration runs (0 of 60 at 0.99; ``tests/gyre_ma/test_stability.py``); a collapse
    from 90 % to 40 % over 32 episodes is caught at either."""
    max_rollbacks: int = Field(3, ge=0)
    """After this many rollbacks the run stops rolling back (and cutting the learning rate),
    says so, and keeps learning from where it is."""


class CurriculumConfig(_Section):
    enabled: bool = False
    """Horizon phases (warm-up → reinforce → refine), step cap k × oracle path length."""
    k: float = Field(2.5, gt=0.0)
    """Step cap = k × the oracle's path length (reinforce, refine)."""
    warmup_k: float | None = Field(1.5, gt=0.0)
    """Cap factor during warm-up (None: k)."""
    warmup_goal: str | None = None
    """A nearer milestone that counts as completion during warm-up."""
    refine_k: float | None = Field(None, gt=0.0)
    """Cap factor during refine (None: k)."""
    threshold: float = Field(0.8, gt=0.0, le=1.0)
    """Mean verified completion over ``window`` iterations that promotes a phase."""
    window: int = Field(3, ge=1)
    """Iterations in the promotion window."""
    oracle_episodes: int = Field(4, ge=1)
    """Oracle episodes run at start to measure path lengths."""


class MonitorConfig(_Section):
    spot_checks: int = Field(2, ge=0)
    """Trajectories dumped as readable Markdown per iteration (``<run_dir>/spot_checks``)."""


class NoiseConfig(_Section):
    kind: Literal["param", "epsilon", "temperature", "none"] = "param"
    """``param``: adaptive parameter-space noise (Plappert et al. 2018); ``epsilon`` /
    ``temperature``: action-space noise (the ablation); ``none``."""
    start: float = Field(0.1, ge=0.0)
    """Target at iteration 0: KL distance δ for ``param``, ε or τ otherwise."""
    end: float = Field(0.01, ge=0.0)
    """Target after ``anneal_iterations``."""
    schedule: Literal["constant", "linear", "cosine", "exponential"] = "cosine"
    """How the target moves from ``start`` to ``end`` (exponential needs both > 0)."""
    anneal_iterations: int | None = Field(None, ge=1)
    """Iterations to anneal over; default ``train.iterations``."""
    initial_sigma: float = Field(0.05, gt=0.0)
    """σ before the first adaptation (param)."""
    adaptation: float = Field(1.05, gt=1.0)
    """α: σ·α below the target, σ/α above (param)."""
    adapt_steps: int = Field(10, ge=1)
    """Adaptations per iteration, each on a fresh perturbation (param)."""
    window: int = Field(1024, ge=1)
    """Recent decision states the distance is measured on."""

    @model_validator(mode="after")
    def _exponential_positive(self) -> NoiseConfig:
        if self.schedule == "exponential" and (self.start <= 0 or self.end <= 0):
            raise ValueError(f"an exponential schedule needs `start` ({self.start}) and `end` ({self.end}) > 0")
        return self


class RolesConfig(_Section):
    explorers: int = Field(1, ge=0)
    """Explorer episodes per task seed per iteration (large noise; feed the elite pool)."""
    executors: int = Field(3, ge=0)
    """Executor episodes per task seed per iteration (small annealed noise; on-policy data)."""
    evaluators: int = Field(4, ge=0)
    """Held-out task seeds validated per iteration, each played once sampled and once
    greedy (noise-free), on seeds no training episode uses; the checkpoint manager judges
    their verified success pooled over ``checkpoints.validation_window`` iterations.
    0 judges the iteration's own training episodes instead (not held-out)."""
    explorer_noise: NoiseConfig = Field(
        default_factory=lambda: NoiseConfig(start=0.3, end=0.05, schedule="cosine"))
    """Explorers: large target, annealed (an LLM manager's default: :data:`LLM_ROLE_NOISE`)."""
    executor_noise: NoiseConfig = Field(
        default_factory=lambda: NoiseConfig(start=0.01, end=0.001, schedule="exponential"))
    """Executors: small target, annealed (an LLM manager's default: :data:`LLM_ROLE_NOISE`)."""
    elite_min_score: float | None = Field(None, ge=0.0, le=1.0)
    """Also mark unsuccessful explorer episodes elite at this milestone score."""
    verify_elite: bool = True
    """Replay elite candidates and check their milestones on environment state first."""


class RolloutConfig(_Section):
    num_envs: int = Field(16, ge=1, le=1024)
    """Episodes each worker (this process, or each Ray actor) keeps in flight, each in an
    env of its own; every round, the pending decisions of all of them are made in one
    batched forward pass. An episode plays the same at any ``num_envs`` (a row's forward
    pass does not depend on its batch-mates); only the speed changes."""


class BackendConfig(_Section):
    name: Literal["local", "ray"] = "local"
    """Where rollouts run: in this process, or in Ray actors."""
    workers: int = Field(2, ge=1)
    """Ray actors (each plays any role)."""
    cpus_per_worker: float = Field(1.0, gt=0.0)
    """CPUs each Ray actor reserves."""
    max_restarts: int = Field(3, ge=0)
    """Ray restarts per actor before it is replaced."""
    max_attempts: int = Field(3, ge=1)
    """Tries per episode before the run fails."""
    sample_timeout_s: float = Field(600.0, gt=0.0)
    """Seconds one call to an actor (up to ``episodes_per_call`` episodes) may take
    before the actor is killed and replaced."""
    startup_timeout_s: float = Field(120.0, gt=0.0)
    """Seconds a Ray actor may take to start (import, build its envs and manager, load a
    model) before the run says it never started; raise it for large LLM managers or options."""
    option_timeout_s: float | None = Field(60.0, gt=0.0)
    """Seconds one option call's sub-policy may run in all (every backend); past it the
    call ends as a failure (``Termination.TIMEOUT``, metric ``option_timeouts``, a
    warning naming the option) and its agent decides again. None: unbounded."""
    episode_timeout_s: float | None = Field(600.0, gt=0.0)
    """Seconds one episode may take (every backend); past it the episode is cut as a
    truncation (metric ``episode_timeouts``). None: unbounded."""
    on_fault: Literal["stop", "continue"] = "stop"
    """What a fault of the user's code in an episode does. ``stop``: the run stops with one
    line naming it (the task seed, the option and agent, the file:line). ``continue``: a
    sub-policy that raised or answered an unusable action ends its call as a failure
    (``Termination.FAULT``) and its agent decides again; an env step that raised cuts the
    episode there, as a truncation, and a reset that raised cuts it before its first step;
    each is kept on the trajectory (``faults/*`` metrics) and warned once per source. Other
    faults (predicates, detectors outside the env's step, rules) stop the run either way."""
    pipeline_depth: int = Field(2, ge=1, le=16)
    """Calls queued on one Ray actor at a time, so it starts the next without waiting
    for the driver (1: one at a time)."""
    episodes_per_call: int = Field(32, ge=1, le=1024)
    """The most episodes one call to a Ray actor plays (fewer as the queue runs low: a
    batch is split evenly over the actors taking it): larger chunks spread the driver's
    per-call cost over more episodes, and the actor keeps up to ``rollout.num_envs`` of a
    call's episodes in flight at once, refilling its slots while the call lasts."""
    ray_init: dict[str, Any] = Field(default_factory=dict)
    """``ray.init`` keyword arguments (``address``, ``num_cpus``), used only with Ray."""
    async_rollouts: bool = False
    """Collect the next iteration's episodes while the learner updates."""
    max_staleness: int = Field(1, ge=0)
    """Async mode: drop trajectories more than this many policy versions old."""

    @property
    def options(self) -> dict[str, Any]:
        """The backend's constructor options (:func:`gyre_ma.backends.make_backend`)."""
        if self.name != "ray":
            return {}
        return {"workers": self.workers, "max_restarts": self.max_restarts, "max_attempts": self.max_attempts,
                "sample_timeout_s": self.sample_timeout_s, "startup_timeout_s": self.startup_timeout_s,
                "cpus_per_worker": self.cpus_per_worker,
                "init": self.ray_init, "pipeline_depth": self.pipeline_depth,
                "episodes_per_call": self.episodes_per_call}


Precision = Literal["32-true", "64-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true"]
"""The Fabric precisions the learner supports (defined here, not in trainers/fit.py, so a config loads
without torch)."""


class TrainerConfig(_Section):
    """The learner's Lightning Fabric (:class:`gyre_ma.trainers.fit.Fitter`): where and in
    what precision the manager, critic and PRM updates run. Rollouts stay on the CPU and
    receive the weights as CPU tensors."""

    accelerator: Literal["cpu", "cuda", "gpu", "mps", "auto"] = "cpu"
    """Fabric's ``accelerator`` for the updates; ``cuda`` (or ``gpu``) trains on a GPU, ``auto``
    takes one if there is one."""
    devices: int | list[int] = 1
    """Fabric's ``devices``: 1, or a one-element list of indices (``[1]``: the second GPU). The
    learner is one process, so it trains on exactly one device."""
    precision: Precision = "32-true"
    """Fabric's ``precision``: ``32-true`` (float32, the default), ``64-true`` (float64),
    ``bf16-mixed`` / ``16-mixed`` (autocast; 16-mixed scales the loss), ``bf16-true`` /
    ``16-true`` (weights in half precision)."""
    strategy: str = "auto"
    """Fabric's ``strategy`` name (``auto``: the single-device strategy); a registered one
    such as ``ddp`` is accepted, but with one device there is nothing to distribute."""
    threads: int | None = Field(1, ge=1, le=1024)
    """torch intra-op threads of the learner's process, set when it is built. The default 1
    is part of determinism: float reductions split over a different number of threads
    round differently, so the same config and seed gave different metrics on machines with
    different core counts. None keeps torch's setting (one per core); more threads help
    only large models. Local rollouts run with their own setting."""

    @field_validator("devices")
    @classmethod
    def _one_device(cls, devices: int | list[int]) -> int | list[int]:
        if (devices if isinstance(devices, int) else len(devices)) != 1:
            raise ValueError("must name one device (1, or a one-element list such as [1]): the learner runs in "
                             "one process")
        return devices

    @field_validator("strategy")
    @classmethod
    def _fabric_strategy(cls, strategy: str) -> str:
        if strategy != "auto":
            from lightning.fabric.strategies import STRATEGY_REGISTRY

            known = STRATEGY_REGISTRY.available_strategies()
            if strategy not in known:
                raise ValueError(f"not a Fabric strategy; expected 'auto' or one of {known}")
        return strategy


LLM_ROLE_NOISE: dict[str, dict[str, Any]] = {
    "explorer_noise": {"kind": "epsilon", "start": 0.2, "end": 0.02},
    "executor_noise": {"kind": "none"},
}
"""The roles' noise where the manager is an LLM (``manager.kind: llm``) and the config gives
them none: explorers mix ε of uniform choice among the eligible options into the policy's
sampling, annealed from 0.2 to 0.02; executors sample from the policy alone."""


class ExperimentConfig(_Section):
    name: str = Field("experiment", min_length=1, max_length=200)
    """Experiment name; the run directory is ``<run_root>/<name>``. One path component:
    letters, digits, ``_``, ``-``, ``.``, ``=``, ``+``, not starting with a dot, so a run
    cannot land outside ``run_root``."""
    seed: int = Field(0, ge=0)
    """Seed of everything random on the local backend."""
    env: EnvConfig = Field(default_factory=EnvConfig)
    """The environment."""
    library: str | None = None
    """Option library: a YAML file, or ``module:callable``; default: the env's own."""
    library_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for the library's factory (a ``module:callable`` or the env's own)."""
    manager: ManagerConfig = Field(default_factory=ManagerConfig)
    """The manager policy."""
    credit: CreditConfig = Field(default_factory=CreditConfig)
    """Credit assignment."""
    train: TrainConfig = Field(default_factory=TrainConfig)
    """The training loop."""
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    """The trajectory buffer."""
    checkpoints: CheckpointConfig = Field(default_factory=CheckpointConfig)
    """Checkpoint slots, rollback and the NaN guard."""
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    """The horizon curriculum."""
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    """Monitoring."""
    roles: RolesConfig = Field(default_factory=RolesConfig)
    """Explorer, executor and evaluator episodes and their exploration noise."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """How a worker plays its episodes: how many at once."""
    backend: BackendConfig = Field(default_factory=BackendConfig)
    """Where rollouts run."""
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    """The learner's Lightning Fabric: accelerator, precision, threads."""
    rewards: RewardConfig = Field(default_factory=RewardConfig)
    """Verified rewards: rules, PRM, arbitration, drift, hacking alarms."""

    run_root: str = "runs"
    """Folder under which run directories are made."""

    @field_validator("name")
    @classmethod
    def _one_path_component(cls, name: str) -> str:
        if not _RUN_NAME.match(name):
            raise ValueError(f"must be one folder name (letters, digits and _ - . = +, not starting with a dot) so "
                             f"that the run stays inside run_root; got {name[:100]!r}")
        return name

    @model_validator(mode="after")
    def _groups_fit(self) -> ExperimentConfig:
        if self.group_size < 1:
            raise ValueError("`roles.explorers` + `roles.executors` must be >= 1: each task seed needs at least one "
                             "episode (got 0 + 0)")
        if self.train.episodes_per_iteration % self.group_size:
            raise ValueError(
                f"`train.episodes_per_iteration` ({self.train.episodes_per_iteration}) must be a multiple of the "
                f"group size, `roles.explorers` ({self.roles.explorers}) + `roles.executors` "
                f"({self.roles.executors}) = {self.group_size}: one group of episodes per task seed")
        return self

    @model_validator(mode="after")
    def _validation_window_fits(self) -> ExperimentConfig:
        wanted, holds = self.checkpoints.min_validation_episodes, self.validation_window_episodes
        if self.checkpoints.enabled and wanted is not None and wanted > holds:
            raise ValueError(
                f"`checkpoints.min_validation_episodes` is {wanted}, but a validation window holds {holds} episodes "
                f"({self._window_text}), so no best.pt would ever be written and nothing would roll back: lower it, "
                "leave it unset (the whole window where it holds fewer than 32), or validate more episodes")
        return self

    @property
    def validation_window_episodes(self) -> int:
        """Episodes a full validation window holds: ``checkpoints.validation_window``
        validations of ``roles.evaluators`` seeds played sampled and greedy (with no
        evaluators, of the iteration's ``train.episodes_per_iteration`` training episodes)."""
        per = 2 * self.roles.evaluators if self.roles.evaluators else self.train.episodes_per_iteration
        return per * self.checkpoints.validation_window

    @property
    def _window_text(self) -> str:
        if self.roles.evaluators:
            return (f"`roles.evaluators` {self.roles.evaluators} × 2 (sampled and greedy) × "
                    f"`checkpoints.validation_window` {self.checkpoints.validation_window}")
        return (f"`train.episodes_per_iteration` {self.train.episodes_per_iteration} × "
                f"`checkpoints.validation_window` {self.checkpoints.validation_window}")

    @property
    def min_validation_episodes(self) -> int:
        """``checkpoints.min_validation_episodes``, or where it is None its default:
        :data:`MIN_VALIDATION_EPISODES`, or the whole window where it holds fewer."""
        wanted = self.checkpoints.min_validation_episodes
        return wanted if wanted is not None else min(MIN_VALIDATION_EPISODES, self.validation_window_episodes)

    @model_validator(mode="before")
    @classmethod
    def _llm_noise_defaults(cls, data: Any) -> Any:
        """An LLM manager's roles explore by sampling: a role the config gives no noise gets
        :data:`LLM_ROLE_NOISE`'s, not parameter noise (which perturbs the MLP manager's weights)."""
        if not isinstance(data, dict):
            return data
        manager = data.get("manager")
        kind = manager.get("kind") if isinstance(manager, dict) else getattr(manager, "kind", None)
        roles = data.get("roles", {})
        if kind != "llm" or not isinstance(roles, dict):  # a RolesConfig built by the caller keeps its noise
            return data
        missing = {key: noise for key, noise in LLM_ROLE_NOISE.items() if key not in roles}
        return {**data, "roles": {**missing, **roles}} if missing else data

    @model_validator(mode="after")
    def _llm_explores_by_sampling(self) -> ExperimentConfig:
        if self.manager.kind != "llm":
            return self
        for role in ("explorer", "executor"):
            if getattr(self.roles, f"{role}s") and getattr(self.roles, f"{role}_noise").kind == "param":
                raise ValueError(f"`roles.{role}_noise.kind` is 'param', but parameter noise perturbs the MLP "
                                 "manager's weights; the LLM manager (`manager.kind: llm`) explores by sampling: "
                                 "use none, epsilon or temperature")
        if self.train.self_imitation is not None and self.train.self_imitation > 0:
            raise ValueError(f"`train.self_imitation` is {self.train.self_imitation}, but self-imitation replays the "
                             "MLP manager's decision features; the LLM manager (`manager.kind: llm`) has none: set "
                             "it to 0")
        if self.train.temperature_final != 1.0:
            raise ValueError(f"`train.temperature_final` is {self.train.temperature_final}, but the temperature "
                             "schedule scales the MLP manager's logits; the LLM manager (`manager.kind: llm`) has "
                             "none: set it to 1")
        return self

    @property
    def imitation_weight(self) -> float:
        """``train.self_imitation``, or where it is None its default: 1 for the option
        manager, 0 for every other kind."""
        if self.train.self_imitation is not None:
            return self.train.self_imitation
        return 1.0 if self.manager.kind == "learned" else 0.0

    @property
    def group_size(self) -> int:
        """Episodes that share a task seed within an iteration: one per explorer and executor."""
        return self.roles.explorers + self.roles.executors

    @property
    def groups_per_iteration(self) -> int:
        """Task seeds per iteration."""
        return self.train.episodes_per_iteration // self.group_size

    @property
    def run_dir(self) -> Path:
        return Path(self.run_root) / self.name


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The config section a field holds: the model itself, or the model a list, mapping or
    optional of it holds (``list[RuleSpec]``); None for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for arg in get_args(annotation) if (m := _model_in(arg)) is not None), None)


def _section_of(model: type[BaseModel], loc: Sequence[Any]) -> type[BaseModel] | None:
    """The config section (model) that the key path ``loc`` leads into; None past a plain value."""
    section: Any = model
    for part in loc:
        if isinstance(part, int):  # an item of a list (rewards.rules.0): its type is the section already
            continue
        field = section.model_fields.get(part)
        section = _model_in(field.annotation) if field is not None else None
        if section is None:
            return None
    return section


def _format_error(err: dict[str, Any], model: type[BaseModel]) -> str:
    path = ".".join(str(p) for p in err["loc"]) or "<root>"
    if err["type"] == "extra_forbidden":
        section = _section_of(model, err["loc"][:-1])
        accepted = sorted(section.model_fields) if section is not None else []
        return f"unknown key '{path}'; accepted keys here: {accepted}"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "missing":
        section = _section_of(model, err["loc"][:-1]) if err["loc"] else None
        field = section.model_fields.get(err["loc"][-1]) if section is not None else None
        what = " ".join((field.description or "").replace("``", "").split()) if field is not None else ""
        what = re.split(r"(?<=\.)\s+(?=[A-Z])", what)[0].rstrip(".")  # its first sentence
        return f"'{path}': required key is missing" + (f" ({what})" if what else "")
    if not err["loc"]:  # a check across sections: the message names the keys and values
        return msg
    got = repr(err["input"])
    return f"'{path}': {msg} (got {got if len(got) <= 200 else got[:200] + '…'})"


def parse_config(data: Any, source: str = "config") -> ExperimentConfig:
    """Validate a mapping; raise :class:`ConfigError` with one line per the first problem."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise ConfigError(f"{source}: {_format_error(first, ExperimentConfig)}") from None


def load_config(path: str | Path, overrides: dict[str, Any] | None = None, *,
                overrides_from: str = "--set") -> ExperimentConfig:
    """Read a YAML config; ``overrides`` are dotted keys (``train.iterations``) applied on top.

    An override changes exactly the key it names: it is set on the file's config with every
    default filled in, so the siblings of a key in a nested section keep the values they
    had (a section's defaults can differ from its class's, e.g. ``roles.executor_noise``).
    An error in a key an override set names the override (``overrides_from``, how the
    caller was given them), not the file, which may not hold that key at all.
    """
    p = Path(path)
    data = read_yaml(p, "config file", ConfigError)
    if data is None:  # an empty file is a mistake (a truncated copy, the wrong path), not "all defaults"
        raise ConfigError(f"config file {p.name!r} is empty: expected a mapping of sections, at least "
                          "'env: {id: ...}' (see configs/quickstart.yaml)")
    if not overrides:
        return _files_beside(parse_config(data, source=p.name), p.parent)
    try:
        base = parse_config(data, source=p.name).model_dump(mode="json")
        # a role noise the file leaves to its default stays a default, which follows the manager's
        # kind: an override (an experiment's variant) may make it an LLM manager
        given = data.get("roles") if isinstance(data.get("roles"), dict) else {}
        for key in LLM_ROLE_NOISE:
            if key not in given and not any(k == f"roles.{key}" or k.startswith(f"roles.{key}.") for k in overrides):
                base["roles"].pop(key, None)
    except ConfigError:  # the overrides may be what makes the file valid: set them on it as written
        base = dict(data or {}) if isinstance(data, dict) else data
    try:
        return _files_beside(parse_config(with_overrides(base, overrides), source=p.name), p.parent)
    except ConfigError as exc:
        raise _blame_override(exc, p.name, overrides, overrides_from) from None


def _blame_override(exc: ConfigError, source: str, overrides: dict[str, Any], overrides_from: str) -> ConfigError:
    """``exc`` (``"<source>: '<key>' ..."`` or ``"<source>: unknown key '<key>' ..."``) told
    as the override's where the key it names is one an override set, or a section above one."""
    text = str(exc)
    found = re.match(rf"{re.escape(source)}: (?:unknown key )?'([^']+)'", text)
    if found is not None:
        key = found.group(1)
        for dotted in overrides:
            if dotted == key or dotted.startswith(key + "."):
                return ConfigError(f"{overrides_from} {dotted} (on {source}):{text[len(source) + 1:]}")
    return exc


def _files_beside(config: ExperimentConfig, folder: Path) -> ExperimentConfig:
    """``library`` and ``rewards.rules_file`` YAML paths, relative ones read from the current
    folder or, where none is there, from the config file's own ``folder`` (made absolute,
    so that the run's stored config finds it from anywhere), as an experiment's ``base``."""

    def beside(name: str | None) -> str | None:
        if name is None or Path(name).suffix not in (".yaml", ".yml") or Path(name).is_absolute():
            return name
        there = folder / name
        return str(there.resolve()) if not Path(name).exists() and there.is_file() else name

    library, rules = beside(config.library), beside(config.rewards.rules_file)
    if library == config.library and rules == config.rewards.rules_file:
        return config
    return config.model_copy(update={"library": library,
                                     "rewards": config.rewards.model_copy(update={"rules_file": rules})})


def with_overrides(data: Any, overrides: dict[str, Any]) -> Any:
    """A copy of the raw config mapping ``data`` with each dotted key of ``overrides`` set
    (``{"train.lr": 1e-3}``), sections created as needed; siblings are kept."""
    if not isinstance(data, dict):
        return data
    data = copy.deepcopy(data)
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override '{dotted}': '{part}' is not a section")
        node[leaf] = value
    return data


def dump_config(config: ExperimentConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


_REFERENCE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_FILES_OF_CODE = ("library", "rewards.rules_file")
"""Keys naming a YAML file whose entries may name code (an option library, a rules file)."""


def code_files(config: ExperimentConfig) -> dict[str, str]:
    """The SHA-256 of each file of code ``config`` names (:func:`code_references`): the
    source file of each referenced module, as it would be imported now, the user's modules
    it imports from beside it (:func:`_modules_beside`), and each YAML file, by absolute
    path; a module that cannot be found is left out. ``train`` records them
    (:data:`CODE_FILE`), and ``eval`` says which changed since."""
    import hashlib
    import importlib.util

    files: list[Path] = []
    for _, value in code_references(config):
        origin: str | None = value
        if _REFERENCE.match(value):
            try:
                spec = importlib.util.find_spec(value.split(":")[0])
            except (ImportError, ValueError):
                continue
            origin = spec.origin if spec is not None else None
        path = Path(origin) if origin else None
        if path is not None and path.is_file():
            files.append(path.resolve())
    found: dict[str, str] = {}
    while files and len(found) < _MOST_CODE_FILES:
        path = files.pop()
        if str(path) not in found:
            found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
            files += _modules_beside(path) if path.suffix == ".py" and not _installed(path) else []
    return found


_MOST_CODE_FILES = 200
"""Most files :func:`code_files` hashes (a project's own code, not a library's)."""


def _installed(path: Path) -> bool:
    """Whether ``path`` is an installed package's (gyre-ma's own or from site-packages), not the user's project."""
    return "site-packages" in path.parts or "dist-packages" in path.parts or Path(__file__).parent in path.parents


def _modules_beside(path: Path) -> list[Path]:
    """The modules the Python file ``path`` imports that are files beside it: ``import helpers``
    or ``from helpers import x`` where ``helpers.py`` (or a package ``helpers/``) sits in its
    folder, and relative imports, each with the ``__init__.py`` of the packages it is in.
    Found by reading the file, not by importing anything; a file that does not parse imports
    nothing here."""
    import ast

    try:
        tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError, OSError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [(alias.name, path.parent) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = path.parents[node.level - 1] if 0 < node.level <= len(path.parents) else path.parent
            module = node.module.split(".") if node.module else []
            names = [(".".join(module + [alias.name]), base) for alias in node.names] + [(".".join(module), base)]
        else:
            continue
        for name, base in names:
            parts = [p for p in name.split(".") if p]
            for k in range(len(parts), 0, -1):  # the longest dotted prefix that is a file beside it
                stem = base.joinpath(*parts[:k])
                hit = next((f for f in (stem.with_suffix(".py"), stem / "__init__.py") if f.is_file()), None)
                if hit is not None:  # with the packages it sits in, which its import runs too
                    inits = (base.joinpath(*parts[:j], "__init__.py") for j in range(1, k))
                    found += [f.resolve() for f in (hit, *inits) if f.is_file()]
                    break
    return found


CODE_FILE = "code.json"
"""In a run directory: :func:`code_files` when the run (last) started training."""


def code_references(config: ExperimentConfig) -> list[tuple[str, str]]:
    """Every ``(dotted key, value)`` of ``config`` that makes gyre-ma import code: a
    ``module:callable`` reference anywhere (env id, library, manager policy, rule checks,
    kwargs) and the YAML files whose entries may hold more (library, rules file).
    A registered env id imports only gyre-ma's own code and is not listed."""
    found: list[tuple[str, str]] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{where}.{k}" if where else str(k))
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                walk(v, f"{where}[{i}]")
        elif isinstance(node, str) and (_REFERENCE.match(node) or (where in _FILES_OF_CODE)):
            found.append((where, node))

    walk(config.model_dump(mode="json"), "")
    return found
