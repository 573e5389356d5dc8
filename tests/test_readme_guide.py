"""The README's "Your own task, step by step" runs as written: its two files, then its
commands (the budget cut to 2 iterations and 10 episodes to keep the suite fast)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gyre_ma.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def _guide() -> str:
    text = README.read_text()
    start = text.index("## Your own task, step by step")
    return text[start:text.index("\n## ", start + 1)]


def test_the_readme_guide_runs_as_written(tmp_path, monkeypatch, capsys):
    guide = _guide()
    blocks = dict(re.findall(r"```(?:python|yaml)\n# (\S+)\n(.*?)```", guide, flags=re.S))
    assert set(blocks) == {"my_task.py", "vault.yaml"}
    for name, body in blocks.items():
        (tmp_path / name).write_text(f"# {name}\n{body}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    commands = re.search(r"```bash\n(.*?)```", guide, flags=re.S)[1].splitlines()
    assert len(commands) == 5
    shorter = {"--episodes 200": "--episodes 10", "--play 20": "--play 4"}
    for line in commands:
        argv = line.split("#")[0].split()[1:]
        argv = " ".join(argv)
        for long, short in shorter.items():
            argv = argv.replace(long, short)
        argv = argv.split() + (["--iterations", "2", "--quiet"] if argv.startswith("train") else [])
        assert main(argv) == 0, line
    out = capsys.readouterr().out
    assert "goals ['in_vault'] reached" in out  # check's random order reaches the vault at times
    learned, random = (json.loads((tmp_path / f"{k}.json").read_text()) for k in ("learned", "random"))
    assert [e["task_seed"] for e in learned["episodes"]] == [e["task_seed"] for e in random["episodes"]]
    assert "learned − random:" in " ".join(out.split())
