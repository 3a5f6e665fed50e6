"""Build the results tables of README.md, docs/results.md, docs/draw.md, docs/attention.md,
docs/captioning.md and docs/leaderboard.md from results/*.json (no number in them is typed by hand),
docs/usage.md's model table from the registry, and timm's results and benchmark CSVs in results/.

    python scripts/results_tables.py           # rewrite the tables in place
    python scripts/results_tables.py --check   # exit 1 when a committed table differs (the tests run this)

docs/tables.yaml lays the tables out: each row is a label and cells; a cell is a string, or a
mapping naming a results file (results/<results>.json, a multi-seed summary or one seed) and what
to show from it:
    metric: test/acc        the metric, as mean ± std over the seeds (or the single value)
      per_seed: true        instead each seed's value with its bootstrap 95% interval, "v [lo, hi]"
                            joined by " / " (a multi-seed attention summary's per_seed_ci95)
    scale: 100              multiply first (accuracies in percent)
    digits: 2               decimals
    values: [a.b.c, ...]    numbers at dotted paths in the file (a key may hold '/'), shown as
                            "first (second / third ...)": a measurement and its chance levels;
                            a missing path shows as "-", a list of numbers as "a, b, c"
      interval: true        the first number with its bootstrap 95% interval, "v [lo, hi] (...)",
                            read from the "ci95" mapping beside it (a.b.ci95.c)
    verdict: a.b.c          a difference to a control with its interval and what the interval
                            says: "+3.3 [+0.4, +6.1] above" (the interval clears 0), "below", or
                            "unresolved" (it holds 0); the only way a table says "beats a control"
      per_seed: true        each seed's verdict, from a multi-seed attention summary's metric
                            (per_seed and per_seed_ci95), joined by " / "
    field: seeds | params | epochs | wall_min | device
                            the seed count, the model's parameter count (built from the recorded
                            config), the epochs of the run (its recipe's when it trained, or its
                            command-line override), the training wall time per seed in minutes, the
                            device
    optional: true          a results file that does not exist shows as "-" (a release without
                            attention results)
or a mapping naming a release (the manifest, zoo/model_index.json) or a benchmark CSV:
    {release: NAME, field: headline | family | data | params | gmacs | seeds | trained_on}
                            its headline metric (the first of `zoo list`'s), family, data, its
                            parameters, its GMACs per image (zoo/model_index.json), the headline
                            metric of its recipe's results run as mean ± std over the seeds ("(n
                            seeds)"), the device its weights trained on (the manifest's record)
    {benchmark_device: cpu}  the device as people write it, with the torch release of its benchmark CSVs
    {benchmark: infer, device: cpu, model: NAME, column: infer_samples_per_sec, batch: 256, mode: eager}
                            a value of the benchmark CSV of that kind, device and batch
                            (results/benchmark-<kind>-<device>-<precision>-bs<batch>-torch<v>.csv,
                            tools/result_csvs.py); mode "default" takes the compiled row where
                            there is one; `batch: largest` the largest batch measured, shown as
                            "v (batch N)"; with `optional: true` a CSV not measured yet shows "-"
A table with `for_each: release` has one row per release: `row` is the template, "{name}" in it
the release's name; `device_row`, a template with "{device}" as well, adds a row under the
release for each other device a benchmark CSV measured it on (the GPU rows); `group_by: task`
splits the table into one per task and data set, each under its own bold line.
A table with `for_each: family` has one row per registered model family (zoo.registry): the
family, `what` (a mapping family -> text; a family without one is an error), its recipes
(`zoo list`) and its releases (`zoo list --pretrained`).
A document holds a table between `<!-- table:NAME -->` and `<!-- /table -->`.

The same run writes the CSVs of tools/result_csvs.py: results/results-<dataset>.csv (timm's
results columns, per data set) and one benchmark CSV per configuration; `--check` compares them too.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from functools import lru_cache
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.model_index import at as _at  # noqa: E402
from zoo.commands.info import FILLS_INPUT, fills_input  # noqa: E402

from tools import result_csvs  # noqa: E402

LAYOUT = ROOT / "docs" / "tables.yaml"
DOCUMENTS = [ROOT / "README.md", ROOT / "docs" / "results.md", ROOT / "docs" / "draw.md", ROOT / "docs" / "attention.md",
             ROOT / "docs" / "captioning.md", ROOT / "docs" / "leaderboard.md", ROOT / "docs" / "usage.md"]
RESULTS = ROOT / "results"
#: the generated CSVs: what `main` writes into results/ and `--check` compares
GENERATED_CSV = ("results-*.csv", "benchmark-*.csv")


@lru_cache(maxsize=None)
def load(name: str) -> dict:
    path = ROOT / "results" / f"{name}.json"
    if not path.is_file():
        raise SystemExit(f"results_tables: {path.relative_to(ROOT)} does not exist (named in {LAYOUT.name})")
    return json.loads(path.read_text())


def _values(record: dict, metric: str) -> list[float]:
    value = (record.get("metrics") or {}).get(metric)
    if value is None:
        raise SystemExit(f"results_tables: {record.get('name')} has no metric {metric}")
    if isinstance(value, dict):
        return [v for v in value["per_seed"] if v is not None]
    return [value]


def metric_cell(record: dict, metric: str, scale: float = 1.0, digits: int = 2, per_seed: bool = False) -> str:
    if per_seed:
        entry = (record.get("metrics") or {}).get(metric) or {}
        values, intervals = entry.get("per_seed") or [], entry.get("per_seed_ci95") or []
        if not values:
            raise SystemExit(f"results_tables: {record.get('name')} has no per-seed metric {metric}")
        return " / ".join(_with_interval(v, ci, scale, digits) for v, ci in zip(values, intervals))
    values = [v * scale for v in _values(record, metric)]
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def _epochs(record: dict) -> int | None:
    """The run's epochs: its command-line override, else its recipe as it was when it trained."""
    from tools.release import load_recipe, recipe_at

    args = record.get("train_args") or []
    for flag, value in zip(args, args[1:]):
        if flag == "--trainer.max_epochs":
            return int(value)
    recipe = recipe_at(record["recipe"], record.get("git_commit")) or load_recipe(record["recipe"])
    return (recipe.get("trainer") or {}).get("max_epochs")


