"""What belongs to a training run, so that one run never writes into another (train.py asks).

- A run folder (`trainer.default_root_dir`) is held by the process training in it: an flock on
  `<root>/.run.lock` for the process's life (the kernel's lock, seen from every PID namespace and,
  over NFS, every machine). A second run there is refused, and so is a new run in a folder that
  already holds an earlier run's checkpoints.
- A checkpoint belongs to the run folder that saved it (`zoo_run.run_dir` in the checkpoint; for
  older checkpoints, the folder above their `checkpoints/`). Resuming it in another folder says so
  in one warning; while its own run is still training, it is refused: two processes would write
  one run's checkpoints' history and one W&B run.
- A run's saved `config.yaml` is a recipe, not a resume: it never holds `ckpt_path` or the W&B run's
  identity (`id`, `version`, `resume`); those live in the checkpoints. A --config file that holds
  them anyway (one saved by an older zoo) has them dropped with one warning: resuming is asked for
  on the command line (`--ckpt_path`), never inherited from a file.
"""
from __future__ import annotations

import fcntl
import os
import socket
import warnings
from pathlib import Path

from zoo.errors import UserError
from zoo.io import check_writable

RUN_LOCK = ".run.lock"
WANDB_IDENTITY = ("id", "version", "resume")  # which W&B run a logger writes: a run's, never a recipe's
_held: list = []  # the lock files of the run folders this process holds


def claim(root: Path, resuming: bool) -> None:
    """Take run folder `root` for this process until `release()` (or its exit), or refuse in one
    line: in use by another run, or holding an earlier run's checkpoints."""
    check_writable(root, "--trainer.default_root_dir", directory=True)
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / RUN_LOCK, "a+")
    except OSError as exc:
        raise UserError(f"--trainer.default_root_dir {root}: cannot write there ({exc.strerror or exc})") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.seek(0)
        owner = lock.read().strip() or "?"
        lock.close()
        raise UserError(f"--trainer.default_root_dir {root} is in use by another training run (pid {owner}); "
                        "give this run its own directory") from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"{os.getpid()} on {socket.gethostname()}")
    lock.flush()
    checkpoints = root / "checkpoints"
    if not resuming and checkpoints.is_dir() and any(checkpoints.glob("*.ckpt")):
        lock.close()
        raise UserError(f"--trainer.default_root_dir {root} already holds an earlier run's checkpoints; "
                        "resume it with --ckpt_path last, or give this run a new directory")
    _held.append(lock)


def release() -> None:
    """Let go of the run folders this process holds: its run has ended."""
    while _held:
        _held.pop().close()


def holder(root: Path) -> str | None:
    """Who trains in run folder `root` right now (its lock file's "pid on host"), or None."""
    try:
        fd = os.open(Path(root) / RUN_LOCK, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        return os.pread(fd, 200, 0).decode(errors="replace").strip() or "?"
    except OSError:
        return None  # no locks on this file system: nothing to go by
    finally:
        os.close(fd)


def run_dir_of(path: Path, checkpoint: dict) -> Path | None:
    """The run folder that saved checkpoint `path`."""
    run = checkpoint.get("zoo_run") if isinstance(checkpoint.get("zoo_run"), dict) else {}
    if isinstance(run.get("run_dir"), str) and run["run_dir"]:
        return Path(run["run_dir"])
    path = Path(path).resolve()
    return path.parent.parent if path.parent.name == "checkpoints" else None


def check_resume_owner(path: Path, checkpoint: dict, root: Path) -> None:
    """Resuming checkpoint `path` in run folder `root`: fine in its own run's folder; refused while
    its run is training elsewhere; one warning when its run is elsewhere and stopped."""
    owner = run_dir_of(path, checkpoint)
    if owner is None or owner.resolve() == Path(root).resolve():
        return
    training = holder(owner)
    if training:
        raise UserError(f"--ckpt_path {path}: its run ({owner}) is still training (pid {training}); resuming it "
                        f"in {root} would make two processes continue one run and one W&B run. Wait for it to "
                        f"stop, or start a new run from its weights with --init_from {path}")
    warnings.warn(f"--ckpt_path {path} is a checkpoint of the run in {owner}: {root} continues that run (its "
                  f"epochs, its W&B run); --init_from {path} starts a new run from its weights instead", UserWarning)


def _wandb_logger_args(config) -> list:
    from zoo.callbacks import WANDB_CLASSES

    trainer = config.get("trainer")
    loggers = trainer.get("logger") if trainer is not None else None
    loggers = loggers if isinstance(loggers, list) else [loggers]
    return [logger.init_args for logger in loggers
            if getattr(logger, "class_path", None) in WANDB_CLASSES and getattr(logger, "init_args", None) is not None]


def as_recipe(config):
    """A copy of a run's config (a jsonargparse Namespace) to save as its config.yaml: without
    `ckpt_path` and the W&B run identity, so that `fit --config RUN/config.yaml` starts a new run."""
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


def drop_inherited_identity(config, argv: list[str]) -> None:
    """Drop `ckpt_path` and the W&B run identity where they came from a --config file rather than
    the command line (a run's config.yaml saved by an older zoo), with one warning."""
    given = [arg.split("=", 1)[0] for arg in argv if arg.startswith("--")]
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
