"""Train any zoo model from a recipe with LightningCLI.

    python train.py fit --config configs/baseline/cnn_centered.yaml
    python train.py fit --config configs/baseline/cnn_centered.yaml --ckpt_path last   # resume
    python train.py fit --config ... --trainer.devices 2 --trainer.strategy ddp        # DDP
    python train.py fit --config ... --print_config

configs/base/trainer.yaml (W&B offline logger, progress bar, checkpointing) is applied first;
the recipe overrides it. Checkpoints go to <trainer.default_root_dir>/checkpoints (best on
validation + last.ckpt). The script is re-entrant: DDP re-executes it once per rank.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "offline")

from lightning.pytorch import LightningDataModule  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.cli import LightningCLI  # noqa: E402

from zoo.errors import UserError  # noqa: E402
from zoo.models.base import ZooModule  # noqa: E402

BASE_CONFIG = str(Path(__file__).resolve().parent / "configs" / "base" / "trainer.yaml")


class ZooCLI(LightningCLI):
    def add_arguments_to_parser(self, parser):
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.link_arguments("trainer.default_root_dir", "checkpoint.dirpath",
                              compute_fn=lambda root: str(Path(root) / "checkpoints"))


def main(args: list[str] | None = None) -> None:
    base = {"default_config_files": [BASE_CONFIG]}
    try:
        ZooCLI(ZooModule, LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
               parser_kwargs={"fit": base, "validate": base, "test": base, "predict": base},
               save_config_kwargs={"overwrite": True}, args=args)
    except UserError as exc:
        print(f"train.py: error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