@lru_cache(maxsize=None)
def _params(name: str) -> int:
    from zoo.registry import build

    config = dict(load(name)["config"])
    config.pop("data", None)
    init_args = dict(config.get("init_args") or {})
    for key in ("pretrained", "pretrained_file"):  # the architecture only, no downloads
        init_args.pop(key, None)
    return sum(p.numel() for p in build({**config, "init_args": init_args}).parameters())


def field_cell(name: str, field: str) -> str:
    record = load(name)
    if field == "seeds":
        return str(len(record.get("seeds") or [record.get("seed")]))
    if field == "params":
        return f"{_params(name) / 1e6:.2f} M"
    if field == "epochs":
        epochs = _epochs(record)
        return f"{epochs}" if epochs is not None else "-"
    if field == "wall_min":  # training time per seed (a summary's own wall time includes evaluation)
        seeds = record.get("seeds")
        walls = [load(f"{name}_seed{s}").get("train_wall_time_s") for s in seeds] if seeds else \
            [record.get("train_wall_time_s")]
        walls = [w for w in walls if w]
        return f"{statistics.fmean(walls) / 60:.0f}" if walls else "-"
    if field == "device":
        return (record.get("device") or {}).get("device", "-")
    raise SystemExit(f"results_tables: unknown field {field!r}")


def _interval_at(record: dict, path: str):
    """The bootstrap interval stored beside the number at `path`: its parent's "ci95" entry."""
    parent, _, key = path.rpartition(".")
    intervals = _at(record, f"{parent}.ci95" if parent else "ci95")
    return intervals.get(key) if isinstance(intervals, dict) else None


def _with_interval(value, interval, scale: float, digits: int, sign: str = "") -> str:
    if not isinstance(value, (int, float)) or value != value:
        return "-"
    text = f"{value * scale:{sign}.{digits}f}"
    if interval:
        text += f" [{interval[0] * scale:{sign}.{digits}f}, {interval[1] * scale:{sign}.{digits}f}]"
    return text


def values_cell(record: dict, paths: list[str], scale: float = 1.0, digits: int = 2, interval: bool = False) -> str:
    def number(v) -> str:
        if isinstance(v, list) and v:  # per glimpse, per seed
            return ", ".join(number(x) for x in v)
        return "-" if not isinstance(v, (int, float)) or v != v else f"{v * scale:.{digits}f}"

    if fills_input(_at(record, f"{paths[0]}_uniform")):  # a box as large as the input: chance is 100%
        return FILLS_INPUT
    shown = [_at(record, path) for path in paths]
    text = [number(v) for v in shown]
    if interval:
        text[0] = _with_interval(shown[0], _interval_at(record, paths[0]), scale, digits)
    return text[0] + (f" ({' / '.join(text[1:])})" if len(text) > 1 else "")


