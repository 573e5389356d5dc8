"""``benchmarks/generalisation.py``'s held-out split by instance: a seed that starts the same
instance as a training seed is told apart from one that starts a new one."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


def test_seeds_that_start_the_same_taxi_state_share_an_instance_and_no_others_do(generalisation):
    bench = generalisation
    _, env, _ = bench.env_and_library("taxi")
    start: dict[int, int] = {}
    for seed in range(400):
        env.reset(seed=seed)
        start[seed] = int(env.unwrapped.s)
    keys = {seed: bench.instance_key(env, seed) for seed in start}
    assert len(set(start.values())) < len(start)  # 400 seeds, at most 300 start states: some repeat
    for a in range(0, 400, 7):
        for b in range(400):
            assert (keys[a] == keys[b]) == (start[a] == start[b]), (a, b)


def test_the_unseen_seeds_are_the_held_out_seeds_whose_start_no_training_seed_made(generalisation):
    from gyre_ma.loop import Gyre

    bench = generalisation
    gyre = Gyre(bench.config("taxi", 0, 2))
    try:
        _, env, _ = bench.env_and_library("taxi")
        trained = set()
        for i in range(3):  # the run's two iterations, and the one an asynchronous run submits
            for task in gyre.tasks(i):
                env.reset(seed=task.task_seed)
                trained.add(int(env.unwrapped.s))
        held_out = list(range(2_000_000, 2_000_300))
        expected = set()
        for seed in held_out:
            env.reset(seed=seed)
            if int(env.unwrapped.s) not in trained:
                expected.add(seed)
        assert 0 < len(expected) < len(held_out)  # some held-out seeds replay a trained start
        assert bench.unseen_seeds("taxi", gyre, held_out) == expected
    finally:
        gyre.close()
