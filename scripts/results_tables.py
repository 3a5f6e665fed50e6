"""Build the results tables of README.md, docs/results.md, docs/draw.md, docs/attention.md and
docs/captioning.md from results/*.json: no number in them is typed by hand.

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
    {release: NAME, field: headline | family | data | params | gmacs}
                            its headline metric (the first of `zoo list`'s), family, data, its
                            parameters, its GMACs per image (zoo/model_index.json)
    {benchmark: infer-cpu, model: NAME, column: infer_samples_per_sec, batch: 256, mode: eager}
                            a value of results/benchmark-<benchmark>.csv (benchmarks/releases.py);
                            mode "default" takes the compiled row where there is one; with
                            `optional: true` a CSV not measured yet shows "-"
A table with `for_each: release` has one row per release: `row` is the template, "{name}" in it
the release's name.
A document holds a table between `<!-- table:NAME -->` and `<!-- /table -->`.
"""
from __future__ import annotations

import argparse
import csv
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

LAYOUT = ROOT / "docs" / "tables.yaml"
DOCUMENTS = [ROOT / "README.md", ROOT / "docs" / "results.md", ROOT / "docs" / "draw.md", ROOT / "docs" / "attention.md",
             ROOT / "docs" / "captioning.md", ROOT / "docs" / "leaderboard.md"]


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
    raise SystemExit(f"results_tables: unknown release field {field!r}")


@lru_cache(maxsize=None)
def _benchmark(name: str) -> tuple[dict, ...]:
    path = ROOT / "results" / f"benchmark-{name}.csv"
    if not path.is_file():
        raise SystemExit(f"results_tables: {path.relative_to(ROOT)} does not exist (named in {LAYOUT.name}); "
                         "run python benchmarks/releases.py")
    with open(path, newline="") as f:
        return tuple(csv.DictReader(f))


def benchmark_cell(spec: dict) -> str:
    if spec.get("optional") and not (ROOT / "results" / f"benchmark-{spec['benchmark']}.csv").is_file():
        return "-"
    kind = spec["column"].split("_")[0]
    rows = [r for r in _benchmark(spec["benchmark"]) if r["model"] == spec["model"]
            and int(r[f"{kind}_batch_size"]) == int(spec["batch"])]
    modes = {r[f"{kind}_mode"]: r for r in rows}
    mode = spec.get("mode", "eager")
    row = modes.get("compile", modes.get("eager")) if mode == "default" else modes.get(mode)
    if row is None:
        return "-"
    value = float(row[spec["column"]])
    return f"{value:,.{spec.get('digits', 0)}f}" + (" (compiled)" if mode == "default" and row is modes.get("compile") else "")


def cell(spec) -> str:
    if not isinstance(spec, dict):
        return str(spec)
    if "release" in spec:
        return release_cell(spec["release"], spec["field"])
    if "benchmark" in spec:
        return benchmark_cell(spec)
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


def _filled(template, name: str):
    if isinstance(template, str):
        return template.replace("{name}", name)
    if isinstance(template, list):
        return [_filled(t, name) for t in template]
    if isinstance(template, dict):
        return {k: _filled(v, name) for k, v in template.items()}
    return template


def rows_of(table: dict) -> list:
    if table.get("for_each") == "release":
        return [_filled(table["row"], name) for name in sorted(_manifest())]
    return table["rows"]


def render(table: dict) -> str:
    header = table["columns"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows_of(table):
        cells = [cell(c) for c in row]
        if len(cells) != len(header):
            raise SystemExit(f"results_tables: a row of {len(cells)} cells under {len(header)} columns: {row[0]}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
    if args.check and stale:
        print(f"results_tables: out of date in {', '.join(map(str, stale))}; run python scripts/results_tables.py",
              file=sys.stderr)
        return 1
    for document in stale:
        print(f"rewrote the tables of {document}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
