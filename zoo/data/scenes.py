"""FashionScenes: an offline captioning dataset with known object boxes.

A scene is a black `canvas_size` x `canvas_size` RGB canvas holding 1 to 3 colour-tinted
Fashion-MNIST items that do not overlap. Each scene gets 3 to 5 reference captions from a small
grammar that names the items, their colours and their spatial relations ("a red shirt left of a
blue bag"). The item boxes are kept, so that attention localisation can be scored: does the
model look at the shirt when it says "shirt"?

Determinism and splits:
- Scenes are generated in blocks of BLOCK scenes, block b from the RNG (seed, split, b): the
  first K scenes of a split are the same whatever the requested size, and a cut evaluation set is
  a prefix of the full one.
- train scenes draw items from Fashion-MNIST train (`seed`). val and test draw from Fashion-MNIST
  test, split into two disjoint halves by `test_seed`; val scenes use `seed + 1`, test scenes
  always `test_seed`, so every run is scored on the same test scenes.
- Each split is cached as .npz under $ZOO_DATA_DIR/scenes (or ./data/scenes), named by a hash of
  every generation setting, and written atomically.

Boxes are tight: x0, y0, x1, y1 in pixels (x1, y1 exclusive) of the drawn (non-zero) pixels of
the item. `box_words` hold the item's head word ("boot" for "ankle boot"), the word a caption
uses to name it.

Batches (float images in [0, 1], no mean/std normalisation; `dm.image_mean`/`dm.image_std`
say so explicitly):
- train: one (scene, caption) pair per example, `images [B, 3, S, S]`, `captions int64 [B, T]`
  (<start> w1 .. wn <end> <pad>..), `lengths int64 [B]` (with <start>/<end>), `image_ids`;
  length-bucketed batches, sorted longest caption first, with `host_lengths` (the lengths as
  plain ints, so a model can skip finished rows without reading a tensor). For supervised attention: `item_boxes float [B, K, 4]` (every item
  slot's box, -1 for empty slots) and `word_items int64 [B, T]` (aligned with `captions`: the
  slot of the item a colour or item word names, -1 elsewhere). `pad_to_multiple` pads T up to a
  multiple (e.g. 8), so a compiled training step meets a few caption lengths, not every one.
- val / test: each scene once, plus `references` (raw strings), `boxes` (list of float [n, 4]),
  `box_words` (list of lists), and `captions`/`lengths`/`word_items`/`item_boxes` of its first
  reference (for a teacher-forced validation loss).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from zoo.data.base import SplitDataModule
from zoo.data.layout import place_items
from zoo.data.vocab import Vocab, pad_captions, tokenize
from zoo.errors import UserError
from zoo.io import atomic_write_bytes

FORMAT_VERSION = 2  # 2: captions carry the item each word names
BLOCK = 256  # scenes per RNG block (prefix stability, see the module docstring)

# Fashion-MNIST class -> caption phrase; the head (last) word is the item's box word.
ITEM_NAMES = ["tshirt", "trousers", "pullover", "dress", "coat",
              "sandal", "shirt", "sneaker", "bag", "ankle boot"]
HEAD_WORDS = [name.split()[-1] for name in ITEM_NAMES]
ITEM_WORDS = frozenset(HEAD_WORDS)
# colour word -> RGB multiplier applied to the grey item
COLOURS = {"red": (1.0, 0.15, 0.15), "green": (0.2, 0.85, 0.2), "blue": (0.25, 0.4, 1.0),
           "yellow": (1.0, 0.9, 0.1), "purple": (0.65, 0.25, 1.0), "orange": (1.0, 0.55, 0.05),
           "white": (1.0, 1.0, 1.0), "cyan": (0.1, 0.85, 0.9)}
COLOUR_NAMES = list(COLOURS)
PALETTE = np.array(list(COLOURS.values()), dtype=np.float32)  # [C, 3]

# relation of item i to item j
LEFT, RIGHT, ABOVE, BELOW = 0, 1, 2, 3
RELATION_WORDS = {LEFT: "left of", RIGHT: "right of", ABOVE: "above", BELOW: "below"}
INVERSE = {LEFT: RIGHT, RIGHT: LEFT, ABOVE: BELOW, BELOW: ABOVE}

SPLITS = ("train", "val", "test")


# ----------------------------------------------------------------------------- grammar
TAG = "\x01"  # joins a word to the item slot it names inside the generator; never in a caption


def noun_phrase(label: int, colour: int, definite: bool = False, slot: int | None = None) -> str:
    """"a red shirt"; with `slot`, the colour and item words are tagged "red\x01<slot>" so the
    caption can say which item each word names (see `untag`)."""
    tag = "" if slot is None else f"{TAG}{slot}"
    colour_word = COLOUR_NAMES[colour] + tag
    name = " ".join(w + tag for w in ITEM_NAMES[label].split())
    if definite:
        return f"the {colour_word} {name}"
    if ITEM_NAMES[label] == "trousers":
        return f"a pair of {colour_word} {name}"
    return f"{'an' if colour_word[0] in 'aeiou' else 'a'} {colour_word} {name}"


def untag(tagged: str) -> tuple[str, list[int]]:
    """A tagged caption -> (the caption, the item slot of each of its `tokenize` tokens, -1 for
    words that name no item)."""
    words, slots = [], []
    for raw in tagged.split():
        word, _, slot = raw.partition(TAG)
        words.append(word)
        slots += [int(slot) if slot else -1] * len(tokenize(word))
    return " ".join(words), slots


def _rel(r: int) -> str:
    return RELATION_WORDS[r]


def _rel_long(r: int) -> str:
    return {LEFT: "to the left of", RIGHT: "to the right of", ABOVE: "above", BELOW: "below"}[r]


# Templates take (np(i, definite) -> str, rel(i, j) -> code) over the scene's items in an order
# the caller permutes; each returns one caption.
def _t1(np_, rel):
    return [
        lambda: np_(0),
        lambda: f"a picture of {np_(0)}",
        lambda: f"there is {np_(0)}",
        lambda: f"{np_(0)} on a black background",
        lambda: f"an image showing {np_(0)}",
        lambda: f"{np_(0)} in the picture",
    ]


def _t2(np_, rel):
    return [
        lambda: f"{np_(0)} {_rel(rel(0, 1))} {np_(1)}",
        lambda: f"{np_(0)} {_rel_long(rel(0, 1))} {np_(1)}",
        lambda: f"there is {np_(0)} {_rel(rel(0, 1))} {np_(1)}",
        lambda: f"{np_(0)} and {np_(1)}",
        lambda: f"{np_(0)} with {np_(1)} {_rel(rel(1, 0))} it",
        lambda: f"{np_(0)} is {_rel_long(rel(0, 1))} {np_(1)}",
    ]


def _t3(np_, rel):
    return [
        lambda: f"{np_(0)} , {np_(1)} and {np_(2)}",
        lambda: f"{np_(0)} {_rel(rel(0, 1))} {np_(1)} and {np_(2)} {_rel(rel(2, 1))} {np_(1, True)}",
        lambda: f"{np_(0)} {_rel(rel(0, 1))} {np_(1)} and {np_(2)} {_rel(rel(2, 0))} {np_(0, True)}",
        lambda: f"three items : {np_(0)} , {np_(1)} and {np_(2)}",
        lambda: f"{np_(0)} {_rel_long(rel(0, 2))} {np_(2)} , and {np_(1)}",
        lambda: f"there is {np_(0)} {_rel(rel(0, 1))} {np_(1)} and {np_(2)}",
    ]


TEMPLATES = {1: _t1, 2: _t2, 3: _t3}


def relations(boxes: np.ndarray) -> np.ndarray:
    """Spatial relation of item i to item j for every pair: boxes float [N, K, 4] -> int [N, K, K].

    Items that do not overlap are separated along x or y (or both); the relation names a
    separating axis (the one with the larger centre distance when both separate), so "A left of
    B" always means A's box ends before B's begins."""
    b = boxes[:, :, None, :]  # item i
    o = boxes[:, None, :, :]  # item j
    left, right = b[..., 2] <= o[..., 0], o[..., 2] <= b[..., 0]
    above, below = b[..., 3] <= o[..., 1], o[..., 3] <= b[..., 1]
    cx = (b[..., 0] + b[..., 2] - o[..., 0] - o[..., 2]) / 2
    cy = (b[..., 1] + b[..., 3] - o[..., 1] - o[..., 3]) / 2
    sep_x, sep_y = left | right, above | below
    horizontal = sep_x & (~sep_y | (np.abs(cx) >= np.abs(cy)))
    return np.where(horizontal, np.where(left, LEFT, RIGHT), np.where(above, ABOVE, BELOW))


