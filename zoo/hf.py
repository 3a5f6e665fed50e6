"""Releases as Hugging Face hub repositories: `zoo card NAME --out DIR` writes one, and
`zoo.create_model("hf-hub:ORG/NAME")`, `zoo.load_checkpoint(DIR)` and every command's
`--checkpoint hf-hub:ORG/NAME` (or a local folder) load one.

A card is three files, the hub's layout for a model:
- `model.safetensors`: the release's weights file byte for byte (its zoo config in its metadata);
- `config.json`: what the model is, timm-style (`architecture`, `num_classes`, `label_names`,
  `pretrained_cfg` with the input facts) plus the whole zoo config and the sha256 and size of
  `model.safetensors`;
- `README.md`: the model card, with YAML front matter and a `model-index` block of its results.

Loading is as safe as loading a release: the class `config.json` names is checked against the
allow-list (zoo.classes) before the weights are even downloaded, `model.safetensors` must have the
sha256 that config.json records (and the user's `--sha256`, if given), and its embedded config must
be the one config.json shows. Downloads go through `huggingface_hub` into its cache
($HF_HOME; `HF_ENDPOINT` picks the server, `HF_HUB_OFFLINE=1` uses the cache alone); a repository
that is refused leaves nothing of itself in the cache.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from zoo.errors import UserError
from zoo.limits import check_tree, shorten

PREFIX = "hf-hub:"
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
README = "README.md"
CARD_FILES = (README, CONFIG, WEIGHTS)
LIBRARY = "attention-zoo"
CARD_VERSION = 1
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")
#: the hub's pipeline tag of each kind of output (ZooModule.output_kind)
PIPELINE_TAGS = {"logits": "image-classification", "caption": "image-to-text",
                 "sample": "unconditional-image-generation"}


def is_hub_id(location) -> bool:
    return isinstance(location, str) and location.startswith(PREFIX)


def is_card(location) -> bool:
    """An `hf-hub:ORG/NAME` repository, or a local folder in the hub layout."""
    if is_hub_id(location):
        return True
    try:
        return Path(location).is_dir() and (Path(location) / CONFIG).is_file()
    except (TypeError, OSError):
        return False


# ----------------------------------------------------------------------------- loading
def fetch_card(location, pin: str | None = None) -> Path:
    """The verified local `model.safetensors` of a card: downloaded from the hub for
    `hf-hub:ORG/NAME[@REVISION]`, else in the local folder `location`; `pin`: a sha256 (prefix,
    lowercase hex) it must also match. One-line UserErrors for a refused class, a missing file, a
    sha256 mismatch or an unreachable hub."""
    if is_hub_id(location):
        repo_id, _, revision = location[len(PREFIX):].partition("@")
        if not REPO_ID.fullmatch(repo_id):
            raise UserError(f"{shorten(location)}: give a hub repository as hf-hub:ORG/NAME")
        fetched = []
        try:
            config_path = _download(location, repo_id, CONFIG, revision or None, fetched)
            config = read_config(config_path, location)
            weights = _download(location, repo_id, WEIGHTS, revision or None, fetched)
            _verify(weights, config, pin, location)
        except UserError:
            for path in fetched:  # a refused repository leaves nothing in the cache
                _evict(path)
            raise
        return weights
    folder = Path(location)
    config = read_config(folder / CONFIG, str(folder))
    weights = folder / WEIGHTS
    if not weights.is_file():
        raise UserError(f"{folder}: no {WEIGHTS} beside its {CONFIG}")
    _verify(weights, config, pin, str(folder))
    return weights


def read_config(path: Path, source: str) -> dict:
    """A card's config.json, checked: a zoo card whose model (and data) classes are the zoo's own."""
    from zoo.classes import check_allowed
    from zoo.hub import MAX_CONFIG_BYTES

    if not path.is_file():
        raise UserError(f"{source}: no {CONFIG}")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise UserError(f"{source}: refused, its {CONFIG} is more than {MAX_CONFIG_BYTES:,} bytes")
    try:
        config = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise UserError(f"{source}: its {CONFIG} is not readable JSON ({shorten(exc, 80)})") from None
    check_tree(config, f"{source}: its {CONFIG}")
    zoo_config = config.get("zoo_config") if isinstance(config, dict) else None
    if not isinstance(zoo_config, dict) or config.get("library_name") != LIBRARY:
        raise UserError(f"{source}: its {CONFIG} is not an {LIBRARY} card (no zoo_config)")
    try:  # before anything else is downloaded or imported
        check_allowed(zoo_config.get("class_path"), "model")
        if isinstance(zoo_config.get("data"), dict):
            check_allowed(zoo_config["data"].get("class_path"), "data")
    except UserError as exc:
        raise UserError(f"{source}: {exc}") from None
    files = config.get("files")
    pinned = files.get(WEIGHTS) if isinstance(files, dict) else None
    digest = pinned.get("sha256") if isinstance(pinned, dict) else None
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise UserError(f"{source}: its {CONFIG} records no sha256 of {WEIGHTS}; refusing unverifiable weights")
    return config


def _verify(weights: Path, config: dict, pin: str | None, source: str) -> None:
    from zoo.hparams import current_config
    from zoo.hub import CONFIG_KEY, sha256_file

    digest = sha256_file(weights)
    expected = config["files"][WEIGHTS]["sha256"]
    if digest != expected:
        raise UserError(f"{source}: {WEIGHTS} fails its sha256 check (config.json says {expected[:12]}…, "
                        f"the file is {digest[:12]}…); refusing it")
    if pin and not digest.startswith(pin):
        raise UserError(f"{source}: {WEIGHTS} is not the pinned file (--sha256 {pin[:12]}…, the file is {digest[:12]}…)")
    embedded = safetensors_metadata(weights, source).get(CONFIG_KEY)
    try:
        embedded = json.loads(embedded) if embedded else None
    except ValueError:
        embedded = None
    if not isinstance(embedded, dict) or current_config(embedded) != current_config(config["zoo_config"]):
        raise UserError(f"{source}: {CONFIG} does not describe the model in {WEIGHTS} (their zoo configs differ)")


def safetensors_metadata(path: Path, source: str) -> dict:
    """The `__metadata__` of a safetensors file's header, read without torch."""
    from zoo.hub import MAX_CONFIG_BYTES

    with open(path, "rb") as f:
        head = f.read(8)
        size = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 2 <= size <= 4 * MAX_CONFIG_BYTES:
            raise UserError(f"{source}: {WEIGHTS} is not a safetensors file")
        try:
            header = json.loads(f.read(size))
        except (ValueError, UnicodeDecodeError):
            raise UserError(f"{source}: {WEIGHTS} has an unreadable header") from None
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    return metadata if isinstance(metadata, dict) else {}


