"""Attention localisation on scenes with known item boxes (FashionScenes).

For each generated word that names an item (by default every word that labels a box anywhere in
the evaluated set): does the peak cell of the attention map the decoder emitted it with have its
centre inside a box of the image labelled with that word (repeated items cannot be told apart
without parsing, and looking at either shirt is looking at a shirt)? An item word whose item is not
in the image is left out and counted in `absent`. Beside it, over the same words:
`attention_mass_in_box` (soft credit) and `box_area`, the fraction of cells inside the boxes, the
chance level of both. `localization_previous_word` applies the test to the map of the step BEFORE
each item word (a decoder may look at the shirt while naming its colour and carry it in its state).

Boxes: x0, y0, x1, y1 in pixels of the model's input, x1/y1 exclusive; grid cell (r, c) of an h x w
grid over an H x W image has its centre at ((c + 0.5) W / w, (r + 0.5) H / h).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import torch


def _as_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def _pair(x) -> tuple[int, int]:
    if isinstance(x, (int, np.integer)):
        return int(x), int(x)
    h, w = x
    return int(h), int(w)


def cell_masks(boxes: torch.Tensor, grid, image_size) -> torch.Tensor:
    """Which grid cells have their centre inside each box: boxes [..., 4] (x0, y0, x1, y1) pixels,
    grid (h, w), image_size H or (H, W) -> bool [..., h * w] (a box of -1s holds no cell)."""
    h, w = _pair(grid)
    H, W = _pair(image_size)
    ys = ((torch.arange(h, device=boxes.device, dtype=boxes.dtype) + 0.5) * (H / h)).repeat_interleave(w)  # [L]
    xs = ((torch.arange(w, device=boxes.device, dtype=boxes.dtype) + 0.5) * (W / w)).repeat(h)
    x0, y0, x1, y1 = (boxes[..., i, None] for i in range(4))
    return (x0 <= xs) & (xs < x1) & (y0 <= ys) & (ys < y1)


def cells_in_boxes(boxes, grid, image_size) -> np.ndarray:
    """`cell_masks` for array-likes: boxes [n, 4] -> bool numpy [n, h, w]."""
    h, w = _pair(grid)
    boxes = torch.from_numpy(_as_numpy(boxes).reshape(-1, 4))
    return cell_masks(boxes, (h, w), image_size).view(-1, h, w).numpy()


def localization_stats(alphas: Sequence, grids, boxes: Sequence, box_words: Sequence[Sequence[str]],
                       words: Sequence[Sequence[str]], image_size, item_words: Iterable[str] | None = None) -> dict:
    """Per-split counts and rates (nan where nothing is scored): localization = hits / scored,
    absent, attention_mass_in_box, box_area, localization_previous_word = previous_hits /
    previous_scored. Per image: alphas [T_i, h*w] or [T_i, h, w] (row t emitted words[i][t]; rows
    past the words are ignored), boxes [n_i, 4] and their item words `box_words`, the generated
    `words`; grids: one (h, w), or one per image; image_size: H or (H, W) of the model's input."""
    n = len(words)
    if not (len(alphas) == len(boxes) == len(box_words) == n):
        raise ValueError(f"alphas, boxes, box_words and words must have one entry per image, got "
                         f"{len(alphas)}, {len(boxes)}, {len(box_words)}, {n}")
    per_image_grid = isinstance(grids, (list, tuple)) and len(grids) == n and n > 0 \
        and not isinstance(grids[0], (int, np.integer))
    H, W = _pair(image_size)
    vocab = set(item_words) if item_words is not None else {w for ws in box_words for w in ws}
    hits = scored = absent = previous_hits = previous_scored = 0
    mass = area = 0.0
    for i in range(n):  # per image: a few words each, once per evaluation
        h, w = _pair(grids[i] if per_image_grid else grids)
        alpha = _as_numpy(alphas[i]).reshape(-1, h * w) if len(words[i]) else np.zeros((0, h * w))
        if alpha.shape[0] < len(words[i]):
            raise ValueError(f"image {i}: {alpha.shape[0]} attention maps for {len(words[i])} words")
        labels = list(box_words[i])
        peak = alpha[:len(words[i])].argmax(1)  # [T]
        cells = cells_in_boxes(boxes[i], (h, w), (H, W)).reshape(-1, h * w)  # [n, L]
        inside = cells[:, peak].T  # [T, n]
        for t, word in enumerate(words[i]):
            if word not in vocab:
                continue
            match = [k for k, label in enumerate(labels) if label == word]
            if not match:
                absent += 1
                continue
            scored += 1
            hits += bool(inside[t, match].any())
            union = cells[match].any(0)  # [L]
            mass += float(alpha[t, union].sum())
            area += float(union.mean())
            if t > 0:
                previous_scored += 1
                previous_hits += bool(inside[t - 1, match].any())
    return {"localization": hits / scored if scored else math.nan, "hits": hits, "scored": scored,
            "absent": absent, "attention_mass_in_box": mass / scored if scored else math.nan,
            "box_area": area / scored if scored else math.nan,
            "localization_previous_word": previous_hits / previous_scored if previous_scored else math.nan,
            "previous_hits": previous_hits, "previous_scored": previous_scored}


def attention_localization(alphas: Sequence, grids, boxes: Sequence, box_words: Sequence[Sequence[str]],
                           words: Sequence[Sequence[str]], image_size,
                           item_words: Iterable[str] | None = None) -> float:
    """Fraction of item words whose attention peak falls inside that item's box (`localization_stats`)."""
    return localization_stats(alphas, grids, boxes, box_words, words, image_size, item_words)["localization"]
