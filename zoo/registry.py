"""Model names -> recipes and released weights.

Every recipe `configs/<family>/<recipe>.yaml` with a `model:` section is the entry
`<family>_<recipe>` ("ram_fmnist_centered"), holding every hyperparameter. Released weights are
listed in `weights/MANIFEST.json` (zoo.weights.hub.manifest), whose config wins for pretrained weights.
"""
from __future__ import annotations

import difflib
import functools
import fnmatch
import inspect
import json
import logging
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from zoo.classes import ALLOWED_CLASSES, allow_class, is_allowed, resolve_class  # noqa: F401 (the public names)
from zoo.guards.budget import check_memory, check_tree, limit
from zoo.guards.errors import UserError, shorten
from zoo.hparams import current_config, current_spec
from zoo.models.memory import data_memory, evaluation_memory, model_memory, training_memory
from zoo.weights import hub

REPO_ROOT = Path(__file__).resolve().parent.parent
#: facts that take torch to know, per entry, and each class's family (scripts/model_index.py writes it)
INDEX_PATH = Path(__file__).resolve().with_name("model_index.json")
log = logging.getLogger("zoo")
_INSTALLED = Path(__file__).resolve().parent / "recipes"
#: the recipes a wheel installs as zoo/recipes, else the clone's configs/ ($ZOO_CONFIG_DIR: others)
SHIPPED_CONFIGS = _INSTALLED if _INSTALLED.is_dir() else REPO_ROOT / "configs"


@dataclass
class Entry:
    name: str
    recipe: Path | None  # the YAML the entry comes from
    model: dict  # {"class_path", "init_args"}
    data: dict | None = None  # {"class_path", "init_args"} of the recipe's datamodule
    weights: dict | None = None  # the manifest record, when weights are released
    metadata: dict = field(default_factory=dict)

    def recipe_config(self) -> dict:
        """The recipe's model config as train.py trains it (`linked`), with the data config beside it."""
        return {**(linked(self.model, self.data) if self.data else self.model), "data": self.data}


@functools.lru_cache(maxsize=None)
def _parsed(path: Path, mtime_ns: int, size: int) -> dict | str:
    """A recipe's YAML, parsed once per version of the file; the reason, as a string, when it is not one."""
    if size > hub.MAX_CONFIG_BYTES:
        return f"more than {hub.MAX_CONFIG_BYTES:,} bytes"
    try:
        recipe = yaml.safe_load(path.read_text()) or {}
        check_tree(recipe, "it")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        return "not valid YAML" + (f" at line {mark.line + 1}" if mark is not None else "")
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot read it ({getattr(exc, 'strerror', None) or exc})"
    except RecursionError:
        return "nested too deep"
    except UserError as exc:
        return str(exc).removeprefix("it: ")
    return recipe if isinstance(recipe, dict) else f"a {type(recipe).__name__}, not a mapping"


def _entries() -> dict[str, Entry]:
    entries: dict[str, Entry] = {}
    root = Path(os.environ["ZOO_CONFIG_DIR"]) if os.environ.get("ZOO_CONFIG_DIR") else SHIPPED_CONFIGS
    for path in sorted(root.glob("*/*.yaml")):
        family = path.parent.name
        if family == "base" or family.startswith("_") or path.stem.startswith("_"):
            continue
        try:
            stat = path.stat()
        except OSError:
            continue
        recipe = _parsed(path, stat.st_mtime_ns, stat.st_size)
        if isinstance(recipe, str):  # one warning per unreadable recipe and version; the others work on
            hub.warn_once(f"{path}: skipped, {recipe}")
            continue
        model = recipe.get("model")
        if not isinstance(model, dict) or not isinstance(model.get("class_path"), str):
            continue
        if not isinstance(model.get("init_args") or {}, dict) or not isinstance(recipe.get("data") or {}, dict):
            hub.warn_once(f"{path}: skipped, its model or data init_args are not mappings")
            continue
        name = f"{family}_{path.stem}"
        model = {"class_path": model["class_path"], "init_args": dict(model.get("init_args") or {})}
        recipe_file = f"configs/{family}/{path.name}"
        entries[name] = Entry(name, path, model, recipe.get("data"),
                              metadata={"recipe": f"python train.py fit --config {recipe_file}", "recipe_file": recipe_file})
    for name, record in hub.manifest().items():
        entry = entries.get(name) or Entry(name, None, record["config"], record["config"].get("data"))
        entry.weights = record
        family = {"family": record["config"]["family"]} if record["config"].get("family") else {}
        released = record.get("metadata") or {}  # a record may say "metadata": null
        # `recipe`: the command that trains the entry (a release's: with its seed); `recipe_file`: its YAML
        recipe = {"recipe": released.get("command") or entry.metadata.get("recipe"),
                  "recipe_file": released.get("recipe") or entry.metadata.get("recipe_file")}
        entry.metadata = {**entry.metadata, **family, **released, **recipe, "sha256": record.get("sha256")}
        entries[name] = entry
    return entries


