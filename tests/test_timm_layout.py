"""Results as timm writes them (issue 45): results/results-<dataset>.csv per data set, one benchmark CSV
per configuration named by device, precision, batch size and torch release, both regenerated from the
committed records by scripts/results_tables.py (tools/result_csvs.py); the leaderboard grouped by task
and data set with the seed spread and GPU rows; docs/usage.md's model table generated from the
registry; the torch-free example says how to install the zoo without torch."""
from __future__ import annotations

import ast
import csv
import json
import re
import statistics
import subprocess
import sys

import pytest
import yaml

from conftest import REPO, load_script
from zoo import registry

MANIFEST = json.loads((REPO / "weights" / "MANIFEST.json").read_text())
INDEX = json.loads(registry.INDEX_PATH.read_text())["entries"]
LAYOUT = yaml.safe_load((REPO / "docs" / "tables.yaml").read_text())


tables = load_script("scripts/results_tables.py", "results_tables_timm")
result_csvs = tables.result_csvs


def _rows(text):
    return list(csv.DictReader(text.splitlines()))


@pytest.fixture(scope="module")
def generated():
    return tables.generated_csvs()


def test_the_committed_csvs_are_what_the_records_say(generated):
    """Regenerate and compare: every results and benchmark CSV in results/ is one the script writes,
    byte for byte, and none it writes is missing (a CSV of an earlier layout is stale)."""
    committed = {p.name for pattern in tables.GENERATED_CSV for p in (REPO / "results").glob(pattern)}
    assert committed == set(generated)
    for name, text in generated.items():
        assert (REPO / "results" / name).read_text() == text, name


def test_every_release_has_one_row_in_its_data_sets_results_csv(generated):
    seen = []
    for name, text in generated.items():
        if not name.startswith("results-"):
            continue
        rows = _rows(text)
        header = text.splitlines()[0].split(",")
        assert header[0] == "model" and header[-4:] == ["param_count", "img_size", "crop_pct", "interpolation"]
        for row in rows:
            model, metadata = row["model"], MANIFEST[row["model"]]["metadata"]
            seen.append(model)
            assert name.startswith(f"results-{result_csvs.dataset_of(metadata)}")
            assert float(row["param_count"]) == pytest.approx(INDEX[model]["num_params"] / 1e6, abs=5e-3)
            assert int(row["img_size"]) == INDEX[model]["preprocessing"]["size"][-1]
            if header[1] == "top1":  # timm's classification columns, in percent, sorted by top1
                assert name == f"results-{result_csvs.dataset_of(metadata)}.csv"
                assert float(row["top1"]) == pytest.approx(100 * metadata["metrics"]["test/acc"], abs=1e-3)
                assert float(row["top1"]) + float(row["top1_err"]) == pytest.approx(100)
                # top5 only where the evaluation recorded it: never a number made up
                assert (row["top5"] == "") == ("test/acc_top5" not in metadata["metrics"])
        if header[1] == "top1":
            assert header == result_csvs.CLASSIFICATION_COLUMNS
            assert [float(r["top1"]) for r in rows] == sorted((float(r["top1"]) for r in rows), reverse=True)
    assert sorted(seen) == sorted(MANIFEST)


def test_a_results_table_of_a_classifier_with_top5_fills_timms_columns():
    manifest = {"m": {"metadata": {"dataset": "FashionMNISTDataModule cluttered60",
                                   "metrics": {"test/acc": 0.8125, "test/acc_top5": 0.99}}}}
    facts = {"m": {"num_params": 1_234_567, "output_kind": "logits", "family": "ram",
                   "preprocessing": {"size": [60, 60], "resize": "squash"}}}
    out = result_csvs.results_tables(manifest, facts)
    assert list(out) == ["results-fmnist-cluttered60.csv"]
    assert _rows(out["results-fmnist-cluttered60.csv"]) == [
        {"model": "m", "top1": "81.25", "top1_err": "18.75", "top5": "99.0", "top5_err": "1.0", "param_count": "1.23",
         "img_size": "60", "crop_pct": "1.0", "interpolation": "bilinear"}]


