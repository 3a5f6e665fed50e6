"""Megapixel Fashion: attention sampling's Megapixel MNIST (Katharopoulos & Fleuret, ICML 2019;
the authors' `scripts/make_mnist.py`) with Fashion-MNIST items, each canvas drawn when asked for.

A canvas is black, `canvas_size` px square, with five 28x28 items placed without overlap: three of
the label's class and two of other classes, plus noise patches (pairs of straight lines) that may
cover parts of them. The label is the class that appears three times. The paper's protocol (its
code's defaults) beside this module's (its defaults):
- canvas: 1,500 x 1,500, one channel | `canvas_size` 1,500.
- canvases: 5,000 train, 1,000 test | `num_train` 5,000, `num_test` 1,000 (fixed by `test_seed`),
  plus `num_val` 1,000 for model selection (the paper has no validation split).
- items: MNIST digits, train canvases from MNIST train, test from MNIST test | Fashion-MNIST items,
  train canvases from its train items less the `val_size` held out for val, test from its test items.
- label: t ~ U{0..9}; 3 items of class t (with replacement), 2 of classes other than t (these 2 may
  share a class) | the same (`target_items` 3, `other_items` 2).
- places: top-left ~ U{0..1472}^2, an item redrawn while it overlaps another | uniform over the
  layouts without overlap (zoo.data.layout.place_items, as every zoo canvas).
- noise: 50 patches per canvas from 50 fixed 28x28 patterns, top-left ~ U{28..1471}^2, pasted after
  the items by assignment | the same (`noise_patches` 50), the 50 patterns drawn once from
  `test_seed` and shared by every split (the code draws them per split).
- a pattern: a line from the corner (0, 0) at angle U(0, 0.4 pi), OR'd with a shuffled copy of
  another, flipped (both of the code's flags flip the same axis); each pixel x U(0.8, 1) | the same.
- randomness: one NumPy stream per split, seed + int(train) | canvas i of a split from its own
  PCG64 stream (seed, split, i): train and val from `seed`, test from `test_seed`.
- low-resolution view: precomputed at scale 0.12 (180 x 180) for the attention network | the
  model's own (the data serves the canvas); `image_size` serves the canvas area-downsampled
  instead, for a dense network on a smaller view.

Batches are zoo.data.cluttered_scale's: (images float [B, 1, S, S] in [0, 1], labels int64 [B]), plus
the three target items' boxes float [B, 3, 4] (x0, y0, x1, y1 pixels of the served image) with
`with_boxes`; `boxed_examples` gives the same boxes for attention scoring. No split is ever held:
1,500 px x 5,000 canvases would be 11 GB.
"""
from __future__ import annotations

import numpy as np

from zoo.data.card import DataCard
from zoo.data.cluttered_scale import CanvasPainter, GeneratedCanvasModule, batches_in_flight, window
from zoo.data.fashion_mnist import CLASS_NAMES, ITEM_SIZE
from zoo.data.layout import place_items
from zoo.guards.errors import UserError

#: fixed noise patterns (the code's 50), each a 28x28 pair of lines
NOISE_PATTERNS = 50
#: RNG streams of the splits and of the noise patterns (apart from zoo.data.cluttered_scale's)
SPLIT_CODES = {"train": 30, "val": 31, "test": 32}
NOISE_CODE = 33


def noise_patterns(rng: np.random.Generator, count: int = NOISE_PATTERNS) -> np.ndarray:
    """uint8 [count, 28, 28]: the reference code's `_create_noise` patterns, vectorised. Pattern i is
    a line from the corner (0, 0) at slope tan(U(0, 0.4 pi)), OR'd with another pattern's line
    (a shuffled copy, flipped along the width with each of two 0.33 chances: both flags flip the
    same axis in the code), each pixel scaled by U(0.8, 1)."""
    slopes = np.tan(rng.random(count) * np.pi / 2.5)
    reach = np.minimum(27.49, 27.49 / slopes)  # the line leaves the 28x28 square at row or column 27
    x = np.linspace(0.0, 1.0, 56)[None] * reach[:, None]  # [count, 56]
    lines = np.zeros((count, ITEM_SIZE, ITEM_SIZE))
    lines[np.arange(count)[:, None], np.round(x).astype(int), np.round(slopes[:, None] * x).astype(int)] = 1.0
    others = lines[rng.permutation(count)]
    flips = (rng.random(count) < 0.33) ^ (rng.random(count) < 0.33)  # two flips of one axis undo each other
    others[flips] = others[flips, :, ::-1]
    noise = ((lines + others) > 0) * (rng.random((count, ITEM_SIZE, ITEM_SIZE)) * 0.2 + 0.8)
    return (noise * 255).astype(np.uint8)


