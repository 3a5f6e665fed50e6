"""ViT attention maps: the last layer's CLS-to-patch attention per head, and attention rollout
(Abnar & Zuidema 2020) as an overlay on the image.

timm's fused attention (`F.scaled_dot_product_attention`) never materialises the attention
weights, so `record_attention` switches fusing off on each attention module for the extraction
only, records the softmax output (the input of `attn_drop`, i.e. before dropout) with forward
hooks, and restores the modules afterwards, even on error."""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch import nn

from zoo.viz.common import colormap, font, to_rgb_uint8

DISPLAY_SIZE = 224  # pixels per image panel in the figures
LABEL = 16


def _attention_modules(vit: nn.Module) -> list[nn.Module]:
    return [m for m in vit.modules() if hasattr(m, "fused_attn") and isinstance(getattr(m, "attn_drop", None), nn.Module)]


@contextmanager
def record_attention(vit: nn.Module):
    """Within the block, every forward of `vit` (a timm VisionTransformer) appends each layer's
    attention weights [B, heads, N, N] (rows: queries, softmax over keys) to the yielded list."""
    modules = _attention_modules(vit)
    if not modules:
        raise ValueError(f"{type(vit).__name__} has no timm attention modules to record")
    recorded: list[torch.Tensor] = []
    saved = [m.fused_attn for m in modules]
    hooks = [m.attn_drop.register_forward_hook(lambda _m, inputs, _out: recorded.append(inputs[0].detach()))
             for m in modules]
    try:
        for m in modules:
            m.fused_attn = False
        yield recorded
    finally:
        for m, flag, hook in zip(modules, saved, hooks):
            m.fused_attn = flag
            hook.remove()


@torch.no_grad()
def attention_weights(vit: nn.Module, images: torch.Tensor, forward=None) -> torch.Tensor:
    """images [B, C, H, W] (already prepared for `vit`) -> attention [layers, B, heads, N, N].
    `forward` defaults to `vit.forward_features`."""
    with record_attention(vit) as recorded:
        (forward or vit.forward_features)(images)
    return torch.stack(recorded).float()


def cls_attention(attention: torch.Tensor, num_prefix_tokens: int, grid: tuple[int, int],
                  cls_index: int | None = 0) -> torch.Tensor:
    """One layer's attention [B, heads, N, N] -> CLS-to-patch maps [B, heads, h, w].

    Row `cls_index` (the CLS query) over the patch keys (the last h*w tokens). Without a class
    token (cls_index None) the mean over all queries is used. A map sums to 1 minus the mass the
    query puts on prefix tokens."""
    query = attention.mean(-2) if cls_index is None else attention[..., cls_index, :]  # [B, heads, N]
    patches = query[..., num_prefix_tokens:]
    return patches.reshape(*patches.shape[:-1], *grid)


