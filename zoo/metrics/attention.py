"""Was the attention on the right thing, and does the model use what it attends? The same metrics
for every family, from an `AttentionRecord`'s pixel maps and boxes and a target box per image.

Correctness (per map, against the target box): the pointing game (Zhang et al. 2016: the peak pixel
lies inside the box), the mass in the box (an edge pixel by its covered share), and for windows and
glimpses the IoU and whether the window's centre lies inside; each beside its chance levels:
uniform (the box's area share), the centre prior (`record.centre_prior`) and random boxes (the
model's own window sizes at uniformly random places, fixed seed).

Faithfulness (Petsiuk et al. 2018, deletion and insertion): blank the most-attended pixels first
and follow the score the model gives its own prediction, against random (and centre-prior) orders;
the score is the area between the curves, above 0 faithful.

Every number gets a percentile-bootstrap 95% interval over the test items (`bootstrap_ci`, paired:
the same resamples for every number), the differences to the controls included: "beats the centre
prior" is a claim only when that interval lies above 0.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from zoo.attention.record import box_coverage, centre_prior, peak_pixels


def _boxes(boxes: torch.Tensor) -> torch.Tensor:
    """[N, 4] or [N, M, 4] -> [N, M, 4]."""
    return boxes[:, None] if boxes.dim() == 2 else boxes


#: elements of box coverage computed at once (20,000 boxes cost time, never gigabytes)
MASK_CHUNK = 1 << 22


def target_mask(boxes: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
    """Target boxes [N, 4] or [N, M, 4] (a box of -1s is an empty slot) -> the union of their pixel
    coverage [N, H, W] in [0, 1]."""
    boxes = _boxes(boxes).float()
    valid = (boxes >= 0).all(-1)  # [N, M]
    H, W = image_size
    step = max(1, MASK_CHUNK // max(1, boxes.shape[0] * H * W))
    mask = boxes.new_zeros(boxes.shape[0], H, W)
    for start in range(0, boxes.shape[1], step):
        part = slice(start, start + step)
        cover = box_coverage(boxes[:, part], image_size) * valid[:, part, None, None]
        mask = torch.maximum(mask, cover.amax(1))
    return mask


def _contains(boxes: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """boxes [..., 4] (x0, y0, x1, y1; x1, y1 exclusive), points x, y [...] -> bool [...]."""
    return (boxes[..., 0] <= x) & (x < boxes[..., 2]) & (boxes[..., 1] <= y) & (y < boxes[..., 3])


def pointing_game(maps: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """maps [N, H, W], target boxes [N, 4] or [N, M, 4] -> hits [N] bool: the peak pixel's centre
    (`record.peak_pixels`: the middle of a plateau) lies inside a target box. A map with no finite
    positive mass is a miss."""
    W = maps.shape[-1]
    flat = torch.nan_to_num(maps.flatten(1).float(), nan=-1.0, posinf=-1.0, neginf=-1.0)
    index = peak_pixels(maps)[:, None]  # [N, 1]
    b = _boxes(boxes).float()
    inside = _contains(b, (index % W).float() + 0.5, (index // W).float() + 0.5)
    return (inside & (b >= 0).all(-1)).any(1) & (flat.amax(1) > 0)


def mass_in_box(maps: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """maps [N, H, W] (probability maps), target boxes -> [N] the mass on the target's pixels."""
    maps = torch.nan_to_num(maps.float(), nan=0.0)
    return (maps * target_mask(boxes, maps.shape[-2:])).flatten(1).sum(1)


