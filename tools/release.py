"""Released weights keep a promise: each is ONE committed recipe, trained with

    python train.py fit --config <recipe> --seed_everything <seed>

and nothing else, and its manifest entry says so (as torchvision's weights carry their recipe and
metrics in `meta`). This module writes a release and checks one:

- `describe`: the manifest entry of a model trained from a recipe (sha256, config, metadata:
  recipe, seed, the command, the results JSON and its metrics, device, preprocessing, class names or
  vocabulary);
- `recipe_mismatches`: the hyperparameters in which a model's config differs from its recipe
  (a release with any is refused); configs, recipes and command lines from before a
  hyperparameter was renamed are compared in current names (zoo.hparams);
- `check_entry`: one line per disagreement between a manifest entry and the repository (recipe
  missing or not the weights' config, sha256, metrics not those of its results JSON);
- `golden_input` / `golden_output`: a release's output on a fixed, seeded input, stored beside the
  weights (weights/golden/<name>.json), so a code change that silently changes a released model
  fails a test.
"""
from __future__ import annotations

import inspect
import json
import math
from pathlib import Path
from typing import Any

import torch
import yaml

from zoo.hparams import block_defaults, block_types, current_config, current_init_args, current_spec
from zoo.registry import REPO_ROOT, linked, resolve_class
from zoo.training.recipe_args import in_current_names
from zoo.weights import hub

GOLDEN_BATCH = 2


def golden_dir() -> Path:
    return hub.weights_dir() / "golden"


def golden_path(name: str, entry: dict | None = None) -> Path:
    """The golden output of release `name`: named after its weights file, so a new release's golden
    output never overwrites the old one before the manifest switches (scripts/release.py)."""
    entry = entry or hub.manifest()[name]
    return golden_dir() / f"{Path(entry['file']).stem}.json"


# ----------------------------------------------------------------------------- recipes
def load_recipe(recipe: str | Path) -> dict:
    path = Path(recipe)
    path = path if path.is_absolute() else REPO_ROOT / path
    return yaml.safe_load(path.read_text()) or {}


def current_recipe(recipe: dict) -> dict:
    """A recipe's model and data sections in current hyperparameter names (a recipe as it was at
    an older commit may use old ones), the model with what its data decides filled in (image
    size, channels, class names: zoo.registry.linked), as train.py trains it."""
    recipe = in_current_names(recipe)  # an old model's accel: the run's
    out = {**recipe, **{section: current_spec(recipe[section]) for section in ("model", "data")
                        if isinstance(recipe.get(section), dict)}}
    if isinstance(out.get("model"), dict) and isinstance(out.get("data"), dict):
        out["model"] = linked(out["model"], out["data"])
    return out


def current_arg(key: str, value: Any, recipe: dict) -> tuple[str, Any]:
    """A command-line `model.init_args.NAME` (without its dashes) and its parsed value, in current
    names: the section's class is the recipe's."""
    section, _, name = key.partition(".init_args.")
    spec = recipe.get(section)
    if not name or not isinstance(spec, dict):
        return key, value
    ((name, value),) = current_init_args(spec.get("class_path"), {name: value}).items()
    return f"{section}.init_args.{name}", value


def _defaults(class_path: str, kind: str) -> dict[str, Any]:
    """The class's argument defaults, and each field of its blocks (zoo.hparams.Block) as `block.field`."""
    cls = resolve_class(class_path, kind)
    signature = inspect.signature(cls)
    return {**{k: p.default for k, p in signature.parameters.items() if p.default is not inspect.Parameter.empty},
            **block_defaults(cls)}