def _download(location: str, repo_id: str, filename: str, revision: str | None, fetched: list) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    # the hub's settings as they are now, not as they were when huggingface_hub was imported (timm
    # imports it early): the server, the cache, offline mode
    home = os.environ.get("HF_HOME")
    cache = os.environ.get("HF_HUB_CACHE") or (os.path.join(home, "hub") if home else None)
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    try:
        path = Path(hf_hub_download(repo_id, filename, revision=revision, cache_dir=cache, local_files_only=offline,
                                    endpoint=os.environ.get("HF_ENDPOINT")))
    except LocalEntryNotFoundError:
        raise UserError(f"{location}: cannot reach the hub for {filename}, and it is not in the cache "
                        "(offline? HF_ENDPOINT points elsewhere?)") from None
    except EntryNotFoundError:
        raise UserError(f"{location}: the repository has no {filename}") from None
    except RevisionNotFoundError:
        raise UserError(f"{location}: no such revision") from None
    except RepositoryNotFoundError:
        raise UserError(f"{location}: no such repository on the hub (or it is private)") from None
    except (HfHubHTTPError, OSError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{location}: could not download {filename} ({shorten(reason, 120)})") from None
    fetched.append(path)
    return path


def _evict(path: Path) -> None:
    """Remove a file huggingface_hub cached: its snapshot link and the blob it points at."""
    blob = path.resolve()
    path.unlink(missing_ok=True)
    if blob != path:
        blob.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- writing
def card_config(record: dict, zoo_config: dict, weights: Path) -> dict:
    """config.json of a release's card (`record`: its `zoo info` record)."""
    from zoo.hub import sha256_file

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
        "files": {WEIGHTS: {"sha256": sha256_file(weights), "size": weights.stat().st_size}},
        "zoo_config": zoo_config,
    }


def _yaml(value) -> str:
    import yaml

    return yaml.safe_dump(value, sort_keys=False, allow_unicode=True, width=120)