class ItemsAndNoise(CanvasPainter):
    """`target_items` items of the label's class and `other_items` of other classes among
    `noise_patches` noise patches (the module docstring's canvases)."""

    def __init__(self, items: np.ndarray, labels: np.ndarray, patterns: np.ndarray, canvas_size: int,
                 target_items: int, other_items: int, noise_patches: int):
        order = np.argsort(labels, kind="stable")  # the items grouped by class: class c is [start[c], end[c])
        self.items, self.labels = items[order], labels[order]
        classes = np.arange(len(CLASS_NAMES))
        self.start, self.end = np.searchsorted(self.labels, classes), np.searchsorted(self.labels, classes, "right")
        if (self.start == self.end).any():
            missing = CLASS_NAMES[int(np.argmax(self.start == self.end))]
            raise UserError(f"MegapixelFashion: no item of class {missing!r} in a split's items")
        self.patterns, self.size = patterns, canvas_size
        self.targets, self.others, self.noise = target_items, other_items, noise_patches

    def _draw(self, rng: np.random.Generator) -> np.ndarray:
        """One canvas's draws from its RNG: [label, K item sources, K (x, y), N pattern, N (top, left)]."""
        label = int(rng.integers(len(CLASS_NAMES)))
        start, end, total = self.start[label], self.end[label], len(self.labels)
        targets = rng.integers(start, end, self.targets)
        # uniform over the items of other classes: an index into them, shifted past class `label`'s
        others = rng.integers(0, total - (end - start), self.others)
        others = np.where(others >= start, others + (end - start), others)
        k = self.targets + self.others
        corners = place_items(rng, np.full((1, k), ITEM_SIZE), np.array([k]), self.size, gap=0)[0]  # [K, 2]
        patterns = rng.integers(0, len(self.patterns), self.noise)
        places = rng.integers(ITEM_SIZE, self.size - ITEM_SIZE, (self.noise, 2))  # the code's U{28..S-29}
        return np.concatenate([[label], targets, others, corners.ravel(), patterns, places.ravel()])

    def paint(self, rngs, indices):
        n, k, m, size = len(rngs), self.targets + self.others, self.noise, self.size
        draws = np.stack([self._draw(rng) for rng in rngs]) if n else np.zeros((0, 1 + 3 * k + 3 * m), np.int64)
        labels, sources = draws[:, 0], draws[:, 1:1 + k]
        corners = draws[:, 1 + k:1 + 3 * k].reshape(n, k, 2)  # (x, y)
        patterns, places = draws[:, 1 + 3 * k:1 + 3 * k + m], draws[:, 1 + 3 * k + m:].reshape(n, m, 2)
        canvases = np.zeros((n, size, size), dtype=np.uint8)
        for slot in range(k):  # items never overlap: assignment, each slot over the whole batch
            place = window(corners[:, slot, 1], corners[:, slot, 0], ITEM_SIZE, ITEM_SIZE)
            canvases[place] = self.items[sources[:, slot]]
        for slot in range(m):  # noise after the items, by assignment, in order (a later patch covers an earlier)
            place = window(places[:, slot, 0], places[:, slot, 1], ITEM_SIZE, ITEM_SIZE)
            canvases[place] = self.patterns[patterns[:, slot]]
        targets = corners[:, :self.targets]
        return canvases, labels, np.concatenate([targets, targets + ITEM_SIZE], -1)  # [B, target_items, 4]


