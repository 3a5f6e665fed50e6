"""Train any zoo model from a recipe with LightningCLI: the `zoo train` command (and the clone's
`python train.py`, which calls main() here).

    python train.py fit --config configs/baseline/cnn_centered.yaml
    python train.py fit --config configs/baseline/cnn_centered.yaml --ckpt_path last    # resume the run
    python train.py fit --config configs/sat/soft_scenes.yaml --init_from sat_soft_scenes --model.init_args.lr 1e-4
                                                                                       # fine-tune: a new run
    python train.py fit --config ... --trainer.devices 2 --trainer.strategy ddp         # DDP
    python train.py fit --config ... --print_config

configs/base/trainer.yaml (W&B offline logger, progress bar, checkpointing) is applied first;
the recipe overrides it. Checkpoints go to <trainer.default_root_dir>/checkpoints (best on
validation + last.ckpt), written atomically. The script is re-entrant: DDP re-executes it per rank.

Resume and fine-tune are different things:
- `--ckpt_path PATH|last` continues the run that wrote the checkpoint: weights, optimizer, schedule,
  epoch and its W&B run. Its model hyperparameters must be the checkpoint's (a differing value is
  refused with one line); a larger `--trainer.max_epochs` extends the run.
- `--init_from NAME|PATH|URL` starts a new run from a release's or a checkpoint's weights, with this
  command's hyperparameters (optimizer and schedule start fresh).
A checkpoint is data, never code: it is loaded with `weights_only=True` (local or remote), the
model class comes from the recipe, never from the file. Which run a folder, a checkpoint and a
saved config.yaml belong to is zoo/runs.py's (config.yaml is a recipe: it never resumes a run).

Every user mistake ends with one line on stderr and exit code 2; SIGTERM (a scheduler's time limit
or preemption) saves last.ckpt where the run is and exits with code 143.
"""
from __future__ import annotations

import difflib
import importlib
import inspect
import json
import logging
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Literal

import yaml
from lightning.pytorch import LightningDataModule
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, ProgressBar, RichProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

from zoo import hub, runs
from zoo.callbacks import WANDB_CLASSES, AtomicCheckpointIO, EpochSummary, InitFrom, ZooCheckpoint
from zoo.errors import UserError, environment_error, one_line_warnings, printable, quiet_lightning
from zoo.hparams import current_init_args, renamed_for
from zoo.hub import MAX_CONFIG_BYTES
from zoo.limits import check_environment, check_memory, check_tree, data_memory, model_memory, shorten
from zoo.models.base import ZooModule
from zoo.registry import ALLOWED_CLASSES, REPO_ROOT, resolve_class


def _base_config() -> str:
    """configs/base/trainer.yaml: the one a wheel installs (zoo/recipes), else the clone's."""
    installed = Path(__file__).resolve().parent / "recipes" / "base" / "trainer.yaml"
    return str(installed if installed.is_file() else REPO_ROOT / "configs" / "base" / "trainer.yaml")


BASE_CONFIG = _base_config()
PROG = "train.py"  # main(prog="zoo train") names the command that was run
HELP = "train.py fit --help lists every option"
FINETUNE_RECIPE = "finetune"  # a recipe whose file name says so is meant to start from trained weights
PRETRAINED_ARGS = ("pretrained", "pretrained_file")
log = logging.getLogger("zoo")


