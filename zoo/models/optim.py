"""The one optimizer and learning-rate schedule factory every family uses: `configure(module,
params, optimizer, lr=..., schedule=...)` returns what `configure_optimizers` returns.

Schedules ("none", "cosine" per epoch to 0, "warmup_cosine" per step to `min_lr`) read the run's
horizon from the trainer whenever they are evaluated, and `refresh` re-evaluates them when training
starts, so a run resumed with a larger `max_epochs` stretches the decay (a `CosineAnnealingLR`
would restore its old `T_max` and train the extra epochs at rate 0). The optimizer's kernel follows
the device (`build_optimizer`): fused on CUDA, torch's default kernels on CPU, as the CPU releases
were trained.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch

from zoo.guards.errors import UserError

OPTIMIZERS = ("adam", "adamw", "sgd", "rmsprop")
SCHEDULES = ("none", "cosine", "warmup_cosine")
#: the schedules a recipe names in `lr_schedule` (warmup_cosine needs a warm-up that only ViT's recipe sets)
RECIPE_SCHEDULES = ("none", "cosine")
_CLASSES = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD,
            "rmsprop": torch.optim.RMSprop}
_FUSED = ("adam", "adamw", "sgd")  # torch has fused kernels for these (CPU and CUDA)


def fused_kernel(params: list[torch.Tensor], name: str) -> bool:
    """Whether `name` runs torch's fused kernel on `params` (an accelerator's, never the CPU's)."""
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    devices = set(_get_fused_kernels_supported_devices()) - {"cpu"}
    return (name in _FUSED and bool(params)
            and all(p.device.type in devices and torch.is_floating_point(p) for p in params))


def build_optimizer(params: Iterable, name: str = "adam", *, lr: float, weight_decay: float = 0.0,
                    betas: Iterable[float] = (0.9, 0.999), momentum: float = 0.9) -> torch.optim.Optimizer:
    """params: tensors or parameter groups (dicts), already on their device."""
    if name not in OPTIMIZERS:
        raise UserError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got '{name}'")
    params = list(params)
    kwargs: dict[str, Any] = {"lr": lr, "weight_decay": weight_decay}
    if name in ("adam", "adamw"):
        kwargs["betas"] = tuple(betas)
    elif name == "sgd":
        kwargs["momentum"] = momentum
    tensors = [p for item in params for p in (item["params"] if isinstance(item, dict) else [item])]
    if fused_kernel(tensors, name):
        kwargs["fused"] = True
    return _CLASSES[name](params, **kwargs)


def cosine_factor(module) -> Callable[[int], float]:
    """lr(epoch) / lr: a half cosine from 1 at epoch 0 to 0 at the last epoch of the run (the
    trainer's `max_epochs` now; 1 without a trainer)."""

    def factor(epoch: int) -> float:
        total = max(1, getattr(getattr(module, "_trainer", None), "max_epochs", None) or 1)
        return 0.5 * (1 + math.cos(math.pi * min(epoch, total) / total))

    return factor


def warmup_cosine_factor(module, warmup_epochs: float, floor: float) -> Callable[[int], float]:
    """lr(step) / lr: linear warm-up from 1/warmup to 1 over `warmup_epochs`, then a cosine from 1
    to `floor` at the run's last optimiser step, both in optimiser steps."""

    def horizon() -> tuple[int, int]:
        trainer = getattr(module, "_trainer", None)
        total = max(1, int(trainer.estimated_stepping_batches)) if trainer is not None else 1
        epochs = getattr(trainer, "max_epochs", None)
        batches = getattr(trainer, "num_training_batches", 1)  # inf until a plain Trainer(max_steps=...) fits
        per_epoch = total / epochs if epochs and epochs > 0 else max(1, batches if math.isfinite(batches) else total)
        return total, min(int(round(warmup_epochs * per_epoch)), total - 1)

    def factor(step: int) -> float:
        total, warmup = horizon()
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def check_schedule(name: str, owner: str) -> None:
    """Refuse, in one line and before anything is built, an `lr_schedule` no recipe may name."""
    if name not in RECIPE_SCHEDULES:
        raise UserError(f"{owner}: lr_schedule must be one of {', '.join(RECIPE_SCHEDULES)}, got {name!r}")


def build_schedule(optimizer: torch.optim.Optimizer, module, name: str = "none", *, warmup_epochs: float = 0.0,
                   min_lr: float = 0.0) -> dict | None:
    """A Lightning lr_scheduler config for `optimizer`, or None for schedule "none"."""
    if name not in SCHEDULES:
        raise UserError(f"lr schedule must be one of {', '.join(SCHEDULES)}, got '{name}'")
    if name == "none":
        return None
    if name == "cosine":
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_factor(module))
        interval = "epoch"
    else:
        first = optimizer.param_groups[0]
        base = float(first.get("initial_lr", first["lr"]))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine_factor(module, warmup_epochs,
                                                                                      min_lr / base))
        interval = "step"
    scheduler._zoo_schedule = True  # `refresh` re-evaluates it after a checkpoint restore
    return {"scheduler": scheduler, "interval": interval}


def refresh(scheduler) -> None:
    """Set a factory schedule's rates for its position and the run's current horizon (a restored
    checkpoint carries its own run's rates: 0 at the end of a finished cosine)."""
    if not getattr(scheduler, "_zoo_schedule", False):
        return
    for group, base, factor in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]


def configure(module, params: Iterable, optimizer: str = "adam", *, lr: float, weight_decay: float = 0.0,
              betas: Iterable[float] = (0.9, 0.999), momentum: float = 0.9, schedule: str = "none",
              warmup_epochs: float = 0.0, min_lr: float = 0.0):
    """What `configure_optimizers` returns: the optimizer alone, or with its schedule."""
    opt = build_optimizer(params, optimizer, lr=lr, weight_decay=weight_decay, betas=betas, momentum=momentum)
    scheduler = build_schedule(opt, module, schedule, warmup_epochs=warmup_epochs, min_lr=min_lr)
    return opt if scheduler is None else {"optimizer": opt, "lr_scheduler": scheduler}