def test_one_benchmark_csv_per_configuration_holds_the_records_rows(generated):
    record = json.loads((REPO / "results" / "bench_releases_cpu.json").read_text())
    cpu = {n: t for n, t in generated.items() if (result_csvs.parse_benchmark_name(n) or {}).get("device") == "cpu"}
    assert cpu, "the CPU record names no CSV"
    rows = []
    for name, text in cpu.items():
        config = result_csvs.parse_benchmark_name(name)
        assert config["precision"] == "fp32" and config["torch"] == record["torch"].split("+")[0]
        kind = config["kind"]
        assert text.splitlines()[0].split(",") == (result_csvs.INFER_COLUMNS if kind == "infer" else result_csvs.TRAIN_COLUMNS)
        for row in _rows(text):
            assert int(row[f"{kind}_batch_size"]) == config["batch"]  # one batch size per file
            rows.append((row["model"], kind, row[f"{kind}_mode"], config["batch"], float(row[f"{kind}_samples_per_sec"])))
    expected = [(r["model"], k, r[f"{k}_mode"], r[f"{k}_batch_size"], r[f"{k}_samples_per_sec"])
                for r in record["rows"] for k in ["infer" if "infer_batch_size" in r else "train"]]
    assert sorted(rows) == sorted(expected)


def test_gpu_training_records_become_csvs_named_by_their_device_and_torch(generated):
    """benchmarks/accel.py's H200 records: a row per registered model whose recipe they timed, per mode."""
    records = [json.loads(p.read_text()) for p in sorted((REPO / "results").glob("bench_accel_*.json"))]
    records = [r for r in records if r.get("device_type") == "cuda"]
    assert records
    gpu = {n: _rows(t) for n, t in generated.items() if n.startswith("benchmark-train-nvidia-h200-fp32-bs")}
    timed = {(f["recipe"], b["batch_size"]) for r in records for f in r["families"].values() for b in f["batches"]}
    recipes = {str(e.recipe.relative_to(REPO)): n for n, e in registry.find_entries().items() if e.recipe}
    assert {(recipes[r], b) for r, b in timed if r in recipes} == {
        (row["model"], int(row["train_batch_size"])) for rows in gpu.values() for row in rows}
    assert all(n.endswith(f"-torch{records[0]['torch'].split('+')[0]}.csv") for n in gpu)


def test_two_records_of_one_measurement_keep_the_newer():
    family = {"recipe": "r.yaml", "batches": [{"batch_size": 8, "modes": {"eager": {"images_per_s": 100.0, "step_s": 0.08}}}]}
    old = {"torch": "2.11.0+cu130", "date": "2026-01-01", "device": {"device": "NVIDIA H200"}, "families": {"f": family}}
    new = json.loads(json.dumps(old))
    new["date"], new["families"]["f"]["batches"][0]["modes"]["eager"] = "2026-02-01", {"images_per_s": 200.0, "step_s": 0.04}
    facts = {"m": {"num_params": 2e6, "preprocessing": {"size": [28, 28]}}}
    out = result_csvs.merge_accel([new, old], {"r.yaml": "m"}, facts)
    assert list(out) == ["benchmark-train-nvidia-h200-fp32-bs8-torch2.11.0.csv"]
    assert [r["train_samples_per_sec"] for r in _rows(out["benchmark-train-nvidia-h200-fp32-bs8-torch2.11.0.csv"])] == ["200.0"]


def test_the_leaderboard_is_grouped_by_task_and_data_with_the_seed_spread_and_gpu_rows():
    layout = LAYOUT["leaderboard"]
    groups = tables.groups_of(layout)
    firsts = [row[0].strip("`") for _, rows in groups for row in rows if not row[0].startswith("↳")]
    assert sorted(firsts) == sorted(MANIFEST)  # every release once
    for title, rows in groups:
        members = [row[0].strip("`") for row in rows if not row[0].startswith("↳")]
        assert {f"{tables.task_of(m)}, {tables.release_cell(m, 'data')}" for m in members} == {title}
        for i, row in enumerate(rows):
            name = row[0].removeprefix("↳ ").strip("`")
            gpu_rows = [r for r in rows[i + 1:] if r[0] == f"↳ `{name}`"]
            if not row[0].startswith("↳"):  # a GPU row under a release for each GPU that measured it
                assert len(gpu_rows) == len(tables.devices_of(name))
    gpu = [row for _, rows in groups for row in rows if row[0].startswith("↳")]
    assert gpu and all("NVIDIA H200" in tables.cell(row[9]) for row in gpu)
    # the seed spread: the release recipe's results run, mean ± std over its seeds
    spread = {n: tables.seed_spread(n) for n in MANIFEST}
    name = next(n for n, s in spread.items() if "3 seeds" in s and "acc" in tables.release_cell(n, "headline"))
    run = MANIFEST[name]["metadata"]["results_file"].rsplit("/", 1)[-1].rsplit("_seed", 1)[0]
    values = [100 * v for v in json.loads((REPO / "results" / f"{run}.json").read_text())["metrics"]["test/acc"]["per_seed"]]
    assert spread[name] == f"{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f} (3 seeds)"
    text = (REPO / "docs" / "leaderboard.md").read_text()
    assert all(f"**{title}**" in text for title, _ in groups)


