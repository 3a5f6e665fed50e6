"""Logging pieces shared by every family: the default W&B logger (offline unless WANDB_MODE says
otherwise) and a callback that logs each model's attention figures at validation."""
from __future__ import annotations

import os
import re
from pathlib import Path

import lightning as L
import numpy as np
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import WandbLogger

OFFLINE_MODES = ("offline", "dryrun", "disabled")


class ZooWandbLogger(WandbLogger):
    """WandbLogger that needs no account: offline under ./wandb unless WANDB_MODE=online.

    `wandb sync wandb/offline-run-*` uploads an offline run later. Model upload (`log_model`)
    is only possible online, so it is forced off offline."""

    def __init__(self, project: str = "attention-zoo", save_dir: str = ".", name: str | None = None,
                 log_model: bool = False, **kwargs):
        offline = os.environ.get("WANDB_MODE", "offline").lower() in OFFLINE_MODES
        kwargs.pop("offline", None)
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        super().__init__(project=project, save_dir=save_dir, name=name, offline=offline,
                         log_model=log_model and not offline, **kwargs)


class ZooCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that keeps the best on validation and also rewrites `last.ckpt` at the end
    of every training epoch, for `--ckpt_path last`.

    Lightning 2.6's `save_last=True` rewrites last.ckpt only in a step where a top-k checkpoint was
    also saved, so after a non-improving epoch last.ckpt would lag behind. Writing it here, after
    the parent's own end-of-epoch save (validation has run by then), means it holds the finished
    epoch (so a resume starts the next one cleanly) and the up-to-date best score. A separate
    callback could not do this: Lightning runs checkpoint callbacks after all others."""

    def __init__(self, *args, write_last: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.write_last = write_last

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self.write_last and self.dirpath and not trainer.fast_dev_run:
            trainer.save_checkpoint(os.path.join(self.dirpath, f"{self.CHECKPOINT_NAME_LAST}.ckpt"))


class AttentionImageLogger(L.Callback):
    """At the end of validation, ask the model where it looks on the first validation batch
    (`model.attention_figures(batch)`) and log the figures: to W&B when it is the logger, else as
    PNGs under the run's directory. Only rank 0 logs."""

    def __init__(self, every_n_epochs: int = 1, max_figures: int = 8):
        self.every_n_epochs = every_n_epochs
        self.max_figures = max_figures
        self._batch = None

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if batch_idx == 0 and dataloader_idx == 0:
            self._batch = batch

    def on_validation_epoch_end(self, trainer, pl_module):
        batch, self._batch = self._batch, None
        if batch is None or trainer.sanity_checking or not trainer.is_global_zero:
            return
        if trainer.current_epoch % self.every_n_epochs:
            return
        was_training = pl_module.training
        pl_module.eval()
        try:
            figures = dict(list(pl_module.attention_figures(batch).items())[: self.max_figures])
        finally:
            pl_module.train(was_training)
        if not figures:
            return
        step = trainer.global_step
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                # One key per figure: W&B shows the images of one key side by side at one size,
                # and the figures (a strip, a grid, overlays) differ in size.
                for caption, figure in figures.items():
                    logger.log_image(key=f"val/attention/{_slug(caption)}", images=[np.asarray(figure)],
                                     caption=[caption], step=step)
                return
        out = Path(trainer.default_root_dir) / "figures" / f"step{step:07d}"
        out.mkdir(parents=True, exist_ok=True)
        for i, (caption, figure) in enumerate(figures.items()):
            from PIL import Image

            image = figure if isinstance(figure, Image.Image) else Image.fromarray(np.asarray(figure))
            image.save(out / f"{i:02d}.png")


def _slug(text: str) -> str:
    """A figure's caption as a W&B key part: words, '/', '.', '-' kept, other runs become '_'."""
    return re.sub(r"[^\w/.-]+", "_", text).strip("_") or "figure"
