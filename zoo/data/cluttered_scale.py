"""Cluttered Fashion-MNIST at any canvas side: the RAM paper's cluttered task (Mnih et al. 2014,
sec. 4.1) from 60 px to 400 px and beyond, at one clutter density, each canvas drawn when asked for.

A canvas of side S holds one 28x28 Fashion-MNIST item at a uniformly random place and
n(S) = round(4 * S^2 / 60^2) distractors: cluttered60's 4 per 60x60, kept per area (S = 60: 4,
100: 11, 200: 44, 400: 178; zoo.data.fashion_mnist's cluttered100 keeps the paper's 8 instead). A
distractor is a random 8x8 crop of a random item of the same split, at a random place, pasted by
pixel max (as in cluttered60).

Canvas i of a split comes from its own generator, numpy's PCG64 seeded by (seed, split, i): the same
canvas whatever the batch, the loader worker or the number of canvases asked for. No split is held
as one array (400 px x 60,000 canvases would be 9.6 GB): the module keeps the 28x28 items and paints
a batch when it is asked for, vectorised over the batch.

Splits (items never cross): train canvases show the Fashion-MNIST train items left after `val_size`
of them are held out (FashionMNISTDataModule's permutation, `split_seed`), val canvases the held-out
ones, test canvases the Fashion-MNIST test items, always from `test_seed` (one test set for every
run). Canvas i shows item i of its split's items: `limit_train` / `limit_eval` keep the first N.

Batches are FashionMNISTDataModule's: (images float [B, 1, S, S] in [0, 1], labels int64 [B]), plus
the item's box float [B, 4] (x0, y0, x1, y1 pixels, exclusive ends) with `with_boxes`; the loader
serves bytes (a quarter of the float's size through worker queues), divided on the device.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from zoo.data.base import SplitDataModule, batch_identity
from zoo.data.card import DataCard
from zoo.data.fashion_mnist import CLASS_NAMES, ITEM_SIZE, PATCH, VARIANTS, load_fashion_mnist, window
from zoo.guards.errors import UserError

#: cluttered60's distractors per canvas pixel: the density every side keeps
DENSITY = VARIANTS["cluttered60"][1] / VARIANTS["cluttered60"][0] ** 2
#: RNG streams of the splits (apart from zoo.data.item_canvases' 10-12)
SPLIT_CODES = {"train": 20, "val": 21, "test": 22}


def distractors_for(canvas_size: int) -> int:
    """n(S) = round(4 * S^2 / 60^2): cluttered60's distractor density on an S x S canvas."""
    return int(round(DENSITY * canvas_size ** 2))


