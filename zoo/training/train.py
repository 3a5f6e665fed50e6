"""`zoo train` (and the clone's `python train.py`): LightningCLI over the zoo's recipes.

    python train.py fit --config configs/baseline/cnn_centered.yaml [--ckpt_path last] [--accel compile]
    python train.py fit --config configs/sat/soft_scenes.yaml --init_from sat_soft_scenes   # a new run
    python train.py validate|test|predict --config RUN/config.yaml --ckpt_path RUN/checkpoints/last.ckpt

configs/base/trainer.yaml applies first, then the recipe (zoo.training.recipe_args). `--ckpt_path`
continues the run that wrote the checkpoint (zoo.training.runs); `--init_from` starts a new run from
other weights. A mistake is one line and exit code 2; SIGTERM saves last.ckpt and exits 143.
"""
from __future__ import annotations

import difflib
import importlib
import inspect
import logging
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Literal

from lightning.pytorch import LightningDataModule
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, ModelSummary, ProgressBar, RichProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

from zoo import registry
from zoo.guards.budget import check_environment
from zoo.guards.errors import UserError, environment_error, one_line_warnings, printable, quiet_lightning
from zoo.guards.writes import atomic_write_bytes
from zoo.hparams import block_defaults, renamed_for
from zoo.models.accel import MODES
from zoo.models.base import ZooModule
from zoo.training import recipe_args, runs, verbs
from zoo.training.callbacks import Accelerate, AtomicCheckpointIO, EpochSummary, InitFrom, ZooCheckpoint, ZooModelSummary

PROG = "train.py"  # main(prog="zoo train") names the command that was run
FINETUNE_RECIPE = "finetune"  # a recipe whose file name says so is meant to start from trained weights
log = logging.getLogger("zoo")


# ----------------------------------------------------------------------------- one-line errors
class ZooArgumentParser(LightningArgumentParser):
    """LightningCLI's parser with one-line errors and no abbreviated options."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message: str, ex: Exception | None = None):
        # jsonargparse (checked: 4.53) calls error() with exit_on_error off while it tries each type
        # of a union, and expects the exception back to try the next one
        if not self.exit_on_error:
            return super().error(message, ex)
        _fail(f"{one_line(str(message), self)} ({PROG} fit --help lists every option)")


def one_line(message: str, parser=None) -> str:
    """jsonargparse's message as its innermost line, named by its key and class, plus a did-you-mean."""
    keys = re.findall(r'Parser key "([^"]+)"', message)
    classes = re.findall(r"Problem with given class_path '([^']+)'", message)
    structure = ("Parser key", "Does not validate", "Subtypes:", "Errors:", "- Problem with given class_path",
                 "- Expected a <class 'NoneType'>", "Given value")
    detail = next((line.strip() for line in message.splitlines() if line.strip()
                   and not line.strip().startswith(structure)), "invalid command line")
    where = ".".join(keys) + (f" ({classes[-1].rsplit('.', 1)[-1]})" if classes else "") + ": " if keys else ""
    return f"{where}{detail}{did_you_mean(detail, keys, classes, parser)}"


def did_you_mean(detail: str, keys: list[str], classes: list[str], parser=None) -> str:
    unknown = re.search(r"nrecognized arguments: (--[\w.]+)", detail)
    option = re.search(r"Option '(\w+)' is not accepted", detail)
    section = (re.search(r"Subcommand '(\w+)' does not accept option '(\w+)(\.[\w.]+)'", detail)
               or re.search(r"^()Option '(\w+)(\.[\w.]+)' is not accepted", detail))
    if unknown and parser is not None:  # the options of the command (flattened: --trainer.max_epochs)
        known = [f"--{key}" for key in parser.get_defaults().keys()]
        choices, given, prefix = known, unknown.group(1), ""
    elif section and parser is not None:  # a config file's top-level key (`modle:`): the verb's own sections
        by_verb = getattr(getattr(parser, "_subcommands_action", None), "_name_parser_map", {})  # jsonargparse 4.53
        named = [by_verb[section.group(1)]] if section.group(1) in by_verb else list(by_verb.values()) or [parser]
        sections = sorted({key.split(".", 1)[0] for verb in named for key in verb.get_defaults().keys()})
        close = difflib.get_close_matches(section.group(2), sections, n=1)
        return f"; did you mean {close[0]}{section.group(3)}?" if close else ""
    elif option and classes:
        owner, given = classes[-1], option.group(1)
        if renamed_for(owner).get(given):  # a recipe older than a rename
            return f"; its name is now {renamed_for(owner)[given]}"
        prefix = f"--{keys[0]}.init_args." + "".join(f"{k}." for k in keys[1:])
        # the class's own arguments, and (given flat) the fields of its blocks: glimpse_szie -> network.glimpse_dim
        named = {name: name for name in _names_in(owner, lambda cls: list(inspect.signature(cls).parameters))}
        if len(keys) == 1:
            named.update({path.rsplit(".", 1)[-1]: path for path in _names_in(owner, lambda c: list(block_defaults(c)))
                          if path.rsplit(".", 1)[-1] not in named})
        close = difflib.get_close_matches(given, list(named), n=1)
        return f"; did you mean {prefix}{named[close[0]]}?" if close else ""
    elif re.search(r"has no attribute|No module named", detail) and classes:
        module, _, given = classes[-1].rpartition(".")
        choices, prefix = _names_in(module, lambda mod: [n for n in dir(mod) if n[:1].isupper()], True), f"{module}."
    else:
        return ""
    close = difflib.get_close_matches(given, choices, n=1)
    return f"; did you mean {prefix}{close[0]}?" if close else ""