# ----------------------------------------------------------------------------- one-line errors
class ZooArgumentParser(LightningArgumentParser):
    """LightningCLI's parser with one-line errors (the key and what is wrong, not 70 lines of
    usage) and no abbreviated options: `--trainer.max_epoch` is a typo, not `max_epochs`."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None):
        if not self.exit_on_error:  # jsonargparse probing a union type: let it try the next one
            return super().error(message, ex)
        unknown = re.search(r"nrecognized arguments: (--[\w.]+)", str(message))
        if unknown:
            close = difflib.get_close_matches(unknown.group(1), list(getattr(self, "_option_string_actions", {})), n=1)
            if close:
                message = f"{message}; did you mean {close[0]}?"
        sys.stderr.write(f"{PROG}: error: {printable(condense(message))} ({HELP})\n")
        sys.exit(2)


def condense(message: str) -> str:
    """jsonargparse's multi-line messages as one line that names the key and the problem."""
    text = str(message)
    nested = _nested_problem(text)
    if nested:
        return nested
    key = re.search(r'Parser key "([^"]+)"', text)
    where = f"{key.group(1)}: " if key else ""
    problem = re.search(r"Problem with given class_path '([^']+)':(.*)", text, re.S)
    if problem:
        class_path = problem.group(1)
        detail = re.split(r"\n\s*- |\n\s*Given value", problem.group(2))[0].strip()
        option = re.search(r"Option '([^']+)' is not accepted", detail)
        if option:
            renamed = renamed_for(class_path).get(option.group(1))  # a recipe older than a rename
            if renamed:
                return f"{where}{class_path} has no argument '{option.group(1)}': its name is now '{renamed}'"
            close = difflib.get_close_matches(option.group(1), _arguments_of(class_path), n=1)
            hint = f"; did you mean {where.rstrip(': ')}.init_args.{close[0]}?" if close and where else ""
            return f"{where}{class_path} has no argument '{option.group(1)}'{hint}"
        if "has no attribute" in detail or "No module named" in detail or "import" in detail.lower():
            first = detail.splitlines()[0].strip() if detail else "not importable"
            return f"{where}cannot import class_path '{class_path}' ({first}){_suggest(class_path)}"
        return f"{where.rstrip(': ')}.init_args.{condense(detail)}" if where else condense(detail)
    expected = re.search(r"Expected a <class '(\w+)'>\. Got value: (.*)", text)
    if expected:
        return f"{where}expected {expected.group(1)}, got {expected.group(2).strip()!r}"
    given = re.search(r"Given value: (.*)", text)
    if "Does not validate against any of the" in text and given:
        return f"{where}{given.group(1).strip()[:120]!r} is not an accepted value"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " ".join(lines)[:300] or "invalid command line"


def _recipe_hint(given: str) -> str:
    """'; did you mean ram_fmnist_centered?' for a near registry name given as --config."""
    from zoo import registry

    close = difflib.get_close_matches(given, registry.list_models(), n=1)
    return f"; did you mean {close[0]}?" if close else ""


NESTED_FIELD = re.compile(r"^(--model\.init_args\.backbone)\.(\w+)$")  # a BackboneSpec field
NULLS = ("null", "None", "~")


def with_nested_nulls(argv: list[str]) -> list[str]:
    """`--model.init_args.backbone.level null` unsets the field. jsonargparse reads a null given
    to a field of a nested dataclass as the string 'None' (refused for an int); the same update as
    a one-field mapping, `--model.init_args.backbone '{"level": null}'`, merges field-wise."""
    out, i = [], 0
    while i < len(argv):
        key, eq, value = argv[i].partition("=")
        if not eq and i + 1 < len(argv):  # "--key value" rather than "--key=value"
            value = argv[i + 1]
        field = NESTED_FIELD.match(key)
        if field and value in NULLS:
            out += [field.group(1), json.dumps({field.group(2): None})]
            i += 1 if eq else 2
        else:
            out.append(argv[i])
            i += 1
    return out


def with_recipe_paths(argv: list[str]) -> list[str]:
    """`--config ram_fmnist_centered` (a registry name that is no file here) means that entry's
    recipe, wherever the recipes are installed: after `pip install` there is no configs/ folder to
    name."""
    from zoo import registry

    names, out = set(registry.list_models()), list(argv)
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            at, given, prefix = i, arg.split("=", 1)[1], "--config="
        elif arg in ("--config", "-c") and i + 1 < len(argv):
            at, given, prefix = i + 1, argv[i + 1], ""
        else:
            continue
        if given in names and not Path(given).exists() and registry.get_entry(given).recipe is not None:
            out[at] = prefix + str(registry.get_entry(given).recipe)
    return out


def _nested_problem(text: str) -> str | None:
    """A problem in a nested argument (`--model.init_args.backbone.modelname`): jsonargparse nests
    one union error in another, and the useful line is the innermost. Returns the dotted key, what
    is wrong and a did-you-mean, or None when the message is not of that shape."""
    keys = re.findall(r'Parser key "([^"]+)"', text)
    if len(keys) < 2:
        return None
    path = f"{keys[0]}.init_args." + ".".join(keys[1:])  # a dataclass field (a backbone's) has no init_args
    classes = re.findall(r"Problem with given class_path '([^']+)'", text)
    option = re.search(r"Option '([^']+)' is not accepted", text)
    if option and classes:
        name, owner = option.group(1), classes[-1]
        close = difflib.get_close_matches(name, _arguments_of(owner), n=1)
        hint = f"; did you mean {path}.{close[0]}?" if close else ""
        return f"{path}: {owner.rsplit('.', 1)[-1]} has no field '{name}'{hint}"
    inner = re.search(r"Subtypes: \[(.*?)\]\s*Errors:(?:\s*- Expected a <class '\w+'>)+\s*Given value type: "
                      r"<class 'str'>\s*Given value: None\b", text)
    if inner:
        return (f"{path}: null cannot be given on the command line for this field (jsonargparse reads it as "
                f"the string 'None'); leave it out, or set it to null in a --config YAML file")
    expected = re.search(r"Expected a <class '(\w+)'>.*?Given value: (.*?)\n", text, re.S)
    if expected:
        return f"{path}: expected {expected.group(1)}, got {expected.group(2).strip()[:80]!r}"
    return None