def split_items(split_seed: int, val_size: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{split: (items uint8 [N, 28, 28], labels int64 [N])}: train and val from Fashion-MNIST train
    (val: the first `val_size` of FashionMNISTDataModule's permutation by `split_seed`), test from
    Fashion-MNIST test."""
    images, labels = load_fashion_mnist("train")
    if not 0 < val_size < len(images):
        raise UserError(f"val_size={val_size} must leave items for both train and val "
                        f"(Fashion-MNIST train holds {len(images):,})")
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(split_seed))
    test_images, test_labels = load_fashion_mnist("test")
    pools = {"train": order[val_size:], "val": order[:val_size]}
    out = {split: (images[idx].numpy(), labels[idx].numpy()) for split, idx in pools.items()}
    return {**out, "test": (test_images.numpy(), test_labels.numpy())}


def batches_in_flight(side: int, batch_size: int, eval_batch_size: int | None, num_workers: int) -> dict[str, float]:
    """Bytes of the batches alive at once: each worker's two prefetched byte batches (one without
    workers) and the float batch on the device."""
    batch = max(batch_size, eval_batch_size or 0) * int(side) ** 2
    return {f"data.init_args.batch_size={batch_size} canvases of {side}x{side} px in flight":
            float(batch * ((2 * num_workers or 1) + 4))}


class CanvasPainter(ABC):
    """What paints a split's canvases: `paint(rngs, indices) -> (canvases uint8 [B, S, S], labels
    int64 [B], boxes int64 [B, M, 4])`, canvas indices[b] from rngs[b] alone."""

    @abstractmethod
    def paint(self, rngs: Sequence[np.random.Generator], indices: np.ndarray): ...


class GeneratedCanvases(Dataset):
    """`length` canvases of one split, each drawn from the RNG (seed, split code, index) when asked for.
    `__getitems__` answers a whole batch: (canvases uint8 [B, 1, S', S'], labels int64 [B][, boxes
    float [B, 4] (one target) or [B, M, 4]]), S' = `served` (the canvas area-downsampled), or S."""

    def __init__(self, painter: CanvasPainter, seed: int, code: int, length: int, with_boxes: bool,
                 served: int | None = None):
        self.painter, self.key, self.length, self.with_boxes = painter, (int(seed), int(code)), int(length), with_boxes
        self.served = served

    def __len__(self) -> int:
        return self.length

    def rng(self, index: int) -> np.random.Generator:
        return np.random.default_rng([*self.key, int(index)])

    def batch(self, indices) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(canvases uint8 [B, 1, S', S'], labels int64 [B], boxes float [B, M, 4]) of `indices`."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= self.length):
            raise IndexError(f"canvas index out of range 0..{self.length - 1}")
        canvases, labels, boxes = self.painter.paint([self.rng(i) for i in indices], indices)
        boxes = torch.from_numpy(boxes).float()
        if self.served is not None and self.served != canvases.shape[-1]:
            boxes = boxes * (self.served / canvases.shape[-1])
            canvases = downsample(canvases, self.served)
        return torch.from_numpy(canvases).unsqueeze(1), torch.from_numpy(labels), boxes

    def __getitems__(self, indices) -> tuple:
        images, labels, boxes = self.batch(indices)
        boxes = boxes[:, 0] if boxes.shape[1] == 1 else boxes  # one target: [B, 4], as FashionMNISTDataModule's
        return (images, labels, *((boxes,) if self.with_boxes else ()))

    def __getitem__(self, index: int) -> tuple:
        return tuple(part[0] for part in self.__getitems__([index]))


def area_bins(size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Torch's "area" resize of one axis from `size` to `side` pixels (adaptive average pooling:
    output i averages inputs floor(i * size / side) .. ceil((i + 1) * size / side) - 1): for each
    input pixel the two outputs it may fall in ([size, 2]) and its weight in each ([size, 2]
    float64; 0 in the second where it falls in one only)."""
    out = np.arange(side)
    start, end = out * size // side, -(-(out + 1) * size // side)
    inputs = np.arange(size)
    first = np.searchsorted(end, inputs, side="right")  # the first output whose range holds the input
    second = np.minimum(first + 1, side - 1)
    in_second = (second != first) & (start[second] <= inputs)
    weights = np.stack([1.0 / (end[first] - start[first]),
                        np.where(in_second, 1.0 / (end[second] - start[second]), 0.0)], 1)
    return np.stack([first, second], 1), weights


def drawn_pixels(canvases: np.ndarray) -> np.ndarray:
    """The flat indices of the nonzero bytes of uint8 `canvases`, found eight bytes at a time (a
    mostly black 1,500 px canvas is scanned ~10x faster than byte by byte)."""
    flat = canvases.reshape(-1)
    body = len(flat) // 8 * 8
    words = np.flatnonzero(flat[:body].view(np.uint64))  # the 8-byte words holding a drawn pixel
    candidates = (words[:, None] * 8 + np.arange(8)).ravel()
    tail = np.arange(body, len(flat))
    candidates = np.concatenate([candidates, tail])
    return candidates[flat[candidates] != 0]


def downsample(canvases: np.ndarray, side: int) -> np.ndarray:
    """uint8 [B, S, S] -> uint8 [B, side, side]: torch's "area" resize, rounded back to bytes (the
    loaders' currency), computed from the drawn pixels only: a mostly black canvas costs its items,
    not its area (1,500 px canvases are 98% black)."""
    n, size = len(canvases), canvases.shape[-1]
    drawn = drawn_pixels(np.ascontiguousarray(canvases))
    values = canvases.reshape(-1)[drawn].astype(np.float64)
    b, rest = np.divmod(drawn, size * size)
    y, x = np.divmod(rest, size)
    bins, weights = area_bins(size, side)
    flat = ((b[:, None, None] * side + bins[y][:, :, None]) * side + bins[x][:, None, :]).ravel()  # [P * 4]
    mass = (values[:, None, None] * weights[y][:, :, None] * weights[x][:, None, :]).ravel()
    out = np.bincount(flat, mass, minlength=n * side * side).reshape(n, side, side)
    return np.rint(out).astype(np.uint8)


class GeneratedCanvasModule(SplitDataModule, ABC):
    """What the on-the-fly canvas modules share: a `painter(split, items, labels)` per split, the
    splits' lengths from `lengths(items)`, loaders over GeneratedCanvases, boxed examples and the
    bytes-to-float step on the device. Subclasses call `save_hyperparameters()` with at least `seed`,
    `test_seed`, `split_seed`, `val_size`, `batch_size`, `eval_batch_size`, `num_workers` and
    `with_boxes`, and set `image_size`."""

    num_classes = len(CLASS_NAMES)
    #: RNG streams of the splits
    split_codes: dict[str, int] = SPLIT_CODES

    def __init__(self):
        super().__init__()
        self.datasets: dict[str, GeneratedCanvases] = {}

    @abstractmethod
    def painter(self, split: str, items: np.ndarray, labels: np.ndarray) -> CanvasPainter:
        """The painter of `split`'s canvases from its items."""

    @abstractmethod
    def lengths(self, items: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, int]:
        """Canvases per split."""

    def served_size(self) -> int | None:
        """The side the canvases are served at when not their own (None: their own)."""
        return None

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        hp = self.hparams
        items = split_items(hp.split_seed, hp.val_size)
        for split, count in self.lengths(items).items():
            seed = hp.test_seed if split == "test" else hp.seed
            self.datasets[split] = GeneratedCanvases(self.painter(split, *items[split]), seed,
                                                     self.split_codes[split], count, hp.with_boxes,
                                                     self.served_size())

    def loader(self, split: str) -> DataLoader:
        if split not in self.datasets:
            raise UserError(f"{type(self).__name__}: no split '{split}' set up (train, val or test)")
        return self.plain_loader(self.datasets[split], train=split == "train", collate_fn=batch_identity)

    def boxed_examples(self, split: str, n: int) -> dict:
        """The target items' boxes (see SplitDataModule)."""
        self.setup()
        images, _, boxes = self.datasets[split].batch(range(min(n, len(self.datasets[split]))))
        return {"images": images.float() / 255.0, "targets": boxes}

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        images, labels, *boxes = batch
        return (images.float().div_(255.0), labels, *boxes)


class ItemOnClutter(CanvasPainter):
    """One item per canvas (canvas i shows items[i]) among `distractors` 8x8 crops of random items."""

    def __init__(self, items: np.ndarray, labels: np.ndarray, canvas_size: int, distractors: int):
        self.items, self.labels, self.size, self.distractors = items, labels, canvas_size, distractors

    def paint(self, rngs, indices):
        size, k, n = self.size, self.distractors, len(indices)
        # per canvas, from its own RNG: the item's (top, left), then per distractor its source item,
        # crop corner (y, x) and place (top, left), in one draw: [B, 2 + 5K]
        high = np.array([size - ITEM_SIZE + 1] * 2 + [len(self.items), ITEM_SIZE - PATCH + 1,
                                                      ITEM_SIZE - PATCH + 1, size - PATCH + 1, size - PATCH + 1] * k)
        draws = np.stack([rng.integers(0, high) for rng in rngs]) if n else np.zeros((0, len(high)), np.int64)
        top, left = draws[:, 0], draws[:, 1]
        which, cy, cx, py, px = (draws[:, 2:].reshape(n, k, 5)[..., j] for j in range(5))  # each [B, K]
        canvases = np.zeros((n, size, size), dtype=np.uint8)
        canvases[window(top, left, ITEM_SIZE, ITEM_SIZE)] = self.items[indices]
        for slot in range(k):  # K pastes by pixel max, each over the whole batch
            crops = self.items[which[:, slot]][window(cy[:, slot], cx[:, slot], PATCH, PATCH)]
            place = window(py[:, slot], px[:, slot], PATCH, PATCH)
            canvases[place] = np.maximum(canvases[place], crops)
        boxes = np.stack([left, top, left + ITEM_SIZE, top + ITEM_SIZE], -1)[:, None]  # [B, 1, 4]
        return canvases, self.labels[indices], boxes


class ClutteredScaleDataModule(GeneratedCanvasModule):
    """The module docstring's canvases of side `canvas_size`, with `distractors` per canvas (None:
    n(S), cluttered60's density)."""

    card = DataCard(image_size="canvas_size", channels=1, class_names=CLASS_NAMES,
                    dimensions={"canvas_size": 4_096, "distractors": 100_000},
                    tiny=dict(val_size=16, limit_train=16, limit_eval=16, batch_size=8))

    def __init__(self, canvas_size: int = 60, distractors: int | None = None, batch_size: int = 128,
                 eval_batch_size: int | None = None, seed: int = 0, test_seed: int = 1234, val_size: int = 5000,
                 split_seed: int = 0, limit_train: int | None = None, limit_eval: int | None = None,
                 num_workers: int = 0, with_boxes: bool = False):
        super().__init__()
        self.save_hyperparameters()
        if canvas_size < ITEM_SIZE:
            raise UserError(f"ClutteredScale: canvas_size must be at least the item's {ITEM_SIZE} px, "
                            f"got {canvas_size}")
        if min(seed, test_seed) < 0:
            raise UserError(f"ClutteredScale: seeds must be >= 0, got seed {seed} and test_seed {test_seed}")
        self.image_size = canvas_size
        self.distractors = distractors_for(canvas_size) if distractors is None else int(distractors)

    def painter(self, split, items, labels):
        return ItemOnClutter(items, labels, self.hparams.canvas_size, self.distractors)

    def lengths(self, items):
        hp = self.hparams
        return {split: len(items[split][1][:(hp.limit_train if split == "train" else hp.limit_eval) or None])
                for split in ("train", "val", "test")}

    @classmethod
    def memory_for(cls, canvas_size: int = 60, batch_size: int = 128, eval_batch_size: int | None = None,
                   num_workers: int = 0, **_) -> dict[str, float]:
        """The items (70,000 x 28 x 28 bytes) and the batches in flight: bytes in each worker's two
        prefetched batches (one in the main process without workers), and the float batch."""
        return {"the Fashion-MNIST items": 70_000 * ITEM_SIZE ** 2,
                **batches_in_flight(canvas_size, batch_size, eval_batch_size, num_workers)}

    @classmethod
    def few_examples(cls, n: int) -> dict:
        return {"limit_train": max(n, 2), "limit_eval": max(n, 2)}  # canvas i does not depend on the limit

    def summary(self) -> str:
        return (super().summary() + f"; {self.hparams.canvas_size}x{self.hparams.canvas_size} px, "
                f"{self.distractors} distractors per canvas")
