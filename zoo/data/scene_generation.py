"""FashionScenes' pictures: tinted Fashion-MNIST items placed without overlap on a black canvas, with
their tight boxes (x1, y1 exclusive) and captions (zoo.data.scene_grammar), deterministic and cached.
Scenes come in blocks of BLOCK, block b from the RNG (seed, split, b), so a cut split is a prefix
of the full one; train draws from Fashion-MNIST train, val and test (always `test_seed`) from two
halves of its test items (`split_pool`). A split is cached as .npz named by its settings' hash.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from zoo.data.layout import place_items
from zoo.data.scene_grammar import COLOURS, HEAD_WORDS, TEMPLATES, captions_for_scene, relations
from zoo.guards.errors import UserError
from zoo.guards.files import check_npz

FORMAT_VERSION = 2  # 2: captions carry the item each word names
BLOCK = 256  # scenes per RNG block (prefix stability, see the module docstring)
SPLITS = ("train", "val", "test")
PALETTE = np.array(list(COLOURS.values()), dtype=np.float32)  # [C, 3], in COLOUR_NAMES' order
MAX_ITEMS = max(TEMPLATES)  # the most items a caption template names
ARRAYS = ("images", "n_items", "labels", "colours", "boxes", "source_index")  # Scenes' fields, in order
TEXTS = ("captions", "caption_items")


@dataclass
class Scenes:
    """One split: images uint8 [N, 3, S, S]; per item slot labels, colours, source_index [N, K] and
    boxes float32 [N, K, 4] (-1: empty slot); captions (N lists of strings) and caption_items (per
    caption, the slot each token names, -1: none)."""

    images: np.ndarray
    n_items: np.ndarray
    labels: np.ndarray
    colours: np.ndarray
    boxes: np.ndarray
    source_index: np.ndarray
    captions: list[list[str]]
    caption_items: list[list[list[int]]]

    def __len__(self) -> int:
        return len(self.images)

    def item_boxes(self, i: int) -> np.ndarray:
        return self.boxes[i, :self.n_items[i]]

    def item_words(self, i: int) -> list[str]:
        return [HEAD_WORDS[c] for c in self.labels[i, :self.n_items[i]]]

    # npz round-trip (no pickles: captions travel as JSON strings)
    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **{name: getattr(self, name) for name in ARRAYS},
                            **{name: np.array(json.dumps(getattr(self, name))) for name in TEXTS},
                            version=np.array(FORMAT_VERSION))
        return buffer.getvalue()

    @classmethod
    def load(cls, path: str | os.PathLike, canvas_size: int, num: int | None = None) -> "Scenes":
        """A cached split (of `num` scenes), checked before and after reading (ValueError: rebuilt)."""
        check_npz(path)
        with np.load(path, allow_pickle=False) as z:
            if int(z["version"]) != FORMAT_VERSION:
                raise ValueError("old cache format")
            scenes = cls(*(z[name] for name in ARRAYS), *(json.loads(str(z[name])) for name in TEXTS))
        n = len(scenes.images) if num is None else num
        k = scenes.labels.shape[1] if scenes.labels.ndim == 2 else -1
        shapes = {"images": (n, 3, canvas_size, canvas_size), "n_items": (n,), "labels": (n, k), "colours": (n, k),
                  "boxes": (n, k, 4), "source_index": (n, k)}
        for name, shape in shapes.items():
            if getattr(scenes, name).shape != shape:
                raise ValueError(f"{name} has shape {getattr(scenes, name).shape}, not {shape}")
        if (len(scenes.captions) != n or len(scenes.caption_items) != n
                or not all(isinstance(c, list) and c and all(isinstance(s, str) for s in c) for c in scenes.captions)
                or int(scenes.n_items.min(initial=1)) < 1 or int(scenes.n_items.max(initial=0)) > k
                or int(scenes.labels.max(initial=0)) >= len(HEAD_WORDS)):
            raise ValueError("inconsistent captions or items")
        return scenes


def _resize_items(items: np.ndarray, size: int) -> np.ndarray:
    """uint8 [M, 28, 28] -> uint8 [M, size, size] (antialiased bilinear)."""
    if items.shape[-1] == size or len(items) == 0:
        return items
    t = torch.from_numpy(items.astype(np.float32))[:, None]
    t = F.interpolate(t, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return t[:, 0].round().clamp(0, 255).to(torch.uint8).numpy()


def draw_layouts(rng: np.random.Generator, pool: np.ndarray, m: int, canvas_size: int,
                 item_sizes: Sequence[int], min_items: int, max_items: int,
                 gap: int) -> dict[str, np.ndarray]:
    """m layouts of K = max_items slots: n_items [m]; source_index, colours, sizes [m, K] (-1: empty);
    corners [m, K, 2] (x, y)."""
    n_items = rng.integers(min_items, max_items + 1, size=m)
    active = np.arange(max_items)[None, :] < n_items[:, None]
    source_index = np.where(active, pool[rng.integers(0, len(pool), size=(m, max_items))], -1)
    colours = np.where(active, rng.integers(0, len(PALETTE), size=(m, max_items)), -1)
    sizes = np.asarray(item_sizes)[rng.integers(0, len(item_sizes), size=(m, max_items))]
    return {"n_items": n_items, "source_index": source_index, "colours": colours, "sizes": sizes,
            "corners": place_items(rng, sizes, n_items, canvas_size, gap)}


def paint(items: np.ndarray, layouts: dict[str, np.ndarray], canvas_size: int) -> tuple[np.ndarray, ...]:
    """Paint tinted items (uint8 [M, 28, 28]) by `layouts` (draw_layouts') -> (images uint8 [N, 3, S, S],
    boxes float32 [N, K, 4] tight around the drawn pixels, -1 for empty slots)."""
    source_index, colours, sizes = layouts["source_index"], layouts["colours"], layouts["sizes"]
    active = source_index >= 0
    n, k = source_index.shape
    images = np.zeros((n, 3, canvas_size, canvas_size), dtype=np.uint8)
    boxes = np.full((n, k, 4), -1.0, dtype=np.float32)
    for slot in range(k):  # K <= 3 slots x a few sizes: each paste covers all scenes at once
        for size in np.unique(sizes[active[:, slot], slot]).tolist():
            sel = np.nonzero(active[:, slot] & (sizes[:, slot] == size))[0]
            grey = _resize_items(items[source_index[sel, slot]], size).astype(np.float32)  # [M, s, s]
            tint = PALETTE[colours[sel, slot]]  # [M, 3]
            patch = np.rint(grey[:, None] * tint[:, :, None, None]).astype(np.uint8)  # [M, 3, s, s]
            x, y = layouts["corners"][sel, slot].T
            rows = (y[:, None] + np.arange(size))[:, None, :, None]
            cols = (x[:, None] + np.arange(size))[:, None, None, :]
            images[sel[:, None, None, None], np.arange(3)[None, :, None, None], rows, cols] = patch
            # tight box of the drawn pixels (the whole patch if an item is blank)
            drawn = patch.max(1) > 0  # [M, s, s]
            blank = ~drawn.any((1, 2))
            hits = drawn.any(1), drawn.any(2)  # [M, s] each: the columns, the rows holding a drawn pixel
            c0, r0 = (np.where(blank, 0, hit.argmax(1)) for hit in hits)
            c1, r1 = (np.where(blank, size, size - hit[:, ::-1].argmax(1)) for hit in hits)
            boxes[sel, slot] = np.stack([x + c0, y + r0, x + c1, y + r1], 1).astype(np.float32)
    return images, boxes


def generate_block(items: np.ndarray, labels: np.ndarray, pool: np.ndarray, n: int,
                   rng: np.random.Generator, canvas_size: int, item_sizes: Sequence[int],
                   min_items: int, max_items: int, min_captions: int, max_captions: int,
                   gap: int) -> Scenes:
    """n <= BLOCK scenes from the items in `pool`; layouts drawn for a full block and cut."""
    layouts = draw_layouts(rng, pool, BLOCK, canvas_size, item_sizes, min_items, max_items, gap)
    counts = rng.integers(min_captions, max_captions + 1, size=BLOCK)[:n]
    layouts = {key: value[:n] for key, value in layouts.items()}
    n_items, source_index, colours = layouts["n_items"], layouts["source_index"], layouts["colours"]
    item_labels = np.where(source_index >= 0, labels[np.maximum(source_index, 0)], -1)
    images, boxes = paint(items, layouts, canvas_size)
    rel = relations(boxes)
    described = [captions_for_scene(item_labels[i, :n_items[i]], colours[i, :n_items[i]],
                                    rel[i, :n_items[i], :n_items[i]], int(counts[i]), rng)
                 for i in range(n)]
    return Scenes(images, n_items.astype(np.int64), item_labels.astype(np.int64), colours.astype(np.int64),
                  boxes, source_index.astype(np.int64), *map(list, zip(*described)))


def generate_scenes(items: np.ndarray, labels: np.ndarray, pool: np.ndarray, num: int, seed: int,
                    split: str, canvas_size: int = 64, item_sizes: Sequence[int] = (28,),
                    min_items: int = 1, max_items: int = MAX_ITEMS, min_captions: int = 3,
                    max_captions: int = 5, gap: int = 0) -> Scenes:
    """`num` scenes of `split` (items uint8 [M, 28, 28], labels int [M], pool: allowed item indices)."""
    if not 1 <= min_items <= max_items <= MAX_ITEMS:
        raise UserError(f"items per scene must satisfy 1 <= min_items <= max_items <= {MAX_ITEMS}, "
                        f"got {min_items}..{max_items}")
    if not 1 <= min_captions <= max_captions:
        raise UserError(f"captions per scene must satisfy 1 <= min <= max, got {min_captions}..{max_captions}")
    if max(item_sizes) > canvas_size:
        raise UserError(f"item size {max(item_sizes)} exceeds the {canvas_size}px canvas")
    if len(pool) == 0:
        raise UserError(f"no items to draw the {split} scenes from")
    if max_items * min(item_sizes) ** 2 > canvas_size ** 2:
        raise UserError(f"cannot place {max_items} items of size {min(item_sizes)} on a "
                        f"{canvas_size}x{canvas_size} canvas without overlap")
    blocks = [generate_block(items, labels, np.asarray(pool), min(BLOCK, num - b * BLOCK),
                             np.random.default_rng([seed, SPLITS.index(split), b]), canvas_size, item_sizes,
                             min_items, max_items, min_captions, max_captions, gap)
              for b in range(-(-num // BLOCK))]
    if not blocks:
        raise UserError(f"the {split} split needs at least one scene")
    return Scenes(*(np.concatenate([getattr(x, name) for x in blocks]) for name in ARRAYS),
                  *([c for x in blocks for c in getattr(x, name)] for name in TEXTS))


def split_pool(split: str, num_items: int, test_seed: int) -> np.ndarray:
    """Item indices `split` may use: all train items, or one of two halves of the test items."""
    if split == "train":
        return np.arange(num_items)
    order = np.random.default_rng([test_seed, 99]).permutation(num_items)
    return np.sort(order[:num_items // 2] if split == "val" else order[num_items // 2:])


# ----------------------------------------------------------------------------- items + cache
def load_items(item_loader, split: str, label: str) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [N, H, W], labels int64 [N]) of `item_loader(split)`, or of Fashion-MNIST."""
    if item_loader is None:
        from zoo.data.fashion_mnist import load_fashion_mnist as item_loader
    images, labels = item_loader(split)
    images, labels = np.asarray(images, dtype=np.uint8), np.asarray(labels, dtype=np.int64)
    if images.ndim != 3 or len(images) != len(labels):
        raise UserError(f"{label}: item source '{split}' must give [N, H, W] images "
                        f"and [N] labels, got {images.shape} and {labels.shape}")
    return images, labels


def cache_file(settings: dict, source: tuple[np.ndarray, np.ndarray] | None, cache_dir: str | None) -> Path:
    """scenes-<split>-<num>-<key>.npz (the key: every setting's and the item source's hash)."""
    if source is not None:
        content = hashlib.sha1(np.ascontiguousarray(source[0]).tobytes())
        content.update(np.ascontiguousarray(source[1]).astype(np.int64).tobytes())
    settings = {**settings, "source": "fashion-mnist" if source is None else content.hexdigest()}
    key = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir else Path(os.environ.get("ZOO_DATA_DIR", "data")) / "scenes"
    return root / f"scenes-{settings['split']}-{settings['num']}-{key}.npz"
