"""Hostile or broken config input fails fast with one line naming the key (issue #18, 8)."""

from __future__ import annotations

import time

import pytest

from gyre_ma.cli import main
from gyre_ma.config import ConfigError, load_config


def bomb(levels: int = 12) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]")
    return "backend:\n  ray_init:\n" + "\n".join("    " + line for line in lines) + "\n"


@pytest.mark.parametrize("content, expected", [
    (bomb(), "aliases"),
    ("train:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(500)), "nests deeper than 64"),
    ("seed: 1\n# " + "x" * (5 << 20) + "\n", "bytes; a YAML file of at most"),
    (b"seed: \xd8\xff\n", "not UTF-8"),
    ("train: {episodes_per_iteration: 1e30}\n", "train.episodes_per_iteration"),
    ("checkpoints: {validation_window: 1000000000000000000000000000000}\n", "must be at most 10,000,000"),
    ("train: {lr: .nan}\n", "'train.lr': Input should be a finite number"),
    ("train: [1, 2]\n", "'train'"),
    ("", "is empty: expected a mapping of sections"),
    ("# a comment only\n", "is empty"),
])
def test_broken_configs_fail_in_one_line_within_seconds(tmp_path, capsys, content, expected):
    path = tmp_path / "c.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace("[", r"\[")):
        load_config(path)
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert time.perf_counter() - start < 10.0


def test_an_error_echoing_a_huge_value_is_cut(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("train: {lr: '" + "9" * 1_000_000 + "'}\n")
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "train.lr" in err and len(err) < 3000
