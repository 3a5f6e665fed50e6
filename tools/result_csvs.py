"""The results and benchmark CSVs in timm's layout, written from the committed records (no torch).

timm keeps one `results-<dataset>.csv` per evaluation set (model, top1, top1_err, top5, top5_err,
param_count, img_size, crop_pct, interpolation) and one benchmark CSV per configuration, named by
what makes its numbers comparable: the device, the precision, the batch size and the torch version.
Here:

- `results/results-<dataset>.csv`: one row per release evaluated on that data set, from the release
  manifest (weights/MANIFEST.json: the released weights' test metrics) and the model index
  (zoo/model_index.json: parameters, input size, resize rule). Classification sets get timm's
  columns (percentages, as timm writes them; top5 is empty where the evaluation did not record
  `test/acc_top5`); a set evaluated for another task gets `results-<dataset>-<task>.csv` with that
  task's metrics in place of top1/top5.
- `results/benchmark-<kind>-<device>-<precision>-bs<batch>-torch<version>.csv`: timm's benchmark
  columns (benchmarks/releases.py), from the JSON records the benchmarks write
  (results/bench_releases_<device>.json) and, for the GPU, from benchmarks/accel.py's training
  records (results/bench_accel_<gpu>*.json: a family's recipe, fp32, per mode).

scripts/results_tables.py writes them with the leaderboard, and `--check` fails when one differs.
"""
from __future__ import annotations

import csv
import io
import re

INFER_COLUMNS = ["model", "infer_samples_per_sec", "infer_step_time", "infer_batch_size", "infer_img_size",
                 "infer_gmacs", "param_count", "infer_mode"]
TRAIN_COLUMNS = ["model", "train_samples_per_sec", "train_step_time", "train_batch_size", "train_img_size",
                 "param_count", "train_mode"]
CLASSIFICATION_COLUMNS = ["model", "top1", "top1_err", "top5", "top5_err", "param_count", "img_size", "crop_pct",
                          "interpolation"]
#: the columns of the tasks timm has no results CSV for: (column, metric, scale)
TASK_METRICS = {
    "captioning": [("bleu4", "test/Bleu_4", 100), ("meteor", "test/METEOR", 100), ("rouge_l", "test/ROUGE_L", 100),
                   ("cider", "test/CIDEr", 1)],
    "generation": [("nelbo", "test/nelbo", 1), ("iwae_k1000", "test/iwae_k1000", 1), ("kl", "test/kl", 1)],
    "item classification": [("item_top1", "test/item_acc", 100), ("cell_top1", "test/cell_acc", 100),
                            ("colour_top1", "test/colour_acc", 100)],
}
#: a release's task, from its family card's output (the model index's output_kind)
TASK_OF_OUTPUT = {"logits": "classification", "caption": "captioning", "sample": "generation"}
#: the releases' precision: benchmarks/releases.py and benchmarks/accel.py time float32 (no autocast)
PRECISION = "fp32"


def slug(text: str) -> str:
    """A file-name piece: lower case, runs of anything else than [a-z0-9_] as one '-'."""
    return re.sub(r"[^a-z0-9_]+", "-", str(text).lower()).strip("-")


def torch_tag(version: str) -> str:
    """'2.14.1+cu130' -> '2.14.1': the release, not the build (timm's file names say the release)."""
    return str(version).split("+")[0]


def benchmark_name(kind: str, device: str, batch: int, torch_version: str, precision: str = PRECISION) -> str:
    return f"benchmark-{kind}-{slug(device)}-{precision}-bs{int(batch)}-torch{torch_tag(torch_version)}.csv"


def parse_benchmark_name(name: str) -> dict | None:
    """The configuration a benchmark CSV's name states, or None for another file."""
    found = re.fullmatch(r"benchmark-(infer|train)-(.+)-(fp32|fp16|bf16|amp)-bs(\d+)-torch(.+)\.csv", name)
    if not found:
        return None
    kind, device, precision, batch, version = found.groups()
    return {"kind": kind, "device": device, "precision": precision, "batch": int(batch), "torch": version}


def csv_text(columns: list[str], rows: list[dict]) -> str:
    from zoo.guards.text import csv_cell

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: csv_cell(row.get(c, "")) for c in columns})  # a model's name is a manifest's text
    return buffer.getvalue()


def read_csv_text(text: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(text)))


def _sorted(rows: list[dict], kind: str) -> list[dict]:
    return sorted(rows, key=lambda r: (r["model"], r[f"{kind}_mode"]))


def releases_benchmarks(record: dict) -> dict[str, str]:
    """{file name: CSV text} of a benchmarks/releases.py record: one file per kind and batch size."""
    device = record.get("device_name") or record.get("device_type") or "cpu"
    grouped: dict[tuple[str, int], list[dict]] = {}
    for row in record.get("rows") or []:
        kind = "infer" if "infer_batch_size" in row else "train"
        grouped.setdefault((kind, int(row[f"{kind}_batch_size"])), []).append(row)
    return {benchmark_name(kind, device, batch, record["torch"]):
            csv_text(INFER_COLUMNS if kind == "infer" else TRAIN_COLUMNS, _sorted(rows, kind))
            for (kind, batch), rows in sorted(grouped.items())}


