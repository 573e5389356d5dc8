"""Starting Ray: the user's ray.init arguments are checked before Ray starts, and an address
where no cluster answers is named at once (a new user's misspelt key read as a bug in
gyre-ma after 12 s; a wrong address hung for minutes with Ray's own retries)."""

from __future__ import annotations

import socket
import time

import pytest

from gyre_ma.backends.ray_start import start_ray
from gyre_ma.cli import main


def test_a_misspelt_ray_init_argument_is_named_with_the_accepted_ones():
    with pytest.raises(ValueError, match=r"^backend.ray_init: unknown ray.init argument\(s\) \['num_cpu'\]; "
                                         r"accepted: \[.*'num_cpus'.*\]$"):
        start_ray({"num_cpu": 2, "_temp_dir": "/tmp"})  # Ray's underscored internals stay allowed


def test_an_address_where_no_cluster_answers_is_named_at_once(monkeypatch):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(ValueError, match=rf"^--ray-address: no Ray cluster answers at '127.0.0.1:{port}' "
                                         r"\(.*\); start one there \(ray start --head\) or correct the address$"):
        start_ray({"address": f"127.0.0.1:{port}"}, where="--ray-address")
    monkeypatch.setenv("RAY_ADDRESS", f"ray://127.0.0.1:{port}")
    with pytest.raises(ValueError, match=r"^RAY_ADDRESS \(the environment\): no Ray cluster answers"):
        start_ray()
    assert time.monotonic() - start < 5


def test_the_cli_says_these_in_one_line_and_refuses_an_address_without_ray(tmp_path, capsys):
    config = tmp_path / "ray.yaml"
    config.write_text(f"name: r\nenv: {{id: coverage_v0}}\nrun_root: {tmp_path}\n"
                      "backend: {name: ray, ray_init: {num_cpu: 1}}\n")
    assert main(["train", str(config), "--iterations", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gyre-ma train: error: backend.ray_init: unknown ray.init argument(s) ['num_cpu']"), err
    experiment = tmp_path / "exp.yaml"
    experiment.write_text(f"name: e\nbase: ray.yaml\nroot: {tmp_path}\nvariants: {{a: {{}}}}\nseeds: 1\n"
                          "budget: {iterations: 1}\n")
    assert main(["experiment", str(experiment), "--ray-address", "auto"]) == 2
    assert "--ray-address is the cluster the runs go to with --ray; add --ray" in capsys.readouterr().err
