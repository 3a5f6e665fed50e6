"""Show-Attend-Tell figures: one image per caption, a word per panel, the word's attention map
upsampled over the image (bright = attended). For hard attention the chosen grid cell is outlined."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw, ImageFont


def _to_uint8_image(image: Any) -> np.ndarray:
    """[3, H, W] / [1, H, W] tensor in [0, 1], or a PIL image -> uint8 [H, W, 3]."""
    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"))
    array = image.detach().float().cpu().clamp(0, 1)
    if array.shape[0] == 1:
        array = array.expand(3, -1, -1)
    return (array.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)


def _heat(values: np.ndarray) -> np.ndarray:
    """[H, W] in [0, 1] -> uint8 [H, W, 3] with matplotlib's 'inferno' colormap."""
    from matplotlib import colormaps

    return (colormaps["inferno"](values)[..., :3] * 255).astype(np.uint8)


def caption_figure(image: Any, result: dict, panel_size: int = 160, columns: int = 5,
                   show_beta: bool = True) -> Image.Image:
    """image: [3, H, W] tensor in [0, 1] (or PIL); result: one `Captioner.caption()` entry
    (`words`, `alpha` [n, h, w], `beta` [n], optional `locations` [n, 2]) -> PIL image with the
    input first, then one panel per word."""
    base = _to_uint8_image(image)
    H, W = base.shape[:2]
    scale = panel_size / max(H, W)
    ph, pw = max(1, round(H * scale)), max(1, round(W * scale))
    resample = Image.NEAREST if scale >= 2 else Image.BILINEAR
    base_panel = np.asarray(Image.fromarray(base).resize((pw, ph), resample)).astype(np.float32)
    words = list(result.get("words", []))
    alpha = torch.as_tensor(result.get("alpha", torch.zeros(0, 1, 1)), dtype=torch.float32)
    beta = result.get("beta")
    locations = result.get("locations")

    panels: list[tuple[np.ndarray, str, tuple | None]] = [(base_panel.astype(np.uint8), "input", None)]
    if len(words):
        h, w = alpha.shape[-2:]
        up = F.interpolate(alpha.view(-1, 1, h, w), size=(ph, pw), mode="bilinear", align_corners=False)[:, 0]
        up = up / up.flatten(1).amax(1).clamp(min=1e-12).view(-1, 1, 1)  # each word's map peaks at 1
        for t, word in enumerate(words):
            a = up[t].clamp(0, 1).numpy()
            blended = base_panel * (0.3 + 0.7 * a[..., None]) * 0.6 + _heat(a).astype(np.float32) * 0.4
            label = word
            if show_beta and beta is not None and len(beta) > t:
                label += f"  beta={float(beta[t]):.2f}"
            box = None
            if locations is not None and len(locations) > t:
                r, c = (int(v) for v in locations[t])
                box = (c * pw / w, r * ph / h, (c + 1) * pw / w - 1, (r + 1) * ph / h - 1)
            panels.append((blended.clip(0, 255).astype(np.uint8), label, box))

    font = ImageFont.load_default()
    text_h = 16
    cols = max(1, min(columns, len(panels)))
    rows = math.ceil(len(panels) / cols)
    pad = 4
    canvas = Image.new("RGB", (cols * (pw + pad) + pad, rows * (ph + text_h + pad) + pad), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    for k, (panel, label, box) in enumerate(panels):
        x = pad + (k % cols) * (pw + pad)
        y = pad + (k // cols) * (ph + text_h + pad)
        canvas.paste(Image.fromarray(panel), (x, y))
        if box is not None:
            draw.rectangle((x + box[0], y + box[1], x + box[2], y + box[3]), outline=(0, 255, 255), width=2)
        draw.text((x + 2, y + ph + 2), label, fill=(0, 0, 0), font=font)
    return canvas
