"""`zoo card NAME|--checkpoint PATH --out DIR [--repo-id ORG/NAME]`: a release, or a model of your own
(a checkpoint `zoo train fit` wrote), as a Hugging Face hub repository, ready for `huggingface-cli
upload ORG/NAME DIR`; `zoo.create_model("hf-hub:ORG/NAME")` (or the folder itself:
`zoo.create_model("./DIR")`) and `--checkpoint hf-hub:ORG/NAME` load one back
(zoo.weights.hub.fetch_card). Its three files: `model.safetensors` (a release's, byte for byte; a
checkpoint's weights and zoo config as a release writes them), `config.json` (timm-style
`architecture`, `label_names`, `pretrained_cfg`, the zoo config, the files' sha256) and `README.md`
(front matter with a `model-index` of the test metrics; a checkpoint's card has none: not measured).
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
from pathlib import Path

from zoo.commands.common import add_checkpoint_arguments, resolve_model
from zoo.guards.errors import UserError, shorten, sigterm_stops
from zoo.guards.writes import (OVERWRITE_HINT, atomic_write_bytes, check_writable, output_folder, swap_in_folder,
                               writing)
from zoo.weights.hub import (CARD_CONFIG, CARD_WEIGHTS, HUB_PREFIX, HUB_REPO_ID, LIBRARY, fetch_release,
                             read_card_config, save_release, sha256_file)

README = "README.md"
CARD_FILES = (README, CARD_CONFIG, CARD_WEIGHTS)
CARD_VERSION = 1
#: the hub's pipeline tag of each kind of output (a family card's `output`)
PIPELINE_TAGS = {"logits": "image-classification", "caption": "image-to-text",
                 "sample": "unconditional-image-generation"}


def card_config(record: dict, zoo_config: dict, weights: Path) -> dict:
    """config.json of a release's card (`record`: its `zoo info` record)."""
    return {
        "library_name": LIBRARY, "zoo_card": CARD_VERSION, "name": record["name"],
        "architecture": zoo_config["class_path"], "family": record["family"],
        "num_classes": record.get("num_classes"), "label_names": record.get("class_names"),
        "vocab_size": record.get("vocab_size"),
        "pretrained_cfg": {key: record.get(key) for key in (
            "input_size", "value_range", "mean", "std", "normalisation", "resize", "resize_size", "interpolation",
            "alpha")},
        "num_params": record.get("num_params"), "gmacs": record.get("gmacs"), "inference": record.get("inference"),
        "recipe": record.get("recipe"), "seed": record.get("seed"),
        "files": {CARD_WEIGHTS: {"sha256": sha256_file(weights), "size": weights.stat().st_size}},
        "zoo_config": zoo_config,
    }


#: a logged metric -> (the hub's metric type, its name on the card); `acc_<how>` and `<what>_acc` are
#: accuracies too (hub_metric). Types are the hub's (Hugging Face `evaluate`) ids where one exists.
HUB_METRICS = {
    "acc": ("accuracy", "Top-1 accuracy"), "error_pct": ("error_rate", "Top-1 error (%)"),
    "loss": ("loss", "Loss"), "nelbo": ("nelbo", "Negative ELBO (nats)"),
    "kl": ("kl_divergence", "KL divergence (nats)"), "rec": ("reconstruction_nll", "Reconstruction NLL (nats)"),
    "iwae_k1000": ("nll", "Negative log-likelihood (IWAE, 1000 samples; nats)"),
    "CIDEr": ("cider", "CIDEr"), "METEOR": ("meteor", "METEOR"), "ROUGE_L": ("rouge", "ROUGE-L"),
    **{f"Bleu_{n}": ("bleu", f"BLEU-{n}") for n in range(1, 5)},
}


def hub_metric(key: str) -> dict:
    """{"type", "name"} of the logged metric `key` ("acc", "acc_mc10", "item_acc") on a hub card."""
    if key in HUB_METRICS:
        kind, name = HUB_METRICS[key]
    elif key.startswith("acc_") or key.endswith("_acc"):
        how = key.removeprefix("acc_") if key.startswith("acc_") else key.removesuffix("_acc")
        kind, name = "accuracy", f"Top-1 accuracy ({how.replace('_', ' ')})"
    else:
        kind, name = key.lower(), key.replace("_", " ")
    return {"type": kind, "name": name}