@functools.lru_cache(maxsize=1)
def index() -> dict:
    """The model index ({"families": {class_path: family}, "entries": {name: facts}}), empty when absent."""
    if not INDEX_PATH.is_file():
        return {"families": {}, "entries": {}}
    return json.loads(INDEX_PATH.read_text())


def family_of(entry: Entry) -> str:
    """The entry's family: the model index's (no import), else its class's card's, else its folder."""
    if "family" not in entry.metadata:
        class_path, folder = entry.model["class_path"], entry.recipe.parent.name if entry.recipe else "?"
        entry.metadata["family"] = index()["families"].get(class_path) or (
            getattr(resolve_class(class_path), "family", folder) if is_allowed(class_path) else folder)
    return entry.metadata["family"]


def get_entry(name: str) -> Entry:
    entries = _entries()
    if name not in entries:
        close = difflib.get_close_matches(name, list(entries), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `zoo list` shows them all"
        raise UserError(f"unknown model '{name}'{hint}")
    family_of(entries[name])
    return entries[name]


def link_data(model_class: type, model_args, data_class: type, data_args, with_names: bool = True) -> None:
    """Give the model what its data decides, in `model_args` (changed in place): the image size and
    channels it serves (a model left at its default takes them, one set otherwise is refused in one
    line), and the label set as `num_classes` and, where the config names none, `class_names`.
    `with_names` false (train.py) leaves the names to `setup`: a long list in LightningCLI's config
    costs jsonargparse quadratic time (checked: 4.53)."""
    from zoo.data.base import as_size

    params = inspect.signature(model_class).parameters
    data_args = data_class.arguments(**data_args) if hasattr(data_class, "arguments") else data_args

    def given(key):
        return model_args[key] if key in model_args else params[key].default

    def take_or_refuse(key, served, data_says):
        value, default = given(key), params[key].default
        if value == default or (isinstance(default, (list, tuple)) and list(value) == list(default)):
            return served
        raise UserError(f"--model.init_args.{key} {value} disagrees with the data's images ({data_says}); "
                        f"set one of them so they agree, or leave the model's out to take the data's")

    size = data_class.image_size_for(**data_args)
    if "image_size" in params and size is not None and given("image_size") is not None \
            and as_size(given("image_size")) != size:
        key = data_class.image_size_argument or "variant"
        size = take_or_refuse("image_size", size, f"{key} {data_args.get(key)}: {size[0]}x{size[1]} px")
        model_args["image_size"] = size[0] if isinstance(given("image_size"), int) and size[0] == size[1] else list(size)
    chans = data_class.image_chans_for(**data_args)
    if "in_chans" in params and chans is not None and given("in_chans") not in (None, chans):
        model_args["in_chans"] = take_or_refuse("in_chans", chans, f"{data_class.__name__}: {chans} channel(s)")
    names = data_class.class_names_for(**data_args)
    if names and "num_classes" in params and given("num_classes") != len(names):
        model_args["num_classes"] = len(names)
    if names and with_names and "class_names" in params and given("class_names") is None:
        model_args["class_names"] = list(names)


def linked(model: dict, data: dict) -> dict:
    """A recipe's model spec in current names with what its data spec decides linked in (`link_data`)."""
    model, data = current_spec(model), current_spec(data)
    if not (is_allowed(model.get("class_path")) and is_allowed(data.get("class_path"), "data")):
        return model
    init_args = dict(model.get("init_args") or {})
    link_data(resolve_class(model["class_path"]), init_args, resolve_class(data["class_path"], "data"),
              dict(data.get("init_args") or {}))
    return {**model, "init_args": init_args}


def list_models(filter: str | list[str] = "", module: str | list[str] = "", pretrained: bool = False,
                exclude_filters: str | list[str] = "", name_matches_cfg: bool = False,
                include_tags: bool | None = None, *, pattern: str | None = None) -> list[str]:
    """Names of registered models, sorted, as timm's `list_models`: those matching any wildcard
    pattern of `filter` (a string or a list; '' or '*': all) and none of `exclude_filters`, of the
    family (families) `module`, with released weights when `pretrained`. Zoo names carry no
    `.tag` and no aliases, so `include_tags` and `name_matches_cfg` change nothing. `pattern` is
    `filter`'s older name; a bool second argument, the older `list_models(pattern, pretrained)`."""
    if isinstance(module, bool):  # list_models("ram_*", True), from before the timm signature
        module, pretrained = "", module
    del name_matches_cfg, include_tags  # accepted for timm's callers: nothing to choose between here
    return sorted(find_entries(filter if pattern is None else pattern, pretrained, exclude_filters, module))


def _patterns(given, what: str) -> list[str]:
    """A wildcard pattern or a list (tuple, set) of them, as a list; '' gives none."""
    patterns = [given] if isinstance(given, str) else list(given) if isinstance(given, (list, tuple, set)) else None
    if patterns is None or not all(isinstance(p, str) for p in patterns):
        raise UserError(f"{what}={shorten(given, 60)}: give a wildcard pattern ('vit*') or a list of them")
    return [p for p in patterns if p]


def find_entries(pattern: str | list[str] = "*", pretrained: bool = False, exclude: str | list[str] = "",
                 family: str | list[str] = "") -> dict[str, Entry]:
    """The entries `list_models` names, read in one pass."""
    include, exclude, families = (_patterns(pattern, "filter"), _patterns(exclude, "exclude_filters"),
                                  _patterns(family, "module"))
    return {n: e for n, e in _entries().items()
            if (not include or any(fnmatch.fnmatchcase(n, p) for p in include))
            and not any(fnmatch.fnmatchcase(n, p) for p in exclude)
            and (e.weights is not None or not pretrained)
            and (not families or family_of(e) in families)}


def instantiate(spec: dict, kind: str = "model", **overrides):
    """An allow-listed {class_path, init_args} built in current names, `overrides` on top, memory checked."""
    if not isinstance(spec, dict):
        raise UserError(f"refused: a {kind} config must be a mapping with class_path, got {type(spec).__name__}")
    check_tree(spec, f"the {kind} config")
    cls = resolve_class(spec.get("class_path"), kind)
    init_args = current_spec(spec).get("init_args") or {}
    if not isinstance(init_args, dict):
        raise UserError(f"{spec['class_path']}: init_args must be a mapping")
    init_args = {k: v for k, v in init_args.items() if not str(k).startswith("_")}
    # an override of a block (a backbone spec) changes the fields it gives, as a second config would
    init_args.update({k: {**init_args[k], **v} if isinstance(v, dict) and isinstance(init_args.get(k), dict) else v
                      for k, v in overrides.items()})
    check_memory(model_memory(cls, init_args) if kind == "model" else data_memory(cls, init_args),
                 f"{kind} {spec['class_path']}")
    try:
        return cls(**init_args)
    except (TypeError, ValueError) as exc:  # an argument the class does not take, or a value it refuses
        raise UserError(f"{spec['class_path']}: bad arguments ({shorten(str(exc), 200)})") from None


def check_run_memory(data, model) -> None:
    """What a run of a parsed config would allocate, checked before anything is built: the weights four
    times (gradients, two moments), the larger of a training and an evaluation step, the data's arrays."""
    def plain(init_args) -> dict:
        return init_args.as_dict() if hasattr(init_args, "as_dict") else dict(init_args or {})

    data_args = plain(data.init_args) if is_allowed(data.class_path, "data") else {}
    batch = _served(data_args.get("batch_size"), data_args.get("limit_train"))
    eval_batch = _served(data_args.get("eval_batch_size"), data_args.get("limit_eval"))
    parts = {}
    if is_allowed(model.class_path, "model"):
        cls, model_args = resolve_class(model.class_path, "model"), plain(model.init_args)
        if _is_count(batch, "batch_size") and (eval_batch is None or _is_count(eval_batch, "eval_batch_size")):
            parts.update(training_memory(cls, model_args, batch, eval_batch))
        else:  # no batch size to measure at (the data module has none, or it is refused later, in one line)
            for key, value in model_memory(cls, model_args).items():
                if key.startswith("the weights"):
                    key, value = f"{key} with gradients and optimizer state (x4)", 4 * value
                parts[key] = value
    if data_args:
        parts.update(data_memory(resolve_class(data.class_path, "data"), data_args))
    check_memory(parts, "this run")


def _is_count(value, name: str | None = None) -> bool:
    """A positive integer (within the limit of `name`: past it, the data module refuses it, naming it)."""
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= (limit(name) if name else value)


def _served(batch, limit):
    """The examples a step holds: the batch size, or the `limit_train` / `limit_eval` below it."""
    return min(batch, limit) if _is_count(batch) and _is_count(limit) else batch


def data_config(model) -> dict | None:
    """{class_path, init_args} of the data module `model` was trained with, or None."""
    return getattr(model, "_zoo_data_config", None)


def build(config: dict, **overrides):
    """A model from its config, in current names; the data config rides along (`data_config`)."""
    config = current_config(config)
    data = config.get("data") if isinstance(config, dict) else None
    if data and not (isinstance(data, dict) and isinstance(data.get("class_path"), str)
                     and isinstance(data.get("init_args") or {}, dict)):
        raise UserError("refused: the data config must be a mapping with a class_path and init_args")
    model = instantiate(config, "model", **overrides)
    if data:
        model._zoo_data_config = data
        model.take_names_of_data_config()  # a release or checkpoint from before its model stored them
    if config.get("_ignored_paths"):
        model._zoo_ignored_paths = list(config["_ignored_paths"])
    return model


def build_datamodule(model, **overrides):
    """The data module `model` was trained with, `overrides` on top (batch_size, limit_eval...)."""
    config = data_config(model)
    if not config:
        raise UserError("the model carries no data config; use a checkpoint written by train.py or a "
                        "registry model")
    cls = resolve_class(config.get("class_path"), "data")
    accepted = inspect.signature(cls).parameters
    ignored = [key for key in getattr(model, "_zoo_ignored_paths", ()) if key not in overrides]
    required = [key for key in ignored if key in accepted and accepted[key].default is inspect.Parameter.empty]
    if required:
        raise UserError(f"the checkpoint's data ({cls.__name__}) reads its files from {', '.join(required)}, which "
                        f"comes from you, not from a checkpoint: give it with --data {required[0]}=PATH")
    if ignored:
        warnings.warn(f"the checkpoint's data config names paths ({', '.join(ignored)}); paths come from you, "
                      f"so the defaults are used (set them with --data {ignored[0]}=PATH)", UserWarning, stacklevel=2)
    unknown = sorted(k for k in overrides if k not in accepted)
    if unknown:
        raise UserError(f"{config['class_path']} has no argument {', '.join(unknown)}")
    merged = {**(config.get("init_args") or {}), **overrides}
    key = "eval_batch_size" if merged.get("eval_batch_size") is not None else "batch_size"
    batch = _served(merged.get(key), merged.get("limit_eval"))
    if _is_count(batch, key) and hasattr(model, "zoo_config"):
        check_memory(evaluation_memory(type(model), model.zoo_config()["init_args"], batch, f"the data's {key}"),
                     "this evaluation")
    return instantiate(config, "data", **overrides)


def load_into(model, path: str | os.PathLike, sha256: str | None = None, new_head: bool = False):
    """Load weights from `path` (a file or URL; `sha256` pins it) into `model`, refusing another
    model's; `new_head`: a new label set, whose head starts fresh (`adapt_state_dict`)."""
    from zoo.models.base import class_path

    state, config = hub.load_fetched(path, sha256)
    expected = class_path(model)
    if config and config.get("class_path") != expected:
        raise UserError(f"{path}: checkpoint is a {config.get('family', '?')} model "
                        f"({config.get('class_path')}), not {expected}")
    model.load_state_dict(adapt_state_dict(model, state, config, source=str(path), new_head=new_head))
    return model


def adapt_state_dict(model, state: dict, config: dict | None, source: str, new_head: bool = False) -> dict:
    """`state` made to fit `model` where the user changed its task: with `new_head`, head parameters
    (`model.head_keys`) of another shape stay fresh; with another vocabulary than `config`'s, the
    rows (`card.vocab_keys`) of words both know are copied. Anything else must fit (`check_state_dict`)."""
    state, own = dict(state), model.state_dict()
    fresh = [k for k in own if new_head and k.startswith(tuple(model.head_keys)) and k in state
             and state[k].shape != own[k].shape]
    state.update({key: own[key] for key in fresh})
    if fresh:
        log.warning("%s: new classifier head %s starts fresh; every other weight is the release's",
                 source, ", ".join(f"{k} {tuple(own[k].shape)}" for k in fresh))
    old = ((config or {}).get("init_args") or {}).get("vocab")
    new = model.hparams.get("vocab") if model.card.vocab_keys else None
    if old and new and list(old) != list(new) and all(k in state for k in model.card.vocab_keys):
        index = {word: i for i, word in enumerate(old)}
        pairs = [(i, index[w]) for i, w in enumerate(new) if w in index]
        import torch

        dst, src = (torch.tensor(p) for p in zip(*pairs))
        for key in model.card.vocab_keys:
            rows = own[key].clone()
            rows[dst] = state[key][src].to(rows.dtype)
            state[key] = rows
        log.warning("%s: vocabulary of %d entries: %d keep the release's rows, %d new words start fresh",
                 source, len(new), len(pairs), len(new) - len(pairs))
    check_state_dict(model, state, source=source)
    return state


def check_state_dict(model, state: dict, source: str) -> None:
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    mismatched = [f"{k} {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
                  for k in own if k in state and own[k].shape != state[k].shape]
    parts = []
    if mismatched:
        parts.append("shapes differ: " + "; ".join(mismatched[:5]) + (" …" if len(mismatched) > 5 else ""))
    if missing:
        parts.append(f"missing {len(missing)} tensors (e.g. {', '.join(missing[:3])})")
    if unexpected:
        parts.append(f"unexpected {len(unexpected)} tensors (e.g. {', '.join(unexpected[:3])})")
    if parts:
        raise UserError(f"{source}: weights do not fit the model: " + "; ".join(parts))


def create_model(name: str, pretrained: bool = False, checkpoint: str | os.PathLike | None = None,
                 sha256: str | None = None, **overrides):
    """The registered model `name` (`hf-hub:ORG/NAME` or a local card folder: a model card), with its released weights
    (`pretrained`) or a `checkpoint` (pinned by `sha256`); `overrides` replace the recipe's values."""
    overrides = _head_override(overrides)
    if hub.is_hub_id(name) or hub.is_card(name):  # a hub repository, or a local folder in its layout
        if checkpoint is not None:
            raise UserError(f"{name} is a whole model with its weights; give it without checkpoint=...")
        return load_checkpoint(name, sha256, **overrides)
    if isinstance(name, os.PathLike) or (name not in _entries() and Path(name).is_dir()):
        raise UserError(f"{name}: a folder, but not a model card (no {hub.CARD_CONFIG} beside a "
                        f"{hub.CARD_WEIGHTS}, as `zoo card` writes)" if Path(name).is_dir() else
                        f"{name}: not a model card folder; a weights file loads with zoo.load_checkpoint(PATH)")
    entry = get_entry(name)
    if pretrained and checkpoint:
        raise UserError("give either pretrained=True or checkpoint=..., not both")
    if pretrained:
        _check_released(entry)
        config = {**entry.weights["config"], "data": entry.weights["config"].get("data") or entry.data}
        released = config.get("init_args") or {}
        new_head = "num_classes" in overrides and overrides["num_classes"] != released.get("num_classes")
        if new_head and released.get("class_names") and "class_names" not in overrides:
            overrides["class_names"] = None  # the release's names are not this label set's
        model = load_into(build(config, **overrides), hub.fetch_release(name), new_head=new_head)
        model._zoo_source = {"name": name, "url": hub.release_url(entry.weights), "file": entry.weights["file"],
                             "sha256": entry.weights["sha256"]}  # for its pretrained_cfg
        return model
    model = build(entry.recipe_config(), **overrides)
    if checkpoint is not None:
        load_into(model, checkpoint, sha256, new_head="num_classes" in overrides)
        model._zoo_source = _source(checkpoint, sha256)
    return model


def _head_override(overrides: dict) -> dict:
    """`overrides` with `num_classes` checked: a positive integer, or None (the release's head)."""
    if "num_classes" not in overrides:
        return overrides
    value = overrides["num_classes"]
    if value is None:
        return {k: v for k, v in overrides.items() if k != "num_classes"}
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"num_classes={shorten(value, 40)}: give a positive integer (the new head's classes), "
                        "or None to keep the release's head")
    return overrides


