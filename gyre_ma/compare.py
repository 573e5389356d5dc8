"""``gyre-ma compare``: two evaluations of the same held-out task seeds, paired seed by seed.

Two policies evaluated on the same task seeds (and sampling stream) meet the same tasks
and draw the same random numbers, so their difference is best judged task by task: the
tasks one solved and the other did not carry the evidence, the tasks both solved or both
failed carry none. Each success rate's own interval (as ``gyre-ma eval`` prints it) ignores
that pairing and is wider than the evidence for the difference.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from gyre_ma.metrics import mcnemar_exact, paired_difference, wilson_interval
from gyre_ma.stats import mean_interval


class CompareError(ValueError):
    """An evaluation file that cannot be compared: named, with what was expected."""


def load_evaluation(path: str | Path) -> dict[str, Any]:
    """An evaluation written by ``gyre-ma eval --json`` (or returned by ``api.evaluate``, then
    saved): its figures and its ``episodes``, each with ``task_seed``, ``success``, ``length``."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CompareError(f"{str(path)!r}: no such file; expected the JSON `gyre-ma eval --json FILE` "
                           "writes") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CompareError(f"{str(path)!r}: not readable JSON ({exc})") from None
    episodes = data.get("episodes") if isinstance(data, dict) else None
    if not isinstance(episodes, list) or not episodes:
        raise CompareError(f"{str(path)!r} has no 'episodes' list; expected the JSON `gyre-ma eval --json FILE` "
                           "writes, which lists every episode it played")
    seen: set[int] = set()
    for i, e in enumerate(episodes):
        if not (isinstance(e, dict) and isinstance(e.get("task_seed"), int) and isinstance(e.get("success"), bool)
                and isinstance(e.get("length"), int)):
            raise CompareError(f"{str(path)!r}: episodes[{i}] is {str(e)[:120]!r}; expected an object with "
                               "task_seed (int), success (bool) and length (int)")
        scores = e.get("scores", {})
        if not (isinstance(scores, dict) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                 for v in scores.values())):
            raise CompareError(f"{str(path)!r}: episodes[{i}]'s scores are {str(scores)[:120]!r}; expected an object "
                               "of names to numbers")
        if e["task_seed"] in seen:
            raise CompareError(f"{str(path)!r}: task seed {e['task_seed']} is played twice; an evaluation plays "
                               "each task seed once")
        seen.add(e["task_seed"])
    return data


def compare(first: dict[str, Any], second: dict[str, Any], *, names: tuple[str, str] = ("A", "B"),
            confidence: float = 0.95) -> dict[str, Any]:
    """``first`` against ``second`` (two :func:`load_evaluation` results) on the task seeds both
    played: each success rate with its Wilson interval, their difference (first − second) with
    Newcombe's paired interval and the exact McNemar p-value, the seeds each alone solved, the
    steps to the goal on the seeds both solved, and each of the env's scores on the seeds where
    both episodes gave it: means, and their mean difference with a bootstrap interval over
    those seeds."""
    by_seed = [{e["task_seed"]: e for e in d["episodes"]} for d in (first, second)]
    seeds = sorted(set(by_seed[0]) & set(by_seed[1]))
    if not seeds:
        raise CompareError(f"{names[0]} and {names[1]} share no task seed ({_span(by_seed[0])} against "
                           f"{_span(by_seed[1])}); evaluate both with the same --seed and --episodes")
    a = np.array([by_seed[0][s]["success"] for s in seeds])
    b = np.array([by_seed[1][s]["success"] for s in seeds])
    both, first_only, second_only = int(np.sum(a & b)), int(np.sum(a & ~b)), int(np.sum(~a & b))
    neither = len(seeds) - both - first_only - second_only
    difference, low, high = paired_difference(both, first_only, second_only, neither, confidence=confidence)
    out: dict[str, Any] = {
        "names": list(names), "task_seeds": len(seeds), "first_seed": seeds[0], "last_seed": seeds[-1],
        "unpaired": [len(by_seed[0]) - len(seeds), len(by_seed[1]) - len(seeds)],
        "success": [float(a.mean()), float(b.mean())],
        "success_ci": [list(wilson_interval(int(x.sum()), len(seeds), confidence=confidence)) for x in (a, b)],
        "both": both, "first_only": first_only, "second_only": second_only, "neither": neither,
        "difference": difference, "difference_ci": [low, high], "mcnemar_p": mcnemar_exact(first_only, second_only),
        "played": [d.get("played") for d in (first, second)], "confidence": confidence,
    }
    solved = [s for s in seeds if by_seed[0][s]["success"] and by_seed[1][s]["success"]]
    if solved:
        steps = np.array([[by_seed[k][s]["length"] for k in (0, 1)] for s in solved], dtype=float)
        gap = mean_interval(steps[:, 0] - steps[:, 1], confidence=confidence)
        out["steps_to_goal"] = {"seeds": len(solved), "means": steps.mean(axis=0).tolist(),
                                "difference": gap.estimate, "difference_ci": [gap.low, gap.high]}
    scores: dict[str, Any] = {}
    for name in sorted({k for d in by_seed for e in d.values() for k in e.get("scores", {})}):
        given = [s for s in seeds if all(name in d[s].get("scores", {}) for d in by_seed)]
        if given:  # the env's own figure, on the seeds where both episodes gave it
            values = np.array([[d[s]["scores"][name] for d in by_seed] for s in given], dtype=float)
            gap = mean_interval(values[:, 0] - values[:, 1], confidence=confidence)
            scores[name] = {"seeds": len(given), "means": values.mean(axis=0).tolist(),
                            "difference": gap.estimate, "difference_ci": [gap.low, gap.high]}
    if scores:
        out["scores"] = scores
    return out


def _span(episodes: dict[int, Any]) -> str:
    return f"{len(episodes)} seeds {min(episodes)}–{max(episodes)}"


def mismatches(result: dict[str, Any]) -> list[str]:
    """How the two evaluations were played differently (sampling stream, greedy against
    sampled where both learned, seeds one of them alone played): each a line worth saying
    beside the figures."""
    notes = []
    played = result["played"]
    if all(isinstance(p, dict) for p in played):
        if played[0].get("stream") != played[1].get("stream"):
            notes.append(f"they drew from different sampling streams ({played[0].get('stream')} and "
                         f"{played[1].get('stream')}): paired by task alone, not by the random numbers too")
        if None not in (played[0].get("mode"), played[1].get("mode")) and played[0]["mode"] != played[1]["mode"]:
            notes.append(f"{result['names'][0]} chose {played[0].get('mode')}, {result['names'][1]} "
                         f"{played[1].get('mode')}")
    for name, left in zip(result["names"], result["unpaired"]):
        if left:
            notes.append(f"{left} task seed{'s' * (left != 1)} {name} alone played left out")
    return notes


__all__ = ["CompareError", "compare", "load_evaluation", "mismatches"]