def _arguments_of(class_path: str) -> list[str]:
    """The argument names of one of our classes (for a did-you-mean), or none."""
    import inspect

    module, _, name = class_path.rpartition(".")
    if not module.startswith("zoo."):
        return []
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return []
    return [p for p in inspect.signature(cls).parameters if p not in ("self", "args", "kwargs")]


def _suggest(class_path: str) -> str:
    """'; did you mean X?' for a misspelt class in one of our modules."""
    module, _, name = class_path.rpartition(".")
    if not module.startswith("zoo."):
        return ""
    try:
        names = [n for n in dir(importlib.import_module(module)) if n[:1].isupper()]
    except ImportError:
        return ""
    close = difflib.get_close_matches(name, names, n=1)
    return f"; did you mean {module}.{close[0]}?" if close else ""


def check_config_files(argv: list[str]) -> None:
    """Every --config file exists and holds a non-empty YAML mapping (checked before LightningCLI,
    whose own messages for these cases are a usage dump or 'Unexpected config'), and neither it nor
    any command-line value expands past zoo.limits (YAML anchors that share one list a billion
    ways, nesting thousands deep): jsonargparse would expand them for minutes and gigabytes."""
    for i, arg in enumerate(argv):  # a command-line value is YAML to jsonargparse as well
        value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
        if ("&" in value or "[" in value or "{" in value) and not arg.startswith("--config"):
            try:
                check_tree(yaml.safe_load(value), f"command-line value {shorten(value, 60)!r}")
            except RecursionError:
                raise UserError(f"command-line value {shorten(value, 60)!r}: refused, nested too deep") from None
            except yaml.YAMLError:
                pass  # not YAML: jsonargparse reports it
    paths = [BASE_CONFIG]
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            paths.append(argv[i + 1])
        elif arg.startswith("--config="):
            paths.append(arg.split("=", 1)[1])
    for path in map(Path, paths):
        if not path.exists():
            raise UserError(f"--config {path}: no such file{_recipe_hint(str(path))}")
        if path.is_dir():
            raise UserError(f"--config {path}: is a directory, not a YAML file")
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise UserError(f"--config {path}: refused, a recipe of more than {MAX_CONFIG_BYTES:,} bytes")
        try:
            content = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}" if mark is not None else ""
            raise UserError(f"--config {path}: not valid YAML{at} ({getattr(exc, 'problem', None) or exc})") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"--config {path}: cannot read ({exc})") from None
        except RecursionError:
            raise UserError(f"--config {path}: refused, nested too deep") from None
        if content is None:
            raise UserError(f"--config {path}: the file is empty")
        check_tree(content, f"--config {path}")
        if not isinstance(content, dict):
            raise UserError(f"--config {path}: expected a mapping of keys (model:, data:, trainer:, ...), "
                            f"got a {type(content).__name__}")


# ----------------------------------------------------------------------------- checkpoints
def newest_readable(directory: Path, skip: Path | None = None) -> Path | None:
    """The readable checkpoint in `directory` that got furthest (most optimizer steps): what the
    run itself recorded, not file times, which are coarser than a run's saves."""
    furthest, best = None, -1
    for path in sorted(directory.glob("*.ckpt")):
        if skip is not None and path.resolve() == skip.resolve():
            continue
        try:
            step = int(hub.read_checkpoint(path).get("global_step", 0))
        except (UserError, TypeError, ValueError):
            continue
        if step > best:
            furthest, best = path, step
    return furthest


