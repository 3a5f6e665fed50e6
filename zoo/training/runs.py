"""What belongs to a training run, so that one run never writes into another (train.py asks).

`claim` gives a run folder to one run before it writes anything (`.zoo-run.json` names the run, the
flock on `.run.lock` holds the folder while it trains); `as_recipe` is a run's config.yaml (no
ckpt_path, no W&B run identity); `check_resume` holds a checkpoint's model, data and folder to this
command's before anything is built. Why each rule: docs/design-notes.md, "Runs".
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import shlex
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn, get_args, get_type_hints

from zoo.guards.errors import UserError, shorten
from zoo.guards.files import read_json
from zoo.guards.writes import atomic_write_bytes, check_writable, lock_note, try_lock
from zoo.hparams import current_init_args
from zoo.weights import hub

RUN_LOCK = ".run.lock"
CLAIM = ".zoo-run.json"  # names the run a folder belongs to (claim)
_CLAIM_BYTES = 64 * 1024  # a claim is a few hundred bytes; a larger file is not one
_RUN_ID = re.compile(r"[0-9a-f]{8,64}")
LAST = "last.ckpt"  # zoo.training.callbacks.ZooCheckpoint's, rewritten every epoch
#: data settings a resumed run may change (with one warning): how the data is served, not which
RESUME_MAY_CHANGE = ("batch_size", "eval_batch_size", "num_workers")
WANDB_IDENTITY = ("id", "version", "resume")  # which W&B run a logger writes: a run's, never a recipe's
WANDB_CLASSES = ("zoo.training.callbacks.ZooWandbLogger", "lightning.pytorch.loggers.WandbLogger",
                 "lightning.pytorch.loggers.wandb.WandbLogger")
_held: list[int] = []  # the locks of the run folders this process holds
_resumed: dict[str, dict] = {}  # checkpoint path (as check_resume verified it) -> its run (run_of)


def launching_process() -> bool:
    """True in the process that starts the run, not in the extra DDP ranks (they inherit RANK/LOCAL_RANK)."""
    rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK") or "0"
    return rank == "0" and os.environ.get("NODE_RANK", "0") == "0"


def claim(root: Path, resume: str | os.PathLike | None = None, command: Sequence[str] = ()) -> str:
    """Take run folder `root` for this run until `release()`, naming the run in it (with `command`)
    before it writes anything, or refuse in one line; `resume`: the checkpoint it continues. Its id."""
    root = Path(root)
    check_writable(root, "--trainer.default_root_dir", directory=True)
    run = (_resumed.get(str(resume)) or run_of(resume, hub.read_checkpoint(resume))) if resume else None
    training = holder(root)
    if training:
        raise _in_use(root, training)
    _check_folder(root, resume, run)  # reading only: a refused run leaves no trace
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = try_lock(root / RUN_LOCK)
    except OSError as exc:
        raise UserError(f"--trainer.default_root_dir {root}: cannot write there ({exc.strerror or exc})") from None
    if lock is None:
        raise _in_use(root, lock_note(root / RUN_LOCK) or "?")
    try:
        _check_folder(root, resume, run)  # again, under the lock: a run that started there meanwhile
        claimed = read_claim(root)
        if run is not None and claimed is not None and (claimed["run_id"] == run["run_id"] or _entries(root)):
            run_id = claimed["run_id"]  # its own folder: the run goes on under its claim
        else:  # a new run; or a resumed one in a folder without a claim (a zoo's before claims) or its files
            run_id = (run or {}).get("run_id") or secrets.token_hex(6)
            created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            atomic_write_bytes(root / CLAIM, (json.dumps({"run_id": run_id, "created": created,
                                                          "command": shlex.join(map(str, command))}, indent=1)
                                              + "\n").encode())
    except BaseException:
        os.close(lock)
        raise
    _held.append(lock)
    return run_id


def _in_use(root: Path, owner: str) -> UserError:
    return UserError(f"--trainer.default_root_dir {root} is in use by another training run (pid {owner}); "
                     "give this run its own directory")


def read_claim(root: Path) -> dict | None:
    """The claim of run folder `root` (`run_id`, `created`, `command`), or None; not a zoo claim: UserError."""
    path = Path(root) / CLAIM
    if not os.path.lexists(path):
        return None
    claimed = read_json(path, str(path), expect=dict, max_bytes=_CLAIM_BYTES)
    if not isinstance(claimed.get("run_id"), str) or not _RUN_ID.fullmatch(claimed["run_id"]):
        raise UserError(f"{path}: not a zoo run's claim (no run_id)")
    return claimed


def run_id(root: Path) -> str | None:
    """The id of the run that claimed folder `root` (its checkpoints carry it), or None."""
    try:
        claimed = read_claim(root)
    except UserError:
        return None
    return claimed["run_id"] if claimed else None


def run_of(path: Path, checkpoint: dict) -> dict:
    """Which run checkpoint `path` is: `run_id` (its run's claim; None before claims) and `run_dir`
    (the folder that saved it, or the one above its `checkpoints/`; None where nothing says)."""
    saved = checkpoint.get("zoo_run") if isinstance(checkpoint.get("zoo_run"), dict) else {}
    found, path = saved.get("run_id"), Path(path).resolve()
    owner = saved.get("run_dir") if isinstance(saved.get("run_dir"), str) and saved["run_dir"] else None
    if owner is None and path.parent.name == "checkpoints":
        owner = str(path.parent.parent)
    return {"run_id": found if isinstance(found, str) and _RUN_ID.fullmatch(found) else None,
            "run_dir": owner, "path": str(path)}


def _entries(root: Path) -> list[str]:
    """What folder `root` holds besides a claim and the run lock (nothing where it does not exist)."""
    try:
        return sorted(entry.name for entry in os.scandir(root) if entry.name not in (CLAIM, RUN_LOCK))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _whose(claimed: dict) -> str:
    return f"run {claimed['run_id']}, started {shorten(claimed.get('created', '?'), 40)}"


def _listing(names: list[str]) -> str:
    shown = ", ".join(shorten(name, 40) for name in names[:4])
    return shown + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _saved_it(root: Path, run: dict) -> bool:
    """Folder `root` saved the checkpoint of `run` (how a folder of a zoo before claims is known)."""
    here = Path(root).resolve()
    path = Path(run["path"])
    return (run["run_dir"] is not None and Path(run["run_dir"]).resolve() == here) or \
        (path.parent.name == "checkpoints" and path.parent.parent == here)


def _check_folder(root: Path, resume, run: dict | None) -> None:
    """Refuse unless this run may write in `root`: a new run (`run` None) an empty one, a resumed one its own."""
    if run is not None:
        return _check_owner(resume, run, root)
    names = _entries(root)
    try:
        claimed = read_claim(root)
    except UserError as exc:
        raise UserError(f"--trainer.default_root_dir {root} holds files the zoo did not write there ({exc}); "
                        "give this run a new directory") from None
    if not names:
        return  # new, empty, or claimed by a run that stopped before it wrote anything
    whose = _whose(claimed) if claimed else None
    if any((root / "checkpoints").glob("*.ckpt")):
        raise UserError(f"--trainer.default_root_dir {root} already holds an earlier run's checkpoints"
                        f"{f' ({whose})' if whose else ''}; resume it with --ckpt_path last, or give this run a "
                        "new directory")
    if whose:
        raise UserError(f"--trainer.default_root_dir {root} holds an earlier run's files ({whose}: "
                        f"{_listing(names)}) and no checkpoint to resume; give this run a new directory")
    raise UserError(f"--trainer.default_root_dir {root} holds files the zoo did not write there ({_listing(names)}); "
                    "a new run writes only into a new or empty directory: give it one")


def _check_owner(path, run: dict, root: Path) -> None:
    """A resumed checkpoint (`run`: run_of it) continues only in its own run's folder."""
    root = Path(root)
    owner = Path(run["run_dir"]) if run["run_dir"] else None
    if owner is not None and owner.resolve() != root.resolve():
        training = holder(owner)
        if training:
            raise UserError(f"--ckpt_path {path}: its run ({owner}) is still training (pid {training}); resuming it "
                            f"in {root} would make two processes continue one run and one W&B run. Wait for it to "
                            f"stop, or start a new run from its weights with --init_from {path}")
    reason = _why_not_its_folder(run, root)
    if reason is None:
        return
    where = f"the run in {owner}" if owner is not None else "another run"
    there = f"resume it there (--trainer.default_root_dir {owner}), or " if owner is not None else ""
    raise UserError(f"--ckpt_path {path} is a checkpoint of {where}, and {root} {reason}: a run continues only in "
                    f"its own folder; {there}start a new run from its weights with --init_from {path}")


def _why_not_its_folder(run: dict, root: Path) -> str | None:
    """Why `root` is not the folder of a resumed checkpoint's `run`, or None where it is."""
    names = _entries(root)
    try:
        claimed = read_claim(root)
    except UserError as exc:
        return f"holds files the zoo did not write there ({exc})"
    if claimed is not None and run["run_id"] and claimed["run_id"] == run["run_id"]:
        return None  # the folder whose claim names its run (wherever it has moved since)
    if claimed is not None and names:  # the claim of a run that wrote there: this one's, or another's
        if not run["run_id"] and _saved_it(root, run):
            return None  # a checkpoint from before claims, in the folder that saved it (claimed since)
        return f"is the folder of another run ({_whose(claimed)})"
    if _saved_it(root, run):
        return None  # the folder that saved it, written by a zoo before claims
    if not names and run["run_dir"] is None:
        return None  # a checkpoint that no run folder names: its run starts here
    return f"holds files that are not its run's ({_listing(names)})" if names else "is not its run's folder"


def holder(root: Path) -> str | None:
    """Who trains in run folder `root` right now (its lock's "pid on host"), or None."""
    return lock_note(Path(root) / RUN_LOCK)


def release() -> None:
    """Let go of the run folders this process holds: its run has ended."""
    while _held:
        os.close(_held.pop())


def _wandb_logger_args(config) -> list:
    trainer = config.get("trainer")
    loggers = trainer.get("logger") if trainer is not None else None
    loggers = loggers if isinstance(loggers, list) else [loggers]
    return [logger.init_args for logger in loggers
            if getattr(logger, "class_path", None) in WANDB_CLASSES and getattr(logger, "init_args", None) is not None]


def as_recipe(config):
    """A run's config as its config.yaml, a recipe: without `ckpt_path` and the W&B run identity."""
    config = config.clone()
    if "ckpt_path" in config:
        config["ckpt_path"] = None
    for init_args in _wandb_logger_args(config):
        for key in WANDB_IDENTITY:
            if key in init_args and key == "resume":
                del init_args[key]
            elif key in init_args:
                init_args[key] = None
    return config


def _given(argv: list[str]) -> list[str]:
    """The options a command line gives (`--key` of `--key value` and `--key=value`)."""
    return [arg.split("=", 1)[0] for arg in argv if arg.startswith("--")]


def drop_inherited_identity(config, argv: list[str]) -> None:
    """Drop `ckpt_path` and the W&B run identity a --config file (an older zoo's config.yaml) gives, warning once."""
    given = _given(argv)
    dropped = []
    if config.get("ckpt_path") and "--ckpt_path" not in given:
        dropped.append(f"ckpt_path {config['ckpt_path']}")
        config["ckpt_path"] = None
    if not any(arg.startswith("--trainer.logger") for arg in given):
        for init_args in _wandb_logger_args(config):
            for key in WANDB_IDENTITY:
                if init_args.get(key) is not None:
                    dropped.append(f"the W&B run's {key} {init_args[key]!r}")
                    init_args[key] = None
    if dropped:
        warnings.warn(f"--config gives {', '.join(dropped)} (a run's saved config, not a recipe): ignored, this "
                      "is a new run; resume a run with --ckpt_path", UserWarning)


# ----------------------------------------------------------------------------- resuming
def check_resume(config, argv: list[str], fitting: bool) -> tuple[Path, object] | None:
    """`--ckpt_path` of a parsed config, checked before anything is built: verified, its model, data and
    folder this run's; then the config resumes it. Returns its path and weights, or None."""
    drop_inherited_identity(config, argv)  # a resume is asked for, never inherited from a file
    if config.get("weights_only") is False:
        raise UserError("--weights_only false would let a checkpoint run code when it loads; refused")
    if "weights_only" in config:
        config["weights_only"] = True
    if config.get("ckpt_path") and config.get("init_from"):
        if "--init_from" in _given(argv):
            raise UserError("--ckpt_path resumes a run from its checkpoint, --init_from starts a new run from other "
                            "weights: drop --init_from to resume (or drop --ckpt_path to start a new run)")
        config["init_from"] = None  # a fine-tune's saved config: its checkpoint holds the weights already
    if not config.get("ckpt_path"):
        return None
    path = resume_path(str(config["ckpt_path"]), Path(config["checkpoint"]["dirpath"]), config.get("sha256"))
    checkpoint = read_resume_checkpoint(path)
    config["ckpt_path"] = str(path)
    model, data = config["model"], config.get("data")
    if data is not None and data.get("init_args") is not None:  # first: what the data decides, it names
        check_resume_data(checkpoint, data["class_path"], data["init_args"], path)
    check_resume_model(checkpoint, model["class_path"], model["init_args"], path, data)
    _resumed[str(path)] = run_of(path, checkpoint)  # for claim(), which checks again under the run lock
    if fitting and launching_process():  # DDP's other ranks find the folder claimed for their run
        _check_owner(path, _resumed[str(path)], Path(config["trainer"].get("default_root_dir") or os.getcwd()))
    if fitting:
        check_resume_budget(path, checkpoint, config["trainer"])
    run = checkpoint.get("zoo_run") if isinstance(checkpoint.get("zoo_run"), dict) else {}
    for init_args in _wandb_logger_args(config) if fitting and isinstance(run.get("wandb_id"), str) else []:
        if init_args.get("id") is None:  # the same W&B run goes on (validate, test, predict: a run of their own)
            init_args["id"], init_args["resume"] = run["wandb_id"], "allow"
    return path, checkpoint.get("state_dict")


def check_resume_budget(path: Path, checkpoint: dict, trainer) -> None:
    """A resume that would train no step (the checkpoint already holds `max_epochs` epochs or
    `max_steps` steps) is refused in one line instead of exiting 0 having done nothing."""
    node = checkpoint  # the epochs the fit loop finished; any level may be missing or of another type
    for key in ("loops", "fit_loop", "epoch_progress", "current", "processed"):
        node = node.get(key) if isinstance(node, dict) else None
    epoch = checkpoint.get("epoch")
    epochs = node if isinstance(node, int) else epoch + 1 if isinstance(epoch, int) else None
    steps, max_epochs, max_steps = checkpoint.get("global_step"), trainer.get("max_epochs"), trainer.get("max_steps")
    if isinstance(epochs, int) and isinstance(max_epochs, int) and 0 <= max_epochs <= epochs:
        raise UserError(f"--ckpt_path {path}: the run already trained {epochs} epoch(s) and "
                        f"trainer.max_epochs is {max_epochs}: nothing would train; raise --trainer.max_epochs "
                        "to go on")
    if isinstance(steps, int) and isinstance(max_steps, int) and 0 <= max_steps <= steps:
        raise UserError(f"--ckpt_path {path}: the run already trained {steps} step(s) and "
                        f"trainer.max_steps is {max_steps}: nothing would train; raise --trainer.max_steps to go on")


def check_resume_weights(model, path: Path | None, state) -> None:
    """A resumed checkpoint's weights must be this model's, refused before the run folder or W&B exist."""
    from zoo.registry import check_state_dict

    if path is None:
        return
    if not isinstance(state, dict):
        raise UserError(f"--ckpt_path {path}: not a training checkpoint (it holds no state_dict)")
    if getattr(model, "embed", True) is None:  # a captioner whose vocabulary comes at setup
        state = {k: v for k, v in state.items() if k not in model.card.vocab_keys}
    check_state_dict(model, state, source=f"--ckpt_path {path}")


def resume_path(ckpt: str, checkpoint_dir: Path, sha256: str | None = None) -> Path:
    """The local, verified file `--ckpt_path` names: 'last' (the run's last.ckpt), a path or a URL."""
    if ckpt in ("best", "hpc", "registry"):
        raise UserError(f"--ckpt_path {ckpt}: give a checkpoint file, a URL, or 'last'")
    if ckpt == "last":
        path = checkpoint_dir / LAST
        if not path.is_file():
            raise UserError(f"--ckpt_path last: no {LAST} in {checkpoint_dir} (is --trainer.default_root_dir the "
                            "run's folder?); leave --ckpt_path out to start a new run")
        return path
    if ckpt.endswith(".safetensors"):
        raise UserError(f"--ckpt_path {ckpt}: released weights are not a training checkpoint (no optimizer or "
                        "epoch to resume); start a new run from them with --init_from instead")
    if not hub.is_url(ckpt) and not Path(ckpt).is_file():
        raise UserError(f"--ckpt_path {ckpt}: no such checkpoint file")
    return hub.fetch(ckpt, sha256)


def newest_readable(directory: Path, skip: Path | None = None) -> Path | None:
    """The readable checkpoint in `directory` that got furthest (its recorded steps, not file times)."""
    furthest, best = None, -1
    for path in sorted(Path(directory).glob("*.ckpt")):
        if skip is not None and path.resolve() == Path(skip).resolve():
            continue
        try:
            step = int(hub.read_checkpoint(path).get("global_step", 0))
        except (UserError, TypeError, ValueError):
            continue
        if step > best:
            furthest, best = path, step
    return furthest


def read_resume_checkpoint(path: Path) -> dict:
    """The checkpoint to resume; an unreadable one names the newest readable one beside it."""
    try:
        return hub.read_checkpoint(path)
    except UserError as exc:
        if "refused" in str(exc):
            raise
        fallback = newest_readable(path.parent, skip=path)
        hint = (f"; the newest readable checkpoint is {fallback}: resume with --ckpt_path {fallback}"
                if fallback else "; no other readable checkpoint in that folder")
        raise UserError(f"cannot resume: {exc}{hint}") from None


def check_resume_model(checkpoint: dict, class_path: str, init_args, path: Path, data=None) -> None:
    """The checkpoint's model must be `class_path` with these `init_args` as the run builds them (what
    its `data` decides linked in; old names read in current ones). One left unset (None) is taken
    from the checkpoint: what the data filled in (a vocabulary), a block field its kind decided."""
    from zoo.registry import is_allowed, resolve_class

    saved = checkpoint.get("zoo") if isinstance(checkpoint.get("zoo"), dict) else {}
    hparams = checkpoint.get("hyper_parameters") or {}
    saved_class = saved.get("class_path") or hparams.get("_class_path")
    if saved_class and saved_class != class_path:
        raise UserError(f"--ckpt_path {path}: the checkpoint is a {saved_class}, but this config trains {class_path}")
    model_class = resolve_class(class_path) if is_allowed(class_path, "model") else None  # else LightningCLI refuses it
    given, built = _plain(init_args), _linked(model_class, init_args, data)
    for key, value in current_init_args(class_path, hparams).items():
        if key.startswith("_") or key not in built:
            continue
        here, there, block = built[key], _plain(value), _block_type(model_class, key)
        if here is None and there is not None:
            init_args[key] = value
        elif there is None and here != given[key]:
            continue  # the data's, linked in; a checkpoint from before its model kept it (class names)
        elif block is not None and isinstance(here, dict) and isinstance(there, dict):
            for field, (mine, theirs) in _block_fields(block, here, there).items():
                if mine is None and theirs is not None:
                    _set(init_args[key], field, theirs)
                elif mine != theirs:
                    _differs(f"{key}.{field}", mine, theirs, path)
        elif here != there:
            _differs(key, here, there, path)


def _set(block, field: str, value) -> None:
    """Set a field of a config's block (a jsonargparse Namespace, a dict or a dataclass)."""
    if hasattr(block, "__setitem__"):
        block[field] = value
    else:
        setattr(block, field, value)


def _differs(key: str, here, there, path: Path) -> NoReturn:
    def quoted(value):  # a name in quotes ('cosine'), a structure shortened
        return repr(value) if isinstance(value, str) and len(value) <= 80 else shorten(value, 80)

    raise UserError(f"--ckpt_path resumes the run it was saved from, but model.init_args.{key} differs "
                    f"({quoted(here)} here, {quoted(there)} in the checkpoint); to train with new "
                    f"hyperparameters start a new run with --init_from {path}")


def _block_fields(block: type, here: dict, there: dict) -> dict:
    """{field: (this config's value, the checkpoint's)} of a typed block, unstated fields at their defaults."""
    defaults = {f.name: _plain(f.default) if f.default is not dataclasses.MISSING else None
                for f in dataclasses.fields(block)}
    return {name: (here.get(name, default), there.get(name, default)) for name, default in defaults.items()}


def _linked(model_class: type | None, init_args, data) -> dict:
    """A plain copy of model `init_args` with what its `data` decides linked in, as checkpoints hold them."""
    from zoo.registry import is_allowed, link_data, resolve_class

    built = _plain(init_args)
    data_path = data.get("class_path") if data is not None else None
    if model_class is not None and isinstance(data_path, str) and is_allowed(data_path, "data"):
        link_data(model_class, built, resolve_class(data_path, "data"), _plain(data.get("init_args") or {}))
    return built


def _block_type(model_class: type | None, key: str) -> type | None:
    """The dataclass hyperparameter `key` is typed as (a `BackboneSpec` block), or None."""
    try:
        hint = get_type_hints(model_class.__init__).get(key) if model_class is not None else None
    except (NameError, TypeError):  # an annotation that does not resolve: compare as plain values
        return None
    return next((t for t in (hint, *get_args(hint)) if dataclasses.is_dataclass(t)), None)


def check_resume_data(checkpoint: dict, class_path: str, init_args, path: Path) -> None:
    """The data the run trains and validates on must be the checkpoint's (else it would validate on
    images it trained on); its paths may move, how it is served (`RESUME_MAY_CHANGE`) change with a warning."""
    from zoo.registry import resolve_class

    zoo_data = (checkpoint.get("zoo") or {}).get("data") if isinstance(checkpoint.get("zoo"), dict) else None
    saved = checkpoint.get("datamodule_hyper_parameters") or (zoo_data or {}).get("init_args") or {}
    if not isinstance(saved, dict) or not saved:
        return
    movable = set(resolve_class(class_path, "data").path_arguments) | {"cache"}
    for key, value in current_init_args(class_path, saved).items():  # saved under old names too
        if str(key).startswith("_") or key not in init_args or key in movable:
            continue
        current = init_args[key]
        if _plain(current) == _plain(value):
            continue
        if key in RESUME_MAY_CHANGE:
            warnings.warn(f"resuming with data.init_args.{key} {_plain(current)!r} (the checkpoint's run used "
                          f"{_plain(value)!r}): the schedule and the epoch length change", UserWarning)
            continue
        raise UserError(f"--ckpt_path resumes the run it was saved from, but data.init_args.{key} differs "
                        f"({shorten(_plain(current), 60)} here, {shorten(_plain(value), 60)} in the checkpoint): "
                        f"the run would train or validate on other data; start a new run with --init_from {path}")


def _plain(value):
    """A config value as plain data (a Namespace, Block or dataclass as a dict, tuples as lists)."""
    if hasattr(value, "as_dict") and callable(value.as_dict):  # jsonargparse's Namespace, a Block
        value = value.as_dict()
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