def hub_dataset(data: dict | None) -> tuple[str, str]:
    """(type, name) of the data set a card's model was evaluated on ("fashion_mnist", "Fashion-MNIST
    (cluttered 60x60)"), from its data config (the data module's `dataset_for`)."""
    from zoo.classes import is_allowed, resolve_class

    data = data if isinstance(data, dict) else {}
    init_args = data.get("init_args") if isinstance(data.get("init_args"), dict) else {}
    if is_allowed(data.get("class_path"), "data"):
        cls = resolve_class(data["class_path"], "data")
        return cls.dataset_for(**cls.arguments(**init_args))
    # not one of ours (read_card_config refuses such a card): its class's name, as an id
    data_class = str(data.get("class_path", "unknown")).rsplit(".", 1)[-1]
    dataset = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", data_class.removesuffix("DataModule")).lower()
    return dataset, dataset


def card_readme(record: dict, config: dict, repo_id: str) -> str:
    """README.md: YAML front matter (library, tags, pipeline, model-index) and the card's text, the
    manifest's text kept inert (zoo.guards.text); a metric that is not a number stays out of the
    model-index and is shown as text in the Facts."""
    import yaml

    from zoo.commands.info import attention_line, render, summary_metrics
    from zoo.guards.text import code_fence, code_span, is_number, markdown_text

    def finite(value) -> bool:
        return is_number(value) and math.isfinite(value)

    metrics = [{**hub_metric(key.split("/", 1)[1]), "value": value["value"]}
               for key, value in summary_metrics(record.get("metrics")).items() if finite(value.get("value"))]
    attention = record.get("attention") if isinstance(record.get("attention"), dict) else {}
    metrics += [{"type": f"attention_{key}", "name": f"attention {key.replace('_', ' ')}", "value": attention[key]}
                for key in ("pointing", "pointing_centre", "deletion_gap", "deletion_gap_centre")
                if finite(attention.get(key))]
    pipeline = PIPELINE_TAGS.get(record.get("output_kind"), "image-classification")
    dataset, dataset_name = hub_dataset(config["zoo_config"].get("data"))
    front = {"library_name": LIBRARY, "license": "mit", "pipeline_tag": pipeline,
             "tags": [LIBRARY, "visual-attention", record["family"]]}
    if metrics:  # the hub's results block holds measured numbers only (a checkpoint's card has none)
        front["model-index"] = [{"name": record["name"], "results": [{
            "task": {"type": pipeline},
            "dataset": {"name": dataset_name, "type": dataset, "split": "test"},
            "metrics": metrics}]}]
    checkpoint = record.get("checkpoint")
    what = (f"A model trained with {LIBRARY} (the weights of the checkpoint {code_span(checkpoint)})"
            if checkpoint else f"A release of {LIBRARY}")
    lines = [
        # allow_unicode=False: YAML escapes every control and non-ASCII character ("\e", "\u202E")
        "---", yaml.safe_dump(front, sort_keys=False, allow_unicode=False, width=120).rstrip(), "---", "",
        f"# {markdown_text(record['name'])}", "",
        markdown_text(record.get("description") or ""), "",
        f"{what}: `{CARD_WEIGHTS}` holds the weights (sha256 `{config['files'][CARD_WEIGHTS]['sha256']}`, "
        f"the sha256 that `{CARD_CONFIG}` records and the loader checks), `{CARD_CONFIG}` the model's config.", "",
        "## Use", "",
        "```python", "import zoo", "", f'model = zoo.create_model("{HUB_PREFIX}{repo_id}")', "```", "",
        f"or from the command line: `zoo attend IMAGE --checkpoint {HUB_PREFIX}{repo_id}`.", "",
        "## Facts", "", *code_fence(render(record)), "",
    ]
    if attention:
        lines += ["## Attention", "", markdown_text(attention_line(attention)), ""]
    if checkpoint:
        lines += ["## Metrics", "", f"Not measured: the card was made from the checkpoint "
                  f"{code_span(checkpoint)} alone, which records no test metrics (`zoo eval` measures them).", ""]
    else:
        lines += ["## Training", "", f"{code_span(record.get('recipe'))} (seed {markdown_text(record.get('seed'))}) "
                  f"trains these weights; {code_span(record.get('remake'))} re-makes the release.", ""]
    return "\n".join(lines)