def read_resume_checkpoint(path: Path) -> dict:
    try:
        return hub.read_checkpoint(path)
    except UserError as exc:
        if "refused" in str(exc):
            raise
        fallback = newest_readable(path.parent, skip=path)
        hint = (f"; the newest readable checkpoint is {fallback}: resume with --ckpt_path {fallback}"
                if fallback else "; no other readable checkpoint in that folder")
        raise UserError(f"cannot resume: {exc}{hint}") from None


def _as_dict(init_args) -> dict:
    """jsonargparse's init_args (a Namespace, nested) as plain dicts, as a class takes them from a file."""
    return init_args.as_dict() if hasattr(init_args, "as_dict") else dict(init_args or {})


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# ----------------------------------------------------------------------------- the CLI
class SaveConfigToRunDir(SaveConfigCallback):
    """Write the full resolved config to <default_root_dir>/config.yaml (beside the checkpoints;
    LightningCLI's default is the logger's directory, which for W&B is the working directory),
    and log it to every logger, so a W&B run holds the trainer and data settings too. It is a
    recipe: no ckpt_path, no W&B run id (zoo.runs.as_recipe)."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.already_saved:
            return
        if trainer.is_global_zero:
            os.makedirs(trainer.default_root_dir, exist_ok=True)
            recipe = runs.as_recipe(self.config)
            self.parser.save(recipe, os.path.join(trainer.default_root_dir, self.config_filename),
                             skip_none=False, overwrite=True, multifile=self.multifile)
            for logger in trainer.loggers:
                logger.log_hyperparams({"config": recipe.as_dict()})
        self.already_saved = trainer.strategy.broadcast(True)


def _take_or_refuse(served, given, model_class, key: str, data_says: str) -> object:
    """The model's value of a fact the data decides: `given` when it agrees with `served`, the
    data's value when `given` is the class default (the recipe left it out), else one line."""
    default = inspect.signature(model_class.__init__).parameters[key].default
    if given == default or (isinstance(default, (list, tuple)) and list(given) == list(default)):
        return served
    raise UserError(f"--model.init_args.{key} {given} disagrees with the data's images ({data_says}); "
                    f"set one of them so they agree, or leave the model's out to take the data's")


def link_image_size(data_class, data_args, model_class, model_args) -> None:
    """The data decides the image size: a model whose recipe leaves its size at the class default
    takes the data's; one set to another size than the data serves is refused (a captioner
    trained on 96 px scenes with image_size 128 would be prepared at 128 px by `zoo caption`)."""
    served = data_class.image_size_for(**data_args) if hasattr(data_class, "image_size_for") else None
    given = model_args.get("image_size")
    if served is None or given is None:
        return
    from zoo.data.base import as_size

    if as_size(given) == served:
        return
    data_key = getattr(data_class, "image_size_argument", None) or "variant"
    size = _take_or_refuse(served, given, model_class, "image_size",
                           f"{data_key} {data_args.get(data_key)}: {served[0]}x{served[1]} px")
    model_args["image_size"] = size[0] if isinstance(given, int) and size[0] == size[1] else list(size)


def link_in_chans(data_class, data_args, model_class, model_args) -> None:
    """The data decides the channels, as it does the size: a model at its class default takes the
    data's `in_chans`; one set to other channels than the data serves is refused."""
    served = data_class.image_chans_for(**data_args) if hasattr(data_class, "image_chans_for") else None
    if served is None or model_args.get("in_chans") in (None, served):
        return
    model_args["in_chans"] = _take_or_refuse(served, model_args["in_chans"], model_class, "in_chans",
                                             f"{data_class.__name__}: {served} channel(s)")


