"""Show-Attend-Tell figures: the input, then one panel per generated word with the word's
attention map over the image.

All the words' maps share ONE colour scale, from 0 to the figure's largest attention weight (a
colour bar at the end says which): a flat map looks flat, and a peaked one stands out. Each panel
also prints the map's peak weight and its entropy in nats (uniform over L cells = ln L, printed in
the bar's caption), and the gate beta_t. For hard attention the chosen grid cell is outlined."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw

from zoo.viz.common import colormap, font, to_rgb_uint8


def caption_figure(image: Any, result: dict, panel_size: int = 160, columns: int = 5,
                   show_beta: bool = True) -> Image.Image:
    """image: [3, H, W] tensor in [0, 1] (or PIL); result: one `Captioner.caption()` entry
    (`words`, `alpha` [n, h, w], `beta` [n], optional `locations` [n, 2]) -> PIL image."""
    base = to_rgb_uint8(image)
    H, W = base.shape[:2]
    scale = panel_size / max(H, W)
    ph, pw = max(1, round(H * scale)), max(1, round(W * scale))
    resample = Image.NEAREST if scale >= 2 else Image.BILINEAR
    base_panel = np.asarray(Image.fromarray(base).resize((pw, ph), resample)).astype(np.float32)
    words = list(result.get("words", []))
    alpha = torch.as_tensor(result.get("alpha", torch.zeros(0, 1, 1)), dtype=torch.float32)
    beta = result.get("beta")
    locations = result.get("locations")

    text_h = 28
    panels: list[tuple[np.ndarray, list[str], tuple | None]] = [(base_panel.astype(np.uint8), ["input"], None)]
    top = 1.0
    if len(words):
        h, w = alpha.shape[-2:]
        maps = alpha[: len(words)].reshape(len(words), h * w)
        top = float(maps.max().clamp(min=1e-12))
        peaks = maps.max(1).values
        entropy = -(maps.clamp(min=1e-12).log() * maps).sum(1)  # nats
        up = F.interpolate(alpha[: len(words)].view(-1, 1, h, w), size=(ph, pw), mode="bilinear",
                           align_corners=False)[:, 0] / top  # one scale for the whole figure
        for t, word in enumerate(words):
            a = up[t].clamp(0, 1).numpy()
            blended = base_panel * (0.3 + 0.7 * a[..., None]) * 0.6 + colormap(a).astype(np.float32) * 0.4
            label = word + (f"  beta {float(beta[t]):.2f}" if show_beta and beta is not None and len(beta) > t else "")
            stats = f"peak {float(peaks[t]):.3f}  H {float(entropy[t]):.2f}"
            box = None
            if locations is not None and len(locations) > t:
                r, c = (int(v) for v in locations[t])
                box = (c * pw / w, r * ph / h, (c + 1) * pw / w - 1, (r + 1) * ph / h - 1)
            panels.append((blended.clip(0, 255).astype(np.uint8), [label, stats], box))
        cells = h * w
    else:
        cells = 1
    bar = np.linspace(1, 0, ph)[:, None].repeat(max(8, pw // 8), 1)
    panels.append((colormap(bar), [f"0 .. {top:.3f}", f"uniform H {math.log(cells):.2f}"], "bar"))

    cols = max(1, min(columns, len(panels)))
    rows = math.ceil(len(panels) / cols)
    pad = 4
    canvas = Image.new("RGB", (cols * (pw + pad) + pad, rows * (ph + text_h + pad) + pad), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    small = font(11)
    for k, (panel, lines, box) in enumerate(panels):
        x = pad + (k % cols) * (pw + pad)
        y = pad + (k // cols) * (ph + text_h + pad)
        canvas.paste(Image.fromarray(panel), (x, y))
        if isinstance(box, tuple):
            draw.rectangle((x + box[0], y + box[1], x + box[2], y + box[3]), outline=(0, 255, 255), width=2)
        for i, line in enumerate(lines):
            draw.text((x + 2, y + ph + 1 + 13 * i), line, fill=(0, 0, 0), font=small)
    return canvas
