"""`zoo info NAME`: everything known about a registered model in one record, read without torch (timm's
`pretrained_cfg` and torchvision's `Weights.meta` as one command).

    zoo info ram_fmnist_centered [--json]

It joins the release manifest (file, sha256, seed, metrics, class names or vocabulary,
preprocessing), the recipe (its command; the first sentence of its leading comment) and the model
index (zoo/model_index.json, written by `python scripts/model_index.py`: what takes torch to know). An
entry whose config the index does not know is computed afresh, with a note, never shown stale.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from zoo.guards.errors import printable
from zoo.guards.files import ALPHA_RULE, INTERPOLATION
from zoo.guards.text import is_number, number_text
from zoo.registry import index

REGENERATE = "python scripts/model_index.py"


def config_of(entry) -> dict:
    """The config an entry's facts describe: its release's where it has one, else its recipe's."""
    return entry.weights["config"] if entry.weights is not None else {**entry.model, "data": entry.data}


def digest(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def stored_facts(entry) -> dict | None:
    """The index's facts of `entry`, or None when the index has none for its current config."""
    record = index()["entries"].get(entry.name)
    return record if record and record.get("config_digest") == digest(config_of(entry)) else None


def computed_facts(entry) -> dict:
    """The torch facts of `entry` (zoo.commands.cost.facts), computed now from its config's architecture
    (no downloads)."""
    from zoo.commands import cost
    from zoo.registry import build

    # a recipe's model with what its data decides (image size, classes), as train.py builds it
    model = build(architecture(config_of(entry) if entry.weights is not None else entry.recipe_config()))
    return {"config_digest": digest(config_of(entry)), "family": model.family, "output_kind": model.card.output,
            **cost.facts(model)}


def architecture(config: dict) -> dict:
    """A model config without the pretrained sources that would download or read a user's file
    (timm's hub, a local checkpoint): the same architecture. A released zoo backbone named by
    `pretrained: NAME` stays (a recipe takes the backbone's architecture from it)."""
    def scrub(args: dict) -> dict:
        return {k: False if k == "pretrained" and v is True else v
                for k, v in args.items() if k != "pretrained_file"}

    init_args = scrub(dict(config.get("init_args") or {}))
    if isinstance(init_args.get("backbone"), dict):
        init_args["backbone"] = scrub(init_args["backbone"])
    return {**config, "init_args": init_args}


def description(entry) -> str | None:
    """The first sentence of the recipe's leading comment."""
    path = entry.recipe
    if path is None or not Path(path).is_file():
        return None
    lines = []
    for line in Path(path).read_text().splitlines():
        text = line.lstrip("#").strip()
        if not line.startswith("#") or not text or text.startswith(("python ", "zoo ")):
            break
        lines.append(text)
    text = " ".join(lines)
    sentence = re.match(r"(.+?\.)(?=\s+[A-Z]|\s*$)", text)  # not at "et al. 2015" or "sec. 4.1"
    return (sentence.group(1) if sentence else text) or None


def describe(name: str) -> dict:
    """The `zoo info` record of `name` (unknown names: a UserError with a did-you-mean)."""
    from zoo.registry import get_entry
    from zoo.weights import hub

    entry = get_entry(name)
    stored = stored_facts(entry)
    facts = stored or computed_facts(entry)
    meta = (entry.weights or {}).get("metadata") or {}
    seeds = facts.get("seeds") or {}  # {metric: {"n", "mean", "std"}}
    pre = {**facts.get("preprocessing", {}), **{k: v for k, v in (meta.get("preprocessing") or {}).items()
                                                if k != "class_names"}}
    names = _words(meta.get("class_names")) or _words(_mapping(meta.get("preprocessing")).get("class_names")) \
        or _words(_mapping(entry.model.get("init_args")).get("class_names")) or _words(facts.get("class_names"))
    vocab = _words(meta.get("vocab"))
    # started from timm's pretrained weights, whose mean/std the model applies (timm's pretrained_cfg)
    args = config_of(entry).get("init_args") or {}
    timm = any(block.get("pretrained") is True or block.get("pretrained_file")
               for block in [args, *([args["backbone"]] if isinstance(args.get("backbone"), dict) else [])])
    record = {
        "name": name,
        "family": entry.metadata.get("family") or facts.get("family"),
        "pretrained": entry.weights is not None,
        "description": description(entry),
        "task": meta.get("task"), "dataset": meta.get("dataset"),
        "input_size": [pre.get("in_chans"), *(pre.get("size") or [])],
        "value_range": [0.0, 1.0],
        "mean": pre.get("mean"), "std": pre.get("std"),
        "normalisation": "inside the model" if pre.get("mean") else
                         "inside the model: the pretrained weights' mean/std (timm's pretrained_cfg)"
                         if timm else "none",
        "resize": pre.get("resize"), "resize_size": pre.get("resize_size"), "interpolation": INTERPOLATION,
        "alpha": ALPHA_RULE,
        "num_classes": len(names) if names else facts.get("num_classes"),
        "class_names": list(names) if names else None,
        "vocab_size": len(vocab) if vocab else facts.get("vocab_size"),
        "num_params": facts.get("num_params"),
        "gmacs": facts["macs"] / 1e9 if facts.get("macs") is not None else None,
        "steps": facts.get("steps"),
        "inference": facts.get("inference"), "output_kind": facts.get("output_kind"),
        "recipe": entry.metadata.get("recipe"),
        "recipe_file": entry.metadata.get("recipe_file"),
    }
    record.update({key: facts[key] for key in ("num_params_note", "gmacs_note") if facts.get(key)})
    if entry.weights is not None:
        path = hub.weights_dir() / entry.weights["file"]
        record.update({
            "file": entry.weights["file"], "file_size": path.stat().st_size if path.is_file() else facts.get("file_size"),
            "sha256": entry.weights.get("sha256"), "url": hub.release_url(entry.weights),
            "seed": meta.get("seed"), "trained_at": meta.get("trained_at"), "device": meta.get("device"),
            "remake": meta.get("remake"), "results_file": meta.get("results_file"),
            # the spread over the seeds of the release's recipe, where its results summary has more than one
            "metrics": {str(key): {"value": value, **({"seeds": seeds[key]} if key in seeds else {})}
                        for key, value in _mapping(meta.get("metrics")).items()},
            "attention": facts.get("attention"),
        })
    if stored is None:
        record["notes"] = [f"computed now: the model index has no facts for this config "
                           f"({REGENERATE} stores them)"]
    return record


def _mapping(value) -> dict:
    """A manifest field that should be a mapping, or {} (a file may hold anything there)."""
    return value if isinstance(value, dict) else {}


def _words(value) -> list | None:
    """A manifest's class names or vocabulary: a list, or None (a file may hold anything there;
    each entry is shown as its escaped text)."""
    return value if isinstance(value, list) and value else None


#: per-step metrics (DRAW's KL per step, RAM's accuracy after k glimpses): in the JSON, not the summary lines
PER_STEP = re.compile(r"_(step|glimpses_)\d+$")


def summary_metrics(metrics: dict) -> dict:
    """The test metrics of a `describe` record that its text and its card show."""
    return {k: v for k, v in _mapping(metrics).items() if k.startswith("test/") and not PER_STEP.search(k)}


# ----------------------------------------------------------------------------- text
def _number(value, digits: int = 4) -> str:
    """A number for the text (a count with thousands separators); anything else a file put where a
    number belongs, as its escaped text (zoo.guards.text.number_text)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return number_text(value, f".{digits}g")


def render(record: dict) -> str:
    """`zoo info`'s text: one fact per line, every line printable (text from a manifest, a recipe or
    the index shows its control characters escaped: no line breaks in two, no ESC reaches a terminal)."""
    # `weights`: where a record not of a registered model has its weights from (zoo card --checkpoint)
    weights = record.get("weights") or (
        "released weights" if record["pretrained"] else "recipe only, no released weights")
    lines = [printable(f"{record['name']}  ({record['family']}, {weights})")]
    if record.get("description"):
        lines.append(printable(f"  {record['description']}"))

    def row(label: str, text) -> None:
        if text not in (None, ""):
            lines.append(printable(f"{label:12s} {text}"))

    c, *hw = record["input_size"]
    norm = f"mean {record['mean']}, std {record['std']} (applied inside the model)" if record["mean"] else \
        "no normalisation" if record["normalisation"] == "none" else f"normalised {record['normalisation']}"
    rules = {"exact": f"exact: the image must be {hw[1]}x{hw[0]} px already (its coordinates are input pixels)",
             "squash": f"squash: the whole image resized to {hw[1]}x{hw[0]} px ({record['interpolation']})",
             "crop": f"crop: the shorter side resized to {record.get('resize_size')} px, then the centre "
                     f"{hw[1]}x{hw[0]} ({record['interpolation']})"}
    row("input", f"{c}x{hw[0]}x{hw[1]} (C x H x W), values in [0, 1]; {norm}")
    row("resize", rules.get(record["resize"], record["resize"]))
    row("alpha", record["alpha"])
    if record.get("class_names"):
        shown = ", ".join(map(str, record["class_names"][:10])) + (", ..." if len(record["class_names"]) > 10 else "")
        row("classes", f"{record['num_classes']}: {shown}")
    elif record.get("num_classes"):
        row("classes", record["num_classes"])
    row("vocabulary", f"{record['vocab_size']} words" if record.get("vocab_size") else None)
    params = record.get("num_params")
    row("parameters", (f"{params:,} ({params / 1e6:.2f} M)" if is_number(params) else _number(params))
        + (f"; {record['num_params_note']}" if record.get("num_params_note") else "") if params is not None else None)
    gmacs = record.get("gmacs")
    row("GMACs", f"- ({record.get('gmacs_note') or 'not known'})" if gmacs is None else
        f"{_number(gmacs)} per image: {record['inference']} (torch.utils.flop_counter; MACs = FLOPs / 2)")
    steps = record.get("steps")
    if isinstance(steps, dict) and all(is_number(steps.get(k)) for k in ("per_step", "once_per_image", "count")):
        row("per step", f"{_number(steps['per_step'] / 1e9)} GMACs x {steps['count']} ({steps['name']})"
            + (f" + {_number(steps['once_per_image'] / 1e9)} once per image" if steps["once_per_image"] else ""))
    if record["pretrained"]:
        size = record.get("file_size")
        row("file", f"{record['file']}" + (f", {size / 1e6:.2f} MB" if is_number(size) and size else ""))
        row("sha256", record["sha256"])
    row("recipe", record["recipe"])
    if record["pretrained"]:
        row("seed", f"{record['seed']} (trained at {str(record.get('trained_at'))[:12]} on {record.get('device')})")
        row("remake", record.get("remake"))
        tests = summary_metrics(record["metrics"])
        for key, metric in tests.items():
            spread = _mapping(metric.get("seeds"))
            extra = (f"   ({spread.get('n')} seeds: {_number(spread.get('mean'))} ± {_number(spread.get('std'), 2)})"
                     if spread else "")
            row("metrics" if key == next(iter(tests)) else "", f"{key} {_number(metric['value'])}{extra}")
        row("attention", attention_line(_mapping(record["attention"])) if record.get("attention") else None)
    for note in record.get("notes", []):
        row("note", note)
    return "\n".join(lines)


#: what a table shows for pointing where the target box is the whole input (here, not in
#: zoo.metrics: `zoo info` never imports torch)
FILLS_INPUT = "n/a (the item fills the input)"


def fills_input(uniform_level) -> bool:
    """A uniform map's pointing (the box's share of the input) of 1: the item fills the input, so every
    map points inside it and the number says nothing about where the model looked."""
    return is_number(uniform_level) and uniform_level >= 1 - 1e-6


def attention_line(scores: dict) -> str:
    """Pointing game and deletion gap beside their chance levels, in one line."""
    def pct(key):
        value = scores.get(key)
        return f"{100 * value:.1f}%" if is_number(value) else number_text(value)

    def num(key):
        return number_text(scores.get(key), "+.3f")

    pointing = (FILLS_INPUT if fills_input(scores.get("pointing_uniform")) else
                f"{pct('pointing')} (uniform {pct('pointing_uniform')}, centre prior {pct('pointing_centre')})")
    return (f"pointing {pointing}; "
            f"deletion gap {num('deletion_gap')} vs random, {num('deletion_gap_centre')} vs centre prior; "
            f"{scores.get('examples', '?')} {scores.get('split', '')} images ({scores.get('source')})")


def add_arguments(parser) -> None:
    parser.add_argument("name", help="a registered model (`zoo list` shows them)")
    parser.add_argument("--json", action="store_true", help="print the record as JSON")


def run(args) -> int:
    from zoo.guards.writes import json_text

    record = describe(args.name)
    # JSON escapes every control character (and a file's NaN is null); the text escapes them too
    print(json_text(record, indent=2, default=str) if args.json else render(record))
    return 0