class ZooCLI(LightningCLI):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("parser_class", ZooArgumentParser)
        self._argv = list(sys.argv[1:] if kwargs.get("args") is None else kwargs["args"])
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser):
        parser.add_lightning_class_args(ZooCheckpoint, "checkpoint")
        parser.link_arguments("trainer.default_root_dir", "checkpoint.dirpath",
                              compute_fn=lambda root: str(Path(root) / "checkpoints"))
        parser.add_argument("--init_from", type=str | None, default=None,
                            help="fine-tune: start a NEW run from these weights (a release name, a .safetensors "
                                 "or .ckpt path, or a URL) with this config's hyperparameters")
        parser.add_argument("--init_vocab", type=Literal["data", "release"], default="data",
                            help="with --init_from, a captioner's vocabulary: 'data' (from the training captions; "
                                 "rows of words the release knows keep its weights) or 'release' (its own)")
        parser.add_argument("--sha256", type=str | None, default=None,
                            help="pin a --ckpt_path or --init_from URL (or file) to its sha256 (8+ hex digits)")

    def before_instantiate_classes(self) -> None:
        """The data decides the label set: a data module that knows its class names before it is
        built (`class_names_for`, e.g. ImageFolder's folders) sets the model's num_classes and
        class_names. A fine-tune recipe that would start from random weights says so."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        data, model = config.get("data"), config.get("model")
        if not hasattr(data, "class_path") or not hasattr(model, "init_args"):
            return
        names_for = getattr(resolve_class(data.class_path, "data"), "class_names_for", None) \
            if data.class_path in ALLOWED_CLASSES["data"] else None
        names = names_for(**data.init_args) if names_for else None
        if names and "num_classes" in model.init_args:
            model.init_args["num_classes"] = len(names)
            if "class_names" in model.init_args:
                model.init_args["class_names"] = list(names)
        if data.class_path in ALLOWED_CLASSES["data"] and model.class_path in ALLOWED_CLASSES["model"]:
            data_class, model_class = resolve_class(data.class_path, "data"), resolve_class(model.class_path, "model")
            link_image_size(data_class, data.init_args, model_class, model.init_args)
            link_in_chans(data_class, data.init_args, model_class, model.init_args)
        if config.get("init_vocab") == "release" and config.get("init_from"):
            vocab = ((InitFrom.source_config(config["init_from"], config.get("sha256")) or {}).get("init_args") or {}).get("vocab")
            if not vocab or "vocab" not in model.init_args or "vocab" not in data.init_args:
                raise UserError(f"--init_vocab release: {config['init_from']} is not a captioner with a vocabulary, "
                                "or this config's data has none to replace")
            if not isinstance(vocab, list) or not all(isinstance(word, str) and word for word in vocab) \
                    or len(set(vocab)) != len(vocab):
                raise UserError(f"--init_vocab release: {config['init_from']}'s vocabulary is not a list of distinct "
                                "words (strings)")
            model.init_args["vocab"] = data.init_args["vocab"] = list(vocab)
        self._check_memory(data, model)
        recipes = [str(p) for p in config.get("config") or []]
        backbone = model.init_args.get("backbone")
        weights = [model.init_args.get(k) for k in PRETRAINED_ARGS] + [getattr(backbone, k, None) for k in PRETRAINED_ARGS]
        if any(FINETUNE_RECIPE in Path(r).stem for r in recipes) and not any(weights) and not config.get("init_from"):
            log.warning("a fine-tune recipe is starting from RANDOM weights: give --init_from NAME, or "
                        "--model.init_args.pretrained true (online) / --model.init_args.pretrained_file PATH")

    @staticmethod
    def _check_memory(data, model) -> None:
        """What the run would allocate, refused above the memory budget before anything is built
        (zoo.limits): the model built on the meta device, its weights counted four times (with their
        gradients and the optimizer's two moments), and the arrays its data module would generate."""
        parts = {}
        if model.class_path in ALLOWED_CLASSES["model"]:
            for key, value in model_memory(resolve_class(model.class_path, "model"), _as_dict(model.init_args)).items():
                if key.startswith("the weights"):
                    key, value = f"{key} with gradients and optimizer state (x4)", 4 * value
                parts[key] = value
        if data.class_path in ALLOWED_CLASSES["data"]:
            parts.update(data_memory(resolve_class(data.class_path, "data"), _as_dict(data.init_args)))
        check_memory(parts, "this run")

    def _set_seed(self) -> None:
        """LightningCLI's, without the "Seed set to" line (the seed is in the saved config.yaml)."""
        from lightning.fabric.utilities.seed import seed_everything

        seed = self._get(self.config, "seed_everything")
        if seed is False:
            return
        seed = seed_everything(None if seed is True else seed, workers=True, verbose=False)
        self.config[self.subcommand]["seed_everything"] = seed

    # ------------------------------------------------------------------ --ckpt_path, safely
    def _parse_ckpt_path(self) -> None:
        """Replaces LightningCLI's version, which merges the checkpoint's hyperparameters over the
        command line (so `--model.init_args.lr` was silently ignored) and would instantiate the
        class the checkpoint names. Here the file is fetched and verified, read with
        weights_only=True, and must match the recipe's model; differing hyperparameters are
        refused, and the W&B run it belongs to is continued."""
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        config = self.config[subcommand]
        runs.drop_inherited_identity(config, self._argv)  # a resume is asked for, never inherited from a file
        ckpt, init_from = config.get("ckpt_path"), config.get("init_from")
        if config.get("weights_only") is False:
            raise UserError("--weights_only false would let a checkpoint run code when it loads; refused")
        if "weights_only" in config:
            config["weights_only"] = True
        if ckpt and init_from:
            raise UserError("give --ckpt_path (resume a run) or --init_from (start a new run from weights), not both")
        if not ckpt:
            return
        ckpt = str(ckpt)
        if ckpt in ("best", "hpc", "registry"):
            raise UserError(f"--ckpt_path {ckpt}: give a checkpoint file, a URL, or 'last'")
        if ckpt == "last":
            path = Path(config.checkpoint.dirpath) / f"{ZooCheckpoint.CHECKPOINT_NAME_LAST}.ckpt"
            if not path.is_file():
                raise UserError(f"--ckpt_path last: no {path.name} in {path.parent} (is --trainer.default_root_dir "
                                "the run's folder?); leave --ckpt_path out to start a new run")
        else:
            if str(ckpt).endswith(".safetensors") or (not hub.is_url(ckpt) and Path(ckpt).suffix == ".safetensors"):
                raise UserError(f"--ckpt_path {ckpt}: released weights are not a training checkpoint (no optimizer "
                                "or epoch to resume); start a new run from them with --init_from instead")
            if not hub.is_url(ckpt) and not Path(ckpt).is_file():
                raise UserError(f"--ckpt_path {ckpt}: no such checkpoint file")
            path = hub.fetch(ckpt, config.get("sha256"))
        checkpoint = read_resume_checkpoint(path)
        self._resume_state = (path, checkpoint.get("state_dict"))  # checked against the model in _preflight
        config["ckpt_path"] = str(path)
        self._check_resume_matches(checkpoint, config, path)
        self._check_resume_data(checkpoint, config, path)  # before config.yaml or W&B is touched
        if subcommand == "fit":
            runs.check_resume_owner(path, checkpoint, Path(config.trainer.get("default_root_dir") or os.getcwd()))
        self._continue_wandb_run(checkpoint, config)

    def _check_resume_matches(self, checkpoint: dict, config, path: Path) -> None:
        saved = checkpoint.get("zoo") if isinstance(checkpoint.get("zoo"), dict) else {}
        hparams = checkpoint.get("hyper_parameters") or {}
        model = config.model
        saved_class = saved.get("class_path") or hparams.get("_class_path")
        if saved_class and saved_class != model.class_path:
            raise UserError(f"--ckpt_path {path}: the checkpoint is a {saved_class}, but this config trains "
                            f"{model.class_path}")
        init_args = model.init_args
        for key, value in current_init_args(model.class_path, hparams).items():  # old names too (zoo.hparams)
            if key.startswith("_") or key not in init_args:
                continue
            current = init_args[key]
            if current is None and value is not None:
                init_args[key] = value  # filled in during training (e.g. a captioner's vocabulary)
            elif _plain(current) != _plain(value):
                raise UserError(f"--ckpt_path resumes the run it was saved from, but model.init_args.{key} differs "
                                f"({_plain(current)!r} here, {_plain(value)!r} in the checkpoint); to train with new "
                                f"hyperparameters start a new run with --init_from {path}")

    #: data settings a resumed run may change (with one warning): how the data is served, not which
    RESUME_MAY_CHANGE = ("batch_size", "eval_batch_size", "num_workers")

    def _check_resume_data(self, checkpoint: dict, config, path: Path) -> None:
        """The data the run trains and validates on must be the checkpoint's: a changed split size,
        seed, variant, image size or vocabulary would validate on images it trained on. Where the
        data lives (a path argument) may move; how it is served (batch size, workers) may change
        with one warning."""
        zoo_data = ((checkpoint.get("zoo") or {}).get("data") or {}) if isinstance(checkpoint.get("zoo"), dict) else {}
        saved = checkpoint.get("datamodule_hyper_parameters") or zoo_data.get("init_args") or {}
        data = config.get("data")
        if not isinstance(saved, dict) or not saved or data is None or not hasattr(data, "init_args"):
            return
        saved = current_init_args(data.class_path, saved)  # a run's data saved under old names (zoo.hparams)
        try:
            movable = set(resolve_class(data.class_path, "data").path_arguments)
        except UserError:
            movable = set()
        for key, value in saved.items():
            if str(key).startswith("_") or key not in data.init_args or key in movable or key == "cache":
                continue
            current = data.init_args[key]
            if _plain(current) == _plain(value):
                continue
            if key in self.RESUME_MAY_CHANGE:
                warnings.warn(f"resuming with data.init_args.{key} {_plain(current)!r} (the checkpoint's run used "
                              f"{_plain(value)!r}): the schedule and the epoch length change", UserWarning)
                continue
            raise UserError(f"--ckpt_path resumes the run it was saved from, but data.init_args.{key} differs "
                            f"({shorten(_plain(current), 60)} here, {shorten(_plain(value), 60)} in the checkpoint): "
                            f"the run would train or validate on other data; start a new run with --init_from {path}")

    @staticmethod
    def _continue_wandb_run(checkpoint: dict, config) -> None:
        run = checkpoint.get("zoo_run") if isinstance(checkpoint.get("zoo_run"), dict) else {}
        run_id, logger = run.get("wandb_id"), config.trainer.get("logger")
        if not isinstance(run_id, str) or not hasattr(logger, "class_path") or logger.class_path not in WANDB_CLASSES:
            return
        if logger.init_args.get("id") is None:
            logger.init_args["id"] = run_id
            logger.init_args["resume"] = "allow"

    # ------------------------------------------------------------------ the trainer
    def instantiate_trainer(self, **kwargs):
        """The trainer, without callbacks that the user's own flags switch off (a progress bar with
        enable_progress_bar false, a learning-rate monitor with no logger, checkpointing with
        enable_checkpointing false) and with atomic checkpoint writes."""
        config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        if self.subcommand == "fit":
            self._preflight(Path(config.get("default_root_dir") or os.getcwd()))
        extra = [self._get(self.config_init, c) for c in self._parser(self.subcommand).callback_keys]
        drop = []
        if config.get("enable_progress_bar") is False:
            drop.append(ProgressBar)
        if config.get("logger") in (False, None, []):
            drop.append(LearningRateMonitor)
        if config.get("enable_checkpointing") is False:
            drop.append(ModelCheckpoint)
        if drop:
            config["callbacks"] = [c for c in (config.get("callbacks") or []) if not isinstance(c, tuple(drop))]
            extra = [c for c in extra if not isinstance(c, tuple(drop))]
        callbacks = config.get("callbacks") or []
        if config.get("enable_progress_bar") is False and not any(isinstance(c, EpochSummary) for c in callbacks):
            config["callbacks"] = [*callbacks, EpochSummary()]  # no bar: still one line per epoch
        elif not sys.stdout.isatty() and any(isinstance(c, RichProgressBar) for c in callbacks):
            # Rich draws nothing without a terminal (a log, CI, `| tee`): report each epoch instead
            config["callbacks"] = [c for c in callbacks if not isinstance(c, RichProgressBar)] + [EpochSummary()]
            config["enable_progress_bar"] = False
        if not config.get("plugins"):
            config["plugins"] = [AtomicCheckpointIO()]
        try:
            return self._instantiate_trainer(config, extra)
        except (TypeError, ValueError, MisconfigurationException) as exc:
            raise UserError(f"trainer: {str(exc).splitlines()[0]}") from None

    # ------------------------------------------------------------------ before training
    def _preflight(self, root: Path) -> None:
        """Checks that end a bad run before it starts (before the trainer and W&B start): the data
        (files, sizes), the run directory (writable, not in use, not an earlier run's), and the
        --init_from source."""
        config = self.config[self.subcommand]
        self._check_resume_weights()
        self._check_data()
        if _launching_process():
            runs.claim(root, resuming=bool(config.get("ckpt_path")))  # held until the run ends (main)
        if config.get("init_from"):
            self._init_from = InitFrom.prepare(config["init_from"], self.model, config.get("sha256"))

    def _check_resume_weights(self) -> None:
        """A resumed checkpoint's weights must be this model's (a checkpoint stripped of its zoo config
        and hyperparameters says nothing else of what it is): refused before the run folder,
        config.yaml or a W&B run exist."""
        from zoo.registry import check_state_dict

        path, state = getattr(self, "_resume_state", (None, None))
        self._resume_state = (None, None)
        if path is None:
            return
        if not isinstance(state, dict):
            raise UserError(f"--ckpt_path {path}: not a training checkpoint (it holds no state_dict)")
        if getattr(self.model, "embed", True) is None:  # a captioner whose vocabulary comes at setup
            state = {k: v for k, v in state.items() if k not in self.model.vocab_keys}
        check_state_dict(self.model, state, source=f"--ckpt_path {path}")

    def before_fit(self) -> None:
        if getattr(self, "_init_from", None) is not None:
            self.trainer.callbacks.append(self._init_from)

    def _check_data(self) -> None:
        dm = self.datamodule
        if dm is None:
            return
        hp = getattr(dm, "hparams", {})
        for key in ("batch_size", "eval_batch_size"):
            value = hp.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise UserError(f"data.init_args.{key} must be a positive integer, got {value!r}")
        if hp.get("num_workers") is not None and hp["num_workers"] < 0:
            raise UserError(f"data.init_args.num_workers must be >= 0, got {hp['num_workers']}")
        dm.prepare_data()  # our data modules build or read their files here and in setup,
        dm.setup("fit")    # idempotently: a missing file is reported now, in one line
        if hasattr(dm, "summary") and _launching_process():
            print(f"data: {dm.summary()}", flush=True)


def _launching_process() -> bool:
    """True in the process that starts the run: not in the extra DDP ranks Lightning or torchrun
    start (they inherit RANK/LOCAL_RANK), which must not take the run directory's lock again."""
    rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK") or "0"
    return rank == "0" and os.environ.get("NODE_RANK", "0") == "0"


def _user_error(exc: BaseException | None) -> str | None:
    """The UserError (or the machine's OSError: zoo.errors.environment_error) behind `exc`,
    following its cause/context chain, as its one line; or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, UserError):
            return str(exc)
        if environment_error(exc):
            return environment_error(exc)
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _fail(message: str, code: int = 2):
    print(f"{PROG}: error: {printable(message)}", file=sys.stderr)
    sys.exit(code)


def main(args: list[str] | None = None, prog: str = "train.py") -> None:
    global PROG, HELP
    PROG, HELP = prog, f"{prog} fit --help lists every option"
    one_line_warnings()
    quiet_lightning()
    # main(args) is also called from Python (tests, notebooks) with its own argument list
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
    # jsonargparse's notice about an argument LightningCLI passes, not one a user can change
    warnings.filterwarnings("ignore", message=r"(?s).*skip_none parameter was deprecated")
    # a frozen, pretrained encoder is in eval mode on purpose (its batch norm statistics stay)
    warnings.filterwarnings("ignore", message=r".*module\(s\) in eval mode at the start of training")
    argv = sys.argv[1:] if args is None else args
    base = {"default_config_files": [BASE_CONFIG]}
    try:
        check_environment(logging=True)
        argv = args = with_nested_nulls(with_recipe_paths(argv))
        check_config_files(argv)
        ZooCLI(ZooModule, LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
               parser_kwargs={"prog": PROG, "fit": base, "validate": base, "test": base, "predict": base},
               save_config_callback=SaveConfigToRunDir, save_config_kwargs={"overwrite": True}, args=args)
    except (SIGTERMException, KeyboardInterrupt) as exc:
        _stopped("SIGTERM" if isinstance(exc, SIGTERMException) else "Ctrl-C")
    except SystemExit as exc:  # Lightning ends a Ctrl-C'd run with sys.exit(1) after saving
        if ZooCheckpoint.interrupted_by == "KeyboardInterrupt" and exc.code == 1:
            _stopped("Ctrl-C")
        raise
    except MisconfigurationException as exc:  # Lightning's "the settings contradict each other"
        _finish_wandb()
        _fail(str(exc).splitlines()[0])
    except OSError as exc:
        message = environment_error(exc)  # a full disk, a read-only or missing folder: the machine, not a bug
        if message is None:
            raise
        _finish_wandb()
        _fail(message)
    except Exception as exc:  # jsonargparse wraps errors raised while instantiating classes
        user_error = _user_error(exc)
        if user_error is None:
            raise
        _finish_wandb()
        _fail(user_error)
    finally:
        runs.release()  # the run folder, for a next run in this process (a notebook, a test)
    _finish_wandb()


def _stopped(by: str) -> None:
    saved = ZooCheckpoint.interrupted_path
    where = f"saved {saved}; resume with --ckpt_path last" if saved else "no checkpoint was saved"
    _finish_wandb()
    _fail(f"stopped by {by}: {where}", 143 if by == "SIGTERM" else 130)


def _finish_wandb() -> None:
    """Close the W&B run explicitly, so the offline run directory is complete for `wandb sync`."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()


if __name__ == "__main__":  # python -m zoo.train
    main(prog="python -m zoo.train")