def _fields(init_args: dict, blocks: dict) -> dict[str, Any]:
    """`init_args` with each block (zoo.hparams.Block) given as its fields, `block.field` (a field
    a recipe leaves out of a block is the block's default, as one it leaves out of init_args)."""
    out: dict[str, Any] = {}
    for key, value in init_args.items():
        if key in blocks and isinstance(value, dict):
            out.update({f"{key}.{field}": inner for field, inner in value.items()})
        else:
            out[key] = value
    return out


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-6)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def recipe_mismatches(config: dict, recipe: dict) -> list[str]:
    """`model.init_args.lr: weights 0.003, recipe 0.002`, ... for every hyperparameter (a missing one
    counts as its default) in which a model's zoo config differs from the recipe's."""
    problems, config, recipe = [], current_config(config), current_recipe(recipe)
    for section, kind in (("model", "model"), ("data", "data")):
        spec = recipe.get(section) or {}
        embedded = config if section == "model" else (config.get("data") or {})
        if spec.get("class_path") != embedded.get("class_path"):
            problems.append(f"{section}.class_path: weights {embedded.get('class_path')}, recipe {spec.get('class_path')}")
            continue
        defaults = _defaults(spec["class_path"], kind)
        # names the data fills in when training starts: a release trained before they were filled
        # in (a baseline's class names) or with its own (a captioner's vocabulary) is its recipe's
        filled = {"class_names", *getattr(getattr(resolve_class(spec["class_path"], kind), "card", None),
                                          "filled_by_data", {})}
        blocks = block_types(resolve_class(spec["class_path"], kind))
        ours, theirs = (_fields(args, blocks) for args in (embedded.get("init_args") or {}, spec.get("init_args") or {}))
        for key in sorted(set(ours) | set(theirs)):
            if key.startswith("_") or key in filled:
                continue
            want, got = theirs.get(key, defaults.get(key)), ours.get(key, defaults.get(key))
            if key == "backbone" and isinstance(want, dict) and isinstance(got, dict):
                problems += _backbone_mismatches(got, want, f"{section}.init_args.backbone")
            elif not _same(got, want):
                problems.append(f"{section}.init_args.{key}: weights {got!r}, recipe {want!r}")
    return problems


# a release records the resolved backbone with no pretrained source (its weights are in the file)
SCRUBBED_BACKBONE_FIELDS = {"pretrained", "pretrained_file"}


def _backbone_mismatches(weights: dict, recipe: dict, where: str) -> list[str]:
    """Fields the recipe's backbone block gives that the weights' resolved backbone contradicts.
    Fields the recipe leaves out were filled in at build time (from a pretrained zoo weight or the
    backbone's defaults), so only given fields are compared."""
    return [f"{where}.{key}: weights {weights.get(key)!r}, recipe {value!r}"
            for key, value in sorted(recipe.items())
            if key not in SCRUBBED_BACKBONE_FIELDS and not _same(weights.get(key), value)]


def override_problems(train_args: list[str], recipe: dict) -> list[str]:
    """Command-line arguments a results run gave train.py beyond the recipe. Only `--model.init_args.K V`
    or `--data.init_args.K V` that repeat the recipe's own value (or the class default it leaves
    in place) are harmless (runs from before a recipe adopted the value); anything else means the
    weights are not the recipe's."""
    problems, args, recipe = [], list(train_args or []), current_recipe(recipe)
    pairs = list(zip(args[0::2], args[1::2])) if len(args) % 2 == 0 else [(a, None) for a in args]
    for flag, value in pairs:
        if value is None:
            problems.append(f"trained with {flag} {value}, which the recipe does not say")
            continue
        key, given = current_arg(flag.lstrip("-"), yaml.safe_load(value), recipe)
        section, _, name = key.partition(".init_args.")
        spec = (recipe.get(section) or {}) if section in ("model", "data") and name else {}
        default = _defaults(spec["class_path"], section).get(name, object()) if spec.get("class_path") else object()
        given_args = _fields(spec.get("init_args") or {}, block_types(resolve_class(spec["class_path"], section))) \
            if spec.get("class_path") else {}
        current = given_args.get(name, default)  # what the recipe says, or leaves to the class
        if not _same(given, current):
            problems.append(f"trained with {flag} {value}, which the recipe does not say")
    return problems


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in (tree or {}).items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _effective_blocks(recipe: dict) -> dict:
    """The recipe with its model's backbone block as the backbone it builds: every argument of
    its kind, the block's value or the kind's default (a block that leaves out a default, or
    an old recipe's block written out in full by zoo.hparams, is the same backbone)."""
    model = recipe.get("model") or {}
    block = (model.get("init_args") or {}).get("backbone")
    if not isinstance(block, dict):
        return recipe
    from zoo.backbones import BACKBONES

    kind = BACKBONES.get(block.get("kind", "stem"))
    defaults = {k: p.default for k, p in inspect.signature(kind).parameters.items()
                if p.default is not inspect.Parameter.empty} if kind else {}
    effective = {**{k: list(v) if isinstance(v, tuple) else v for k, v in defaults.items()}, **block}
    return {**recipe, "model": {**model, "init_args": {**model["init_args"], "backbone": effective}}}