def _verdict(value, interval, scale: float, digits: int) -> str:
    word = "above" if interval[0] > 0 else "below" if interval[1] < 0 else "unresolved"
    return f"{_with_interval(value, interval, scale, digits, sign='+')} {word}"


def verdict_cell(record: dict, path: str, scale: float = 1.0, digits: int = 2, per_seed: bool = False) -> str:
    """A difference to a control, its interval, and the verdict the interval allows; `per_seed`:
    each seed's, from a multi-seed attention summary's metric `path` (per_seed, per_seed_ci95)."""
    if per_seed:
        entry = (record.get("metrics") or {}).get(path) or {}
        values, intervals = entry.get("per_seed") or [], entry.get("per_seed_ci95") or []
        if not values or len(intervals) != len(values) or not all(intervals):
            raise SystemExit(f"results_tables: {record.get('name')} has no per-seed intervals for {path}: "
                             "no verdict without one")
        return " / ".join(_verdict(v, ci, scale, digits) for v, ci in zip(values, intervals))
    value, interval = _at(record, path), _interval_at(record, path)
    if not isinstance(value, (int, float)) or value != value:
        return "-"
    if not interval:
        raise SystemExit(f"results_tables: {record.get('name')} has no interval for {path}: no verdict without one")
    return _verdict(value, interval, scale, digits)


@lru_cache(maxsize=None)
def _manifest() -> dict:
    return json.loads((ROOT / "weights" / "MANIFEST.json").read_text())


@lru_cache(maxsize=None)
def _index() -> dict:
    return json.loads((ROOT / "zoo" / "model_index.json").read_text())["entries"]


def release_cell(name: str, field: str) -> str:
    if name not in _manifest():
        raise SystemExit(f"results_tables: no release named {name!r} (named in {LAYOUT.name})")
    if field == "headline":
        from zoo.commands.list_models import HEADLINE

        metrics = _manifest()[name]["metadata"]["metrics"]
        key = next((k for k in HEADLINE if k in metrics), None)
        if key is None:
            return "-"
        value = metrics[key]
        shown = f"{100 * value:.2f} %" if "acc" in key.split("/")[-1] else f"{value:.4g}"
        return f"{key.removeprefix('test/')} {shown}"
    facts = _index()[name]
    if field == "family":
        return facts["family"]
    if field == "data":
        return str(_manifest()[name]["metadata"].get("dataset", "-")).replace("DataModule", "")
    if field == "params":
        return f"{facts['num_params'] / 1e6:.2f} M"
    if field == "gmacs":
        return f"{facts['macs'] / 1e9:.3g}"
    if field == "seeds":
        return seed_spread(name)
    if field == "trained_on":
        return str(_manifest()[name]["metadata"].get("device") or "-")
    raise SystemExit(f"results_tables: unknown release field {field!r}")


def seed_spread(name: str) -> str:
    """The release recipe's results run: its headline metric as mean ± std over the seeds, "(n seeds)";
    the run is the summary beside the release's per-seed results file (results/<run>_seed0.json)."""
    from zoo.commands.list_models import HEADLINE

    metadata = _manifest()[name]["metadata"]
    run = Path(str(metadata.get("results_file", ""))).stem.rsplit("_seed", 1)[0]
    if not (RESULTS / f"{run}.json").is_file():
        return "-"
    metrics = load(run).get("metrics") or {}
    key = next((k for k in HEADLINE if k in metrics and k in (metadata.get("metrics") or {})), None)
    if key is None:
        return "-"
    values = _values(load(run), key)
    scale, digits = (100, 2) if "acc" in key.split("/")[-1] else (1, 4 if key == "test/CIDEr" else 1)
    values = [v * scale for v in values]
    spread = f"{statistics.fmean(values):.{digits}f}" + (
        f" ± {statistics.stdev(values):.{digits}f}" if len(values) > 1 else "")
    return f"{spread} ({len(values)} seed{'s' if len(values) != 1 else ''})"


def task_of(name: str) -> str:
    return result_csvs.task_of(name, _index()[name])


@lru_cache(maxsize=None)
def _benchmarks() -> dict[tuple[str, str, int], tuple[dict, ...]]:
    """{(kind, device, batch): rows} of the generated benchmark CSVs (the newest torch's where several)."""
    found = {}
    for name, text in sorted(generated_csvs().items(), key=lambda item: item[0]):
        config = result_csvs.parse_benchmark_name(name)
        if config:
            found[(config["kind"], config["device"], config["batch"])] = tuple(result_csvs.read_csv_text(text))
            _TORCH[config["device"]] = config["torch"]
    return found


