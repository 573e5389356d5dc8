"""check_env: passes on a real adapted env; names the problem on deliberately broken ones."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo import ParallelEnv
from pettingzoo.classic import rps_v2

from gyre_ma.envs.adapters import from_gymnasium, from_pettingzoo
from gyre_ma.envs.checks import EnvCheckError, check_env, why_outside
from gyre_ma.options.graph import TaskGraph

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

N = 30  # steps per episode in the toy checks: enough to reach every milestone


# ---------------------------------------------------------------------- real envs pass
def test_check_env_accepts_an_instance_and_random_actions() -> None:
    env = from_gymnasium(
        "CartPole-v1", milestones={"pushed_right": lambda e: bool(e.state[1] > 0.1)},
        graph={"goals": ["pushed_right"], "milestones": {"pushed_right": {}}},
    )
    report = check_env(env, seeds=(3,), n_steps=40)
    assert report.seeds == (3,) and "pushed_right" in report.milestones
    assert report.unverifiable == ()  # the lambda has no reference; the adapter's own callable re-verifies it


def test_a_closure_detector_is_re_verified_on_state_not_taken_on_trust() -> None:
    """Measurement 9: a detector written as a closure got no verifier, and check_env silently
    skipped it. A closure that reads something other than the env state is now caught."""
    calls = itertools.count()

    def flaky(env) -> bool:  # true on every other call: not a function of the state
        return next(calls) % 2 == 1

    env = from_gymnasium("CartPole-v1", milestones={"pushed_right": flaky},
                         graph={"goals": ["pushed_right"], "milestones": {"pushed_right": {}}})
    with pytest.raises(EnvCheckError, match="verifier"):
        check_env(env, seeds=(3,), n_steps=10)


def test_check_env_passes_on_adapted_pettingzoo_aec_env() -> None:
    def make():
        return from_pettingzoo(
            rps_v2.env(max_cycles=8),
            milestones={"first_round": lambda e: e.num_moves >= 1, "five_rounds": lambda e: e.num_moves >= 5},
            graph={"goals": ["five_rounds"], "milestones": {
                "first_round": {}, "five_rounds": {"requires": ["first_round"]}}},
        )

    report = check_env(make, n_steps=20)
    assert report.name == "gyre_rps_v2" and report.milestones == {"first_round", "five_rounds"}


# ---------------------------------------------------------------------- a toy env and its breakages
def counter_at_least_one(env: CounterEnv) -> bool:
    return env.counter >= 1


class CounterEnv(ParallelEnv):
    """Two agents add their 0/1 actions to a shared counter; milestones at counts 1 and 3."""

    metadata = {"name": "counter_v0", "is_parallelizable": True, "render_modes": []}
    spec = {"goals": ["three"], "milestones": {"one": {}, "three": {"requires": ["one"]}}}
    thresholds = {"one": 1, "three": 3}

    def __init__(self, max_cycles: int = 12) -> None:
        self.possible_agents = ["a0", "a1"]
        self.agents: list[str] = []
        self.max_cycles = max_cycles
        self.render_mode = None
        self._obs_space = spaces.Box(0, 100, (1,), np.int64)
        self._act_space = spaces.Discrete(2)
        self.state_space = spaces.Box(0, 100, (1,), np.int64)
        self._graph = TaskGraph.from_spec(self.spec)
        self.counter, self.t, self.achieved = 0, 0, set()

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._act_space

    def observe(self, agent: str) -> np.ndarray:
        return np.array([self.counter], dtype=np.int64)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.counter, self.t, self.achieved = 0, 0, set()
        self.detect()
        return {a: self.observe(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        acting = list(self.agents)
        self.counter += sum(int(actions[a]) for a in acting)
        self.t += 1
        done = self.truncate()
        out = (
            {a: self.observe(a) for a in acting},
            {a: float(actions[a]) for a in acting},
            dict.fromkeys(acting, False),
            dict.fromkeys(acting, done),
            {a: {} for a in acting},
        )
        if done:
            self.agents = []
        self.detect()
        return out

    def truncate(self) -> bool:
        return self.t >= self.max_cycles

    def detect(self) -> None:
        self.achieved |= {m for m, n in self.thresholds.items() if self.counter >= n}

    def state(self) -> np.ndarray:
        return np.array([self.counter], dtype=np.int64)

    def task_graph(self) -> TaskGraph:
        return self._graph

    def verified_milestones(self) -> frozenset[str]:
        return frozenset(self.achieved)


def _fails(env_cls: type, check: str, *patterns: str, **kwargs) -> EnvCheckError:
    with pytest.raises(EnvCheckError) as info:
        check_env(env_cls, n_steps=N, **kwargs)
    err = info.value
    assert err.check == check, str(err)
    text = str(err)
    assert "fix:" in text
    for pattern in patterns:
        assert re.search(pattern, text), f"{pattern!r} not in:\n{text}"
    assert isinstance(err, AssertionError) and isinstance(err, ValueError)
    return err


def test_the_toy_env_itself_passes() -> None:
    report = check_env(CounterEnv, n_steps=N)
    assert report.milestones == {"one", "three"}
    assert check_env(CounterEnv(), n_steps=N, pettingzoo_tests=False).pettingzoo_tests == ()


class ObservationOutOfSpace(CounterEnv):
    def observe(self, agent):
        return np.array([self.counter * 50], dtype=np.int64)


def test_observation_outside_its_space() -> None:
    err = _fails(
        ObservationOutOfSpace, "observation_space",
        r"agent 'a0'", r"outside observation_space\('a0'\)", r"observation\[0\] = 1\d\d is outside \[0, 100\]",
    )
    assert err.agent == "a0" and err.step >= 1


class MilestoneBeforeItsPrerequisite(CounterEnv):
    thresholds = {"one": 5, "three": 3}


def test_milestone_before_its_prerequisite() -> None:
    err = _fails(
        MilestoneBeforeItsPrerequisite, "graph_order",
        r"milestone 'three' is verified after step \d+ but its prerequisite\(s\) are not: 'one'",
    )
    assert err.milestone == "three"


class OrGroup(CounterEnv):
    spec = {
        "goals": ["c"],
        "milestones": {"a": {}, "b": {}, "c": {"any_of": [["a", "b"]]}},
    }
    thresholds = {"b": 1, "c": 2}


class OrGroupUnmet(OrGroup):
    thresholds = {"a": 9, "b": 9, "c": 2}


def test_or_group_prerequisites() -> None:
    assert check_env(OrGroup, n_steps=N, pettingzoo_tests=False).milestones == {"b", "c"}
    _fails(OrGroupUnmet, "graph_order", r"milestone 'c' .* not: one of 'a', 'b'", pettingzoo_tests=False)


_episodes = itertools.count()


class NonDeterministicVerifier(CounterEnv):
    """'one' needs a count of 1 or 2 depending on a counter that survives reset()."""

    def reset(self, seed=None, options=None):
        self.thresholds = {"one": 1 + next(_episodes) % 2, "three": 3}
        return super().reset(seed=seed, options=options)


def test_non_deterministic_verifier() -> None:
    _fails(
        NonDeterministicVerifier, "determinism",
        r"identical observations", r"verifier is not deterministic", r"no unseeded RNG",
    )


class UnknownMilestone(CounterEnv):
    thresholds = {"one": 1, "three": 3, "bonus": 2}


def test_milestone_not_in_graph() -> None:
    err = _fails(UnknownMilestone, "graph_nodes", r"reports 'bonus', which is not a node", r"\['one', 'three'\]")
    assert err.milestone == "bonus"


class Forgetful(CounterEnv):
    def detect(self):
        self.achieved = {m for m, n in self.thresholds.items() if self.counter >= n}
        if self.counter >= 5:
            self.achieved.discard("one")


def test_milestones_must_be_monotone() -> None:
    _fails(Forgetful, "monotone", r"milestone 'one' was verified after step \d+ but not after step \d+")


class ClaimsWithoutState(CounterEnv):
    spec = {
        "goals": ["three"],
        "milestones": {
            "one": {"verifier": f"{__name__}:counter_at_least_one"},
            "three": {"requires": ["one"]},
        },
    }
    thresholds = {"one": 0, "three": 3}


class VerifiedByRef(ClaimsWithoutState):
    thresholds = {"one": 1, "three": 3}


def test_milestone_without_state_to_support_it() -> None:
    assert check_env(VerifiedByRef, n_steps=N, pettingzoo_tests=False).milestones == {"one", "three"}
    err = _fails(
        ClaimsWithoutState, "verifier",
        r"reports 'one' at reset, but its verifier '.*:counter_at_least_one' is false",
        pettingzoo_tests=False,
    )
    assert err.step == 0 and err.milestone == "one"


class IgnoresMaxCycles(CounterEnv):
    def truncate(self):
        return self.t >= 40


def test_max_cycles_must_truncate() -> None:
    _fails(IgnoresMaxCycles, "max_cycles", r"with max_cycles = 5, agent 'a0' was neither terminated nor truncated")


class FreshSpaces(CounterEnv):
    def observation_space(self, agent):
        return spaces.Box(0, 100, (1,), np.int64)


def test_pettingzoo_failures_are_reported_as_env_check_errors() -> None:
    _fails(FreshSpaces, "pettingzoo.parallel_api_test", r"exact same space object")


def test_not_a_gyre_env() -> None:
    with pytest.raises(EnvCheckError, match=r"no method\(s\) \['task_graph', 'verified_milestones'\]"):
        check_env(rps_v2.parallel_env)


def test_why_outside_points_into_nested_spaces() -> None:
    space = spaces.Dict({"pos": spaces.Box(0, 4, (2,), np.int64), "dir": spaces.Discrete(4)})
    assert why_outside(space, {"pos": np.array([1, 7]), "dir": 0}, "obs") == (
        "obs['pos'][1] = 7 is outside [0, 4] (1 value(s) out of bounds)"
    )
    assert why_outside(space, {"pos": np.array([1, 2])}, "obs") == "obs['dir'] is missing"
    assert "has shape (3,)" in why_outside(space["pos"], np.zeros(3, np.int64))
    glitch = np.zeros(31, np.float32)
    glitch[4] = np.nan  # a session-54 user read "min=nan, max=nan" as an observation all NaN
    assert why_outside(spaces.Box(-1, 1, (31,), np.float32), glitch, "obs") == "obs[4] is NaN (1 of 31 value(s) NaN)"


class NonDeterministicPixel(CounterEnv):
    """A dict observation with a large image whose one cell depends on a counter surviving reset()."""

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Dict({"count": spaces.Box(0, 100, (1,), np.int64),
                            "image": spaces.Box(0, 9, (8, 8, 3), np.int64)})

    def observe(self, agent: str) -> dict:
        image = np.zeros((8, 8, 3), dtype=np.int64)
        image[5, 2, 1] = self.noise
        return {"count": np.array([self.counter], dtype=np.int64), "image": image}

    def reset(self, seed=None, options=None):
        self.noise = next(_episodes) % 2
        return super().reset(seed=seed, options=options)


def test_the_determinism_check_names_the_element_that_differs() -> None:
    _fails(NonDeterministicPixel, "determinism",
           r"first at \['image'\]\[5, 2, 1\]: (np\.int64\()?[01]\)? vs (np\.int64\()?[01]\)?",
           pettingzoo_tests=False)