def earlier_card_problem(folder: Path) -> str | None:
    """None when `folder` is an intact earlier card (its files only, each with its recorded sha256), else why not."""
    names = sorted(p.name for p in folder.iterdir())
    if names != sorted(CARD_FILES) or any((folder / n).is_symlink() for n in names):
        return "holds other files (not an earlier model card)"
    try:
        config = read_card_config(folder / CARD_CONFIG, str(folder))
    except UserError:
        return "holds other files (its config.json is not a model card's)"
    for name, recorded in config["files"].items():
        if name in CARD_FILES and isinstance(recorded, dict) and sha256_file(folder / name) != recorded.get("sha256"):
            return (f"{name} is not the file the earlier card wrote (its sha256 is not the one {CARD_CONFIG} records: "
                    "edited or replaced since)")
    return None


def check_card_target(given, overwrite: bool = True) -> Path:
    """The card's folder (a symlink followed), before any work: missing, empty, or an intact earlier
    card, replaced only with `overwrite`; anything else is refused."""
    out = check_writable(output_folder(given), "--out", directory=True)
    earlier = out.is_dir() and any(out.iterdir())
    problem = earlier_card_problem(out) if earlier else None
    if problem:
        raise UserError(f"--out {given}: {problem}; give a new or empty folder")
    if earlier and not overwrite:
        raise UserError(f"--out {given}: holds an earlier card; {OVERWRITE_HINT}")
    return out


def card_repo_id(repo_id: str | None, name: str, where: str) -> str:
    """The hub repository the card's usage lines name: `repo_id`, else attention-zoo/`name` (`where`
    the name came from, for the message when it is no repository name)."""
    if repo_id is None and not HUB_REPO_ID.fullmatch(f"attention-zoo/{name}"):
        raise UserError(f"{where}: {shorten(name)!r} is no hub repository name; give --repo-id ORG/NAME")
    repo_id = repo_id or f"attention-zoo/{name}"
    if not HUB_REPO_ID.fullmatch(repo_id):
        raise UserError(f"--repo-id {shorten(repo_id)}: give it as ORG/NAME")
    return repo_id


def write_card(name: str, out_dir, repo_id: str | None = None) -> list[Path]:
    """Write release `name` as a hub repository in `out_dir`, all at once (a staging folder swapped in)."""
    from zoo.commands.info import describe
    from zoo.registry import get_entry, list_models

    entry = get_entry(name)
    if entry.weights is None:
        raise UserError(f"'{name}' has no released weights to put in a card "
                        f"(released: {', '.join(list_models(pretrained=True)) or 'none'})")
    out_dir = check_card_target(out_dir)
    repo_id = card_repo_id(repo_id, name, name)
    record = describe(name)
    source = fetch_release(name)  # sha256-checked against the manifest

    def put_weights(path: Path) -> str:
        shutil.copyfile(source, path)
        return entry.weights["sha256"]

    return _write(out_dir, record, entry.weights["config"], repo_id, put_weights,
                  f"{source}: changed while it was copied; try again")


def describe_checkpoint(model, name: str, checkpoint: str) -> dict:
    """A `zoo info`-style record of a model loaded from `checkpoint` (zoo.commands.info.describe's
    fields, from the model itself): no recipe, seed or metrics, which a checkpoint does not record."""
    from zoo.commands import cost
    from zoo.guards.files import ALPHA_RULE, INTERPOLATION

    facts = cost.facts(model)
    pre = facts["preprocessing"]
    return {
        "name": name, "family": model.family, "pretrained": False, "weights": "weights of a checkpoint",
        "checkpoint": Path(checkpoint).name, "description": None, "task": model.family, "dataset": None,
        "input_size": [pre.get("in_chans"), *(pre.get("size") or [])], "value_range": [0.0, 1.0],
        "mean": pre.get("mean"), "std": pre.get("std"),
        "normalisation": "inside the model" if pre.get("mean") else "none",
        "resize": pre.get("resize"), "resize_size": pre.get("resize_size"), "interpolation": INTERPOLATION,
        "alpha": ALPHA_RULE, "num_classes": facts.get("num_classes"), "class_names": facts.get("class_names"),
        "vocab_size": facts.get("vocab_size"), "num_params": facts.get("num_params"),
        "gmacs": facts["macs"] / 1e9 if facts.get("macs") is not None else None, "steps": facts.get("steps"),
        "inference": facts.get("inference"), "output_kind": model.card.output,
        "recipe": None, "recipe_file": None, "seed": None, "metrics": {},
        **{key: facts[key] for key in ("num_params_note", "gmacs_note") if facts.get(key)},
    }