_TORCH: dict[str, str] = {}  # the torch release of each device's benchmark CSVs


def _benchmark(kind: str, device: str, batch: int | str, model: str) -> tuple[int, tuple[dict, ...]] | None:
    """The batch and the rows of `model` in the CSV of this kind, device and batch ("largest": the
    largest batch measured for the model), or None where there is none."""
    sizes = sorted(b for (k, d, b), rows in _benchmarks().items() if k == kind and d == device
                   and any(r["model"] == model for r in rows))
    batch = sizes[-1] if batch == "largest" and sizes else batch
    rows = _benchmarks().get((kind, device, int(batch) if batch != "largest" else -1))
    return (int(batch), rows) if rows else None


def devices_of(name: str) -> list[str]:
    """The devices besides the CPU that a benchmark CSV measured `name` on."""
    return sorted({d for (k, d, b), rows in _benchmarks().items() if d != "cpu" and any(r["model"] == name for r in rows)})


def device_title(device: str) -> str:
    """A device as a CSV's name says it ('nvidia-h200'), as people write it, with the torch release
    its CSVs were measured with ('NVIDIA H200, torch 2.11.0')."""
    _benchmarks()
    torch_version = f", torch {_TORCH[device]}" if device in _TORCH else ""
    return device.replace("-", " ").upper() + torch_version


def benchmark_cell(spec: dict) -> str:
    kind = spec["benchmark"]
    found = _benchmark(kind, spec.get("device", "cpu"), spec["batch"], spec["model"])
    if found is None:
        if spec.get("optional"):
            return "-"
        raise SystemExit(f"results_tables: no {kind} benchmark on {spec.get('device', 'cpu')} at batch {spec['batch']} "
                         f"(named in {LAYOUT.name}); run python benchmarks/releases.py")
    batch, rows = found
    modes = {r[f"{kind}_mode"]: r for r in rows if r["model"] == spec["model"]}
    mode = spec.get("mode", "eager")
    row = modes.get("compile", modes.get("eager")) if mode == "default" else modes.get(mode)
    if row is None:
        return "-"
    value = float(row[spec["column"]])
    notes = [f"batch {batch}"] if spec["batch"] == "largest" else []
    if mode == "default" and row is modes.get("compile"):
        notes.append("compiled")
    return f"{value:,.{spec.get('digits', 0)}f}" + (f" ({', '.join(notes)})" if notes else "")


def cell(spec) -> str:
    if not isinstance(spec, dict):
        return str(spec)
    if "release" in spec:
        return release_cell(spec["release"], spec["field"])
    if "benchmark" in spec:
        return benchmark_cell(spec)
    if "benchmark_device" in spec:
        return device_title(spec["benchmark_device"])
    name = spec["results"]
    if spec.get("optional") and not (ROOT / "results" / f"{name}.json").is_file():
        return "-"
    if "values" in spec:
        return values_cell(load(name), spec["values"], spec.get("scale", 1.0), spec.get("digits", 2),
                           spec.get("interval", False))
    if "verdict" in spec:
        return verdict_cell(load(name), spec["verdict"], spec.get("scale", 1.0), spec.get("digits", 2),
                            spec.get("per_seed", False))
    if "field" in spec:
        return field_cell(name, spec["field"])
    return metric_cell(load(name), spec["metric"], spec.get("scale", 1.0), spec.get("digits", 2),
                       spec.get("per_seed", False))


def _filled(template, name: str, more: dict[str, str] | None = None):
    if isinstance(template, str):
        for key, value in {"{name}": name, **(more or {})}.items():
            template = template.replace(key, value)
        return template
    if isinstance(template, list):
        return [_filled(t, name, more) for t in template]
    if isinstance(template, dict):
        return {k: _filled(v, name, more) for k, v in template.items()}
    return template


def _release_rows(table: dict, names: list[str]) -> list:
    rows = []
    for name in names:
        rows.append(_filled(table["row"], name))
        for device in devices_of(name) if "device_row" in table else []:
            rows.append(_filled(table["device_row"], name, {"{device}": device, "{device_title}": device_title(device)}))
    return rows


def _families() -> dict[str, dict[str, list[str]]]:
    from zoo import registry

    families: dict[str, dict[str, list[str]]] = {}
    for name, entry in sorted(registry.find_entries().items()):
        family = families.setdefault(registry.family_of(entry), {"recipes": [], "releases": []})
        family["recipes"].append(name)
        if entry.weights is not None:
            family["releases"].append(name)
    return families