def _names_in(dotted: str, names, is_module: bool = False) -> list[str]:
    """`names(obj)` of one of our classes or modules (for a did-you-mean), or none."""
    module, _, attribute = dotted.rpartition(".")
    if not dotted.startswith("zoo."):
        return []
    try:
        return names(importlib.import_module(dotted) if is_module else getattr(importlib.import_module(module), attribute))
    except (ImportError, AttributeError, TypeError, ValueError):
        return []


# ----------------------------------------------------------------------------- the CLI
class SaveConfigToRunDir(SaveConfigCallback):
    """The resolved config, a recipe (runs.as_recipe), saved as <default_root_dir>/config.yaml and logged."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.already_saved:
            return
        if trainer.is_global_zero:
            recipe = runs.as_recipe(self.config)
            if stage == "fit":  # validate, test and predict read a run, never write it (zoo.training.verbs)
                atomic_write_bytes(Path(trainer.default_root_dir) / self.config_filename,
                                   self.parser.dump(recipe, skip_unset=False).encode())
            for logger in trainer.loggers:
                logger.log_hyperparams({"config": recipe.as_dict()})
        self.already_saved = trainer.strategy.broadcast(True)


class ZooCLI(LightningCLI):
    def __init__(self, *args, **kwargs):
        self._argv = list(kwargs["args"])
        super().__init__(*args, parser_class=ZooArgumentParser, **kwargs)

    def add_arguments_to_parser(self, parser):
        # built here, not by LightningCLI, so that `enable_checkpointing: false` leaves it out
        parser.add_class_arguments(ZooCheckpoint, "checkpoint", fail_untyped=False, instantiate=False,
                                   sub_configs=True)
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
        parser.add_argument("--accel", type=Literal[MODES], default="auto",
                            help="speed, the run's choice (zoo.models.accel): auto | eager | compile | reduce-overhead")

    def _add_subcommands(self, parser, **kwargs) -> None:
        super()._add_subcommands(parser, **kwargs)
        # the verbs' list in --help: their own first sentences, not the Trainer methods' (cut short)
        for action in getattr(parser._subcommands_action, "_choices_actions", ()):  # jsonargparse 4.53
            if action.dest in verbs.HELP:
                action.help = verbs.SHORT_HELP[action.dest]

    def _prepare_subcommand_parser(self, klass, subcommand: str, **kwargs):
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        verbs.add_arguments(parser, subcommand)  # predict's --predictions
        return parser

    def _parse_ckpt_path(self) -> None:
        # LightningCLI's (2.6.6) would merge the checkpoint's hyperparameters and build the class the
        # file names; here the file is checked against the recipe before anything is built
        subcommand = self.config.get("subcommand")
        if subcommand:  # the resumed weights are checked against the model once it is built (_preflight)
            self._resume_state = runs.check_resume(self.config[subcommand], self._argv, fitting=subcommand == "fit")

    def before_instantiate_classes(self) -> None:
        """Link what the data decides into the model; a fine-tune recipe from random weights says so."""
        config = self.config[self.subcommand]
        data, model = config.get("data"), config.get("model")
        if not hasattr(data, "class_path") or not hasattr(model, "init_args"):
            return
        if registry.is_allowed(data.class_path, "data") and registry.is_allowed(model.class_path, "model"):
            registry.link_data(registry.resolve_class(model.class_path), model.init_args,
                               registry.resolve_class(data.class_path, "data"), dict(data.init_args),
                               with_names=False)
        if config.get("init_vocab") == "release" and not config.get("init_from") and not config.get("ckpt_path"):
            raise UserError("--init_vocab release takes the vocabulary of the --init_from weights: give --init_from "
                            "NAME|PATH|URL too (or drop --init_vocab)")
        if config.get("init_vocab") == "release" and config.get("init_from"):
            vocab = ((InitFrom.source_config(config.init_from, config.get("sha256")) or {}).get("init_args") or {}).get("vocab")
            if not vocab or "vocab" not in model.init_args or "vocab" not in data.init_args:
                raise UserError(f"--init_vocab release: {config.init_from} is not a captioner with a vocabulary, "
                                "or this config's data has none to replace")
            if not isinstance(vocab, list) or not all(isinstance(w, str) and w for w in vocab) or len(set(vocab)) != len(vocab):
                raise UserError(f"--init_vocab release: {config.init_from}'s vocabulary is not a list of distinct words")
            model.init_args["vocab"] = data.init_args["vocab"] = list(vocab)
        registry.check_run_memory(data, model)  # before anything is built (zoo.guards.budget)
        backbone = model.init_args.get("backbone")
        weights = any(model.init_args.get(k) or getattr(backbone, k, None) for k in ("pretrained", "pretrained_file"))
        if any(FINETUNE_RECIPE in Path(str(r)).stem for r in config.get("config") or []) and not weights \
                and not config.get("init_from"):
            log.warning("a fine-tune recipe is starting from RANDOM weights: give --init_from NAME, or "
                        "--model.init_args.pretrained true (online) / --model.init_args.pretrained_file PATH")

    def instantiate_trainer(self, **kwargs):
        """The trainer with atomic checkpoints, the run's speed, without the callbacks the user's flags
        switch off, and one line per epoch where no terminal shows a bar."""
        run = self.config_init[self.subcommand]
        config = {**run.get("trainer", {}), **kwargs}
        if self.subcommand == "fit":
            self._preflight(run, Path(config.get("default_root_dir") or os.getcwd()))
        off = tuple(kind for kind, flag in ((ProgressBar, "enable_progress_bar"), (ModelCheckpoint, "enable_checkpointing"))
                    if config.get(flag) is False) + ((LearningRateMonitor,) if config.get("logger") in (False, None, []) else ())
        callbacks = [c for c in config.get("callbacks") or [] if not isinstance(c, off)] + [Accelerate(run.get("accel"))]
        if ModelCheckpoint not in off:
            callbacks.append(ZooCheckpoint(**run["checkpoint"].as_dict()))
        callbacks = verbs.callbacks(self.subcommand, run, self.model, callbacks)
        if ProgressBar in off or not sys.stdout.isatty() and any(isinstance(c, RichProgressBar) for c in callbacks):
            # Rich draws nothing without a terminal (a log, CI, `| tee`): report each epoch instead
            callbacks = [c for c in callbacks if not isinstance(c, (RichProgressBar, EpochSummary))] + [EpochSummary()]
            config["enable_progress_bar"] = False
        if config.get("enable_model_summary") is not False and not any(isinstance(c, ModelSummary) for c in callbacks):
            # Lightning's summary less a FLOPs count it cannot make (ZooModelSummary); the flag off, or
            # Lightning adds its own beside it with a line saying so
            callbacks, config["enable_model_summary"] = [*callbacks, ZooModelSummary()], False
        try:
            return super().instantiate_trainer(**{**config, "callbacks": callbacks,
                                                  "plugins": config.get("plugins") or [AtomicCheckpointIO()]})
        except (TypeError, ValueError, MisconfigurationException) as exc:
            raise UserError(f"trainer: {str(exc).splitlines()[0]}") from None

    def _preflight(self, run, root: Path) -> None:
        """What ends a bad run before the trainer and W&B start: the data, the run folder, --init_from."""
        runs.check_resume_weights(self.model, *(getattr(self, "_resume_state", None) or (None, None)))
        data, hparams = self.datamodule, getattr(self.datamodule, "hparams", {})
        for key in ("batch_size", "eval_batch_size"):
            value = hparams.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise UserError(f"data.init_args.{key} must be a positive integer, got {value!r}")
        if (hparams.get("num_workers") or 0) < 0:
            raise UserError(f"data.init_args.num_workers must be >= 0, got {hparams.num_workers}")
        if data is not None:
            data.prepare_data()  # our data modules build or read their files here and in setup,
            data.setup("fit")    # idempotently: a missing file is reported now, in one line
            check_batches(data)
            if hasattr(data, "summary") and runs.launching_process():
                print(f"data: {data.summary()}", flush=True)
        if run.get("init_from"):
            self._init_from = InitFrom.prepare(run["init_from"], self.model, run.get("sha256"))
        if runs.launching_process():  # last: the run's first write, held until the run ends (main)
            runs.claim(root, resume=run.get("ckpt_path"), command=[PROG, *self._argv])

    def before_fit(self) -> None:
        if getattr(self, "_init_from", None) is not None:
            self.trainer.callbacks.append(self._init_from)


def check_batches(data) -> None:
    """A training loader that makes no batch (an empty split, or fewer examples than a `batch_size`
    that drops the last partial batch) would end the run at once with exit 0: refused in one line."""
    datasets = getattr(data, "datasets", None)  # our data modules' splits, built by setup
    split = datasets.get("train") if isinstance(datasets, dict) else None
    if split is not None and hasattr(split, "__len__") and not len(split):  # a shuffling loader refuses to exist
        raise UserError(f"data: the training split is empty ({type(data).__name__}): no step would train")
    loader = data.train_dataloader()
    try:
        if len(loader):
            return
        count = len(loader.dataset)
    except TypeError:  # an iterable without a length: nothing to say before it runs
        return
    batch_size = getattr(data, "hparams", {}).get("batch_size", getattr(loader, "batch_size", None))
    raise UserError(f"data.init_args.batch_size {batch_size} is more than the {count} training example(s), and "
                    f"{type(data).__name__} drops a last partial batch: no step would train; give "
                    f"--data.init_args.batch_size {count} or less, or more training data")


def _user_error(exc: BaseException | None) -> str | None:
    """The one line of the UserError or the machine's OSError behind `exc`, following its causes."""
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
    _finish_wandb()
    print(f"{PROG}: error: {printable(message)}", file=sys.stderr)
    sys.exit(code)