def box_area(boxes: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
    """[N]: the share of the image's pixels inside the target (the uniform map's pointing game and
    mass in box)."""
    H, W = image_size
    return target_mask(boxes, image_size).flatten(1).sum(1) / (H * W)


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [..., 4], b [..., 4] (x0, y0, x1, y1) -> IoU [...]."""
    w = (torch.minimum(a[..., 2], b[..., 2]) - torch.maximum(a[..., 0], b[..., 0])).clamp_min(0)
    h = (torch.minimum(a[..., 3], b[..., 3]) - torch.maximum(a[..., 1], b[..., 1])).clamp_min(0)
    inter = w * h
    area = lambda t: (t[..., 2] - t[..., 0]).clamp_min(0) * (t[..., 3] - t[..., 1]).clamp_min(0)
    return inter / (area(a) + area(b) - inter).clamp_min(1e-12)


def centre_in_box(windows: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """windows [..., 4], target boxes [..., 4] -> bool [...]: the window's centre lies in the box."""
    return _contains(boxes, (windows[..., 0] + windows[..., 2]) / 2, (windows[..., 1] + windows[..., 3]) / 2)


def bootstrap_ci(values: dict[str, torch.Tensor], groups: torch.Tensor, resamples: int = 1000, seed: int = 0,
                 level: float = 0.95) -> dict[str, list[float]]:
    """Percentile-bootstrap intervals of means over test items: values {name: [N]}, groups [N] (the
    test item of each entry, e.g. a caption's words share one) -> {name: [low, high]}. Items are
    drawn with replacement, the same draws for every name (a difference's interval is paired)."""
    if not values or groups.numel() == 0:
        return {}
    names = list(values)
    _, item = torch.unique(groups.cpu(), return_inverse=True)
    items = int(item.max()) + 1
    stacked = torch.stack([values[name].detach().cpu().double().flatten() for name in names], 1)  # [N, k]
    sums = torch.zeros(items, len(names), dtype=torch.float64).index_add_(0, item, stacked)
    counts = torch.zeros(items, dtype=torch.float64).index_add_(0, item, torch.ones(len(item), dtype=torch.float64))
    generator = torch.Generator().manual_seed(seed)
    drawn = torch.randint(items, (resamples, items), generator=generator)
    times = torch.zeros(resamples, items, dtype=torch.float64).scatter_add_(1, drawn, torch.ones_like(drawn, dtype=torch.float64))
    means = (times @ sums) / (times @ counts).unsqueeze(1)  # [resamples, k]
    tail = (1 - level) / 2
    low, high = torch.quantile(means, torch.tensor([tail, 1 - tail], dtype=torch.float64), dim=0)
    return {name: [float(low[i]), float(high[i])] for i, name in enumerate(names)}


def _summary(per_entry: dict[str, torch.Tensor], groups: torch.Tensor | None, seed: int) -> dict:
    """Means of per-entry values, and with `groups` their bootstrap intervals under "ci95"."""
    out: dict = {name: value.float().mean().item() for name, value in per_entry.items()}
    if groups is not None:
        out["ci95"] = bootstrap_ci(per_entry, groups, seed=seed)
    return out


def correctness(maps: torch.Tensor, targets: torch.Tensor, windows: torch.Tensor | None = None,
                window_names: list[str] | None = None, seed: int = 0,
                groups: torch.Tensor | None = None) -> dict[str, float]:
    """Means over N maps [N, H, W]; targets [N, 4] or [N, M, 4] (any counts; -1s are empty slots);
    windows [N, K, 4] or None, per window name against the best-overlapping target. Every metric
    with its chance levels (`_uniform`, `_centre`, `_random`) and the differences to them
    (`_minus_uniform`, ...); with groups [N] (each map's test item), intervals under "ci95"."""
    N, H, W = maps.shape
    targets = _boxes(targets).float()
    if N == 0:
        return {"maps": 0}  # nothing to score (e.g. a caption set that names no item)
    prior = centre_prior((H, W), device=maps.device).expand(N, H, W)
    area = box_area(targets, (H, W))
    per_map = {
        "pointing": pointing_game(maps, targets).float(),
        "pointing_uniform": area,
        "pointing_centre": pointing_game(prior, targets).float(),
        "mass_in_box": mass_in_box(maps, targets),
        "mass_in_box_uniform": area,
        "mass_in_box_centre": mass_in_box(prior, targets),
    }
    if windows is not None:
        generator = torch.Generator(device=windows.device).manual_seed(seed)
        valid = (targets >= 0).all(-1)[:, None, :]  # [N, 1, M]
        for k, name in enumerate(window_names or [f"window {k + 1}" for k in range(windows.shape[1])]):
            window = windows[:, k].float()  # [N, 4]
            size = window[:, 2:] - window[:, :2]
            at = lambda centre: torch.cat([centre - size / 2, centre + size / 2], -1)
            # the window's size at uniformly random places, and at the image's middle
            u = torch.rand(N, 2, generator=generator, device=windows.device)
            candidates = {"": window, "_random": at(u * torch.tensor([W, H], device=windows.device)),
                          "_centre": at(torch.tensor([W / 2, H / 2], device=windows.device))}
            key = name.replace(" ", "_")
            for suffix, boxes in candidates.items():
                iou = (box_iou(boxes[:, None, None], targets[:, None]) * valid).amax(-1)[:, 0]  # [N]
                inside = (centre_in_box(boxes[:, None, None], targets[:, None]) & valid).any(-1)[:, 0]
                per_map[f"{key}_iou{suffix}"] = iou
                per_map[f"{key}_centre_in_box{suffix}"] = inside.float()
    for name, measured in list(per_map.items()):  # the paired differences to the controls
        for control in ("_uniform", "_centre", "_random"):
            if not name.endswith(("_uniform", "_centre", "_random")) and f"{name}{control}" in per_map:
                per_map[f"{name}_minus{control}"] = measured - per_map[f"{name}{control}"]
    return {"maps": N, **_summary(per_map, groups, seed)}


# ----------------------------------------------------------------------------- faithfulness
def order_by(maps: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """[N, H, W] -> pixel indices [N, H*W], most attended first (ties broken by a random key from
    `generator`, so flat regions of a map are not blanked in raster order)."""
    flat = torch.nan_to_num(maps.flatten(1).float(), nan=0.0)
    jitter = torch.rand(flat.shape, generator=generator, device=flat.device) if generator is not None \
        else torch.zeros_like(flat)
    key = flat + jitter * 1e-9 * flat.abs().amax(1, keepdim=True).clamp_min(1e-30)
    return key.argsort(1, descending=True)


def curve(score: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor, order: torch.Tensor,
          steps: int, background: float = 0.0, insertion: bool = False) -> torch.Tensor:
    """Deletion (or insertion) curve: images [N, C, H, W], order [N, H*W] -> scores [steps + 1, N]:
    at step k the first k/steps of the ordered pixels are blanked (insertion: only they are shown);
    `score(images) -> [N]`, the model's probability of its own clean prediction."""
    N, C, H, W = images.shape
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(H * W, device=order.device).expand(N, -1))  # pixel -> position
    rank = rank.view(N, 1, H, W)
    blank = torch.full_like(images, background)
    scores = []
    for k in range(steps + 1):  # a handful of model calls, each batched over N
        chosen = rank < round(k * H * W / steps)
        shown = ~chosen if not insertion else chosen
        scores.append(score(torch.where(shown, images, blank)))
    return torch.stack(scores)


def faithfulness_rows(score: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor, maps: torch.Tensor,
                      steps: int = 10, background: float = 0.0, seed: int = 0) -> dict[str, torch.Tensor]:
    """Per row [N]: deletion and insertion areas for the attention order, a random order and the
    centre prior's order, and the gaps (positive: the attention is faithful). images [N, C, H, W],
    maps [N, H, W]."""
    N, _, H, W = images.shape
    generator = torch.Generator(device=images.device).manual_seed(seed)
    orders = {
        "attention": order_by(maps, generator),
        "random": torch.rand(N, H * W, generator=generator, device=images.device).argsort(1),
        "centre": order_by(centre_prior((H, W), device=images.device).expand(N, H, W), generator),
    }
    area = partial(torch.trapezoid, dx=1.0 / steps, dim=0)  # [steps + 1, N] -> [N], the area on [0, 1]
    out: dict[str, torch.Tensor] = {}
    for name, order in orders.items():
        out[f"deletion_{name}"] = area(curve(score, images, order, steps, background)).float()
        out[f"insertion_{name}"] = area(curve(score, images, order, steps, background, insertion=True)).float()
    out["deletion_gap"] = out["deletion_random"] - out["deletion_attention"]
    out["insertion_gap"] = out["insertion_attention"] - out["insertion_random"]
    out["deletion_gap_centre"] = out["deletion_centre"] - out["deletion_attention"]
    return out


# ----------------------------------------------------------------------------- a whole evaluation
def scored_steps(record, targets: torch.Tensor, target_words: list[list[str]] | None = None):
    """(images [S], steps [S], targets [S, M, 4], labelled): every headline step of every image on all
    its target boxes; with `target_words` (captions), the steps labelled with an item word, on the
    boxes it names in its own image, and labelled [W, 2] = (image, 1 if the word names nothing there:
    a hallucination, not scored) for every item word."""
    images, times = record.headline_steps().nonzero(as_tuple=True)
    targets = _boxes(targets).float()
    if target_words is None:
        return images, times, targets[images], torch.zeros(0, 2, dtype=torch.long)
    vocab = {word for words in target_words for word in words if word}
    keep, boxes, labelled = [], [], []
    for s, (i, t) in enumerate(zip(images.tolist(), times.tolist())):  # a few words per caption
        word = record.labels[i][t]
        if word not in vocab:
            continue
        named = torch.tensor([w == word for w in target_words[i]], dtype=torch.bool)
        labelled.append((i, int(not named.any())))
        if not named.any():
            continue
        keep.append(s)
        boxes.append(torch.where(named[:, None], targets[i], torch.full_like(targets[i], -1.0)))
    keep_t = torch.tensor(keep, dtype=torch.long)
    return (images[keep_t], times[keep_t], (torch.stack(boxes) if boxes else targets[:0]),
            torch.tensor(labelled, dtype=torch.long).view(-1, 2))


@torch.no_grad()
def evaluate(model, examples: dict, batch_size: int = 100, curve_steps: int = 10, background: float = 0.0,
             seed: int = 0) -> dict:
    """Correctness and faithfulness of `model.attention_record` on `examples` (a data module's
    `boxed_examples`): every headline step's map and window on its target boxes, with a per-step
    breakdown; faithfulness follows `model.evidence` while the pixels are deleted in the order of
    where the model looked (overall for a class, the word's own map for a word)."""
    images_all, targets_all = examples["images"], examples["targets"]
    words_all = examples.get("target_words")
    scored, windows = [], []  # (maps, steps, target boxes, items) per batch; the windows of the maps
    rows: list[tuple] = []  # (images, row maps, evidence, items) per batch, for faithfulness
    labelled: list[torch.Tensor] = []  # (item, hallucinated) per item word
    degenerate = 0
    names: list[str] = []
    for start in range(0, len(images_all), batch_size):
        images = images_all[start:start + batch_size]
        words = words_all[start:start + batch_size] if words_all is not None else None
        record = model.attention_record(images)
        degenerate += int(record.degenerate().sum())
        idx, t, target, named = scored_steps(record, targets_all[start:start + batch_size], words)
        labelled.append(named + torch.tensor([start, 0]))
        scored.append((record.maps[idx, t], t, target, idx.cpu() + start))
        names = record.box_labels
        if record.boxes is not None:
            windows.append(record.boxes[idx, t])
        if words is None:  # a class: where the model looked overall, one row per image
            idx = torch.arange(len(images))
            t = torch.full_like(idx, record.maps.shape[1] - 1)
            row_maps = record.overall()
        else:
            row_maps = record.maps[idx, t]
        evidence = model.evidence(record, idx, t) if len(idx) else None
        if evidence is not None:
            rows.append((images[idx], row_maps, evidence, idx.cpu() + start))
    maps_t, times_t, boxes_t, items_t = (torch.cat(parts) for parts in zip(*scored))
    out: dict = {"correctness": correctness(maps_t, boxes_t, torch.cat(windows) if windows else None, names, seed,
                                            groups=items_t),
                 "degenerate_maps": degenerate}
    if words_all is not None:
        words_t = torch.cat(labelled)
        absent, count = int(words_t[:, 1].sum()), len(words_t)
        out["hallucination"] = {"item_words": count, "absent": absent,
                                "chair_i": absent / count if count else float("nan"),
                                "ci95": bootstrap_ci({"chair_i": words_t[:, 1].double()}, words_t[:, 0], seed=seed)}
    else:
        times_c = times_t.cpu()
        out["per_step"] = [correctness(maps_t[times_t == s], boxes_t[times_t == s], seed=seed,
                                       groups=items_t[times_c == s]) | {"step": int(s) + 1}
                           for s in times_t.unique().tolist()]
    out["faithfulness"] = None  # a family with no evidence to follow
    if rows:
        parts = [faithfulness_rows(evidence, images, row_maps, curve_steps, background, seed)
                 for images, row_maps, evidence, _ in rows]
        per_row = {key: torch.cat([part[key].cpu() for part in parts]) for key in parts[0]}
        out["faithfulness"] = {**_summary(per_row, torch.cat([r[3] for r in rows]), seed),
                               "rows": int(sum(len(r[3]) for r in rows))}
    return out