def accel_benchmarks(record: dict, model_of_recipe: dict[str, str], facts: dict[str, dict]) -> dict[str, list[dict]]:
    """{file name: rows} of a benchmarks/accel.py training record (a GPU's): one row per family recipe
    that is a registered model and per mode, in timm's train columns; `facts` is the model index's."""
    device = (record.get("device") or {}).get("device") or record.get("device_type")
    out: dict[str, list[dict]] = {}
    for family in record.get("families", {}).values():
        model = model_of_recipe.get(family.get("recipe"))
        if model is None or model not in facts:
            continue
        for batch in family.get("batches") or []:
            name = benchmark_name("train", device, batch["batch_size"], record["torch"])
            for mode, timing in sorted((batch.get("modes") or {}).items()):
                if not timing.get("images_per_s"):
                    continue
                out.setdefault(name, []).append({
                    "model": model, "train_samples_per_sec": round(timing["images_per_s"], 2),
                    "train_step_time": round(1000 * timing["step_s"], 3), "train_batch_size": batch["batch_size"],
                    "train_img_size": facts[model]["preprocessing"]["size"][-1],
                    "param_count": round(facts[model]["num_params"] / 1e6, 3), "train_mode": mode})
    return out


def merge_accel(records: list[dict], model_of_recipe: dict[str, str], facts: dict[str, dict]) -> dict[str, str]:
    """The GPU training CSVs of several accel records: where two records time one model, batch and mode,
    the newer record's row stands (a later run of the same measurement)."""
    merged: dict[str, dict[tuple, dict]] = {}
    for record in sorted(records, key=lambda r: r.get("date") or ""):
        for name, rows in accel_benchmarks(record, model_of_recipe, facts).items():
            for row in rows:
                merged.setdefault(name, {})[(row["model"], row["train_mode"])] = row
    return {name: csv_text(TRAIN_COLUMNS, _sorted(list(rows.values()), "train")) for name, rows in sorted(merged.items())}


def dataset_of(metadata: dict) -> str:
    """'FashionMNISTDataModule' + data 'cluttered60' -> 'fmnist-cluttered60'; 'FashionScenesDataModule' ->
    'fashionscenes' (the manifest's dataset, its DataModule suffix dropped)."""
    parts = str(metadata.get("dataset", "unknown")).replace("DataModule", "").split()
    base = {"fashionmnist": "fmnist"}.get(parts[0].lower(), parts[0].lower()) if parts else "unknown"
    return slug("-".join([base, *parts[1:]]))


def task_of(name: str, facts: dict) -> str:
    task = TASK_OF_OUTPUT.get(facts.get("output_kind"), facts.get("output_kind") or "other")
    return "item classification" if task == "classification" and facts.get("family") == "backbone" else task


def _interpolation(preprocessing: dict) -> str:
    from zoo.preprocess import INTERPOLATION

    # "exact": the model refuses another size, so nothing is resized; "squash" and "crop" resize
    return "none" if preprocessing.get("resize") == "exact" else INTERPOLATION


def results_tables(manifest: dict, facts: dict[str, dict]) -> dict[str, str]:
    """{file name: CSV text}: the releases' test results per data set (and task, where not classification)."""
    grouped: dict[tuple[str, str], list[dict]] = {}
    for name in sorted(manifest):
        metadata, index = manifest[name]["metadata"], facts[name]
        metrics, pre = metadata.get("metrics") or {}, index["preprocessing"]
        task = task_of(name, index)
        row = {"model": name, "param_count": round(index["num_params"] / 1e6, 2), "img_size": pre["size"][-1],
               "crop_pct": 1.0 if pre.get("resize") != "crop" else "", "interpolation": _interpolation(pre)}
        if task == "classification":
            for k, metric in ((1, "test/acc"), (5, "test/acc_top5")):
                if metrics.get(metric) is not None:
                    row[f"top{k}"] = round(100 * metrics[metric], 3)
                    row[f"top{k}_err"] = round(100 - row[f"top{k}"], 3)
        else:
            for column, metric, scale in TASK_METRICS.get(task, []):
                if metrics.get(metric) is not None:
                    row[column] = round(scale * metrics[metric], 4)
        grouped.setdefault((dataset_of(metadata), task), []).append(row)
    out = {}
    for (dataset, task), rows in sorted(grouped.items()):
        if task == "classification":
            columns = CLASSIFICATION_COLUMNS
            rows = sorted(rows, key=lambda r: (-(r.get("top1") or 0), r["model"]))  # timm sorts by top1
            name = f"results-{dataset}.csv"
        else:
            columns = ["model", *(c for c, _, _ in TASK_METRICS.get(task, [])), "param_count", "img_size",
                       "crop_pct", "interpolation"]
            name = f"results-{dataset}-{slug(task)}.csv"
        out[name] = csv_text(columns, rows)
    return out
