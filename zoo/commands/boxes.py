"""`zoo attend --boxes FILE`: each image's known targets, from a JSON object of images to their boxes
[x0, y0, x1, y1] in the ORIGINAL image's pixels, as a list or under "boxes" (a scene export's
`references.json` as it is). A key names an image as given, the same file (from the current folder
or the boxes file's), or its basename where unique. Boxes are mapped into the model input's pixels
(Preprocessing.map_boxes), the attention record's frame."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from zoo.guards.errors import UserError, shorten
from zoo.guards.files import read_json

FRAME = "model input pixels (x0, y0, x1, y1), mapped from the original image's pixels by the resize rule"


def _resolved(path: str | os.PathLike) -> Path | None:
    try:
        return Path(path).resolve()
    except (OSError, ValueError, RuntimeError):  # a key no file system can name (NUL, loops)
        return None


def match_keys(keys, images: list[str], boxes_file: str) -> dict[str, str]:
    """{image as given: the key naming it} for the images some key names."""
    by_file: dict[Path | None, str] = {}
    for key in keys:
        for root in (Path.cwd(), Path(boxes_file).parent):
            by_file.setdefault(_resolved(root / key), key)
    by_file.pop(None, None)  # keys no file system can name
    matched = {image: image if image in keys else by_file.get(_resolved(image)) for image in images}
    matched = {image: key for image, key in matched.items() if key is not None}
    unmatched = [image for image in images if image not in matched]
    for image in unmatched:
        name = Path(image).name
        if name not in keys:
            continue
        namesakes = [other for other in unmatched if Path(other).name == name]
        if len(namesakes) > 1:
            raise UserError(f"--boxes {boxes_file}: key {name!r} names {len(namesakes)} images "
                            f"({', '.join(namesakes[:3])}); give their paths as keys")
        matched[image] = name
    return matched


def read_boxes(path: str, images: list[str], sizes: list[tuple[int, int]],
               words: dict[str, list[str]] | None = None) -> dict[str, torch.Tensor]:
    """{image: boxes [K, 4] in its original pixels} for the given `images` of original `sizes` (H, W),
    checked: four numbers with x0 < x1, y0 < y1, inside the image. An entry's "box_words" (the item
    word of each box, as a scene export writes them) go into `words` {image: K words} when given."""
    raw = read_json(path, f"--boxes {path}", expect=dict)
    boxes, size_of = {}, dict(zip(images, sizes))
    for image, key in match_keys(raw, images, path).items():
        entry = raw[key].get("boxes") if isinstance(raw[key], dict) else raw[key]
        if not isinstance(entry, list):
            raise UserError(f"--boxes {path}: {image}: expected a list of [x0, y0, x1, y1] boxes "
                            "(or an object with one under \"boxes\")")
        H, W = size_of[image]
        for box in entry:
            if (not isinstance(box, list) or len(box) != 4
                    or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in box)):
                raise UserError(f"--boxes {path}: {image}: a box is four numbers [x0, y0, x1, y1], got {shorten(box, 60)}")
            x0, y0, x1, y1 = box
            if not (0 <= x0 < x1 <= W and 0 <= y0 < y1 <= H):
                raise UserError(f"--boxes {path}: {image}: box {shorten(box, 60)} is not inside the {W}x{H} image "
                                "(boxes are in the original image's pixels)")
        named = raw[key].get("box_words") if isinstance(raw[key], dict) else None
        if named is not None and (not isinstance(named, list) or len(named) != len(entry)
                                  or not all(isinstance(w, str) for w in named)):
            raise UserError(f"--boxes {path}: {image}: \"box_words\" must be one word per box "
                            f"({len(entry)}), got {shorten(named, 60)}")
        if entry:
            boxes[image] = torch.tensor(entry, dtype=torch.float32).reshape(-1, 4)
            if named is not None and words is not None:
                words[image] = list(named)
    return boxes


def to_input(spec, boxes: dict[str, torch.Tensor], images: list[str], sizes: list[tuple[int, int]],
             words: dict[str, list[str]] | None = None):
    """{image: boxes [K, 4] in the model input's pixels}; a box the centre crop cuts away is left out
    (and its word from `words`, in place)."""
    mapped = {}
    for image, size in zip(images, sizes):
        if image in boxes:
            inside = spec.map_boxes(boxes[image], size)
            keep = (inside[:, 2] > inside[:, 0]) & (inside[:, 3] > inside[:, 1])
            inside = inside[keep]
            if words is not None and image in words:
                words[image] = [w for w, k in zip(words[image], keep.tolist()) if k]
            if len(inside):
                mapped[image] = inside
    return mapped


def item_steps(labels: list[str], boxes: torch.Tensor, box_words: list[str] | None, vocab: set[str]):
    """A caption's words against its image's boxes, as the zoo's localisation metric scores them
    (`zoo.metrics.attention.scored_steps`): a word that names an item (in `vocab`) is scored on the
    boxes of that item (with `box_words`; without them, on every box); a word naming no item in the
    image (a hallucination) and every other word are not scored. -> (targets [T, K, 4], -1 for a box
    not named, or None per step; kinds: "item", "absent" or "other" per step)."""
    targets, kinds = [], []
    for word in labels:
        if word not in vocab:
            targets.append(None)
            kinds.append("other")
            continue
        named = torch.tensor([w == word for w in box_words] if box_words is not None else [True] * len(boxes),
                             dtype=torch.bool)
        if not named.any():
            targets.append(None)
            kinds.append("absent")
            continue
        targets.append(torch.where(named[:, None], boxes, torch.full_like(boxes, -1.0)))
        kinds.append("item")
    return targets, kinds


def summary(records: list[dict], n_images: int) -> list[str]:
    """The scores in one line, and one on the images without boxes."""
    scored = [r for r in records if "target_boxes" in r]
    lines = []
    if scored:
        steps = [s for r in scored for s in r["steps"] if s.get("pointing") is not None]
        words = [r["item_words"] for r in scored if "item_words" in r]
        what = f"{len(steps)} item word(s)" if words else f"{len(steps)} step(s)"
        if steps:
            pointing = sum(s["pointing"] for s in steps) / len(steps)
            mass = sum(s["mass_in_box"] for s in steps) / len(steps)
            lines.append(f"boxes: {len(scored)} image(s), {what}: pointing {100 * pointing:.1f}% "
                         f"of {'them' if words else 'steps'}, mean mass in box {mass:.3f}")
        else:
            lines.append(f"boxes: {len(scored)} image(s), {what}: nothing to score")
        if words:
            absent = sorted({w for r in words for w in r["absent"]})
            other = sorted({w for r in words for w in r["other"]})
            source = words[0]["source"]
            lines.append(f"boxes: item words from {source}; not scored: "
                         + (f"item words naming no box in their image ({', '.join(absent)}); " if absent else "")
                         + f"other words ({', '.join(other) or 'none'})")
    if len(scored) < n_images:
        missing = [r["image"] for r in records if "target_boxes" not in r]
        shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        lines.append(f"boxes: {len(missing)} of {n_images} image(s) have no boxes in the file, not scored ({shown})")
    return lines
