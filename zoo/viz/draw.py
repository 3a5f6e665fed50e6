"""DRAW figures (PIL images): sample grids, reconstruction strips and the animated canvas. As in the
paper's figures the read box is green, the write box red, spanning the N x N grid (N * delta pixels,
centred at (gX, gY)), its border width proportional to the filters' sigma.
"""
from __future__ import annotations

import io
import os

import numpy as np
import torch
from PIL import Image, ImageDraw

from zoo.viz.common import to_rgb_uint8

READ_COLOUR = (0, 220, 0)
WRITE_COLOUR = (230, 0, 0)
FIGURE_GREY = (40, 40, 40)  # between cells
CELL_GREY = (90, 90, 90)  # the margin around an image, where windows past its border show


def _box(params, index: int, n: int, scale: int) -> tuple[list[float], int]:
    """The N x N grid of example `index` as a rectangle in the upscaled figure, and its border
    width (proportional to sigma, at least 1)."""
    gx, gy = float(params.gx[index]), float(params.gy[index])
    half = n * float(params.delta[index]) / 2
    sigma = float(params.sigma2[index]) ** 0.5
    # 1-based pixel a covers [a - 1, a] in continuous coordinates, so its centre is a - 0.5
    cx, cy = (gx - 0.5) * scale, (gy - 0.5) * scale
    width = max(1, int(round(sigma * scale * 0.5)))
    return [cx - half * scale, cy - half * scale, cx + half * scale, cy + half * scale], width


def compose(cells: list[list[tuple[torch.Tensor, list]]], scale: int = 3, pad: int = 2,
            margin: float | None = None) -> Image.Image:
    """A grid figure of cells[row][col] = (image [C, H, W] in [0, 1], boxes: (FilterParams, example,
    N, colour) each), with a margin (default a quarter image) where windows may reach past it."""
    rows = len(cells)
    cols = max(len(r) for r in cells)
    H, W = cells[0][0][0].shape[-2:]
    has_boxes = any(boxes for row in cells for _, boxes in row)
    m = int(round((max(H, W) / 4 if margin is None else margin) * scale)) if has_boxes else 0
    ch, cw = H * scale + 2 * m, W * scale + 2 * m
    figure = Image.new("RGB", (cols * (cw + pad) + pad, rows * (ch + pad) + pad), FIGURE_GREY)
    for r, row in enumerate(cells):
        for c, (image, boxes) in enumerate(row):
            tile = Image.new("RGB", (cw, ch), CELL_GREY)
            tile.paste(Image.fromarray(to_rgb_uint8(image)).resize((W * scale, H * scale), Image.NEAREST), (m, m))
            draw = ImageDraw.Draw(tile)
            for params, index, n, colour in boxes:
                if params is None:  # a step without attention
                    continue
                rect, width = _box(params, index, n, scale)
                draw.rectangle([v + m for v in rect], outline=colour, width=width)
            figure.paste(tile, (pad + c * (cw + pad), pad + r * (ch + pad)))
    return figure


def _rows(n: int, nrow: int | None) -> list[range]:
    """Indices 0..n-1 in rows of nrow (default: square-ish)."""
    nrow = nrow or max(1, int(np.ceil(np.sqrt(n))))
    return [range(start, min(start + nrow, n)) for start in range(0, n, nrow)]


def _windows(params: list | None, n: int | None, t: int, index: int, colour) -> list:
    """Step t's window of example `index` as a `compose` box (none without attention)."""
    return [(params[t], index, n, colour)] if params is not None and n and params[t] is not None else []


def sample_grid(images: torch.Tensor, nrow: int | None = None, scale: int = 2) -> Image.Image:
    """images [n, C, H, W] in [0, 1] -> one grid, nrow images per row (default: square-ish)."""
    return compose([[(images[i], []) for i in row] for row in _rows(images.shape[0], nrow)], scale=scale)


def canvas_frames(canvases: torch.Tensor, write: list | None = None, write_n: int | None = None,
                  read: list | None = None, read_n: int | None = None, nrow: int | None = None,
                  scale: int = 2, targets: torch.Tensor | None = None) -> list[Image.Image]:
    """One frame per step: canvases [T, n, C, H, W] in [0, 1] with the step's read and write boxes
    (T FilterParams or None); with targets [n, C, H, W] each canvas follows its target, which carries
    the read box (the read looks at the input, the write draws on the canvas)."""
    T, n = canvases.shape[:2]
    frames = []
    for t in range(T):
        cells = []
        for indices in _rows(n, nrow):
            row = []
            for i in indices:
                reads = _windows(read, read_n, t, i, READ_COLOUR)
                writes = _windows(write, write_n, t, i, WRITE_COLOUR)
                if targets is not None:
                    row += [(targets[i], reads), (canvases[t, i], writes)]
                else:
                    row.append((canvases[t, i], reads + writes))
            cells.append(row)
        frames.append(compose(cells, scale=scale))
    return frames


def _grey_palette(levels: int) -> Image.Image:
    """A "P" image holding `levels` greys, the figure's background greys and the box colours."""
    greys = [round(i * 255 / (levels - 1)) for i in range(levels)]
    colours = [(g, g, g) for g in greys] + [FIGURE_GREY, CELL_GREY, READ_COLOUR, WRITE_COLOUR]
    palette = Image.new("P", (1, 1))
    flat = [c for rgb in colours for c in rgb]
    palette.putpalette(flat + [0] * (768 - len(flat)))
    return palette


def gif_bytes(frames: list[Image.Image], duration_ms: int = 80, final_hold_ms: int = 1000,
              greys: int | None = None) -> bytes:
    """An endlessly looping GIF that holds on the finished canvas; `greys`: that many grey levels plus
    the box colours, undithered (16 make the file 2.5 times smaller than 256 adaptive colours)."""
    buffer = io.BytesIO()
    if greys:
        palette = _grey_palette(greys)
        frames = [f.quantize(palette=palette, dither=Image.Dither.NONE) for f in frames]
    durations = [duration_ms] * (len(frames) - 1) + [final_hold_ms]
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], duration=durations, loop=0)
    return buffer.getvalue()


def save_gif(frames: list[Image.Image], path: str | os.PathLike, duration_ms: int = 80,
             greys: int | None = None) -> None:
    from zoo.guards.writes import atomic_write_bytes

    atomic_write_bytes(path, gif_bytes(frames, duration_ms, greys=greys))


def _steps(T: int, k: int) -> list[int]:
    """k step indices spread over 0..T-1, always ending with the last."""
    k = max(1, min(k, T))
    return sorted({int(round(v)) for v in np.linspace(T - 1, 0, k)[::-1]})


def reconstruction_strip(x: torch.Tensor, canvases: torch.Tensor, read: list | None, write: list | None,
                         read_n: int | None, write_n: int | None, steps: int = 8, scale: int = 3) -> Image.Image:
    """A row per example x [n, C, H, W]: the input, then canvases [T, n, C, H, W] at `steps` steps
    with their read and write boxes."""
    chosen = _steps(canvases.shape[0], steps)
    cells = [[(x[i], [])] + [(canvases[t, i], _windows(read, read_n, t, i, READ_COLOUR)
                              + _windows(write, write_n, t, i, WRITE_COLOUR)) for t in chosen]
             for i in range(x.shape[0])]
    return compose(cells, scale=scale)
