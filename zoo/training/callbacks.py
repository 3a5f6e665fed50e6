"""Training pieces every family shares: the W&B logger (offline by default), crash-safe checkpoints,
fine-tuning from released weights, speed, progress lines, and the attention figures at validation."""
from __future__ import annotations

import difflib
import logging
import os
import time
from pathlib import Path

import lightning as L
import numpy as np
import torch
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol
from lightning.pytorch.callbacks import ModelCheckpoint, ModelSummary, RichModelSummary
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.exceptions import SIGTERMException

from zoo.guards.errors import UserError
from zoo.guards.writes import atomic_save_image, replacing, share_file, sweep_stale
from zoo.weights import hub

OFFLINE_MODES = ("offline", "dryrun", "disabled")


class ZooWandbLogger(WandbLogger):
    """WandbLogger that needs no account: offline unless WANDB_MODE=online (`log_model` then off), its
    `save_dir` made when the W&B run starts, so nothing is written before the run claims its folder."""

    def __init__(self, project: str = "attention-zoo", save_dir: str = ".", name: str | None = None,
                 log_model: bool = False, **kwargs):
        offline = os.environ.get("WANDB_MODE", "offline").lower() in OFFLINE_MODES
        kwargs.pop("offline", None)
        super().__init__(project=project, save_dir=save_dir, name=name, offline=offline,
                         log_model=log_model and not offline, **kwargs)
        if self._wandb_init.get("anonymous") is None:
            self._wandb_init.pop("anonymous", None)  # an unset key W&B warns about at every start

    @property
    @rank_zero_experiment
    def experiment(self):
        if self._experiment is None and self._save_dir:
            Path(self._save_dir).mkdir(parents=True, exist_ok=True)  # W&B would fall back to /tmp without it
        return super().experiment


class AtomicCheckpointIO(TorchCheckpointIO):
    """Checkpoints written to a temporary beside them, synced, then renamed over the target: a kill
    or a full disk mid-write leaves the previous one intact (zoo.guards.writes.replacing)."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        if storage_options is not None or not _is_local_file_protocol(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        sink = None
        try:
            with replacing(path) as tmp:
                with open(tmp, "xb") as f:
                    sink = _WriteErrors(f)
                    torch.save(checkpoint, sink)
                    f.flush()
                    os.fsync(f.fileno())
        except BaseException as exc:
            # torch's zip writer turns an error inside write() (a full disk, Ctrl-C) into its own
            # "unexpected pos" RuntimeError: raise what really happened, for one clear line
            real = sink.error if sink is not None else None
            if real is not None and real is not exc:
                if isinstance(real, OSError) and real.filename is None:
                    real.filename = str(path)
                raise real from None
            raise

    def remove_checkpoint(self, path) -> None:
        super().remove_checkpoint(path)
        if _is_local_file_protocol(path):
            sweep_stale(path)  # and what a killed save of it left


class _WriteErrors:
    """A file for torch.save that remembers the exception its write() raised."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except BaseException as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.f.flush()


class ZooCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that keeps the best on validation and rewrites `last.ckpt` after every epoch's
    validation (Lightning 2.6's `save_last` lags after a non-improving epoch), and where an
    interrupted run (SIGTERM, Ctrl-C) stopped; each checkpoint records its run and W&B run. When the
    epoch's validation made a new best, best and last hold the same step's weights: they are stored
    once (the best file becomes a hard link of last.ckpt)."""

    #: where the last interrupted run saved its checkpoint (read by train.py for its message)
    interrupted_path: str | None = None
    interrupted_by: str | None = None  # "SIGTERMException" or "KeyboardInterrupt"
    _stopping_by: str | None = None

    def __init__(self, *args, write_last: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.write_last = write_last
        self._best_saved_at: tuple[str, int] | None = None  # (file, global step) of the latest top-k save

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        super()._save_checkpoint(trainer, filepath)
        self._best_saved_at = (filepath, trainer.global_step)

    def _last_path(self) -> str:
        return os.path.join(self.dirpath, f"{self.CHECKPOINT_NAME_LAST}.ckpt")

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if getattr(self, "_validate_first", False):
            # resumed from a save cut off in validation, which Lightning would skip: validate it now
            self._validate_first = False
            trainer.validating = True
            trainer.fit_loop.epoch_loop.val_loop.run()
            trainer.training = True
        super().on_train_epoch_end(trainer, pl_module)
        if self.write_last and self.dirpath and not trainer.fast_dev_run:
            trainer.save_checkpoint(self._last_path())  # the full training state (optimizer, epoch)
            self._share_with_best(trainer)

    def _share_with_best(self, trainer) -> None:
        """The best checkpoint saved at this step becomes last.ckpt's bytes: the same weights, and the
        epoch's end state, which resumes as last.ckpt does. The next save of last.ckpt renames a new
        file over its name; the best keeps these bytes."""
        path, step = self._best_saved_at or (None, None)
        if (step == trainer.global_step and path == self.best_model_path and trainer.is_global_zero
                and _is_local_file_protocol(path) and os.path.isfile(path)):
            share_file(self._last_path(), path)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        from zoo.training.runs import run_id

        run = checkpoint.setdefault("zoo_run", {})
        run["run_dir"] = str(Path(trainer.default_root_dir).resolve())  # whose checkpoint it is (zoo.training.runs)
        claimed = run_id(trainer.default_root_dir)  # the run that claimed the folder: it continues only there
        if claimed:
            run["run_id"] = claimed
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger) and logger.version:
                run["wandb_id"] = str(logger.version)
        if self._stopping_by:
            run["interrupted"] = self._stopping_by  # saved where an interrupted run stopped
            run["interrupted_in"] = "validation" if trainer.validating else "training"

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        super().on_load_checkpoint(trainer, pl_module, checkpoint)
        run = checkpoint.get("zoo_run") if isinstance(checkpoint.get("zoo_run"), dict) else {}
        self._validate_first = run.get("interrupted_in") == "validation"

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if not isinstance(exception, (SIGTERMException, KeyboardInterrupt)) or not self.dirpath \
                or trainer.state.fn != "fit" or trainer.sanity_checking:
            return
        self._stopping_by = ZooCheckpoint.interrupted_by = type(exception).__name__
        try:
            trainer.save_checkpoint(self._last_path())  # the full training state (optimizer, epoch)
            ZooCheckpoint.interrupted_path = self._last_path()
        finally:
            self._stopping_by = None


class InitFrom(L.Callback):
    """Fine-tuning: weights (no optimizer state) loaded when fit starts; `prepare` checks them before."""

    def __init__(self, state: dict[str, torch.Tensor], source: str, config: dict | None = None):
        self.state, self.source, self.config = state, source, config

    @staticmethod
    def _load(source: str, sha256: str | None = None) -> tuple[dict, dict | None]:
        """The weights and zoo config of a release name, a file or a URL."""
        if not hub.is_url(source) and not Path(source).exists() and source in hub.manifest():
            return hub.load_weights(hub.fetch_release(source))
        if not hub.is_url(source) and not Path(source).is_file():
            released = ", ".join(sorted(hub.manifest())) or "none"
            close = difflib.get_close_matches(source, list(hub.manifest()), n=1)
            hint = f"; did you mean {close[0]}?" if close else f" (releases: {released})"
            raise UserError(f"--init_from {source}: no such file or release{hint}")
        return hub.load_weights(hub.fetch(source, sha256))

    @classmethod
    def source_config(cls, source: str, sha256: str | None = None) -> dict | None:
        """The zoo config the --init_from source was trained with (its hyperparameters, vocabulary)."""
        return cls._load(source, sha256)[1]

    @classmethod
    def prepare(cls, source: str, model, sha256: str | None = None) -> "InitFrom":
        from zoo.models.base import class_path

        state, config = cls._load(source, sha256)
        expected = class_path(model)
        if config and config.get("class_path") != expected:
            raise UserError(f"--init_from {source}: it holds a {config.get('family', '?')} model "
                            f"({config.get('class_path')}); this run trains {expected}")
        return cls(state, source, config)

    def on_fit_start(self, trainer, pl_module) -> None:
        """The weights, adapted to a new label set or vocabulary (zoo.registry.adapt_state_dict)."""
        from zoo.registry import adapt_state_dict

        hp = pl_module.hparams
        released = (self.config or {}).get("init_args") or {}
        new_head = "num_classes" in hp and released.get("num_classes") not in (None, hp.num_classes)
        state = adapt_state_dict(pl_module, self.state, self.config, source=f"--init_from {self.source}",
                                 new_head=new_head)
        pl_module.load_state_dict(state)
        names = getattr(trainer.datamodule, "class_names", None)
        if new_head and "class_names" in hp and names and len(names) == hp.num_classes:
            hp.class_names = list(names)
        self.state = {}


class Accelerate(L.Callback):
    """`--accel` (zoo.models.accel), given to the model at setup: the run's option, never in a checkpoint."""

    def __init__(self, mode: str = "auto"):
        from zoo.models.accel import check_mode

        self.mode = check_mode(mode)

    def setup(self, trainer, pl_module, stage: str) -> None:
        pl_module.accel.request(self.mode)


class ZooModelSummary(ModelSummary):
    """Lightning's model summary at the start of `fit` (its Rich table where Rich is installed, as
    Lightning's default), less the FLOPs column and total where it counted none: Lightning counts
    FLOPs only by a forward pass of the model's `example_input_array`, which no family sets (a batch
    of its input size, run before training), and would print "Total FLOPs: 0". `zoo info NAME` gives
    a model's GMACs per image."""

    def summarize(self, summary_data, total_parameters, trainable_parameters, model_size, total_training_modes,
                  total_flops, **kwargs) -> None:
        from lightning.pytorch.utilities.imports import _RICH_AVAILABLE
        from lightning.pytorch.utilities.model_summary.model_summary import (
            _format_summary_table, get_formatted_model_size, get_human_readable_count)

        lightning = RichModelSummary if _RICH_AVAILABLE else ModelSummary
        if total_flops:
            return lightning.summarize(summary_data, total_parameters, trainable_parameters, model_size,
                                       total_training_modes, total_flops, **kwargs)
        columns = [column for column in summary_data if column[0] != "FLOPs"]
        if not _RICH_AVAILABLE:  # Lightning's plain table; its last line is the FLOPs total
            table = _format_summary_table(total_parameters, trainable_parameters, model_size, total_training_modes,
                                          total_flops, *columns)
            logging.getLogger(ModelSummary.__module__).info("\n" + table.rsplit("\n", 1)[0])
            return
        from rich import get_console
        from rich.table import Table

        table = Table(header_style=kwargs.get("header_style", "bold magenta"))
        for name, _ in columns:  # as Lightning's: counts and sizes right-aligned
            table.add_column(name, style="dim" if name == " " else None,
                             justify="right" if name in ("Params", "Params per Device", "In sizes", "Out sizes") else "left",
                             no_wrap=name == "Name")
        for row in zip(*(values for _, values in columns)):
            table.add_row(*row)
        totals = Table.grid(expand=True)
        totals.add_column()
        for label, value in (("Trainable params", get_human_readable_count(int(trainable_parameters))),
                             ("Non-trainable params", get_human_readable_count(int(total_parameters - trainable_parameters))),
                             ("Total params", get_human_readable_count(int(total_parameters))),
                             ("Total estimated model params size (MB)", get_formatted_model_size(model_size)),
                             ("Modules in train mode", total_training_modes["train"]),
                             ("Modules in eval mode", total_training_modes["eval"])):
            totals.add_row(f"[bold]{label}[/]: {value}")
        get_console().print(table)
        get_console().print(totals)


class EpochSummary(L.Callback):
    """One line per epoch on stdout (step, metrics, time) where no terminal shows a progress bar."""

    def __init__(self):
        self._started = None

    def on_train_start(self, trainer, pl_module) -> None:
        self._started = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero or trainer.sanity_checking:
            return
        shown = {k: float(v) for k, v in sorted(trainer.callback_metrics.items())
                 if k.startswith(("train/", "val/")) and getattr(v, "numel", lambda: 1)() == 1 and "step" not in k}
        metrics = "  ".join(f"{k} {v:.4g}" for k, v in shown.items())
        elapsed = time.perf_counter() - (self._started or time.perf_counter())
        print(f"epoch {trainer.current_epoch + 1}/{trainer.max_epochs}  step {trainer.global_step}  {metrics}  "
              f"({elapsed:.0f} s)", flush=True)


class AttentionImageLogger(L.Callback):
    """After validation, log `model.attention_figures` of the first validation batch (rank 0): to W&B
    under `val/attention/<index>` (one example per key across epochs), else as PNGs in the run folder."""

    def __init__(self, every_n_epochs: int = 1, max_figures: int = 8):
        self.every_n_epochs, self.max_figures, self._batch = every_n_epochs, max_figures, None

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if batch_idx == 0 and dataloader_idx == 0:
            self._batch = batch

    def on_validation_epoch_end(self, trainer, pl_module):
        batch, self._batch = self._batch, None
        if batch is None or trainer.sanity_checking or not trainer.is_global_zero \
                or trainer.current_epoch % self.every_n_epochs:
            return
        from zoo.models.base import evaluating

        with evaluating(pl_module):
            figures = list(pl_module.attention_figures(batch).items())[: self.max_figures]
        if not figures:
            return
        step = trainer.global_step
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                # one key per figure: W&B shows one key's images at one size, and figures differ
                for index, (caption, figure) in enumerate(figures):
                    logger.log_image(key=f"val/attention/{index}", images=[np.asarray(figure)],
                                     caption=[caption], step=step)
                return
        out = Path(trainer.default_root_dir) / "figures" / f"step{step:07d}"
        from PIL import Image

        for index, (caption, figure) in enumerate(figures):
            image = figure if isinstance(figure, Image.Image) else Image.fromarray(np.asarray(figure))
            atomic_save_image(image, out / f"{index:02d}.png")
