"""The captioning tables of docs/captioning.md, from the results JSON (nothing typed by hand).

    python scripts/sat_report.py [--results results] > tables.md

Each row is a results run summary results/<name>.json written by scripts/results_run.py (mean ±
std over its seeds, test split, selection on validation CIDEr); a row whose JSON is missing is
printed as "not run". Localisation: the fraction of generated item words whose attention peak
lies in the named item's box; mass in box: the mean attention mass inside that box; chance: the
mean fraction of grid cells inside those boxes (what a uniform map gives for both).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

COLUMNS = [("B-1", "Bleu_1", 100), ("B-2", "Bleu_2", 100), ("B-3", "Bleu_3", 100), ("B-4", "Bleu_4", 100),
           ("METEOR", "METEOR", 100), ("ROUGE-L", "ROUGE_L", 100), ("CIDEr", "CIDEr", 1),
           ("localisation %", "localization", 100), ("mass in box %", "attention_mass_in_box", 100),
           ("chance %", "box_area", 100)]

TABLES = {
    "Item 1: the pretrained, frozen encoder against one trained from scratch": [
        ("soft, encoder from scratch", "sat_soft_scenes_scratch"),
        ("soft, frozen pretrained encoder (`sat_soft_scenes`)", "sat_soft_scenes"),
        ("hard (authors' rule), encoder from scratch", "sat_hard_scenes_scratch"),
        ("hard (authors' rule), frozen pretrained encoder", "sat_hard_scenes_authors"),
    ],
    "Item 2: hard attention, one change at a time (frozen pretrained encoder unless said)": [
        ("authors' rule, encoder from scratch", "sat_hard_scenes_scratch"),
        ("authors' rule", "sat_hard_scenes_authors"),
        ("+ learned baseline b(h_{t-1}, y_t)", "sat_hard_scenes_learned_baseline"),
        ("+ per-word cost, learned baseline, reward scale 1 (`sat_hard_scenes`)", "sat_hard_scenes"),
        ("soft attention, for reference (`sat_soft_scenes`)", "sat_soft_scenes"),
    ],
    "Item 3: supervised attention (Liu et al. 2017), frozen pretrained encoder": [
        ("soft", "sat_soft_scenes"),
        ("soft + supervised attention", "sat_soft_scenes_supervised"),
        ("hard", "sat_hard_scenes"),
        ("hard + supervised attention", "sat_hard_scenes_supervised"),
    ],
}


def cell(metrics: dict, key: str, scale: float, split: str) -> str:
    entry = metrics.get(f"{split}/{key}")
    if entry is None:
        return "-"
    digits = 2 if scale == 1 else 1
    mean, std = entry["mean"] * scale, entry["std"] * scale
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if len(entry["per_seed"]) > 1 else f"{mean:.{digits}f}"


def table(title: str, rows: list[tuple[str, str]], results: Path, split: str) -> str:
    lines = [f"### {title}", "", "| model | " + " | ".join(c[0] for c in COLUMNS) + " | seeds | results |",
             "|---|" + "---|" * (len(COLUMNS) + 2)]
    for label, name in rows:
        path = results / f"{name}.json"
        if not path.is_file():
            lines.append(f"| {label} | " + " | ".join("not run" for _ in COLUMNS) + " | 0 | - |")
            continue
        record = json.loads(path.read_text())
        metrics = record["metrics"]
        lines.append(f"| {label} | " + " | ".join(cell(metrics, key, scale, split) for _, key, scale in COLUMNS)
                     + f" | {len(record['seeds'])} | `{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}` |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=str(ROOT / "results"))
    parser.add_argument("--split", default="test", choices=["val", "test"])
    args = parser.parse_args()
    results = Path(args.results).resolve()
    print("\n\n".join(table(title, rows, results, args.split) for title, rows in TABLES.items()))


if __name__ == "__main__":
    main()
