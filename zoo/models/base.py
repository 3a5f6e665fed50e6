"""What every zoo LightningModule shares: a family name, a self-describing checkpoint, and a
hook that feeds attention figures to the logger.

A family subclasses `ZooModule`, calls `self.save_hyperparameters()` in `__init__` with plain
values only (ints, floats, strings, bools, lists and dicts of those), and sets `family`.
Plain hyperparameters keep `torch.load(weights_only=True)` working on its checkpoints.
"""
from __future__ import annotations

from typing import Any

import lightning as L
import torch
import torch.nn.functional as F


def class_path(obj_or_cls: Any) -> str:
    cls = obj_or_cls if isinstance(obj_or_cls, type) else type(obj_or_cls)
    return f"{cls.__module__}.{cls.__qualname__}"


class ZooModule(L.LightningModule):
    #: Short family name ("baseline", "ram", "draw", "vit", "captioner"): the CLI uses it to
    #: refuse a checkpoint of the wrong family with a clear message.
    family: str = "zoo"

    # ------------------------------------------------------------------ checkpoints
    def zoo_config(self) -> dict:
        """Everything needed to rebuild this model (and its data) without the training script."""
        config: dict = {"family": self.family, "class_path": class_path(self),
                        "init_args": _init_args(self.hparams)}
        trainer = self._trainer
        datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
        if datamodule is not None:
            config["data"] = {"class_path": class_path(datamodule),
                              "init_args": _init_args(getattr(datamodule, "hparams", {}))}
        elif getattr(self, "_zoo_data_config", None):
            config["data"] = self._zoo_data_config
        return config

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["zoo"] = self.zoo_config()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        data = checkpoint.get("zoo", {}).get("data")
        if data:
            self._zoo_data_config = data

    # ------------------------------------------------------------------ visualisation
    def attention_figures(self, batch: Any) -> dict[str, Any]:
        """Return {caption: image (PIL.Image or HxWx3 uint8 array)} showing where the model looks
        on a few validation examples. `zoo.logging.AttentionImageLogger` logs these at validation.
        The default has nothing to show."""
        return {}

    # ------------------------------------------------------------------ helpers
    def speed_setup(self) -> None:
        """Optional speed switches shared by families (config keys `compile`, `channels_last`)."""
        if self.hparams.get("channels_last", False):
            self.to(memory_format=torch.channels_last)


class ClassifierModule(ZooModule):
    """Glue shared by plain image classifiers (the baselines, DRAW's attention classifier):
    cross-entropy, accuracy, the test error in percent, and Adam with an optional cosine schedule.
    Subclasses define `forward(images) -> logits [B, classes]` and keep `lr`, `weight_decay` and
    `cosine_schedule` in their hparams."""

    def _step(self, batch, stage: str):
        images, labels = batch
        logits = self(images)
        loss = F.cross_entropy(logits, labels)
        wrong = (logits.argmax(-1) != labels).float().mean()
        sync = stage != "train"  # epoch-level metrics are averaged over DDP ranks
        self.log(f"{stage}/loss", loss, prog_bar=stage != "train", sync_dist=sync)
        self.log(f"{stage}/acc", 1 - wrong, prog_bar=True, sync_dist=sync)
        if stage == "test":
            self.log("test/error_pct", 100 * wrong, sync_dist=True)
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._step(batch, "test")

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        if not self.hparams.cosine_schedule:
            return optimizer
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, self.trainer.max_epochs or 1))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}


def _init_args(hparams) -> dict:
    """Constructor arguments from hparams; LightningCLI adds bookkeeping keys like `_class_path`."""
    return _plain({k: v for k, v in dict(hparams).items() if not str(k).startswith("_")})


def _plain(value: Any) -> Any:
    """Hyperparameters as JSON-able plain values (tuples become lists)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"hyperparameter value {value!r} is not a plain value; keep hparams primitive "
                    "so that checkpoints load with weights_only=True")
