"""``gyre-ma compare``: two evaluations of the same task seeds, paired seed by seed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.stats

from gyre_ma import api
from gyre_ma.cli import main
from gyre_ma.metrics import mcnemar_exact, paired_difference, wilson_interval


def test_the_paired_interval_is_newcombes_published_one():
    """Fagerland, Lydersen and Laake's worked example (Cavo et al. 2012: 59 both, 6 and 16
    one alone, 80 neither): −0.0621 (95 % CI −0.1186 to −0.0046), as their R package
    ``contingencytables`` prints it."""
    difference, low, high = paired_difference(59, 6, 16, 80)
    assert (round(difference, 4), round(low, 4), round(high, 4)) == (-0.0621, -0.1186, -0.0046)
    # swapping the two policies mirrors the interval
    assert paired_difference(59, 16, 6, 80) == pytest.approx((-difference, -high, -low))
    # no correlation (a cross product within n/2 of 0): the independent square-and-add of the two Wilson intervals
    d, lo, hi = paired_difference(10, 10, 10, 10)
    l1, u1 = wilson_interval(20, 40)
    assert (d, lo, hi) == pytest.approx((0.0, -np.hypot(0.5 - l1, u1 - 0.5), np.hypot(0.5 - l1, u1 - 0.5)))
    # pairing narrows it: the same two rates (60 % and 50 %) with every disagreement on one side
    d, lo, hi = paired_difference(100, 20, 0, 80)
    (l1, u1), (l2, u2) = wilson_interval(120, 200), wilson_interval(100, 200)
    independent = np.hypot(0.6 - l1, u2 - 0.5) + np.hypot(u1 - 0.6, 0.5 - l2)
    assert d == pytest.approx(0.1) and 0 < lo and hi - lo < 0.5 * independent
    # one alone solved every seed: no correlation to count, the interval stays inside [-1, 1]
    assert paired_difference(0, 200, 0, 0) == pytest.approx(
        (1.0, 1.0 - np.hypot(1.0 - wilson_interval(200, 200)[0], wilson_interval(0, 200)[1]), 1.0))
    with pytest.raises(ValueError, match=r"need counts >= 0 of at least one task, got \(0, 0, 0, 0\)"):
        paired_difference(0, 0, 0, 0)


@pytest.mark.parametrize("first_only,second_only", [(0, 0), (6, 16), (100, 5), (7, 7), (0, 12), (31, 40)])
def test_mcnemars_exact_p_is_scipys_binomial_test(first_only, second_only):
    expected = 1.0 if first_only + second_only == 0 else scipy.stats.binomtest(first_only, first_only + second_only
                                                                              ).pvalue
    assert mcnemar_exact(first_only, second_only) == pytest.approx(expected, rel=1e-12)


def test_compare_pairs_two_evaluations_of_the_same_seeds(tmp_path, capsys):
    """A user evaluated a policy and a baseline on the same held-out seeds and read two
    intervals side by side; the evidence is in the seeds one alone solved."""
    config = tmp_path / "quick.yaml"
    config.write_text(f"name: quick\nenv: {{id: techtree_v0}}\nrun_root: {tmp_path}\n")
    for kind in ("oracle", "random"):
        assert main(["eval", str(config), "--set", f"manager.kind={kind}", "--episodes", "12", "--json",
                     str(tmp_path / f"{kind}.json")]) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "oracle.json"), str(tmp_path / "random.json"), "--json",
                 str(tmp_path / "c.json")]) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    result = json.loads((tmp_path / "c.json").read_text())
    runs = [{e["task_seed"]: e for e in json.loads((tmp_path / f"{k}.json").read_text())["episodes"]}
            for k in ("oracle", "random")]
    a = np.array([runs[0][s]["success"] for s in sorted(runs[0])])
    b = np.array([runs[1][s]["success"] for s in sorted(runs[0])])
    assert result["task_seeds"] == 12 and result["success"] == [a.mean(), b.mean()]
    assert (result["first_only"], result["second_only"]) == (int(np.sum(a & ~b)), int(np.sum(~a & b)))
    assert result["first_only"] > 0  # the oracle solves what a random order does not
    assert "note:" not in out  # neither learned: no mode to differ in, the same stream and seeds
    assert result["difference"] == pytest.approx(a.mean() - b.mean())
    assert result["mcnemar_p"] == pytest.approx(mcnemar_exact(result["first_only"], result["second_only"]))
    assert result["played"][0]["mode"] is None and result["played"][0]["first_seed"] == 1_000_000  # nothing learned
    low, high = result["difference_ci"]
    assert (f"oracle − random: {100 * result['difference']:+.1f} points of verified completion (95 % CI "
            f"{100 * low:+.1f} to {100 * high:+.1f}, Newcombe's interval for paired rates)") in out
    both = [s for s in runs[0] if runs[0][s]["success"] and runs[1][s]["success"]]
    if both:  # steps to the goal where both reached it, paired too
        gap = np.mean([runs[0][s]["length"] - runs[1][s]["length"] for s in both])
        assert result["steps_to_goal"]["seeds"] == len(both)
        assert result["steps_to_goal"]["difference"] == pytest.approx(gap)
    assert api.compare(tmp_path / "oracle.json", tmp_path / "random.json", quiet=True) == result
    given = [json.loads((tmp_path / f"{k}.json").read_text()) for k in ("oracle", "random")]  # evaluate's dicts
    assert api.compare(*given, quiet=True) | {"names": ["oracle", "random"]} == result


def test_compare_refuses_files_it_cannot_pair_naming_each(tmp_path, capsys):
    def episodes(seeds, success=True):
        return {"episodes": [{"task_seed": s, "success": success, "length": 5} for s in seeds]}

    files = {"a.json": episodes(range(10)), "far.json": episodes(range(100, 110)), "figures.json": {"success_rate": 1},
             "twice.json": episodes([1, 2, 2]), "half.json": episodes(range(5), False),
             "bad.json": {"episodes": [{"task_seed": "1", "success": True, "length": 5}]}}
    for name, data in files.items():
        (tmp_path / name).write_text(json.dumps(data))
    (tmp_path / "broken.json").write_text("{")
    expected = {
        "far.json": r"a and far share no task seed \(10 seeds 0–9 against 10 seeds 100–109\); evaluate both with "
                    r"the same --seed and --episodes",
        "figures.json": r"figures.json' has no 'episodes' list; expected the JSON `gyre-ma eval --json FILE` writes",
        "twice.json": r"twice.json': task seed 2 is played twice",
        "bad.json": r"bad.json': episodes\[0\] is .*; expected an object with task_seed \(int\), success \(bool\) "
                    r"and length \(int\)",
        "broken.json": r"broken.json': not readable JSON",
        "missing.json": r"missing.json': no such file",
    }
    for name, message in expected.items():
        assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / name)]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert __import__("re").search(message, err), (name, err)
    # seeds one alone played are left out, and said to be
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "half.json")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "compared on 5 task seeds (0–4)" in out and "note: 5 task seeds a alone played left out" in out
    assert "a − half: +100.0 points" in out