def recipe_at(recipe: str, commit: str | None) -> dict | None:
    """The recipe file as it was at `commit` (None without git, a commit, or the file then)."""
    import subprocess

    if not commit or not (REPO_ROOT / ".git").exists():
        return None
    shown = subprocess.run(["git", "show", f"{commit.removesuffix('-dirty')}:{recipe}"], cwd=REPO_ROOT,
                           capture_output=True, text=True)
    return (yaml.safe_load(shown.stdout) or {}) if shown.returncode == 0 else None


def recipe_drift(recipe: str, commit: str | None, train_args: list[str] | None = None) -> list[str]:
    """How the committed recipe differs from the one that trained the weights (the file at the
    results' git commit, with the run's command-line arguments applied): trainer settings such as
    max_epochs are not in a model's config, so only this catches a recipe edited after training.
    Keys the old recipe lacks are fine when the new value is the class default. Without git or a
    commit there is nothing to compare (the wheel, a record without provenance)."""
    if not commit or not (REPO_ROOT / ".git").exists():
        return []
    then = recipe_at(recipe, commit)
    if then is None:
        return [f"recipe: {recipe} did not exist at the training commit {commit[:12]}"]
    then = current_recipe(then)
    old, new = _flatten(_effective_blocks(then)), _flatten(_effective_blocks(current_recipe(load_recipe(recipe))))
    args = list(train_args or [])
    for flag, value in zip(args[0::2], args[1::2]):
        key, parsed = current_arg(flag.lstrip("-"), yaml.safe_load(value), then)
        old[key] = parsed
    problems = []
    current = load_recipe(recipe)
    for key in sorted(set(old) | set(new)):
        if _same(old.get(key), new.get(key)):
            continue
        section, _, name = key.partition(".init_args.")
        spec = (current.get(section) or {}) if name else {}
        if spec.get("class_path") and (key not in old or key not in new):
            # a setting one version leaves out trains with the class default: compare with that
            default = _defaults(spec["class_path"], section).get(name, object())
            if _same(old.get(key, default), new.get(key, default)):
                continue
        problems.append(f"{key}: {old.get(key)!r} when trained, {new.get(key)!r} in the recipe now")
    return problems


# ----------------------------------------------------------------------------- writing a release
def describe(model, name: str, recipe: str, seed: int, results_file: str, sha256: str) -> dict:
    """The manifest entry of `model`, trained by `recipe` with `seed`; its metrics come from the
    per-seed results JSON `results_file` (written by scripts/results_run.py)."""
    from zoo.registry import release_meta

    results = json.loads((REPO_ROOT / results_file).read_text())
    config = model.zoo_config()
    family = config["family"]
    data = config.get("data") or {}
    variant = (data.get("init_args") or {}).get("variant", "")
    metadata = {
        "task": family,
        "dataset": f"{data.get('class_path', '?').rsplit('.', 1)[-1]} {variant}".strip(),
        "recipe": str(recipe),
        "seed": int(seed),
        "command": f"python train.py fit --config {recipe} --seed_everything {seed}",
        "remake": f"python scripts/release.py --remake {name}",
        "results_file": str(results_file),
        "metrics": results.get("metrics", {}),
        "device": (results.get("device") or {}).get("device"),
        "trained_at": results.get("git_commit"),
    }
    return {"file": f"{name}.safetensors", "sha256": sha256, "config": config,
            "metadata": release_meta(model, metadata)}