def test_a_benchmark_cell_reads_the_csv_of_its_configuration(monkeypatch):
    found = {("train", "cpu", 256): ({"model": "m", "train_samples_per_sec": "100", "train_mode": "eager"},
                                     {"model": "m", "train_samples_per_sec": "300", "train_mode": "compile"}),
             ("train", "gpu-x", 64): ({"model": "m", "train_samples_per_sec": "5000", "train_mode": "compile"},),
             ("train", "gpu-x", 1000): ({"model": "m", "train_samples_per_sec": "90000", "train_mode": "eager"},)}
    monkeypatch.setattr(tables, "_benchmarks", lambda: found)
    spec = {"benchmark": "train", "device": "cpu", "model": "m", "column": "train_samples_per_sec", "batch": 256}
    assert tables.benchmark_cell(spec) == "100"
    assert tables.benchmark_cell({**spec, "mode": "default"}) == "300 (compiled)"
    assert tables.benchmark_cell({**spec, "batch": 1, "optional": True}) == "-"
    assert tables.benchmark_cell({**spec, "device": "gpu-x", "batch": "largest"}) == "90,000 (batch 1000)"
    assert tables.devices_of("m") == ["gpu-x"] and tables.devices_of("other") == []
    with pytest.raises(SystemExit):
        tables.benchmark_cell({**spec, "batch": 1})


def test_usage_lists_every_registered_family_with_its_recipes_and_releases():
    rows = tables.groups_of(LAYOUT["models"])[0][1]
    entries = registry.find_entries()
    families = {registry.family_of(e) for e in entries.values()}
    assert [row[0] for row in rows] == [f"`{f}`" for f in sorted(families)]
    for row in rows:
        family = row[0].strip("`")
        assert row[2] == ", ".join(f"`{n}`" for n, e in sorted(entries.items()) if registry.family_of(e) == family)
        released = [n for n, e in sorted(entries.items()) if registry.family_of(e) == family and e.weights]
        assert row[3] == (", ".join(f"`{n}`" for n in released) or "-")
    usage = (REPO / "docs" / "usage.md").read_text()
    assert tables.fill(usage, {"models": tables.render(LAYOUT["models"])}, REPO / "docs" / "usage.md") == usage
    with pytest.raises(SystemExit, match="does not describe"):  # a new family must be described
        tables.groups_of({**LAYOUT["models"], "what": {}})


def test_the_torch_free_example_says_how_to_install_the_zoo_without_torch(tmp_path):
    """The install lines in docs/examples/onnx_caption.py: the zoo with --no-deps under pyproject's name
    (or the checkout), then exactly the third-party modules the example imports; with every other
    dependency of the package unimportable, the example starts."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    source = (REPO / "docs" / "examples" / "onnx_caption.py").read_text()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = [line.split("#")[0].split() for line in ast.get_docstring(ast.parse(source)).splitlines()
             if line.strip().startswith("pip install")]
    targets = {tuple(words[2:]) for words in lines}
    assert ("--no-deps", ".") in targets and ("--no-deps", project["name"]) in targets
    imported = {a.name.split(".")[0] for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Import)
                for a in node.names} | {node.module.split(".")[0] for node in ast.walk(ast.parse(source))
                                        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    third_party = imported - set(sys.stdlib_module_names) - {"zoo", "__future__"}
    distribution = {"PIL": "pillow"}
    assert ("onnxruntime", "numpy", "pillow") in targets
    assert {distribution.get(m, m) for m in third_party} == {"onnxruntime", "numpy", "pillow"}
    module_of = {"pyyaml": "yaml", "pillow": "PIL"}
    dependencies = {module_of.get(d, d) for d in (re.split(r"[<>=\[ ]", d)[0].lower() for d in project["dependencies"])}
    blocked = sorted(dependencies - third_party)
    assert "torch" in blocked
    code = (f"import runpy, sys\nfor m in {blocked!r}: sys.modules[m] = None\n"
            f"sys.argv = ['onnx_caption.py', '--help']\nrunpy.run_path({str(REPO / 'docs/examples/onnx_caption.py')!r}, "
            "run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--beam-size" in result.stdout