def main(args: list[str] | None = None, prog: str = "train.py") -> None:
    global PROG
    PROG = prog
    one_line_warnings()
    quiet_lightning()
    # notices about what main() and LightningCLI pass, not what a user can change
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
    warnings.filterwarnings("ignore", message=r"(?s).*skip_none parameter was deprecated")
    # a frozen, pretrained encoder is in eval mode on purpose (its batch norm statistics stay)
    warnings.filterwarnings("ignore", message=r".*module\(s\) in eval mode at the start of training")
    base = {"default_config_files": [recipe_args.BASE_CONFIG]}
    try:
        check_environment(logging=True)
        argv = recipe_args.prepare(sys.argv[1:] if args is None else args)
        ZooCLI(ZooModule, LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
               parser_kwargs={"prog": PROG, "description": verbs.DESCRIPTION, **{verb: {**base, "description": text} for verb, text in verbs.HELP.items()}},
               save_config_callback=SaveConfigToRunDir, save_config_kwargs={"overwrite": True},
               args=argv)
    except (SIGTERMException, KeyboardInterrupt) as exc:
        _stopped("SIGTERM" if isinstance(exc, SIGTERMException) else "Ctrl-C")
    except SystemExit as exc:  # Lightning ends a Ctrl-C'd run with sys.exit(1) after saving
        if ZooCheckpoint.interrupted_by == "KeyboardInterrupt" and exc.code == 1:
            _stopped("Ctrl-C")
        raise
    except MisconfigurationException as exc:  # Lightning's "the settings contradict each other"
        _fail(str(exc).splitlines()[0])
    except Exception as exc:  # jsonargparse wraps errors raised while instantiating classes
        user_error = _user_error(exc)
        if user_error is None:
            raise
        _fail(user_error)
    finally:
        runs.release()  # the run folder, for a next run in this process (a notebook, a test)
    _finish_wandb()


def _stopped(by: str) -> None:
    saved = ZooCheckpoint.interrupted_path
    _fail(f"stopped by {by}: " + (f"saved {saved}; resume with --ckpt_path last" if saved else "no checkpoint was saved"),
          143 if by == "SIGTERM" else 130)


def _finish_wandb() -> None:
    """Close the W&B run explicitly, so the offline run directory is complete for `wandb sync`."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()


if __name__ == "__main__":  # python -m zoo.training.train
    main(prog="python -m zoo.training.train")
