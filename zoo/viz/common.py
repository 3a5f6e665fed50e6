"""What every figure shares: a model's input tensor as an RGB picture, the colour map, the font."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image, ImageFont


def to_rgb_uint8(image: Any) -> np.ndarray:
    """[C, H, W] tensor or array in [0, 1] (C = 1 or 3; other counts show the first channel), or a
    PIL image -> uint8 [H, W, 3]."""
    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"))
    array = torch.as_tensor(np.asarray(image) if not isinstance(image, torch.Tensor) else image)
    array = array.detach().float().cpu().clamp(0, 1)
    if array.shape[0] != 3:
        array = array[:1].expand(3, -1, -1)
    return (array.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)


def colormap(values: np.ndarray) -> np.ndarray:
    """[...] values in [0, 1] -> uint8 [..., 3] in matplotlib's 'inferno' (dark = low)."""
    from matplotlib import colormaps

    return (colormaps["inferno"](np.clip(values, 0, 1))[..., :3] * 255).round().astype(np.uint8)


def font(size: int = 12):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1
        return ImageFont.load_default()