def _family_rows(table: dict) -> list:
    what = table.get("what") or {}
    rows = []
    for family, names in sorted(_families().items()):
        if family not in what:
            raise SystemExit(f"results_tables: the registry has a family {family!r} that {LAYOUT.name}'s "
                             f"`what` does not describe")
        rows.append([f"`{family}`", what[family], ", ".join(f"`{n}`" for n in names["recipes"]),
                     ", ".join(f"`{n}`" for n in names["releases"]) or "-"])
    return rows


def groups_of(table: dict) -> list[tuple[str, list]]:
    """(title, rows) per group: one untitled group, or one per task and data set (`group_by: task`)."""
    if table.get("for_each") == "family":
        return [("", _family_rows(table))]
    if table.get("for_each") != "release":
        return [("", table["rows"])]
    names = sorted(_manifest())
    if table.get("group_by") != "task":
        return [("", _release_rows(table, names))]
    groups: dict[tuple[str, str], list[str]] = {}
    for name in names:
        groups.setdefault((task_of(name), release_cell(name, "data")), []).append(name)
    return [(f"{task}, {data}", _release_rows(table, members)) for (task, data), members in sorted(groups.items())]


def rows_of(table: dict) -> list:
    return [row for _, rows in groups_of(table) for row in rows]


def render(table: dict) -> str:
    header = table["columns"]
    parts = []
    for title, rows in groups_of(table):
        lines = ([f"**{title}**", ""] if title else []) + ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for row in rows:
            cells = [cell(c) for c in row]
            if len(cells) != len(header):
                raise SystemExit(f"results_tables: a row of {len(cells)} cells under {len(header)} columns: {row[0]}")
            lines.append("| " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


@lru_cache(maxsize=None)
def generated_csvs() -> dict[str, str]:
    """{file name in results/: text}: the results CSVs per data set and the benchmark CSVs per
    configuration (tools/result_csvs.py), from the manifest, the index and the benchmark records."""
    from zoo import registry

    out = result_csvs.results_tables(_manifest(), _index())
    for path in sorted(RESULTS.glob("bench_releases_*.json")):
        record = json.loads(path.read_text())
        if record.get("rows") and record.get("torch"):
            out.update(result_csvs.releases_benchmarks(record))
    accel = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("bench_accel_*.json"))]
    accel = [r for r in accel if r.get("device_type") == "cuda" and r.get("torch")]
    recipes = {str(e.recipe.resolve().relative_to(ROOT)): n for n, e in registry.find_entries().items()
               if e.recipe is not None and e.recipe.resolve().is_relative_to(ROOT)}
    out.update(result_csvs.merge_accel(accel, recipes, _index()))
    return out


def fill(text: str, tables: dict[str, str], source: Path) -> str:
    out, pos = [], 0
    while True:
        start = text.find("<!-- table:", pos)
        if start < 0:
            out.append(text[pos:])
            return "".join(out)
        head_end = text.index("-->", start) + 3
        name = text[start + len("<!-- table:"):head_end - 3].strip()
        end = text.index("<!-- /table -->", head_end)
        if name not in tables:
            raise SystemExit(f"results_tables: {source.name} asks for table {name!r}, not in {LAYOUT.name}")
        out.append(text[pos:head_end] + "\n" + tables[name] + "\n")
        pos = end


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report tables that differ (exit 1)")
    args = parser.parse_args(argv)
    layout = yaml.safe_load(LAYOUT.read_text())
    tables = {name: render(table) for name, table in layout.items()}
    stale = []
    for document in DOCUMENTS:
        text = document.read_text()
        new = fill(text, tables, document)
        if new != text:
            stale.append(document.relative_to(ROOT))
            if not args.check:
                document.write_text(new)
    generated = generated_csvs()
    for name, text in generated.items():
        path = RESULTS / name
        if not path.is_file() or path.read_text() != text:
            stale.append(path.relative_to(ROOT))
            if not args.check:
                from zoo.guards.writes import atomic_write_bytes

                atomic_write_bytes(path, text.encode())
    for pattern in GENERATED_CSV:  # a CSV of an earlier layout, or of a record that is gone
        for path in sorted(RESULTS.glob(pattern)):
            if path.name not in generated:
                stale.append(path.relative_to(ROOT))
                if not args.check:
                    path.unlink()
    if args.check and stale:
        print(f"results_tables: out of date in {', '.join(map(str, stale))}; run python scripts/results_tables.py",
              file=sys.stderr)
        return 1
    for document in stale:
        print(f"rewrote {document}" if document.suffix == ".csv" else f"rewrote the tables of {document}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