def write_checkpoint_card(model, checkpoint: str, out_dir, repo_id: str | None = None,
                          name: str | None = None) -> list[Path]:
    """Write `model` (loaded from `checkpoint`) as a hub repository in `out_dir`, its weights and zoo
    config as a release writes them (zoo.weights.hub.save_release); named `name`, else after the
    card's folder."""
    from zoo.registry import release_meta

    out_dir = check_card_target(out_dir)
    name = name or out_dir.name
    repo_id = card_repo_id(repo_id, name, f"--out {out_dir}")
    record = describe_checkpoint(model, name, checkpoint)
    zoo_config = model.zoo_config()
    meta = release_meta(model, {"task": model.family, "source": Path(checkpoint).name})
    return _write(out_dir, record, zoo_config, repo_id, lambda path: save_release(model, zoo_config, path, meta),
                  f"{checkpoint}: its weights changed while the card was written; try again")


def _write(out_dir: Path, record: dict, zoo_config: dict, repo_id: str, put_weights, changed: str) -> list[Path]:
    """The card's three files in a staging folder swapped in for `out_dir` at once; `put_weights(path)`
    writes model.safetensors and returns the sha256 it must have (else `changed` is raised)."""
    with sigterm_stops(), writing(out_dir) as staging:
        staging.mkdir()
        expected = put_weights(staging / CARD_WEIGHTS)
        config = card_config(record, zoo_config, staging / CARD_WEIGHTS)
        if config["files"][CARD_WEIGHTS]["sha256"] != expected:
            raise UserError(changed)
        readme = card_readme(record, config, repo_id).encode()
        # recorded, so that a README edited since is not replaced (earlier_card_problem)
        config["files"][README] = {"sha256": hashlib.sha256(readme).hexdigest(), "size": len(readme)}
        atomic_write_bytes(staging / CARD_CONFIG, (json.dumps(config, indent=2) + "\n").encode())
        atomic_write_bytes(staging / README, readme)
        check_card_target(out_dir)  # someone wrote there while we worked?
        swap_in_folder(staging, out_dir, earlier_card_problem)
    return [out_dir / n for n in CARD_FILES]


def add_arguments(parser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("name", nargs="?", help="a release (`zoo list --pretrained` shows them)")
    add_checkpoint_arguments(parser, source)
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="folder for the card: new, empty, or (with --overwrite) an earlier card (replaced "
                             "whole); a checkpoint's card is named after it")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier card in --out")
    parser.add_argument("--repo-id", metavar="ORG/NAME",
                        help="the hub repository the card's usage lines name (default: attention-zoo/NAME)")


def run(args) -> int:
    from types import SimpleNamespace

    from zoo.registry import get_entry

    if args.checkpoint:
        out = check_card_target(args.out, args.overwrite)  # before the model loads
        model = resolve_model(SimpleNamespace(checkpoint=args.checkpoint, sha256=args.sha256, model=None))
        paths = write_checkpoint_card(model, args.checkpoint, out, args.repo_id)
    else:
        if args.sha256:
            raise UserError("--sha256 pins a --checkpoint; a release is pinned by its manifest")
        get_entry(args.name)  # an unknown name first: did-you-mean
        out = check_card_target(args.out, args.overwrite)
        paths = write_card(args.name, out, args.repo_id)
    for path in paths:
        print(f"wrote {path}")
    return 0
