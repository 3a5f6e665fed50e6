"""RAM glimpse trajectories: the image with a numbered box for every glimpse and every scale,
the path between glimpse centres, and the predicted class in a header strip."""
from __future__ import annotations

import colorsys

import numpy as np
import torch
from PIL import Image, ImageDraw

from zoo.viz.common import font, to_rgb_uint8

DISPLAY_SIZE = 300  # the longer image side in the figure, in pixels
HEADER = 22


def step_colours(n: int) -> list[tuple[int, int, int]]:
    """n distinct colours running from yellow (first glimpse) through red to blue (last)."""
    out = []
    for t in range(n):
        hue = (0.16 - 0.8 * t / max(1, n - 1)) % 1.0
        r, g, b = colorsys.hsv_to_rgb(hue, 0.9, 1.0)
        out.append((int(255 * r), int(255 * g), int(255 * b)))
    return out


def draw_glimpses(image: torch.Tensor | np.ndarray, boxes: torch.Tensor | np.ndarray, predicted: str,
                  label: str | None = None, confidence: float | None = None,
                  display_size: int = DISPLAY_SIZE) -> Image.Image:
    """image [C, H, W] in [0, 1] (C = 1 or 3); boxes [T, k, 4] as (x0, y0, x1, y1) in pixel-edge
    coordinates (`Retina.boxes`), glimpse t's scales from smallest to largest. Returns an RGB image.

    Each glimpse has its own colour; its smallest box is drawn thick and numbered t + 1, its larger
    scales thin. Boxes may extend past the image: a margin shows them, clipped to the figure."""
    pixels = to_rgb_uint8(image)
    boxes = torch.as_tensor(np.asarray(boxes) if not isinstance(boxes, torch.Tensor) else boxes)
    boxes = boxes.detach().double().cpu()
    H, W = pixels.shape[:2]
    zoom = max(1, round(display_size / max(H, W)))
    margin = max(8, display_size // 10)
    picture = Image.fromarray(pixels).resize((W * zoom, H * zoom), Image.NEAREST)
    canvas = Image.new("RGB", (W * zoom + 2 * margin, H * zoom + 2 * margin + HEADER), (40, 40, 40))
    top = HEADER + margin
    canvas.paste(picture, (margin, top))
    draw = ImageDraw.Draw(canvas)
    small = font(12)

    def to_canvas(x: float, y: float) -> tuple[float, float]:
        return margin + x * zoom, top + y * zoom

    T = boxes.shape[0]
    colours = step_colours(T)
    centres = []
    for t in range(T):
        for i in reversed(range(boxes.shape[1])):  # large scales first, so the small box sits on top
            x0, y0, x1, y1 = boxes[t, i].tolist()
            draw.rectangle([to_canvas(x0, y0), to_canvas(x1, y1)], outline=colours[t], width=2 if i == 0 else 1)
        x0, y0, x1, y1 = boxes[t, 0].tolist()
        centres.append(to_canvas((x0 + x1) / 2, (y0 + y1) / 2))
    if T > 1:
        draw.line(centres, fill=(255, 255, 255), width=1)
    for t, (cx, cy) in enumerate(centres):
        r = 3
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colours[t])
        x0, y0 = to_canvas(*boxes[t, 0, :2].tolist())
        draw.text((x0 + 2, y0 + 1), str(t + 1), fill=colours[t], font=small, stroke_width=1,
                  stroke_fill=(0, 0, 0))
    title = f"pred: {predicted}" + (f" ({confidence:.0%})" if confidence is not None else "")
    colour = (255, 255, 255)
    if label is not None:
        title += f"   true: {label}"
        colour = (120, 230, 120) if label == predicted else (255, 120, 120)
    draw.rectangle([0, 0, canvas.width, HEADER], fill=(0, 0, 0))
    draw.text((6, 4), title, fill=colour, font=small)
    return canvas
