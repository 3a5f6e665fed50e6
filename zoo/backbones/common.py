"""Pieces the backbones share: the output type, freezing, and timm model creation with one-line
errors for the mistakes users make (unknown names, missing or ill-fitting weight files, no network)."""
from __future__ import annotations

import difflib
import logging
import os
import re
import socket
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlparse

import torch
from torch import nn

from zoo.guards.errors import UserError

log = logging.getLogger("zoo")


class PatchFeatures(NamedTuple):
    tokens: torch.Tensor  # [B, L, D]; L = h * w patch tokens, row-major (plus prefix tokens first, if kept)
    grid: tuple[int, int]  # (h, w) of the patch grid


def freeze(module: nn.Module) -> nn.Module:
    """No gradients for `module`'s parameters (a frozen Backbone also keeps its BatchNorm statistics)."""
    for p in module.parameters():
        p.requires_grad_(False)
    return module


class Backbone(nn.Module):
    """images [B, C, H, W] in [0, 1] -> PatchFeatures, after matching the channels (grayscale into a
    3-channel network repeats its channel) and `(x - mean) / std` (`normalize` None: when pretrained
    or given mean/std). `trainable=False` freezes it, in eval mode and without autograd, while the
    model around it trains. A subclass builds its network, calls `finish(...)` with its default
    statistics, and defines `features(x) -> [B, D, h, w]` (or its own forward)."""

    def __init__(self, in_chans: int, trainable: bool = True):
        super().__init__()
        self.in_chans, self.trainable = in_chans, trainable

    def finish(self, normalize: bool | None, mean, std, default_mean, default_std, pretrained: bool = False) -> None:
        self.normalize = bool((pretrained or mean is not None or std is not None) if normalize is None else normalize)
        mean = torch.tensor(mean if mean is not None else default_mean, dtype=torch.float32)
        std = torch.tensor(std if std is not None else default_std, dtype=torch.float32)
        if mean.numel() != self.in_chans:  # ImageNet's 3 statistics for a grayscale model: their average
            mean, std = mean.mean().repeat(self.in_chans), std.mean().repeat(self.in_chans)
        self.register_buffer("mean", mean.view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", std.view(1, -1, 1, 1), persistent=False)
        if not self.trainable:
            freeze(self)
            self.eval()

    def train(self, mode: bool = True):
        return super().train(mode and self.trainable)

    def _grad_context(self):
        return torch.enable_grad() if self.trainable and torch.is_grad_enabled() else torch.no_grad()

    def prepare(self, images: torch.Tensor) -> torch.Tensor:
        """images [B, C, H, W] -> the network's input (channels matched, normalised)."""
        c = images.shape[1]
        if c != self.in_chans and not (c == 1 and self.in_chans == 3):
            raise UserError(f"images have {c} channels, the backbone expects {self.in_chans}")
        x = images.expand(-1, self.in_chans, -1, -1) if c != self.in_chans else images
        return (x - self.mean) / self.std if self.normalize else x

    def forward(self, images: torch.Tensor) -> PatchFeatures:
        # images [B, C, H, W] -> tokens [B, h*w, D], grid (h, w)
        x = self.prepare(images)
        with self._grad_context():
            feats = self.features(x)  # [B, D, h, w]
        return PatchFeatures(feats.flatten(2).transpose(1, 2), tuple(feats.shape[-2:]))


FILE_HINT = "pass it as pretrained_file=PATH (--model.init_args.backbone.pretrained_file PATH)"


_SIZE_MISMATCH = re.compile(r"size mismatch for ([\w.]+): copying a param with shape torch\.Size\(\[([\d, ]*)\]\) "
                            r"from checkpoint, the shape in current model is torch\.Size\(\[([\d, ]*)\]\)")


def _file_overlay(path: Path, model_name: str) -> dict:
    """pretrained_cfg_overlay for a local file: its path, plus the input channels and class count
    the file was trained with, so timm adapts `in_chans` and the head from the right source."""
    import timm.models
    from safetensors import safe_open

    overlay: dict = {"file": str(path)}
    try:
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as f:
                shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        else:
            state = timm.models.load_state_dict(str(path), weights_only=True)
            shapes = {k: tuple(v.shape) for k, v in state.items()}
    except Exception as exc:
        raise UserError(f"{path}: not a readable weights file ({type(exc).__name__}: {exc})") from None
    cfg = timm.models.get_pretrained_cfg(model_name)
    if cfg is None:
        return overlay
    first, classifier = f"{cfg.first_conv}.weight", f"{cfg.classifier}.weight"
    if isinstance(cfg.first_conv, str) and len(shapes.get(first, ())) == 4:
        overlay["input_size"] = (shapes[first][1], *cfg.input_size[1:])
    if isinstance(cfg.classifier, str) and len(shapes.get(classifier, ())) >= 1:
        overlay["num_classes"] = shapes[classifier][0]
    return overlay


def _hub_reachable(cfg) -> bool:
    """A quick DNS probe: timm's hub client otherwise retries for about a minute offline."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    host = urlparse(cfg.url).hostname if cfg.url and not cfg.hf_hub_id else urlparse(endpoint).hostname
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False


def _cached_hub_file(cfg) -> str | None:
    if not cfg.hf_hub_id:
        return None
    from huggingface_hub import try_to_load_from_cache  # a dependency of the project and of timm

    for filename in ("model.safetensors", "open_clip_pytorch_model.bin", "pytorch_model.bin"):
        found = try_to_load_from_cache(cfg.hf_hub_id, filename)
        if isinstance(found, str):
            return found
    return None


def create_timm(model_name: str, pretrained: bool = False, pretrained_file: str | None = None, **kwargs):
    """`timm.create_model` with the zoo's error handling. pretrained_file: a local checkpoint through
    timm's `pretrained_cfg_overlay` (which adapts position embeddings, `in_chans` and the head);
    pretrained alone: timm's hub route, which offline fails at once, saying to pass a file."""
    import timm
    import timm.models

    if not timm.is_model(model_name):
        close = difflib.get_close_matches(model_name, timm.list_models(), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UserError(f"unknown timm model '{model_name}'{hint}")
    overlay = None
    if pretrained_file:
        path = Path(pretrained_file).expanduser()
        if not path.is_file():
            raise UserError(f"{path}: no such pretrained weights file")
        overlay = _file_overlay(path, model_name)
        pretrained = True
    elif pretrained:
        cfg = timm.models.get_pretrained_cfg(model_name)
        if cfg is not None and (cfg.hf_hub_id or cfg.url) and not _hub_reachable(cfg):
            cached = _cached_hub_file(cfg)
            if cached is None:
                raise UserError(f"cannot download pretrained weights for '{model_name}' (offline?); "
                                f"download its model.safetensors elsewhere and {FILE_HINT}")
            overlay = {"file": cached}
    try:
        net = timm.create_model(model_name, pretrained=pretrained, pretrained_cfg_overlay=overlay, **kwargs)
    except TypeError as exc:
        raise UserError(f"timm model '{model_name}': bad arguments ({exc})") from None
    except RuntimeError as exc:
        raise _weights_error(exc, pretrained_file or model_name) from None
    except OSError as exc:  # hub and download errors (huggingface_hub's are OSErrors)
        if pretrained_file:
            raise UserError(f"{pretrained_file}: cannot read ({exc})") from None
        raise UserError(f"cannot download pretrained weights for '{model_name}' ({type(exc).__name__}); "
                        f"download its model.safetensors elsewhere and {FILE_HINT}") from None
    source_classes = (overlay.get("num_classes") if pretrained_file
                      else getattr(timm.models.get_pretrained_cfg(model_name), "num_classes", None))
    if pretrained and kwargs.get("num_classes") and source_classes and kwargs["num_classes"] != source_classes:
        log.warning("%s: its %d-class head does not fit %d classes: the head starts fresh; every other weight is "
                    "pretrained", pretrained_file or model_name, source_classes, kwargs["num_classes"])
    return net


def _weights_error(exc: RuntimeError, source: str) -> Exception:
    """A one-line UserError naming the tensors whose shapes differ, or the missing/unexpected ones."""
    text = str(exc)
    mismatched = _SIZE_MISMATCH.findall(text)
    if mismatched:
        parts = [f"{name} ({got}) vs model ({want})" for name, got, want in mismatched]
        more = f" and {len(parts) - 4} more" if len(parts) > 4 else ""
        return UserError(f"{source}: weights do not fit the model, shapes differ: "
                         + "; ".join(parts[:4]) + more)
    if "Missing key(s)" in text or "Unexpected key(s)" in text:
        return UserError(f"{source}: weights do not fit the model: " + " ".join(text.split())[:400])
    if "pretrained" in text.lower() and "weights" in text.lower():
        return UserError(f"{source}: {text.splitlines()[0]}")
    return exc
