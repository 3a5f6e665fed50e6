"""One record of where a model looked, the same for every family that attends: a family's
`attention_record(images)` returns an `AttentionRecord` for B images.

- `maps [B, T, H, W]`: per step a probability map over the input's pixels (a coarse grid's cell
  mass spread evenly over its pixels: mass is counted per pixel, so the families' maps compare);
- `step_mask [B, T]`: which steps exist (captions differ in length);
- `labels`: B lists of T strings (the word, "glimpse 3", "layer 2");
- `boxes [B, T, K, 4]` or None: windows or glimpses (x0, y0, x1, y1) in pixel edges (pixel (r, c)
  covers [c, c + 1) x [r, r + 1); they may reach past the image), named by `box_labels`;
- `prediction`: a classifier's `probs`, `label`, `class_names`; a captioner's `words`,
  `word_probs`; a generator's `canvas`.
Axis order: batch, step, y, x; pairs are (x, y). `maps_from_cells`, `maps_from_boxes` and
`maps_from_filters` turn each family's native attention into pixel maps.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch


@dataclass
class AttentionRecord:
    family: str
    kind: str  # "soft" (content maps), "glimpse" (hard, box-shaped), "window" (DRAW filters), "rollout"
    maps: torch.Tensor  # [B, T, H, W], each existing step a probability map
    labels: list[list[str]]  # B x T
    step_mask: torch.Tensor  # [B, T] bool
    prediction: dict[str, Any] = field(default_factory=dict)
    boxes: torch.Tensor | None = None  # [B, T, K, 4] (x0, y0, x1, y1) pixel edges
    box_labels: list[str] = field(default_factory=list)  # K names
    # where the model looked overall: "steps" (every step's map) or "last" (it sums up the others: rollout)
    headline: str = "steps"

    def __post_init__(self):
        if self.maps.dim() != 4:
            raise ValueError(f"maps must be [B, T, H, W], got {tuple(self.maps.shape)}")
        B, T = self.maps.shape[:2]
        if tuple(self.step_mask.shape) != (B, T):
            raise ValueError(f"step_mask must be [{B}, {T}], got {tuple(self.step_mask.shape)}")
        if self.boxes is not None and (self.boxes.dim() != 4 or tuple(self.boxes.shape[:2]) != (B, T)
                                       or self.boxes.shape[-1] != 4):
            raise ValueError(f"boxes must be [{B}, {T}, K, 4], got {tuple(self.boxes.shape)}")

    @property
    def image_size(self) -> tuple[int, int]:
        return int(self.maps.shape[-2]), int(self.maps.shape[-1])

    def __len__(self) -> int:
        return int(self.maps.shape[0])

    def to(self, device) -> "AttentionRecord":
        prediction = {key: value.to(device) if isinstance(value, torch.Tensor) else value
                      for key, value in self.prediction.items()}
        return replace(self, maps=self.maps.to(device), step_mask=self.step_mask.to(device),
                       boxes=None if self.boxes is None else self.boxes.to(device), prediction=prediction)

    def headline_steps(self) -> torch.Tensor:
        """[B, T] bool: the steps the headline metrics score."""
        if self.headline == "last":
            last = torch.zeros_like(self.step_mask)
            last[:, -1] = self.step_mask[:, -1]
            return last
        return self.step_mask

    def overall(self) -> torch.Tensor:
        """[B, H, W]: where the model looked overall, the mean of its headline steps' maps."""
        steps = self.headline_steps().to(self.maps.dtype)
        total = (self.maps * steps[..., None, None]).sum(1)
        return total / steps.sum(1).clamp_min(1)[:, None, None]

    def degenerate(self) -> torch.Tensor:
        """[B, T] bool: existing steps whose map is all zero, NaN or Inf (reported, never drawn)."""
        flat = self.maps.flatten(2)
        return (~torch.isfinite(flat).all(-1) | ~(flat.sum(-1) > 0)) & self.step_mask

    def peaks(self) -> torch.Tensor:
        """[B, T, 2] (x, y): the pixel centre of each map's peak (`peak_pixels`)."""
        W = self.maps.shape[-1]
        index = peak_pixels(self.maps)
        return torch.stack([(index % W).float() + 0.5, (index // W).float() + 0.5], -1)

    def as_dict(self, maps: bool = True, decimals: int = 5) -> dict[str, Any]:
        """Plain lists (JSON-ready): the documented axis order is in `axes`."""
        B, T = self.maps.shape[:2]
        out: dict[str, Any] = {
            "family": self.family, "kind": self.kind, "headline": self.headline,
            "image_size": dict(zip(("height", "width"), self.image_size)),
            "axes": {"maps": "[image, step, y, x]", "boxes": "[image, step, box, (x0, y0, x1, y1)]",
                     "peaks": "[image, step, (x, y)]", "coordinates": "pixel edges: pixel (row r, column c) "
                     "covers [c, c + 1) x [r, r + 1); x is the column, y the row"},
            "images": [],
        }
        peaks = self.peaks()
        bad = self.degenerate()
        for b in range(B):
            steps = []
            for t in range(T):
                if not bool(self.step_mask[b, t]):
                    continue
                step: dict[str, Any] = {"label": self.labels[b][t], "peak": [round(float(v), 3) for v in peaks[b, t]],
                                        "degenerate": bool(bad[b, t])}
                if self.boxes is not None:
                    step["boxes"] = {name: [round(float(v), 3) for v in self.boxes[b, t, k]]
                                     for k, name in enumerate(self.box_labels)}
                if maps:
                    step["map"] = torch.nan_to_num(self.maps[b, t].float(), nan=0.0).round(decimals=decimals).tolist()
                steps.append(step)
            out["images"].append({"steps": steps, "prediction": _plain(self.prediction, b)})
        return out

    def to_json(self, maps: bool = True) -> str:
        """Strict JSON: a non-finite number (a NaN map's peak, a score) is null."""
        from zoo.guards.writes import json_text

        return json_text(self.as_dict(maps=maps))


def _plain(prediction: dict[str, Any], b: int) -> dict[str, Any]:
    """Image b's share of a batched prediction, as plain values."""
    out = {}
    for key, value in prediction.items():
        if key == "class_names":
            out[key] = list(value) if value else None
        elif key.startswith("canvas"):
            continue  # canvases are pictures, drawn by the figures: too big for JSON
        elif isinstance(value, torch.Tensor):
            item = value[b]
            out[key] = item.item() if item.dim() == 0 else [round(float(v), 5) for v in item.flatten()]
        elif isinstance(value, list) and len(value) > b:
            out[key] = value[b]
    return out


def peak_pixels(maps: torch.Tensor, tolerance: float = 1e-5) -> torch.Tensor:
    """[..., H, W] maps -> [...] the flat index of each map's peak pixel: of a plateau (a coarse cell,
    a glimpse's finest box), the pixel nearest its centroid, not its top-left corner. NaN: no mass."""
    H, W = maps.shape[-2:]
    flat = torch.nan_to_num(maps.flatten(-2).float(), nan=-1.0, posinf=-1.0, neginf=-1.0)
    top = flat.amax(-1, keepdim=True)
    plateau = (flat >= top - tolerance * top.abs()).float()
    ys = torch.arange(H, device=maps.device, dtype=torch.float32).repeat_interleave(W)
    xs = torch.arange(W, device=maps.device, dtype=torch.float32).repeat(H)
    count = plateau.sum(-1, keepdim=True)
    cy, cx = (plateau * ys).sum(-1, keepdim=True) / count, (plateau * xs).sum(-1, keepdim=True) / count
    distance = (ys - cy) ** 2 + (xs - cx) ** 2
    return torch.where(plateau > 0, distance, torch.full_like(distance, float("inf"))).argmin(-1)


def concatenate(records: list[AttentionRecord]) -> AttentionRecord:
    """Records of consecutive batches (one model) -> one record, steps padded to the longest."""
    if len(records) == 1:
        return records[0]
    T = max(r.maps.shape[1] for r in records)

    def pad(t: torch.Tensor, value=0) -> torch.Tensor:
        extra = T - t.shape[1]
        return t if extra == 0 else torch.cat([t, t.new_full((t.shape[0], extra, *t.shape[2:]), value)], 1)

    first = records[0]
    prediction = {}
    for key, value in first.prediction.items():
        if isinstance(value, torch.Tensor):
            parts = [r.prediction[key] for r in records]
            prediction[key] = torch.cat(parts) if all(
                p.shape[1:] == parts[0].shape[1:] for p in parts) else parts
        elif isinstance(value, list) and key != "class_names":
            prediction[key] = [item for r in records for item in r.prediction[key]]
        else:
            prediction[key] = value
    return replace(first, maps=torch.cat([pad(r.maps) for r in records]),
                   step_mask=torch.cat([pad(r.step_mask, False) for r in records]),
                   labels=[row + [""] * (T - len(row)) for r in records for row in r.labels],
                   boxes=None if first.boxes is None else torch.cat([pad(r.boxes) for r in records]),
                   prediction=prediction)


def _normalise(maps: torch.Tensor) -> torch.Tensor:
    """[..., H, W] -> each map divided by its sum (an all-zero map stays zero: degenerate)."""
    total = maps.sum((-2, -1), keepdim=True)
    return torch.where(total > 0, maps / total.clamp_min(1e-30), maps)


def maps_from_cells(cells: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
    """Cell maps [..., h, w] -> pixel maps [..., H, W]: each cell's mass spread evenly over the pixels
    whose centre it holds (the total unchanged)."""
    h, w = cells.shape[-2:]
    H, W = image_size
    rows = ((torch.arange(H, device=cells.device) + 0.5) * h / H).floor().long().clamp_(0, h - 1)  # [H]
    cols = ((torch.arange(W, device=cells.device) + 0.5) * w / W).floor().long().clamp_(0, w - 1)  # [W]
    row_count = torch.bincount(rows, minlength=h).to(cells.dtype)  # pixels per cell row
    col_count = torch.bincount(cols, minlength=w).to(cells.dtype)
    per_pixel = cells / (row_count[:, None] * col_count[None, :]).clamp_min(1)  # [..., h, w]
    return per_pixel[..., rows, :][..., cols]


def box_coverage(boxes: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
    """boxes [..., 4] (x0, y0, x1, y1) -> [..., H, W]: the fraction of each pixel inside the box."""
    H, W = image_size
    ys = torch.arange(H, device=boxes.device, dtype=boxes.dtype)
    xs = torch.arange(W, device=boxes.device, dtype=boxes.dtype)
    x0, y0, x1, y1 = (boxes[..., i, None] for i in range(4))
    cover_x = (torch.minimum(xs + 1, x1) - torch.maximum(xs, x0)).clamp(0, 1)  # [..., W]
    cover_y = (torch.minimum(ys + 1, y1) - torch.maximum(ys, y0)).clamp(0, 1)  # [..., H]
    return cover_y[..., :, None] * cover_x[..., None, :]


def maps_from_boxes(boxes: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
    """Glimpse boxes [B, T, K, 4] -> [B, T, H, W]: each of the K scales spreads an equal share of the
    mass over its pixels in the image (each is read into the same g x g cells: the finest is densest)."""
    per_box = _normalise(box_coverage(boxes, image_size))  # [B, T, K, H, W]
    return _normalise(per_box.sum(2))


def maps_from_filters(fx: torch.Tensor, fy: torch.Tensor) -> torch.Tensor:
    """DRAW filterbanks Fx [..., N, W], Fy [..., N, H] (rows sum to 1) -> [..., H, W]: the weight each
    pixel gets in the N x N read, F_Y^T 1 1^T F_X / N^2, which sums to 1 (eq. 27 with x = the pixel)."""
    n = fx.shape[-2]
    return fy.sum(-2)[..., :, None] * fx.sum(-2)[..., None, :] / (n * n)


def window_boxes(gx: torch.Tensor, gy: torch.Tensor, delta: torch.Tensor, n: int) -> torch.Tensor:
    """DRAW's N x N grid as a box (N delta pixels on a side, centred at (gX, gY), eqs. 19-24):
    [...] -> [..., 4] in pixel edges. The paper's 1-based pixel a covers [a - 1, a)."""
    half = n * delta / 2
    cx, cy = gx - 0.5, gy - 0.5
    return torch.stack([cx - half, cy - half, cx + half, cy + half], -1)


def centre_prior(image_size: tuple[int, int], sigma: float = 0.25, device=None) -> torch.Tensor:
    """[H, W]: a Gaussian at the image centre with std `sigma` x the side (always looking at the middle)."""
    H, W = image_size
    ys = (torch.arange(H, device=device, dtype=torch.float32) + 0.5 - H / 2) / (sigma * H)
    xs = (torch.arange(W, device=device, dtype=torch.float32) + 0.5 - W / 2) / (sigma * W)
    prior = torch.exp(-0.5 * (ys[:, None] ** 2 + xs[None, :] ** 2))
    return prior / prior.sum()


def step_labels(prefix: str, batch: int, steps: int) -> list[list[str]]:
    return [[f"{prefix} {t + 1}" for t in range(steps)] for _ in range(batch)]


def full_mask(batch: int, steps: int, device=None) -> torch.Tensor:
    return torch.ones(batch, steps, dtype=torch.bool, device=device)