def captions_for_scene(labels: Sequence[int], colours: Sequence[int], rel: np.ndarray,
                       count: int, rng: np.random.Generator, with_items: bool = False):
    """`count` distinct captions of one scene (labels/colours of its n items, rel [n, n]).
    with_items: also return, per caption, the item (index into labels) each token names, -1
    for tokens that name none (the colour and item words of a noun phrase name its item)."""
    n = len(labels)
    out: list[str] = []
    items: list[list[int]] = []
    seen = set()
    for _ in range(50 * count):
        if len(out) == count:
            break
        perm = rng.permutation(n)

        def np_(k, definite=False, perm=perm):
            return noun_phrase(int(labels[perm[k]]), int(colours[perm[k]]), definite, slot=int(perm[k]))

        def rel_(a, b, perm=perm):
            return int(rel[perm[a], perm[b]])

        templates = TEMPLATES[n](np_, rel_)
        caption, slots = untag(templates[int(rng.integers(len(templates)))]())
        if caption not in seen:
            seen.add(caption)
            out.append(caption)
            items.append(slots)
    return (out, items) if with_items else out


# ----------------------------------------------------------------------------- generation
@dataclass
class Scenes:
    """One split. images uint8 [N, 3, S, S]; per item slot k < n_items[i]: labels [N, K]
    (-1 for empty slots), colours [N, K], boxes float32 [N, K, 4] (x0, y0, x1, y1, exclusive
    ends), source_index [N, K] (index into the Fashion-MNIST split the item came from);
    captions: list of N lists of strings; caption_items: for each caption, the item slot each of
    its `tokenize` tokens names (its colour and item words), -1 for the other tokens."""

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

    def cut(self, n: int) -> "Scenes":
        return Scenes(self.images[:n], self.n_items[:n], self.labels[:n], self.colours[:n],
                      self.boxes[:n], self.source_index[:n], self.captions[:n], self.caption_items[:n])

    # npz round-trip (no pickles: captions travel as one JSON string)
    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        np.savez_compressed(buffer, images=self.images, n_items=self.n_items, labels=self.labels,
                            colours=self.colours, boxes=self.boxes, source_index=self.source_index,
                            captions=np.array(json.dumps(self.captions)),
                            caption_items=np.array(json.dumps(self.caption_items)),
                            version=np.array(FORMAT_VERSION))
        return buffer.getvalue()

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Scenes":
        with np.load(path, allow_pickle=False) as z:
            if int(z["version"]) != FORMAT_VERSION:
                raise ValueError("old cache format")
            return cls(z["images"], z["n_items"], z["labels"], z["colours"], z["boxes"],
                       z["source_index"], json.loads(str(z["captions"])), json.loads(str(z["caption_items"])))


