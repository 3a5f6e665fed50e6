"""ViT attention figures: the last layer's CLS-to-patch attention per head, and attention
rollout (Abnar & Zuidema 2020) as an overlay on the image. The maps come from
zoo.attention.rollout; this module only draws."""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image, ImageDraw

from zoo.viz.common import colormap, font, to_rgb_uint8

DISPLAY_SIZE = 224  # pixels per image panel in the figures
LABEL = 16


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