class MegapixelFashionDataModule(GeneratedCanvasModule):
    """The module docstring's canvases, served at `image_size` (None: `canvas_size`)."""

    card = DataCard(image_size="image_size", channels=1, class_names=CLASS_NAMES,
                    dimensions={"canvas_size": 4_096, "target_items": 1_000, "other_items": 1_000,
                                "noise_patches": 100_000},
                    tiny=dict(num_train=8, num_val=4, num_test=4, val_size=100, batch_size=4))
    split_codes = SPLIT_CODES

    @classmethod
    def image_size_for(cls, canvas_size: int = 1500, image_size: int | None = None, **_) -> tuple[int, int]:
        return (int(image_size or canvas_size),) * 2

    def __init__(self, canvas_size: int = 1500, image_size: int | None = None, num_train: int = 5000,
                 num_val: int = 1000, num_test: int = 1000, target_items: int = 3, other_items: int = 2,
                 noise_patches: int = 50, batch_size: int = 128, eval_batch_size: int | None = None, seed: int = 0,
                 test_seed: int = 1234, val_size: int = 5000, split_seed: int = 0, num_workers: int = 0,
                 with_boxes: bool = False):
        super().__init__()
        self.save_hyperparameters()
        if canvas_size < 3 * ITEM_SIZE:
            raise UserError(f"MegapixelFashion: canvas_size must be at least {3 * ITEM_SIZE} px (noise patches "
                            f"start {ITEM_SIZE} px inside the canvas), got {canvas_size}")
        if image_size is not None and not 1 <= image_size <= canvas_size:
            raise UserError(f"MegapixelFashion: image_size must be 1..canvas_size ({canvas_size}), got {image_size}")
        if target_items <= other_items or other_items < 0:
            raise UserError("MegapixelFashion: the label's class must appear most often: need target_items > "
                            f"other_items >= 0, got {target_items} and {other_items}")
        for name in ("num_train", "num_val", "num_test"):
            if self.hparams[name] < 1:
                raise UserError(f"MegapixelFashion: {name} must be >= 1, got {self.hparams[name]}")
        if min(seed, test_seed) < 0:
            raise UserError(f"MegapixelFashion: seeds must be >= 0, got seed {seed} and test_seed {test_seed}")
        self.image_size = image_size or canvas_size

    def painter(self, split, items, labels):
        hp = self.hparams
        patterns = noise_patterns(np.random.default_rng([hp.test_seed, NOISE_CODE]))
        return ItemsAndNoise(items, labels, patterns, hp.canvas_size, hp.target_items, hp.other_items, hp.noise_patches)

    def lengths(self, items):
        return {split: self.hparams[f"num_{split}"] for split in ("train", "val", "test")}

    def served_size(self) -> int | None:
        return self.hparams.image_size

    @classmethod
    def memory_for(cls, canvas_size: int = 1500, image_size: int | None = None, batch_size: int = 128,
                   eval_batch_size: int | None = None, num_workers: int = 0, **_) -> dict[str, float]:
        """The items (70,000 x 28 x 28 bytes), the canvases each painting process holds, and the
        batches in flight at the served size."""
        batch = max(batch_size, eval_batch_size or 0)
        return {"the Fashion-MNIST items": 70_000 * ITEM_SIZE ** 2,
                f"data.init_args.batch_size={batch} canvases of {canvas_size}x{canvas_size} px being painted":
                    float(batch * canvas_size ** 2 * max(1, num_workers)),
                **batches_in_flight(image_size or canvas_size, batch_size, eval_batch_size, num_workers)}

    @classmethod
    def few_examples(cls, n: int) -> dict:
        return {"num_train": 1, "num_val": 1}  # canvas i does not depend on the split's size

    def summary(self) -> str:
        hp = self.hparams
        served = f", served at {hp.image_size} px" if hp.image_size else ""
        return super().summary() + f"; {hp.canvas_size}x{hp.canvas_size} px canvases{served}"