def _resize_items(items: np.ndarray, size: int) -> np.ndarray:
    """uint8 [M, 28, 28] -> uint8 [M, size, size] (antialiased bilinear)."""
    if items.shape[-1] == size or len(items) == 0:
        return items
    t = torch.from_numpy(items.astype(np.float32))[:, None]
    t = F.interpolate(t, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return t[:, 0].round().clamp(0, 255).to(torch.uint8).numpy()


def paint(items: np.ndarray, source_index: np.ndarray, colours: np.ndarray, sizes: np.ndarray,
          corners: np.ndarray, active: np.ndarray, canvas_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Paint tinted items on black canvases, vectorised over canvases.

    items uint8 [M, 28, 28]; per canvas n and slot k: source_index [N, K] (into items), colours
    [N, K] (palette index), sizes [N, K] (px), corners [N, K, 2] (x, y), active bool [N, K] ->
    (images uint8 [N, 3, S, S], boxes float32 [N, K, 4], the tight x0, y0, x1, y1 of the drawn
    pixels, -1 for inactive slots)."""
    n, k = source_index.shape
    images = np.zeros((n, 3, canvas_size, canvas_size), dtype=np.uint8)
    boxes = np.full((n, k, 4), -1.0, dtype=np.float32)
    for slot in range(k):  # K <= 3 slots x a few sizes: each paste covers all scenes at once
        for size in np.unique(sizes[active[:, slot], slot]).tolist():
            sel = np.nonzero(active[:, slot] & (sizes[:, slot] == size))[0]
            grey = _resize_items(items[source_index[sel, slot]], size).astype(np.float32)  # [M, s, s]
            tint = PALETTE[colours[sel, slot]]  # [M, 3]
            patch = np.rint(grey[:, None] * tint[:, :, None, None]).astype(np.uint8)  # [M, 3, s, s]
            x, y = corners[sel, slot, 0], corners[sel, slot, 1]
            rows = (y[:, None] + np.arange(size))[:, None, :, None]
            cols = (x[:, None] + np.arange(size))[:, None, None, :]
            images[sel[:, None, None, None], np.arange(3)[None, :, None, None], rows, cols] = patch
            # tight box of the drawn pixels (the whole patch if an item is blank)
            drawn = patch.max(1) > 0  # [M, s, s]
            any_row, any_col = drawn.any(2), drawn.any(1)
            blank = ~any_row.any(1)
            r0 = np.where(blank, 0, any_row.argmax(1))
            r1 = np.where(blank, size, size - any_row[:, ::-1].argmax(1))
            c0 = np.where(blank, 0, any_col.argmax(1))
            c1 = np.where(blank, size, size - any_col[:, ::-1].argmax(1))
            boxes[sel, slot] = np.stack([x + c0, y + r0, x + c1, y + r1], 1).astype(np.float32)
    return images, boxes


def generate_block(items: np.ndarray, labels: np.ndarray, pool: np.ndarray, n: int,
                   rng: np.random.Generator, canvas_size: int, item_sizes: Sequence[int],
                   min_items: int, max_items: int, min_captions: int, max_captions: int,
                   gap: int) -> Scenes:
    """n <= BLOCK scenes from the items whose indices are in `pool`; vectorised except the
    captions. Layouts are drawn for a full block and cut, so scene i does not depend on n."""
    k, m = max_items, BLOCK  # a full block is drawn, then cut to n
    n_items = rng.integers(min_items, max_items + 1, size=m)
    active = np.arange(k)[None, :] < n_items[:, None]
    source_index = np.where(active, pool[rng.integers(0, len(pool), size=(m, k))], -1)
    item_labels = np.where(active, labels[np.maximum(source_index, 0)], -1)
    colours = np.where(active, rng.integers(0, len(PALETTE), size=(m, k)), -1)
    sizes = np.asarray(item_sizes)[rng.integers(0, len(item_sizes), size=(m, k))]
    corners = place_items(rng, sizes, n_items, canvas_size, gap)
    counts = rng.integers(min_captions, max_captions + 1, size=m)
    n_items, active, source_index, item_labels, colours, sizes, corners, counts = (
        a[:n] for a in (n_items, active, source_index, item_labels, colours, sizes, corners, counts))

    images, boxes = paint(items, source_index, colours, sizes, corners, active, canvas_size)
    rel = relations(boxes)
    described = [captions_for_scene(item_labels[i, :n_items[i]], colours[i, :n_items[i]],
                                    rel[i, :n_items[i], :n_items[i]], int(counts[i]), rng, with_items=True)
                 for i in range(n)]
    return Scenes(images, n_items.astype(np.int64), item_labels.astype(np.int64),
                  colours.astype(np.int64), boxes, source_index.astype(np.int64),
                  [d[0] for d in described], [d[1] for d in described])


def generate_scenes(items: np.ndarray, labels: np.ndarray, pool: np.ndarray, num: int, seed: int,
                    split: str, canvas_size: int = 64, item_sizes: Sequence[int] = (28,),
                    min_items: int = 1, max_items: int = 3, min_captions: int = 3,
                    max_captions: int = 5, gap: int = 0) -> Scenes:
    """`num` scenes of `split` (items uint8 [M, 28, 28], labels int [M], pool: allowed item
    indices). Deterministic in (seed, split); scene i does not depend on `num`."""
    if not 1 <= min_items <= max_items <= 3:
        raise UserError(f"items per scene must satisfy 1 <= min_items <= max_items <= 3, "
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
    split_code = SPLITS.index(split)
    blocks = []
    for b in range(-(-num // BLOCK)):
        rng = np.random.default_rng([seed, split_code, b])
        blocks.append(generate_block(items, labels, np.asarray(pool), min(BLOCK, num - b * BLOCK), rng,
                                     canvas_size, item_sizes, min_items, max_items, min_captions,
                                     max_captions, gap))
    if not blocks:
        raise UserError(f"the {split} split needs at least one scene")
    return Scenes(*(np.concatenate([getattr(x, f) for x in blocks]) for f in
                    ("images", "n_items", "labels", "colours", "boxes", "source_index")),
                  [c for x in blocks for c in x.captions], [c for x in blocks for c in x.caption_items])


def split_pools(num_train_items: int, num_test_items: int, test_seed: int) -> dict[str, np.ndarray]:
    """Item indices each split may use: train from the train items; val and test from two
    disjoint halves of the test items."""
    order = np.random.default_rng([test_seed, 99]).permutation(num_test_items)
    half = num_test_items // 2
    return {"train": np.arange(num_train_items), "val": np.sort(order[:half]), "test": np.sort(order[half:])}


def default_cache_dir() -> Path:
    return Path(os.environ.get("ZOO_DATA_DIR", "data")) / "scenes"


def _fingerprint(items: np.ndarray, labels: np.ndarray) -> str:
    h = hashlib.sha1()
    h.update(np.ascontiguousarray(items).tobytes())
    h.update(np.ascontiguousarray(labels).astype(np.int64).tobytes())
    return h.hexdigest()


def _default_loader(split: str):
    from zoo.data.fashion_mnist import load_fashion_mnist

    return load_fashion_mnist(split)


# ----------------------------------------------------------------------------- datasets
def _to_float(images: np.ndarray, index: np.ndarray) -> torch.Tensor:
    """uint8 [N, 3, S, S] gathered at index -> float32 in [0, 1]. numpy on purpose: small torch
    ops on a busy CPU lose most of their time to intra-op thread handoffs."""
    return torch.from_numpy(images[index].astype(np.float32) / np.float32(255.0))


def padded_length(longest: int, multiple: int | None, limit: int) -> int:
    """Columns of a caption batch: the longest caption, or that rounded up to a multiple of
    `multiple` (capped at the data's widest, `limit`), so a compiled step sees few shapes."""
    if not multiple:
        return longest
    return min(-(-longest // multiple) * multiple, limit)


def _word_items(encoded_items: list[list[int]], multiple: int | None) -> torch.Tensor:
    """Per caption, the item slot of each token (aligned with <start> w1 .. wn <end>) -> int64
    [N, T], -1 for <start>, <end>, pads and words that name no item."""
    return pad_captions([[-1, *items, -1] for items in encoded_items], pad_value=-1, multiple=multiple)[0]


class SceneTrainPairs(Dataset):
    """Every (scene, caption) pair; __getitems__ builds a whole batch with one gather."""

    def __init__(self, scenes: Scenes, captions: torch.Tensor, lengths: torch.Tensor, pair_scene: torch.Tensor,
                 word_items: torch.Tensor, pad_to_multiple: int | None = None):
        self.images = scenes.images
        self.item_boxes = torch.from_numpy(scenes.boxes)  # [N, K, 4], -1 for empty slots
        self.captions, self.lengths, self.pair_scene = captions, lengths, pair_scene
        self.word_items, self.pad_to_multiple = word_items, pad_to_multiple

    def __len__(self) -> int:
        return len(self.pair_scene)

    def __getitems__(self, indices):
        idx = torch.as_tensor(indices, dtype=torch.long)
        idx = idx[torch.argsort(self.lengths[idx], descending=True, stable=True)]  # longest caption first
        scene = self.pair_scene[idx]
        lengths = self.lengths[idx]
        width = padded_length(int(lengths.max()), self.pad_to_multiple, self.captions.shape[1])
        return {"images": _to_float(self.images, scene.numpy()),
                "captions": self.captions[idx, :width],
                "lengths": lengths,
                "host_lengths": lengths.tolist(),  # plain ints: the model skips finished rows without a sync
                "image_ids": scene.tolist(),
                "word_items": self.word_items[idx, :width],
                "item_boxes": self.item_boxes[scene]}

    def __getitem__(self, i):
        return {k: v[0] for k, v in self.__getitems__([i]).items()}


class SceneEval(Dataset):
    """Each scene once, with its references and item boxes."""

    def __init__(self, scenes: Scenes, first_captions: torch.Tensor, first_lengths: torch.Tensor,
                 first_items: torch.Tensor, pad_to_multiple: int | None = None):
        self.scenes = scenes
        self.images = scenes.images
        self.item_boxes = torch.from_numpy(scenes.boxes)
        self.boxes = [torch.from_numpy(scenes.item_boxes(i).copy()) for i in range(len(scenes))]
        self.box_words = [scenes.item_words(i) for i in range(len(scenes))]
        self.first_captions, self.first_lengths, self.first_items = first_captions, first_lengths, first_items
        self.pad_to_multiple = pad_to_multiple

    def __len__(self) -> int:
        return len(self.images)

    def __getitems__(self, indices):
        idx = torch.as_tensor(indices, dtype=torch.long)
        lengths = self.first_lengths[idx]
        width = padded_length(int(lengths.max()), self.pad_to_multiple, self.first_captions.shape[1])
        return {"images": _to_float(self.images, idx.numpy()),
                "captions": self.first_captions[idx, :width],
                "lengths": lengths,
                "word_items": self.first_items[idx, :width],
                "item_boxes": self.item_boxes[idx],
                "image_ids": idx.tolist(),
                "references": [list(self.scenes.captions[i]) for i in idx.tolist()],
                "boxes": [self.boxes[i] for i in idx.tolist()],
                "box_words": [list(self.box_words[i]) for i in idx.tolist()]}

    def __getitem__(self, i):
        return {k: v[0] for k, v in self.__getitems__([i]).items()}


def _batch_identity(batch):
    return batch


# ----------------------------------------------------------------------------- datamodule
class FashionScenesDataModule(SplitDataModule):
    """FashionScenes splits as caption batches (see the module docstring for the batch layout).

    `dm.vocab` (built from the training captions only) is available after `setup()`, and also
    before it: reading it generates or loads the training split. `max_len` caps the words of a
    caption: longer training captions are left out of training (so the model never learns to
    stop mid-sentence); evaluation captions are cut. `item_loader(split) -> (uint8 [N, 28, 28],
    int64 [N])` replaces Fashion-MNIST (tests); it is not a hyperparameter."""

    path_arguments = ("cache_dir",)
    image_size_argument = "canvas_size"
    image_chans = 3

    def __init__(self, num_train: int = 10000, num_val: int = 500, num_test: int = 1000,
                 seed: int = 0, test_seed: int = 1234, batch_size: int = 64,
                 eval_batch_size: int | None = None, max_len: int = 24, min_freq: int = 1,
                 max_vocab: int | None = None, num_workers: int = 0, canvas_size: int = 64,
                 item_sizes: tuple[int, ...] = (28,), min_items: int = 1, max_items: int = 3,
                 min_captions: int = 3, max_captions: int = 5, gap: int = 0,
                 bucket_pool: int = 50, pad_to_multiple: int | None = None, cache: bool = True,
                 cache_dir: str | None = None, item_loader: Callable | None = None,
                 vocab: list[str] | None = None):
        super().__init__()
        self.save_hyperparameters(ignore=["item_loader"])
        for name in ("num_train", "num_val", "num_test"):
            if getattr(self.hparams, name) < 1:
                raise UserError(f"FashionScenes: {name} must be >= 1, got {getattr(self.hparams, name)}")
        if max_len < 1:
            raise UserError(f"FashionScenes: max_len must be >= 1, got {max_len}")
        if pad_to_multiple is not None and pad_to_multiple < 1:
            raise UserError(f"FashionScenes: pad_to_multiple must be >= 1, got {pad_to_multiple}")
        self.item_loader = item_loader
        self.image_size = canvas_size
        self.in_chans = 3
        self.image_mean = (0.0, 0.0, 0.0)  # images are in [0, 1], not normalised further
        self.image_std = (1.0, 1.0, 1.0)
        self.item_words = ITEM_WORDS
        self.provides_word_boxes = True  # batches carry item_boxes + word_items (supervised attention)
        #: which split test_dataloader() serves: eval.py sets "val" for `--split val`
        self.scenes: dict[str, Scenes] = {}
        self.datasets: dict[str, Dataset] = {}
        self._vocab: Vocab | None = None
        self._sources: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    # ------------------------------------------------------------------ generation + cache
    def _source(self, fm_split: str) -> tuple[np.ndarray, np.ndarray]:
        if fm_split not in self._sources:
            loader = self.item_loader or _default_loader
            images, labels = loader(fm_split)
            images, labels = np.asarray(images, dtype=np.uint8), np.asarray(labels, dtype=np.int64)
            if images.ndim != 3 or len(images) != len(labels):
                raise UserError(f"FashionScenes: item source '{fm_split}' must give [N, H, W] images "
                                f"and [N] labels, got {images.shape} and {labels.shape}")
            self._sources[fm_split] = (images, labels)
        return self._sources[fm_split]

    def _settings(self, split: str) -> dict:
        hp = self.hparams
        return {"version": FORMAT_VERSION, "block": BLOCK, "split": split,
                "num": {"train": hp.num_train, "val": hp.num_val, "test": hp.num_test}[split],
                "seed": {"train": hp.seed, "val": hp.seed + 1, "test": hp.test_seed}[split],
                "test_seed": hp.test_seed, "canvas_size": hp.canvas_size, "item_sizes": list(hp.item_sizes),
                "min_items": hp.min_items, "max_items": hp.max_items, "min_captions": hp.min_captions,
                "max_captions": hp.max_captions, "gap": hp.gap, "items": ITEM_NAMES, "colours": COLOURS}

    def cache_path(self, split: str) -> Path:
        settings = self._settings(split)
        if self.item_loader is None:
            settings["source"] = "fashion-mnist"
        else:  # an injected source is identified by its content
            fm_split = "train" if split == "train" else "test"
            settings["source"] = _fingerprint(*self._source(fm_split))
        key = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
        root = Path(self.hparams.cache_dir) if self.hparams.cache_dir else default_cache_dir()
        return root / f"scenes-{split}-{settings['num']}-{key}.npz"

    def build_split(self, split: str) -> Scenes:
        """Generate (or load from the cache) one split."""
        if split in self.scenes:
            return self.scenes[split]
        path = self.cache_path(split) if self.hparams.cache else None
        scenes = None
        if path is not None and path.is_file():
            try:
                scenes = Scenes.load(path)
            except Exception:  # a stale or damaged cache file is rebuilt, not trusted
                scenes = None
        if scenes is None:
            settings = self._settings(split)
            fm_split = "train" if split == "train" else "test"
            items, labels = self._source(fm_split)
            test_items = len(self._source("test")[0]) if split != "train" else 0
            pools = split_pools(len(items) if split == "train" else 0, test_items, self.hparams.test_seed)
            hp = self.hparams
            scenes = generate_scenes(items, labels, pools[split], settings["num"], settings["seed"], split,
                                     hp.canvas_size, hp.item_sizes, hp.min_items, hp.max_items,
                                     hp.min_captions, hp.max_captions, hp.gap)
            if path is not None:
                atomic_write_bytes(path, scenes.to_bytes())
        self.scenes[split] = scenes
        return scenes

    def prepare_data(self) -> None:
        for split in SPLITS:
            self.build_split(split)

    # ------------------------------------------------------------------ vocabulary
    @property
    def vocab(self) -> Vocab:
        if self._vocab is None and self.hparams.get("vocab"):  # fixed (a release's): other words are <unk>
            self._vocab = Vocab(self.hparams.vocab)
        if self._vocab is None:
            train = self.build_split("train")
            self._vocab = Vocab.build((tokenize(c) for caps in train.captions for c in caps),
                                      min_freq=self.hparams.min_freq, max_size=self.hparams.max_vocab)
        return self._vocab

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    # ------------------------------------------------------------------ datasets
    def setup(self, stage: str | None = None) -> None:
        vocab, max_len, multiple = self.vocab, self.hparams.max_len, self.hparams.pad_to_multiple
        if "train" not in self.datasets:
            train = self.build_split("train")
            encoded, items, scene_of = [], [], []
            for i, (caps, caps_items) in enumerate(zip(train.captions, train.caption_items)):
                for c, c_items in zip(caps, caps_items):
                    tokens = tokenize(c)
                    if len(tokens) <= max_len:
                        encoded.append(vocab.encode_caption(tokens))
                        items.append(c_items)
                        scene_of.append(i)
            if not encoded:
                raise UserError(f"FashionScenes: every training caption is longer than max_len={max_len}")
            captions, lengths = pad_captions(encoded, multiple=multiple)
            self.datasets["train"] = SceneTrainPairs(train, captions, lengths, torch.tensor(scene_of),
                                                     _word_items(items, multiple), multiple)
        for split in ("val", "test"):
            if split not in self.datasets:
                scenes = self.build_split(split)
                first = [vocab.encode_caption(tokenize(caps[0]), max_len) for caps in scenes.captions]
                first_items = _word_items([items[0][:max_len] for items in scenes.caption_items], multiple)
                self.datasets[split] = SceneEval(scenes, *pad_captions(first, multiple=multiple), first_items,
                                                 multiple)

    def boxed_examples(self, split: str, n: int) -> dict:
        """Every item's box and head word: a word's attention is scored on the boxes of the items
        it names (see SplitDataModule)."""
        self.setup()
        batch = self.datasets[split].__getitems__(list(range(min(n, len(self.datasets[split])))))
        return {"images": batch["images"], "targets": batch["item_boxes"].float(),
                "target_words": [words + [""] * (batch["item_boxes"].shape[1] - len(words))
                                 for words in batch["box_words"]]}

    def loader(self, split: str) -> DataLoader:
        if split == "train":
            return self.bucketed_loader(self.datasets["train"], _batch_identity)
        if split not in ("val", "test"):
            raise UserError(f"FashionScenes: no evaluation split '{split}' (val or test)")
        return self.plain_loader(self.datasets[split], collate_fn=_batch_identity)

    # ------------------------------------------------------------------ demo helper
    def export_pngs(self, split: str, directory: str | os.PathLike, count: int) -> list[Path]:
        """Write the first `count` scenes of `split` as PNGs plus references.json (for the
        demo and for captioning held-out scenes from the CLI)."""
        from PIL import Image

        from zoo.io import atomic_save_image

        scenes = self.build_split(split)
        directory = Path(directory)
        paths, refs = [], {}
        for i in range(min(count, len(scenes))):
            path = directory / f"{split}_{i:05d}.png"
            atomic_save_image(Image.fromarray(scenes.images[i].transpose(1, 2, 0)), path)
            refs[path.name] = {"references": scenes.captions[i], "boxes": scenes.item_boxes(i).tolist(),
                               "box_words": scenes.item_words(i)}
            paths.append(path)
        atomic_write_bytes(directory / "references.json", (json.dumps(refs, indent=1) + "\n").encode())
        return paths