def _check_released(entry: Entry) -> Entry:
    if entry.weights is None:
        available = ", ".join(list_models(pretrained=True)) or "none yet"
        raise UserError(f"'{entry.name}' has no released weights (pretrained models: {available})")
    return entry


@dataclass(frozen=True)
class Weights:
    """A release, as torchvision's `Weights`: where it is, its input (`transforms()`) and `meta`."""

    name: str
    file: str
    sha256: str
    url: str | None
    meta: dict

    def transforms(self):
        """PIL image -> float [C, H, W] in [0, 1], the model's evaluation preprocessing."""
        from zoo.preprocess import Preprocessing

        return Preprocessing.from_dict(self.meta["preprocessing"])

    def get_model(self, **overrides):
        return create_model(self.name, pretrained=True, **overrides)


def release_meta(model, metadata: dict | None = None) -> dict:
    """What a release records beside its config: its preprocessing, class names or vocabulary, size."""
    from zoo.preprocess import for_model

    spec, vocab = for_model(model), model.hparams.get("vocab")
    return {**(metadata or {}), "preprocessing": spec.as_dict(),
            **({"class_names": list(spec.class_names)} if spec.class_names else {}),
            **({"vocab": list(vocab)} if vocab else {}),
            "num_params": sum(p.numel() for p in model.parameters())}