# ----------------------------------------------------------------------------- checking a release
def check_entry(name: str, entry: dict) -> list[str]:
    """Every disagreement between a manifest entry and the repository, one line each, naming the
    entry and the field."""
    problems: list[str] = []
    meta = entry.get("metadata") or {}
    recipe = meta.get("recipe")
    if not recipe or not (REPO_ROOT / recipe).is_file():
        return [f"{name}: recipe: {recipe!r} is not a committed config"]
    if meta.get("command") != f"python train.py fit --config {recipe} --seed_everything {meta.get('seed')}":
        problems.append(f"{name}: command: {meta.get('command')!r} is not the plain recipe command")
    problems += [f"{name}: {p}" for p in recipe_mismatches(entry.get("config") or {}, load_recipe(recipe))]
    path = hub.weights_dir() / entry.get("file", "")
    if not path.is_file():
        problems.append(f"{name}: file: {path} is missing")
    elif hub.sha256_file(path) != entry.get("sha256"):
        problems.append(f"{name}: sha256: the manifest says {str(entry.get('sha256'))[:12]}…, "
                        f"{path.name} is {hub.sha256_file(path)[:12]}…")
    else:
        _, file_config = hub.load_weights(path)  # both in current names: the file keeps the names it was written with
        if not _same(file_config, current_config(entry.get("config"))):
            problems.append(f"{name}: config: the file's embedded config differs from the manifest's")
    results_file = meta.get("results_file")
    if not results_file or not (REPO_ROOT / results_file).is_file():
        problems.append(f"{name}: results_file: {results_file!r} does not exist")
    else:
        results = json.loads((REPO_ROOT / results_file).read_text())
        if results.get("seed") != meta.get("seed"):
            problems.append(f"{name}: seed: manifest {meta.get('seed')}, results {results.get('seed')}")
        problems += [f"{name}: {p}" for p in override_problems(results.get("train_args") or [], load_recipe(recipe))]
        problems += [f"{name}: {p}" for p in recipe_drift(recipe, results.get("git_commit"),
                                                            results.get("train_args"))]
        for key, value in sorted((meta.get("metrics") or {}).items()):
            if not _same(value, (results.get("metrics") or {}).get(key)):
                problems.append(f"{name}: metrics.{key}: manifest {value}, {results_file} "
                                f"{(results.get('metrics') or {}).get(key)}")
        if not meta.get("metrics"):
            problems.append(f"{name}: metrics: none recorded")
    return problems


# ----------------------------------------------------------------------------- golden outputs
def golden_input(model) -> torch.Tensor:
    """A fixed input of the model's shape: seeded noise in [0, 1] ([GOLDEN_BATCH, C, H, W])."""
    from zoo.preprocess import for_model

    spec = for_model(model)
    return torch.rand(GOLDEN_BATCH, spec.in_chans, *spec.size, generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def golden_output(model) -> dict[str, Any]:
    """What the release answers on `golden_input`: logits (classifiers), the greedy caption and its
    attention maps (captioners), or a seeded sample (DRAW generators); rounded to 1e-5."""
    model = model.eval()
    kind = model.card.output

    def values(t: torch.Tensor) -> list:
        return [round(float(v), 5) for v in t.detach().float().flatten()]

    if kind == "sample":
        sample = model.sample(GOLDEN_BATCH, generator=torch.Generator().manual_seed(0))["images"]
        return {"kind": "sample", "shape": list(sample.shape), "values": values(sample)}
    images = golden_input(model)
    if kind == "caption":
        results = model.caption(images, beam_size=1)
        return {"kind": "caption", "words": [r["words"] for r in results],
                "alpha": [values(r["alpha"]) for r in results]}
    logits = model(images)
    if isinstance(logits, (tuple, list)):  # several heads (the backbone pretraining's item and colour maps)
        logits = [t for t in logits if isinstance(t, torch.Tensor)]
        return {"kind": "logits", "shape": [list(t.shape) for t in logits],
                "values": [v for t in logits for v in values(t)]}
    return {"kind": "logits", "shape": list(logits.shape), "values": values(logits)}


def golden_mismatch(expected: dict, actual: dict, atol: float = 1e-4) -> str | None:
    """Where `actual` departs from the stored output, in words, or None."""
    if expected.get("kind") != actual.get("kind"):
        return f"kind {actual.get('kind')} vs stored {expected.get('kind')}"
    if "words" in expected and expected["words"] != actual["words"]:
        return f"caption {actual['words']} vs stored {expected['words']}"
    for key in ("values", "alpha"):
        if key not in expected:
            continue
        a = torch.tensor(_flat(actual[key]))
        e = torch.tensor(_flat(expected[key]))
        if a.shape != e.shape:
            return f"{key}: {tuple(a.shape)} values vs stored {tuple(e.shape)}"
        worst = (a - e).abs().max().item() if a.numel() else 0.0
        if worst > atol:
            return f"{key} differ by up to {worst:.3g} (tolerance {atol:g})"
    return None


def _flat(values) -> list[float]:
    return [v for row in values for v in row] if values and isinstance(values[0], list) else list(values)
