"""Every benchmark script runs: each `benchmarks/*.py` in its smallest setting (a batch of 2, one
round) writes its JSON. A script nothing runs breaks silently (benchmarks/accel.py once crashed on
import for a whole release)."""
from __future__ import annotations

import json

import pytest

from conftest import REPO, cli_env, run_cli

#: the smallest run of each benchmark: seconds, not its real measurement
TINY = {
    "accel.py": ["--families", "baseline", "--batches", "4", "--device", "cpu", "--steps", "1", "--rounds", "1",
                 "--threads", "1"],
    "beam.py": ["--batch-size", "2", "--beam-size", "2", "--max-len", "4", "--repeats", "1", "--train-steps", "1",
                "--train-caption-len", "4"],
    "draw.py": ["--batch-size", "2", "--iters", "1", "--device", "cpu", "--threads", "1"],
    "glimpse.py": ["--device", "cpu", "--batch-size", "2", "--repeats", "1", "--threads", "1"],
    "releases.py": ["--models", "ram_fmnist_centered", "sat_soft_scenes", "--batch-sizes", "2", "--warmup", "0",
                    "--repeats", "1", "--min-repeat-s", "0", "--threads", "1", "--modes", "eager", "--csv-dir", "."],
    "sampling.py": ["--batch-size", "3", "--sizes", "20", "--repeats", "1", "--threads", "1"],
    "sat_train.py": ["--threads", "1", "--rounds", "1", "--batch-size", "2"],
    "vit.py": ["--steps", "1", "--warmup", "0", "--rounds", "1", "--batch-size", "2"],
}
SLOW = {"accel.py"}  # compiles a step: about 20 s


def test_every_benchmark_has_a_tiny_run():
    assert sorted(TINY) == sorted(p.name for p in (REPO / "benchmarks").glob("*.py"))


@pytest.mark.slow  # each runs a script in its own process
@pytest.mark.parametrize("script", [pytest.param(s, marks=pytest.mark.slow) if s in SLOW else s for s in sorted(TINY)])
def test_benchmark_runs_and_writes_its_json(script, tmp_path):
    out = tmp_path / "bench.json"
    code, stdout, stderr = run_cli([f"benchmarks/{script}", *TINY[script], "--out", str(out)], cwd=tmp_path,
                                   env=cli_env(None), timeout=600)
    assert code == 0, stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["git_commit"] and record["device"]  # provenance, as every published number has