def rollout(attention: torch.Tensor, head_fusion: str = "mean", residual: float = 0.5) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema 2020, eq. 1): attention [layers, B, heads, N, N] ->
    [B, N, N], the product of the per-layer matrices from the last layer down to the first.

    Each layer's heads are fused (mean in the paper; max/min as options) and the residual
    connection is modelled as A' = residual * I + (1 - residual) * A with rows re-normalised,
    so every row of the result still sums to 1."""
    fuse = {"mean": lambda a: a.mean(2), "max": lambda a: a.amax(2), "min": lambda a: a.amin(2)}
    if head_fusion not in fuse:
        raise ValueError(f"head_fusion must be one of {', '.join(fuse)}, not '{head_fusion}'")
    fused = fuse[head_fusion](attention.float())  # [layers, B, N, N]
    eye = torch.eye(fused.shape[-1], dtype=fused.dtype, device=fused.device)
    layers = residual * eye + (1 - residual) * fused
    layers = layers / layers.sum(-1, keepdim=True)
    joint = layers[0]
    for layer in layers[1:]:  # a loop over depth (<= a few dozen), batched over images
        joint = layer @ joint  # rollout_l = A'_l @ rollout_{l-1}
    return joint


def rollout_map(joint: torch.Tensor, num_prefix_tokens: int, grid: tuple[int, int],
                cls_index: int | None = 0) -> torch.Tensor:
    """Rollout [B, N, N] -> how much the CLS token (or the mean token) draws from each patch [B, h, w]."""
    query = joint.mean(-2) if cls_index is None else joint[:, cls_index]
    return query[:, num_prefix_tokens:].reshape(-1, *grid)


# ----------------------------------------------------------------------------- figures
def _image_rgb(image: torch.Tensor, size: int) -> Image.Image:
    return Image.fromarray(to_rgb_uint8(image)).resize((size, size), Image.BILINEAR)


def _heat(values: torch.Tensor, size: int, top: float, smooth: bool = True) -> tuple[np.ndarray, Image.Image]:
    """values [h, w] on the scale 0 .. top -> (unit map [size, size], its colour-mapped picture)."""
    scaled = (values.detach().float().cpu() / max(top, 1e-12)).clamp(0, 1).numpy()
    upsampled = Image.fromarray((scaled * 255).astype(np.uint8)).resize(
        (size, size), Image.BILINEAR if smooth else Image.NEAREST)
    unit = np.asarray(upsampled, dtype=np.float32) / 255.0
    return unit, Image.fromarray(colormap(unit))


def _labelled(panels: list[Image.Image], labels: list[str], columns: int) -> Image.Image:
    size = panels[0].width
    rows = (len(panels) + columns - 1) // columns
    canvas = Image.new("RGB", (columns * size, rows * (size + LABEL)), (30, 30, 30))
    draw, small = ImageDraw.Draw(canvas), font(12)
    for i, (panel, label) in enumerate(zip(panels, labels)):
        x, y = (i % columns) * size, (i // columns) * (size + LABEL)
        draw.text((x + 3, y + 1), label, fill=(235, 235, 235), font=small)
        canvas.paste(panel, (x, y + LABEL))
    return canvas


def heads_figure(image: torch.Tensor, maps: torch.Tensor, title: str = "", size: int = DISPLAY_SIZE // 2) -> Image.Image:
    """image [C, H, W] in [0, 1], maps [heads, h, w] -> the image followed by one heat map per
    head, all on one colour scale (0 .. the largest weight of any head, nearest-neighbour so the
    patches stay visible), each labelled with its peak weight."""
    top = float(maps.max())
    panels = [_image_rgb(image, size)] + [_heat(m, size, top, smooth=False)[1] for m in maps]
    labels = [title or "input"] + [f"head {i} peak {float(m.max()):.3f}" for i, m in enumerate(maps)]
    return _labelled(panels, labels, columns=min(len(panels), 7))


def rollout_figure(image: torch.Tensor, values: torch.Tensor, title: str = "", alpha: float = 0.6,
                   size: int = DISPLAY_SIZE) -> Image.Image:
    """image [C, H, W] in [0, 1], values [h, w] -> image | heat map | heat map over the image; the
    map's scale is 0 .. its peak, printed in the label."""
    picture = _image_rgb(image, size)
    top = float(values.max())
    unit, heat = _heat(values, size, top)
    weight = (alpha * unit)[..., None]
    overlay = (np.asarray(picture, np.float32) * (1 - weight) + np.asarray(heat, np.float32) * weight)
    panels = [picture, heat, Image.fromarray(overlay.round().astype(np.uint8))]
    return _labelled(panels, [title or "input", f"attention rollout (0 .. {top:.3f})", "overlay"], columns=3)


def attention_figure(image: torch.Tensor, rollout_values: torch.Tensor, head_maps: torch.Tensor,
                     title: str = "") -> Image.Image:
    """Both views in one figure of a fixed size for a given model (so a logger can show a batch
    of them side by side): rollout (image | heat map | overlay) above the per-head maps."""
    top = rollout_figure(image, rollout_values, title)
    bottom = heads_figure(image, head_maps, "last layer", size=top.width // min(head_maps.shape[0] + 1, 7))
    canvas = Image.new("RGB", (top.width, top.height + bottom.height), (30, 30, 30))
    canvas.paste(top, (0, 0))
    canvas.paste(bottom, (0, top.height))
    return canvas