def _dataset_type(zoo_config: dict) -> str:
    """The data module's name as a dataset id: FashionMNISTDataModule -> fashion_mnist."""
    name = str((zoo_config.get("data") or {}).get("class_path", "unknown")).rsplit(".", 1)[-1].removesuffix("DataModule")
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def card_readme(record: dict, config: dict, repo_id: str) -> str:
    """README.md: YAML front matter (library, tags, pipeline, model-index) and the card's text."""
    zoo_config = config["zoo_config"]
    from zoo.info import attention_line, render, summary_metrics

    metrics = [{"type": key.split("/", 1)[1], "value": value["value"], "name": key}
               for key, value in summary_metrics(record.get("metrics")).items()]
    attention = record.get("attention") or {}
    metrics += [{"type": f"attention_{key}", "value": attention[key], "name": f"attention {key.replace('_', ' ')}"}
                for key in ("pointing", "pointing_centre", "deletion_gap", "deletion_gap_centre")
                if isinstance(attention.get(key), (int, float))]
    pipeline = PIPELINE_TAGS.get(record.get("output_kind"), "image-classification")
    front = {
        "library_name": LIBRARY, "license": "mit", "pipeline_tag": pipeline,
        "tags": [LIBRARY, "visual-attention", record["family"]],
        "model-index": [{"name": record["name"], "results": [{
            "task": {"type": pipeline},
            "dataset": {"name": record.get("dataset") or "?", "type": _dataset_type(zoo_config), "split": "test"},
            "metrics": metrics}]}],
    }
    lines = [
        "---", _yaml(front).rstrip(), "---", "",
        f"# {record['name']}", "",
        record.get("description") or "", "",
        f"A release of {LIBRARY}: `{WEIGHTS}` holds the weights (sha256 `{config['files'][WEIGHTS]['sha256']}`, "
        f"the sha256 that `{CONFIG}` records and the loader checks), `{CONFIG}` the model's config.", "",
        "## Use", "",
        "```python", "import zoo", "", f'model = zoo.create_model("{PREFIX}{repo_id}")', "```", "",
        f"or from the command line: `zoo attend IMAGE --checkpoint {PREFIX}{repo_id}`.", "",
        "## Facts", "", "```", render(record), "```", "",
    ]
    if attention:
        lines += ["## Attention", "", attention_line(attention), ""]
    lines += ["## Training", "", f"`{record.get('recipe')}` (seed {record.get('seed')}) trains these weights; "
              f"`{record.get('remake')}` re-makes the release.", ""]
    return "\n".join(lines)


def earlier_card_problem(folder: Path) -> str | None:
    """None when `folder` is an earlier card: exactly a card's files (no links), with a config.json
    that reads as one; otherwise why not, in words."""
    names = sorted(p.name for p in folder.iterdir())
    if names != sorted(CARD_FILES) or any((folder / n).is_symlink() for n in names):
        return "holds other files (not an earlier model card)"
    try:
        read_config(folder / CONFIG, str(folder))
    except UserError:
        return "holds other files (its config.json is not a model card's)"
    return None


def check_card_target(out_dir: Path) -> None:
    """The card's folder is missing, empty, or an earlier card: anything else is someone's folder,
    refused before any work."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"--out {out_dir}: exists and is not a directory")
    problem = earlier_card_problem(out_dir) if out_dir.is_dir() and any(out_dir.iterdir()) else None
    if problem:
        raise UserError(f"--out {out_dir}: {problem}; give a new or empty folder")


def write_card(name: str, out_dir, repo_id: str | None = None) -> list[Path]:
    """Write release `name` as a hub repository in `out_dir` (README.md, config.json,
    model.safetensors), all at once: a staging folder beside it is swapped in at the end."""
    from zoo import hub
    from zoo.info import describe
    from zoo.io import atomic_write_bytes, sigterm_raises, swap_in_folder, writing
    from zoo.registry import get_entry, list_models

    entry = get_entry(name)
    if entry.weights is None:
        raise UserError(f"'{name}' has no released weights to put in a card "
                        f"(released: {', '.join(list_models(pretrained=True)) or 'none'})")
    out_dir = Path(out_dir)
    check_card_target(out_dir)
    repo_id = repo_id or f"attention-zoo/{name}"
    if not REPO_ID.fullmatch(repo_id):
        raise UserError(f"--repo-id {shorten(repo_id)}: give it as ORG/NAME")
    record = describe(name)
    source = hub.fetch_release(name)  # sha256-checked against the manifest
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with sigterm_raises(), writing(out_dir) as staging:
        staging.mkdir()
        shutil.copyfile(source, staging / WEIGHTS)
        config = card_config(record, entry.weights["config"], staging / WEIGHTS)
        if config["files"][WEIGHTS]["sha256"] != entry.weights["sha256"]:
            raise UserError(f"{source}: changed while it was copied; try again")
        atomic_write_bytes(staging / CONFIG, (json.dumps(config, indent=2) + "\n").encode())
        atomic_write_bytes(staging / README, card_readme(record, config, repo_id).encode())
        check_card_target(out_dir)  # someone wrote there while we worked?
        swap_in_folder(staging, out_dir, earlier_card_problem)
    return [out_dir / n for n in CARD_FILES]
