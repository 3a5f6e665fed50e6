"""scripts/scaling.py (issue 43, item 4): `report` regenerates results/scaling.csv and docs/scaling.md's
tables exactly from the committed JSON; `measure` on a tiny configuration writes well-formed JSON
whose numbers behave as the families' designs say; training results join their cost rows with a
bootstrap interval."""
from __future__ import annotations

import csv
import importlib.util
import json
import math
import shutil
import sys

import pytest

from conftest import REPO

spec = importlib.util.spec_from_file_location("scaling_script", REPO / "scripts" / "scaling.py")
scaling = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # (its dataclass looks itself up)
spec.loader.exec_module(scaling)

#: the cheapest measure: two small canvases, one run of each timing, no Megapixel Fashion
TINY = ["--sizes", "32", "48", "--no-megapixel", "--repeats", "1", "--warmup", "0", "--throughput-repeats", "1",
        "--batch-size", "4", "--memory-batch", "2", "--max-seconds", "5", "--threads", "0"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny measure of DRAM and the small CNN (the rows the checks read) -> (the JSON, its path)."""
    out = tmp_path_factory.mktemp("scaling") / "scaling_cost_cpu.json"
    assert scaling.main(["measure", "--families", "DRAM", "SmallCNN", *TINY, "--out", str(out)]) == 0
    return json.loads(out.read_text()), out


def test_the_committed_csv_and_tables_are_what_the_json_says():
    """Editing a number of docs/scaling.md or results/scaling.csv by hand, or committing a cost or
    training result without `python scripts/scaling.py report`, fails here."""
    assert scaling.main(["report", "--check"]) == 0


def test_measure_writes_a_row_per_family_and_size_with_its_provenance(tiny):
    record, _ = tiny
    assert record["git_commit"] and record["device"] and record["date"] and record["wall_time_s"] > 0
    assert record["setting"]["sizes"] == [32, 48] and record["setting"]["memory_budget_mb"] == 4096
    assert sorted((r["family"], r["task"], r["img_size"]) for r in record["rows"]) == [
        ("DRAM", "scale", 32), ("DRAM", "scale", 48), ("SmallCNN", "scale", 32), ("SmallCNN", "scale", 48)]
    for row in record["rows"]:
        macs = row["macs"]
        assert macs["counter"] > 0 and macs["total"] == macs["counter"] + macs["analytic"]
        assert macs["analytic"] == sum(macs["analytic_parts"].values()) and macs["counted_on"] == "cpu"
        assert row["latency"]["repeats"] == 1 and row["latency"]["cpu_min_s"] > 0
        assert 1 <= row["throughput"]["batch"] <= 4 and row["throughput"]["samples_per_sec"] > 0
        assert row["train_memory"]["batch"] == 2 and row["train_memory"]["step"] == "forward and backward"
        assert row["train_memory"]["bytes"] > row["train_memory"]["input_bytes"] == 2 * row["img_size"] ** 2 * 4
        assert row["param_count"] > 0 and row["notes"] == []
    # every check is there, unresolved without its 60 and 400 px rows
    assert [c["name"] for c in record["checks"]] == [c["name"] for c in scaling.checks([])]
    assert all(c["value"] is None and c["meets"] is None for c in record["checks"])


def test_drams_cost_grows_only_by_its_context_views_area_average(tiny):
    """DRAM reads a fixed number of fixed-size glimpses and a fixed-size context view: the counter's
    MACs are the same at every side, and the analytic term grows by exactly the pixels the context
    view's area average adds (one add per pixel), while the small CNN's MACs grow with the area."""
    rows = {(r["family"], r["img_size"]): r for r in tiny[0]["rows"]}
    small, large = rows["DRAM", 32]["macs"], rows["DRAM", 48]["macs"]
    assert small["counter"] == large["counter"]
    assert large["analytic"] - small["analytic"] == 48 ** 2 - 32 ** 2
    assert large["steps"] == small["steps"] and small["steps"]["count"] == 4
    assert small["steps"]["per_step"] * 4 + small["steps"]["once_per_image"] == small["counter"]
    cnn = rows["SmallCNN", 48]["macs"]["counter"] / rows["SmallCNN", 32]["macs"]["counter"]
    assert cnn == pytest.approx((48 / 32) ** 2, rel=0.05)


def test_the_analytic_term_counts_attention_kernels_the_counter_has_no_formula_for():
    """On CPU the fused scaled-dot-product attention has no flop-counter formula: the analytic term
    counts it as B H L S (E + Ev), which is what the counter counts for the same product written out."""
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    q, k, v = torch.rand(2, 3, 10, 8), torch.rand(2, 3, 12, 8), torch.rand(2, 3, 12, 4)
    unseen, counter = scaling._unseen_work(), FlopCounterMode(display=False)
    with torch.no_grad(), counter, unseen:
        F.scaled_dot_product_attention(q, k, v)
    written_out = FlopCounterMode(display=False)
    with torch.no_grad(), written_out:
        (q @ k.transpose(-2, -1)).softmax(-1) @ v
    assert unseen.macs["attention kernels"] + counter.get_total_flops() // 2 == written_out.get_total_flops() // 2


def test_a_family_over_the_memory_budget_keeps_its_row_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_LIMITS", "memory_mb=5")  # the small CNN's forward pass of one 400 px image: 40 MB
    out = tmp_path / "cost.json"
    assert scaling.main(["measure", "--families", "SmallCNN", *TINY, "--sizes", "400", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["macs"]["counted_on"] == "meta" and row["macs"]["counter"] > 0  # counted without running
    assert row["latency"] is None and row["throughput"] is None
    assert row["notes"][0].startswith("not run: refused, it would need about")
    assert "more than the" in row["notes"][-1] and not row["train_memory"]["within_budget"]


def test_report_joins_training_results_with_their_seed_spread_and_bootstrap_interval(tiny, tmp_path):
    record, path = tiny
    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(path, results / path.name)
    dram = next(r for r in record["rows"] if r["family"] == "DRAM" and r["img_size"] == 48)
    config = {"class_path": "zoo.models.ram.RAM", "init_args": {"image_size": 48},
              "data": {"class_path": scaling.SCALE_DATA, "init_args": {"canvas_size": 48, "limit_eval": 400}}}
    accs = [0.70, 0.72, 0.74]
    for seed, acc in enumerate(accs):
        (results / f"ram_x_seed{seed}.json").write_text(json.dumps(
            {"recipe": dram["recipe_file"], "train_args": [], "seed": seed, "config": config,
             "metrics": {"test/acc": acc}}))
    (results / "ram_y_seed0.json").write_text(json.dumps(  # a recipe no cost row measured
        {"recipe": "configs/ram/other.yaml", "train_args": [], "seed": 0, "config": config,
         "metrics": {"test/acc": 0.5}}))
    at32 = {**config, "init_args": {"image_size": 32}, "data": {**config["data"], "init_args": {"canvas_size": 32}}}
    for name, train_args, acc in (("ram_short_seed0", ["--trainer.max_epochs", "2"], 0.6),  # a budget: joined, stated
                                  ("ram_other_model_seed0", ["--model.init_args.num_glimpses", "2"], 0.4)):
        (results / f"{name}.json").write_text(json.dumps(
            {"recipe": str(REPO / dram["recipe_file"]), "train_args": train_args, "seed": 0, "config": at32,
             "metrics": {"test/acc": acc}}))
    doc = tmp_path / "scaling.md"
    shutil.copy(REPO / "docs" / "scaling.md", doc)
    paths = ["--results", str(results), "--csv", str(tmp_path / "s.csv"), "--doc", str(doc),
             "--figure", str(tmp_path / "s.png")]
    assert scaling.main(["report", *paths, "--check"]) == 1  # nothing written yet
    assert scaling.main(["report", *paths]) == 0
    assert scaling.main(["report", *paths, "--check"]) == 0
    assert (tmp_path / "s.png").read_bytes().startswith(b"\x89PNG")
    with open(tmp_path / "s.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames[:5] == ["model", "family", "task", "device", "img_size"]
        rows = list(reader)
    row = next(r for r in rows if r["family"] == "DRAM" and r["img_size"] == "48")
    assert float(row["top1"]) == pytest.approx(72.0) and float(row["top1_err"]) == pytest.approx(28.0)
    assert float(row["top1_std"]) == pytest.approx(2.0) and row["seeds"] == "3"
    # the mean of 3 seeds of 400 test canvases: a binomial standard error of sqrt(sum p(1-p)/n) / 3
    se = 100 * math.sqrt(sum(p * (1 - p) / 400 for p in accs)) / 3
    low, high = float(row["top1_ci95_low"]), float(row["top1_ci95_high"])
    assert low == pytest.approx(72 - 1.96 * se, abs=0.3) and high == pytest.approx(72 + 1.96 * se, abs=0.3)
    assert float(row["infer_gmacs"]) == pytest.approx(dram["macs"]["total"] / 1e9, abs=1e-6)
    assert float(row["infer_samples_per_sec"]) == pytest.approx(
        int(row["infer_batch_size"]) / (float(row["infer_step_time"]) / 1000), rel=1e-2)  # timm's columns agree
    orphan = next(r for r in rows if r["model"] == "other")
    assert orphan["top1"] == "50.00" and orphan["notes"].startswith("no cost row: ram_y_seed0")
    short = next(r for r in rows if r["family"] == "DRAM" and r["img_size"] == "32")
    assert short["top1"] == "60.00" and short["top1_std"] == "" and short["notes"] == "trained with --trainer.max_epochs 2"
    other = next(r for r in rows if r["notes"].startswith("no cost row: ram_other_model_seed0"))
    assert other["top1"] == "40.00" and other["notes"].endswith("(train_args [\"--model.init_args.num_glimpses\", \"2\"])")
    text = doc.read_text()
    assert "| DRAM | scale | 48 |" in text and "72.00 ± 2.00 [" in text
    doc.write_text(text.replace("| DRAM | scale | 48 |", "| DRAM | scale | 49 |"))
    assert scaling.main(["report", *paths, "--check"]) == 1  # a hand edit is caught


def test_results_of_the_same_architecture_and_of_the_same_task_join_a_row_and_say_whose(tiny, tmp_path, monkeypatch):
    record, path = tiny
    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(path, results / path.name)
    plan = next(p for p in scaling.PLANS if p.family == "DRAM")
    monkeypatch.setattr(scaling, "PLANS", (scaling.Plan("DRAM", plan.recipe, same_model=("ram_fmnist_cluttered60",)),))
    monkeypatch.setattr(scaling, "SAME_TASK", {("some.data.Module", "small"): ("scale", 32)})
    from zoo import registry

    for name, recipe, data, acc in (
            ("ram_stage_seed0", registry.get_entry("ram_fmnist_cluttered60").metadata["recipe_file"],
             {"class_path": scaling.SCALE_DATA, "init_args": {"canvas_size": 48}}, 0.8),
            ("ram_other_data_seed0", next(r for r in record["rows"] if r["family"] == "DRAM")["recipe_file"],
             {"class_path": "some.data.Module", "init_args": {"variant": "small"}}, 0.7),
            ("ram_unplanned_seed0", "configs/ram/other.yaml",  # another recipe on that data: not a row of its own
             {"class_path": "some.data.Module", "init_args": {"variant": "small"}}, 0.6)):
        (results / f"{name}.json").write_text(json.dumps(
            {"recipe": recipe, "train_args": [], "seed": 0, "metrics": {"test/acc": acc},
             "config": {"class_path": "zoo.models.ram.RAM", "init_args": {"image_size": 48}, "data": data}}))
    rows = scaling.report_rows(scaling._load_costs(results), scaling.training_results(results))
    at = {r["img_size"]: r for r in rows if r["family"] == "DRAM"}
    assert at[48]["top1"] == "80.00" and at[48]["notes"] == "top-1 of ram_stage_seed0"
    assert at[32]["top1"] == "70.00" and at[32]["notes"] == "top-1 of ram_other_data_seed0 on Module small"
    assert not [r for r in rows if "ram_unplanned" in r["notes"]]


def test_a_plans_stage_recipes_get_rows_of_their_own_that_their_results_join(tmp_path, monkeypatch):
    """A curriculum stage that trains another model (DRAM's views sized for their canvas) is measured as
    it is at its own canvas, beside the plan's architecture there; its results join its row, not the
    plan's, and the issue's cost checks read the plan's rows only."""
    plan = next(p for p in scaling.PLANS if p.stages)
    stage = plan.stages[0]
    side = scaling._stage_side(stage)
    monkeypatch.setattr(scaling, "PLANS", (scaling.Plan(plan.family, plan.recipe, stages=(stage,)),))
    results = tmp_path / "results"
    results.mkdir()
    out = results / "scaling_cost_cpu.json"
    sizes = TINY.index("--sizes")
    assert scaling.main(["measure", "--families", plan.family, *TINY[:sizes + 1], str(side), *TINY[sizes + 3:],
                         "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    mine, theirs = (next(r for r in record["rows"] if (r["recipe"] == stage) == own) for own in (True, False))
    assert mine["stage"] and "stage" not in theirs and mine["img_size"] == theirs["img_size"] == side
    assert mine["model"] != theirs["model"] and mine["macs"]["total"] != theirs["macs"]["total"]
    assert scaling.checks(record["rows"]) == scaling.checks([theirs])
    from zoo import registry

    (results / f"{stage}_seed0.json").write_text(json.dumps(
        {"recipe": registry.get_entry(stage).metadata["recipe_file"], "train_args": [], "seed": 0,
         "metrics": {"test/acc": 0.75}, "config": {"class_path": "zoo.models.ram.RAM", "init_args": {"image_size": side},
                                                   "data": registry.get_entry(stage).data}}))
    rows = {r["family"]: r for r in scaling.report_rows(scaling._load_costs(results), scaling.training_results(results))}
    assert rows[f"{plan.family}, own recipe"]["top1"] == "75.00" and rows[plan.family]["top1"] == ""
    assert scaling.stale_rows(scaling._load_costs(results)) == []


@pytest.mark.parametrize("plan", [p for p in scaling.PLANS if p.same_model], ids=lambda p: p.family)
def test_a_plans_same_model_recipes_train_its_architecture(plan):
    """Their results stand for the plan's cost rows: only optimisation and the linked image size may differ."""
    from zoo import registry

    def model(name):  # the recipe's model arguments over its class's defaults
        import inspect

        entry = registry.get_entry(name)
        defaults = {k: p.default for k, p in inspect.signature(
            registry.resolve_class(entry.model["class_path"], "model")).parameters.items()}
        init = {**defaults, **(entry.model.get("init_args") or {})}
        return {k: v for k, v in init.items() if k not in scaling.OPTIMISATION | {"image_size"}}

    for name in plan.same_model:
        assert model(name) == model(plan.recipe), name


def test_report_refuses_a_cost_row_that_measured_another_model_than_its_recipe_builds_now(tiny, tmp_path, capsys):
    record, path = tiny
    results = tmp_path / "results"
    results.mkdir()
    args = ["report", "--results", str(results), "--csv", str(tmp_path / "s.csv"), "--doc", str(tmp_path / "d.md"),
            "--figure", str(tmp_path / "s.png")]
    shutil.copy(REPO / "docs" / "scaling.md", tmp_path / "d.md")
    changed = json.loads(json.dumps(record))
    row = next(r for r in changed["rows"] if r["family"] == "DRAM")
    row["model"] = {**row["model"], "num_glimpses": 99}  # as if the recipe had changed since `measure`
    (results / path.name).write_text(json.dumps(changed))
    assert scaling.main(args) == 1
    assert f"DRAM scale {row['img_size']} px (num_glimpses)" in capsys.readouterr().err
    assert not (tmp_path / "s.csv").exists()
    (results / path.name).write_text(json.dumps(record))
    assert scaling.main(args) == 0


def test_the_accuracy_checks_compare_ats_with_the_small_cnn_at_400_px_and_at_atss_megapixel_memory():
    blank = {c: "" for c in scaling.CSV_COLUMNS}
    ats, cnn = scaling.MEGAPIXEL_SAME_MEMORY
    rows = [blank | {"model": "ats_scale400", "family": "ATS", "task": "scale", "img_size": 400, "top1": "82.00",
                     "seeds": 3},
            blank | {"model": "baseline_smallcnn_scale400", "family": "SmallCNN", "task": "scale", "img_size": 400,
                     "top1": "84.50", "seeds": 1},
            blank | {"model": ats, "family": "ATS", "task": "megapixel", "img_size": 1500, "top1": "57.10", "seeds": 1},
            blank | {"model": cnn, "family": "SmallCNN", "task": "megapixel", "img_size": 192, "top1": "40.00",
                     "seeds": 1}]
    by = {c["name"]: c for c in scaling.accuracy_checks(rows)}
    assert by["ats_minus_smallcnn_top1_400"]["value"] == pytest.approx(-2.5)
    assert by["ats_minus_smallcnn_top1_400"]["meets"] is False and by["ats_minus_smallcnn_top1_400"]["shown"] == "-2.50"
    lead = by["megapixel_ats_lead"]
    assert lead["value"] == pytest.approx(17.1) and lead["meets"] is True
    assert lead["also"] == {"ATS": f"{ats} 57.10 (1 seed)", "small CNN": f"{cnn} 40.00 (1 seed)"}
    rows[3]["top1"] = "50.00"  # a lead of 7.1 points is short of the 10
    assert scaling.accuracy_checks(rows)[1]["meets"] is False
    unmeasured = scaling.accuracy_checks(rows[:1] + rows[2:3])
    assert all(c["value"] is None and c["meets"] is None for c in unmeasured)
    assert unmeasured[1]["also"]["small CNN"] == "not trained"
    # the memory check beside it: the CNN's canvas is downsampled to at most ATS's training memory
    memory = [{"task": "megapixel", "recipe": ats, "train_memory": {"bytes": 800.0}},
              {"task": "megapixel", "recipe": cnn, "train_memory": {"bytes": 780.0}}]
    check = next(c for c in scaling.checks(memory) if c["name"] == "megapixel_cnn_over_ats_train_memory")
    assert check["value"] == pytest.approx(780 / 800) and check["meets"] is True


def test_the_dram_checks_ask_three_seeds_at_65_percent_and_the_papers_cnn_at_400_px():
    blank = {c: "" for c in scaling.CSV_COLUMNS}
    rows = [blank | {"model": "ram_scale400_dram", "family": "DRAM", "task": "scale", "img_size": 400, "top1": "70.00",
                     "seeds": 3},
            blank | {"model": "baseline_cnn_scale400", "family": "PaperCNN", "task": "scale", "img_size": 400,
                     "top1": "10.00", "seeds": 1},
            blank | {"model": "baseline_smallcnn_scale400", "family": "SmallCNN", "task": "scale", "img_size": 400,
                     "top1": "85.00", "seeds": 1}]
    by = {c["name"]: c for c in scaling.accuracy_checks(rows)}
    assert by["dram_top1_400"]["meets"] is True and by["dram_top1_400"]["shown"] == "70.00 (3 seeds)"
    assert by["dram_minus_papercnn_top1_400"]["value"] == pytest.approx(60) and by["dram_minus_papercnn_top1_400"]["meets"]
    gap = by["dram_minus_smallcnn_top1_400"]  # reported, whatever it is
    assert gap["value"] == pytest.approx(-15) and gap["meets"] is None and gap["target"] == "reported"
    rows[0]["seeds"] = 1  # one seed is not the three
    assert {c["name"]: c for c in scaling.accuracy_checks(rows)}["dram_top1_400"]["meets"] is False
    rows[0] |= {"seeds": 3, "top1": "64.90"}
    assert {c["name"]: c for c in scaling.accuracy_checks(rows)}["dram_top1_400"]["meets"] is False


def test_pointing_beats_the_centre_prior_only_where_every_seeds_interval_lies_above_it(tmp_path):
    """An attention result of a recipe on the scale data joins its family's pointing check (a summary
    over seeds before one run's); a recipe on other data, or another family's, does not."""
    def summary(diffs):
        return {"metrics": {"pointing": {"mean": 0.9, "per_seed": [0.9] * len(diffs)},
                            "pointing_centre": {"mean": 0.1, "per_seed": [0.1] * len(diffs)},
                            "pointing_minus_centre": {"mean": 0.8, "per_seed": [0.8] * len(diffs),
                                                      "per_seed_ci95": diffs}}}

    def one_run(low):
        return {"trained": {"correctness": {"pointing": 0.5, "pointing_centre": 0.004, "pointing_minus_centre": 0.496,
                                            "ci95": {"pointing_minus_centre": [low, 0.6]}}}}

    files = {"attention_ram_scale400_dram.json": summary([[0.7, 0.9], [0.75, 0.85], [0.72, 0.88]]),
             "attention_ram_scale400_dram_seed0.json": one_run(-0.1),  # a seed's own: its summary stands for it
             "attention_ats_scale200.json": one_run(-0.01),
             "attention_ram_fmnist_cluttered60_dram.json": one_run(0.3),  # FashionMNISTDataModule: not a scale row
             "attention_vit_fmnist_cluttered60_probe.json": one_run(0.3)}  # no such recipe
    for name, record in files.items():
        (tmp_path / name).write_text(json.dumps(record))
    checks = {c["name"]: c for c in scaling.pointing_checks(tmp_path)}
    assert sorted(checks) == ["ats_pointing_scale_200", "dram_pointing_scale_400"]
    dram = checks["dram_pointing_scale_400"]
    assert dram["meets"] is True and dram["shown"] == "+80.0 [70.0, 90.0]"
    assert dram["also"]["from"] == "attention_ram_scale400_dram.json (3 seeds)"
    assert checks["ats_pointing_scale_200"]["meets"] is False  # its interval reaches below the prior
