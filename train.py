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
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback  # noqa: E402

from zoo.callbacks import ZooCheckpoint  # noqa: E402
from zoo.errors import UserError  # noqa: E402
from zoo.models.base import ZooModule  # noqa: E402

BASE_CONFIG = str(Path(__file__).resolve().parent / "configs" / "base" / "trainer.yaml")


class SaveConfigToRunDir(SaveConfigCallback):
    """Write the full resolved config to <default_root_dir>/config.yaml (beside the checkpoints;
    LightningCLI's default is the logger's directory, which for W&B is the working directory),
    and log it to every logger, so a W&B run holds the trainer and data settings too."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.already_saved:
            return
        if trainer.is_global_zero:
            os.makedirs(trainer.default_root_dir, exist_ok=True)
            self.parser.save(self.config, os.path.join(trainer.default_root_dir, self.config_filename),
                             skip_none=False, overwrite=True, multifile=self.multifile)
            for logger in trainer.loggers:
                logger.log_hyperparams({"config": self.config.as_dict()})
        self.already_saved = trainer.strategy.broadcast(True)


class ZooCLI(LightningCLI):
    def add_arguments_to_parser(self, parser):
        parser.add_lightning_class_args(ZooCheckpoint, "checkpoint")
        parser.link_arguments("trainer.default_root_dir", "checkpoint.dirpath",
                              compute_fn=lambda root: str(Path(root) / "checkpoints"))


def main(args: list[str] | None = None) -> None:
    base = {"default_config_files": [BASE_CONFIG]}
    try:
        ZooCLI(ZooModule, LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
               parser_kwargs={"fit": base, "validate": base, "test": base, "predict": base},
               save_config_callback=SaveConfigToRunDir, save_config_kwargs={"overwrite": True}, args=args)
    except Exception as exc:  # jsonargparse wraps errors raised while instantiating classes
        user_error = _user_error(exc)
        if user_error is None:
            raise
        print(f"train.py: error: {user_error}", file=sys.stderr)
        sys.exit(2)
    _finish_wandb()


def _finish_wandb() -> None:
    """Close the W&B run explicitly, so the offline run directory is complete for `wandb sync`."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()


def _user_error(exc: BaseException | None) -> UserError | None:
    """The UserError behind `exc`, following its cause/context chain, or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, UserError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


if __name__ == "__main__":
    main()
