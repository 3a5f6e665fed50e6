"""The leaderboard with cost: benchmarks/releases.py writes timm's CSV columns, one CSV per kind and
batch size named by device, precision and torch release, with one row per release (eager, and
compiled where that is the release's default), its GMACs and
parameters are zoo/commands/cost.py's (the model index's), a time cap keeps the eager rows first and lists
what it skipped; docs/leaderboard.md is generated from the manifest, the index, the attention
results and those CSVs (one row per release, checked by test_results_run's table check)."""
from __future__ import annotations

import csv
import json

import pytest
import torch

from conftest import REPO, load_script
from zoo import registry

MANIFEST = json.loads((REPO / "weights" / "MANIFEST.json").read_text())
INDEX = json.loads(registry.INDEX_PATH.read_text())["entries"]


bench = load_script("benchmarks/releases.py", "bench_releases")
tables = load_script("scripts/results_tables.py", "results_tables_script")

TINY = ["--warmup", "0", "--repeats", "1", "--min-repeat-s", "0", "--threads", "1"]


@pytest.fixture(autouse=True)
def shipped(monkeypatch, tmp_path):
    monkeypatch.setenv("ZOO_WEIGHTS_DIR", str(REPO / "weights"))
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))


def read_csv(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def bench_csv(folder, kind, batch):
    """Where benchmarks/releases.py writes this kind and batch on the CPU: timm's file name."""
    return folder / f"benchmark-{kind}-cpu-fp32-bs{batch}-torch{torch.__version__.split('+')[0]}.csv"


def test_every_release_gets_a_row_in_timms_columns(tmp_path):
    assert bench.main(["--kinds", "infer", "--batch-sizes", "1", "3", "--modes", "eager", *TINY,
                       "--csv-dir", str(tmp_path), "--out", str(tmp_path / "bench.json")]) == 0
    (columns, rows), (_, rows3) = read_csv(bench_csv(tmp_path, "infer", 1)), read_csv(bench_csv(tmp_path, "infer", 3))
    assert {r["infer_batch_size"] for r in rows} == {"1"} and {r["infer_batch_size"] for r in rows3} == {"3"}
    rows += rows3
    assert columns == ["model", "infer_samples_per_sec", "infer_step_time", "infer_batch_size", "infer_img_size",
                       "infer_gmacs", "param_count", "infer_mode"]
    assert sorted((r["model"], r["infer_batch_size"]) for r in rows) == sorted(
        (name, batch) for name in MANIFEST for batch in ("1", "3"))
    for row in rows:
        facts = INDEX[row["model"]]
        assert float(row["infer_gmacs"]) == pytest.approx(facts["macs"] / 1e9, rel=1e-3)
        assert float(row["param_count"]) == pytest.approx(facts["num_params"] / 1e6, abs=5e-4)
        assert int(row["infer_img_size"]) == facts["preprocessing"]["size"][-1]
        assert float(row["infer_samples_per_sec"]) > 0 and float(row["infer_step_time"]) > 0
        # the rate and the step time describe one measurement
        assert float(row["infer_samples_per_sec"]) == pytest.approx(
            int(row["infer_batch_size"]) / (float(row["infer_step_time"]) / 1000), rel=1e-2)
    record = json.loads((tmp_path / "bench.json").read_text())
    assert record["complete"] and record["git_commit"] and record["failed"] == [] and record["skipped"] == []
    # scripts/results_tables.py rewrites the CSVs from the record: the same files
    written = tables.result_csvs.releases_benchmarks(record)
    assert sorted(written) == sorted(p.name for p in tmp_path.glob("benchmark-*.csv"))
    assert all((tmp_path / name).read_text() == text for name, text in written.items())


def test_a_time_cap_keeps_eager_rows_first_and_lists_the_rest(tmp_path):
    assert bench.main(["--models", "ram_fmnist_centered", "--batch-sizes", "2", "--max-seconds", "0", *TINY,
                       "--csv-dir", str(tmp_path), "--out", str(tmp_path / "bench.json")]) == 0
    record = json.loads((tmp_path / "bench.json").read_text())
    assert record["skipped"] == ["ram_fmnist_centered infer eager batch 2", "ram_fmnist_centered train eager batch 2",
                                 "ram_fmnist_centered train compile batch 2"]  # the compiled row comes last
    assert read_csv(bench_csv(tmp_path, "train", 2))[1] == []


def test_compiled_rows_are_where_the_release_compiles_by_default(monkeypatch):
    from zoo import registry

    monkeypatch.setattr(bench, "compile_unavailable", lambda device: None)
    ram, vit = (registry.create_model(n, pretrained=True) for n in ("ram_fmnist_centered", "vit_fmnist"))
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert bench.default_modes(ram, cpu, "train") == ["eager", "compile"]  # a long run: auto compiles on CPU
    assert bench.default_modes(ram, cpu, "infer") == ["eager"]  # evaluation stays eager on CPU
    assert bench.default_modes(vit, cpu, "train") == ["eager"]
    assert bench.default_modes(vit, cuda, "infer") == ["eager", "compile"]  # auto compiles everything on CUDA
    monkeypatch.setattr(bench, "compile_unavailable", lambda device: "no compiler")
    assert bench.default_modes(ram, cpu, "train") == ["eager"]


@pytest.mark.slow  # traces two programs and a training step (about 30 s)
def test_the_compiled_rows_run(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_COMPILE_BACKEND", "aot_eager")  # the compile path without generating code
    assert bench.main(["--models", "ram_fmnist_centered", "sat_soft_scenes", "--batch-sizes", "2",
                       "--modes", "eager", "compile", *TINY, "--csv-dir", str(tmp_path),
                       "--out", str(tmp_path / "bench.json")]) == 0
    _, infer = read_csv(bench_csv(tmp_path, "infer", 2))
    _, train = read_csv(bench_csv(tmp_path, "train", 2))
    for rows, kind in ((infer, "infer"), (train, "train")):
        assert sorted((r["model"], r[f"{kind}_mode"]) for r in rows) == [
            ("ram_fmnist_centered", "compile"), ("ram_fmnist_centered", "eager"),
            ("sat_soft_scenes", "compile"), ("sat_soft_scenes", "eager")]
    assert json.loads((tmp_path / "bench.json").read_text())["failed"] == []


def test_the_leaderboard_has_one_row_per_release_from_the_sources():
    import yaml

    layout = yaml.safe_load((REPO / "docs" / "tables.yaml").read_text())["leaderboard"]
    rows = [row for row in tables.rows_of(layout) if not row[0].startswith("↳")]  # ↳: a GPU row
    assert sorted(row[0].strip("`") for row in rows) == sorted(MANIFEST)
    assert tables.release_cell("vit_fmnist", "params") == f"{INDEX['vit_fmnist']['num_params'] / 1e6:.2f} M"
    assert tables.release_cell("vit_fmnist", "headline") == f"acc {100 * MANIFEST['vit_fmnist']['metadata']['metrics']['test/acc']:.2f} %"
    assert tables.release_cell("vit_fmnist", "trained_on") == MANIFEST["vit_fmnist"]["metadata"]["device"]
    text = (REPO / "docs" / "leaderboard.md").read_text()
    assert all(f"| `{name}` |" in text for name in MANIFEST)