def get_weights(name: str) -> Weights:
    """The release `name` (see `list_models(pretrained=True)`)."""
    entry = get_entry(name)
    record = _check_released(entry).weights
    meta = dict(record.get("metadata") or {})
    if "preprocessing" not in meta:  # releases from before the manifest recorded it
        config = record["config"]
        model = build({**config, "data": config.get("data") or entry.data})
        meta = release_meta(model, meta)
    return Weights(name, record["file"], record["sha256"], hub.release_url(record), meta)


def load_checkpoint(path: str | os.PathLike, sha256: str | None = None, **overrides):
    """A model from a zoo checkpoint alone (a .ckpt, .safetensors or model card; a path or pinned URL)."""
    overrides = _head_override(overrides)
    state, config = hub.load_fetched(path, sha256)
    if not isinstance(config, dict) or "class_path" not in config:
        raise UserError(f"{path}: no zoo config inside; use zoo.create_model(NAME, checkpoint=PATH)")
    model = build(scrub_paths(config), **overrides)
    check_state_dict(model, state, source=str(path))
    model.load_state_dict(state)
    model._zoo_source = _source(path, sha256)
    return model


def _source(location, sha256: str | None) -> dict:
    """Where a loaded model's weights came from, as its `pretrained_cfg` names it."""
    if hub.is_hub_id(location):
        repo_id = str(location)[len(hub.HUB_PREFIX):]
        return {"name": repo_id.partition("@")[0].rsplit("/", 1)[-1], "hf_hub_id": repo_id}
    if hub.is_card(location):
        card = hub.read_card_config(Path(location) / hub.CARD_CONFIG, str(location))
        return {"name": card.get("name"), "file": str(Path(location) / hub.CARD_WEIGHTS),
                "sha256": card["files"][hub.CARD_WEIGHTS]["sha256"]}
    # a checkpoint or weights file: no release name (a run's last.ckpt is no model's name)
    return {"url" if hub.is_url(str(location)) else "file": str(location), "sha256": sha256}


def scrub_paths(config: dict) -> dict:
    """A config from a file without the paths its data config names (a file never chooses where we
    read or write); their names ride along as `_ignored_paths` for `build_datamodule`'s notice."""
    data = config.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("init_args"), dict):
        return config
    try:
        cls = resolve_class(data.get("class_path"), "data")
    except UserError:
        return config  # not ours: build_datamodule refuses it, if anyone asks for the data
    paths = [key for key in getattr(cls, "path_arguments", ()) if data["init_args"].get(key) is not None]
    if not paths:
        return config
    init_args = {k: v for k, v in data["init_args"].items() if k not in paths}
    return {**config, "data": {**data, "init_args": init_args}, "_ignored_paths": paths}
