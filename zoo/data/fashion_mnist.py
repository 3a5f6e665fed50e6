"""Fashion-MNIST and the RAM paper's task variants (Mnih et al. 2014, sec. 4.1).

IDX files (plain or .gz) come from `$ZOO_DATA_DIR/fashion-mnist`, `./data/fashion-mnist`, Debian's
`/usr/share/datasets/fashion-mnist`, else a torchvision download into `./data`.

Variants (VARIANTS; canvases built once, vectorised, from a seed): centered (28x28), translated (on
60x60), cluttered60 / cluttered100 (translated plus 4 / 8 distractors, 8x8 crops of other training
images), two_items60 (two items apart on 60x60, DRAW's two-digit task, Gregor et al. 2015 sec. 4.3;
labels [N, 2], boxes [N, 2, 4]).

`curriculum_epochs` N > 0 trains epoch e < N with floor(D * e / N) of the variant's D distractors
(nested in the full canvases); `with_boxes` serves the item's box float [B, 4] with every batch.
"""
from __future__ import annotations

import gzip
import math
import os
import re
import zlib
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from zoo.data.base import SplitDataModule
from zoo.data.card import DataCard
from zoo.data.layout import place_items
from zoo.guards.budget import check_memory
from zoo.guards.errors import UserError

CLASS_NAMES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
               "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
ITEM_SIZE = 28
PATCH = 8  # a distractor's side


# variant name -> (canvas size, number of distractors)
VARIANTS = {"centered": (28, 0), "translated": (60, 0), "cluttered60": (60, 4), "cluttered100": (100, 8),
            "two_items60": (60, 0)}
# variants with more than one item per canvas -> items per canvas (the others: 1)
MULTI_ITEM = {"two_items60": 2}


# ----------------------------------------------------------------------------- IDX files
def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Parse an IDX file (plain or gzip) of unsigned bytes into an array, checking its header."""
    path = Path(path)
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            raw = f.read(4)
            if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08 or not 1 <= raw[3] <= 4:
                raise UserError(f"{path}: not an IDX file of unsigned bytes (bad magic number)")
            ndim = raw[3]
            raw += f.read(4 * ndim)
            if len(raw) < 4 + 4 * ndim:
                raise UserError(f"{path}: truncated IDX header")
            shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
            expected = math.prod(shape)
            # the size the header declares, checked before it is read (a small .gz can inflate to gigabytes)
            check_memory({f"the {shape} array it declares": float(expected)}, str(path))
            data = f.read(expected + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise UserError(f"{path}: cannot read IDX file ({exc})") from None
    if len(data) != expected:
        raise UserError(f"{path}: corrupt IDX file: header says {shape} ({expected} bytes), "
                        f"file holds {len(data)}{'+' if len(data) > expected else ''} bytes of data")
    return np.frombuffer(data, dtype=np.uint8).reshape(shape)


def _find(directory: Path, stem: str) -> Path | None:
    return next((path for path in (directory / stem, directory / f"{stem}.gz") if path.is_file()), None)


def locate(split: str) -> tuple[Path, Path]:
    """Paths of the (images, labels) IDX files of `split`, downloading as a last resort."""
    if split not in FILES:
        raise UserError(f"unknown Fashion-MNIST split '{split}' (train or test)")
    image_stem, label_stem = FILES[split]
    root = os.environ.get("ZOO_DATA_DIR")
    searched = ([Path(root) / "fashion-mnist"] if root else []) + [Path("data/fashion-mnist"), DEBIAN_DIR]
    for directory in searched:
        images, labels = _find(directory, image_stem), _find(directory, label_stem)
        if images or labels:
            if not (images and labels):
                missing = image_stem if images is None else label_stem
                raise UserError(f"{directory}: {missing}[.gz] is missing")
            return images, labels
    download_root = Path(os.environ.get("ZOO_DATA_DIR", "data"))
    raw = download_root / "FashionMNIST" / "raw"  # torchvision's layout
    if _find(raw, image_stem) is None:
        try:
            from torchvision.datasets import FashionMNIST

            FashionMNIST(str(download_root), train=(split == "train"), download=True)
        except Exception as exc:
            raise UserError(
                "Fashion-MNIST not found (looked in " + ", ".join(map(str, searched)) +
                f") and the download failed ({type(exc).__name__}). Install Debian's "
                "dataset-fashion-mnist, or put the IDX files in $ZOO_DATA_DIR/fashion-mnist") from None
    return _find(raw, image_stem), _find(raw, label_stem)


def load_fashion_mnist(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(images uint8 [N, 28, 28], labels int64 [N]) of the "train" or "test" split."""
    image_path, label_path = locate(split)
    images, labels = read_idx(image_path), read_idx(label_path)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise UserError(f"{image_path} / {label_path}: shapes {images.shape} and {labels.shape} do not match")
    if labels.max(initial=0) >= len(CLASS_NAMES):
        raise UserError(f"{label_path}: labels outside 0..9")
    return torch.from_numpy(images.copy()), torch.from_numpy(labels.astype(np.int64))


# ----------------------------------------------------------------------------- variants
def make_variant(images: np.ndarray, variant: str, seed: int,
                 distractor_source: np.ndarray | None = None, return_sources: bool = False,
                 distractors: int | None = None):
    """Place 28x28 items on canvases -> (canvases uint8 [N, S, S], boxes int [N, 4]: x0, y0, x1, y1,
    exclusive ends), deterministic in `seed`. `distractors`: only the first that many of the
    variant's (a curriculum's canvases). A multi-item variant puts image i and K - 1 others on
    canvas i (boxes [N, K, 4]); `return_sources` adds the indices of each canvas's items [N, K]."""
    if variant not in VARIANTS:
        raise UserError(f"unknown variant '{variant}' (choose from {', '.join(VARIANTS)})")
    size, n_distractors = VARIANTS[variant]
    images = np.asarray(images, dtype=np.uint8)
    n = len(images)
    rng = np.random.default_rng(seed)
    canvases, sources = np.zeros((n, size, size), dtype=np.uint8), np.arange(n)[:, None]
    if variant in MULTI_ITEM:
        k = MULTI_ITEM[variant]
        if n < k:
            raise UserError(f"{k} items per canvas need at least {k} images, got {n}")
        # K - 1 distinct images other than i: offsets 1..n-1 (mod n), rows with a repeat redrawn
        others = rng.integers(1, n, size=(n, k - 1))
        while k > 2 and (clash := (np.diff(np.sort(others, 1)) == 0).any(1)).any():
            others[clash] = rng.integers(1, n, size=(int(clash.sum()), k - 1))
        sources = np.concatenate([sources, (sources + others) % n], 1)
        corners = place_items(rng, np.full((n, k), ITEM_SIZE), np.full(n, k), size, gap=0)  # [N, K, 2] (x, y)
        for slot in range(k):  # K pastes, each over all canvases at once
            _paste_max(canvases, images[sources[:, slot]], corners[:, slot, 1], corners[:, slot, 0])
        boxes = np.concatenate([corners, corners + ITEM_SIZE], -1)  # x0, y0, x1, y1
    elif size == ITEM_SIZE:
        canvases, boxes = images.copy(), np.tile(np.array([0, 0, ITEM_SIZE, ITEM_SIZE]), (n, 1))
    else:
        top = rng.integers(0, size - ITEM_SIZE + 1, size=n)
        left = rng.integers(0, size - ITEM_SIZE + 1, size=n)
        _paste_max(canvases, images, top, left)
        source = images if distractor_source is None else np.asarray(distractor_source, dtype=np.uint8)
        for _ in range(n_distractors if distractors is None else min(n_distractors, distractors)):
            # an 8x8 crop of another random image, at a random place on the canvas
            which = rng.integers(0, len(source), size=n)
            cy = rng.integers(0, ITEM_SIZE - PATCH + 1, size=n)
            cx = rng.integers(0, ITEM_SIZE - PATCH + 1, size=n)
            _paste_max(canvases, source[which][window(cy, cx, PATCH, PATCH)],
                       rng.integers(0, size - PATCH + 1, size=n), rng.integers(0, size - PATCH + 1, size=n))
        boxes = np.stack([left, top, left + ITEM_SIZE, top + ITEM_SIZE], axis=1)
    return (canvases, boxes, sources) if return_sources else (canvases, boxes)


def window(top: np.ndarray, left: np.ndarray, h: int, w: int) -> tuple:
    """The index of each image n's h x w window at (top[n], left[n]): images[index] is [N, h, w]."""
    return (np.arange(len(top))[:, None, None], (top[:, None] + np.arange(h))[:, :, None],
            (left[:, None] + np.arange(w))[:, None, :])


def _paste_max(canvases: np.ndarray, patches: np.ndarray, top: np.ndarray, left: np.ndarray) -> None:
    """canvases[n, top:top+h, left:left+w] = max(canvas, patch) for every n at once."""
    index = window(top, left, *patches.shape[1:])
    canvases[index] = np.maximum(canvases[index], patches)


# ----------------------------------------------------------------------------- datamodule
class FashionMNISTDataModule(SplitDataModule):
    """Fashion-MNIST variants as (images float [B, 1, S, S] in [0, 1], labels int64 [B] or [B, K]).
    Validation is carved out of train by `split_seed`; canvases are drawn with `seed` (train),
    `seed + 1` (val) and `test_seed` (test, the same for every run)."""

    card = DataCard(image_size="variant", channels=1, class_names=CLASS_NAMES,  # zoo.preprocess labels with these
                    tiny=dict(val_size=16, limit_train=16, limit_eval=16, batch_size=8))

    @classmethod
    def image_size_for(cls, variant: str = "centered", **_) -> tuple[int, int] | None:
        return (VARIANTS[variant][0],) * 2 if variant in VARIANTS else None  # an unknown variant: refused later

    @classmethod
    def dataset_for(cls, variant: str = "centered", **_) -> tuple[str, str]:
        size = VARIANTS[variant][0] if variant in VARIANTS else None
        kind = re.sub(r"\d+$", "", variant).replace("_", " ")
        return "fashion_mnist", f"Fashion-MNIST ({kind}{f' {size}x{size}' if size else ''})"

    def __init__(self, variant: str = "centered", batch_size: int = 128, seed: int = 0,
                 val_size: int = 5000, split_seed: int = 0, test_seed: int = 1234,
                 limit_train: int | None = None, limit_eval: int | None = None,
                 num_workers: int = 0, eval_batch_size: int | None = None,
                 curriculum_epochs: int = 0, with_boxes: bool = False):
        super().__init__()
        if variant not in VARIANTS:
            raise UserError(f"unknown variant '{variant}' (choose from {', '.join(VARIANTS)})")
        if curriculum_epochs < 0:
            raise UserError(f"curriculum_epochs must be >= 0, got {curriculum_epochs}")
        if curriculum_epochs and (variant in MULTI_ITEM or not VARIANTS[variant][1]):
            raise UserError(f"curriculum_epochs: the variant '{variant}' has no distractors to add gradually")
        self.save_hyperparameters()
        self.variant = variant
        self.image_size = VARIANTS[variant][0]
        self.num_classes = len(CLASS_NAMES)
        self.datasets: dict[str, TensorDataset] = {}
        self.boxes: dict[str, torch.Tensor] = {}

    def _build(self, split: str, images, labels, seed: int, count: int | None = None,
               keep: int | None = None) -> None:
        """Fill datasets[split] and boxes[split]: `images` on canvases with `count` distractors, the first `keep`."""
        canvases, boxes, sources = make_variant(images.numpy(), self.variant, seed, self._distractor_source,
                                                return_sources=True, distractors=count)
        if self.variant in MULTI_ITEM:
            labels = labels[torch.from_numpy(sources)]  # [N, K]: every item's class
        self.boxes[split] = torch.from_numpy(boxes)[:keep]
        served = (self.boxes[split].float(),) if self.hparams.with_boxes else ()
        canvases = torch.from_numpy(canvases)[:keep].unsqueeze(1)  # [N, 1, S, S]
        self.datasets[split] = TensorDataset(canvases, labels[:keep], *served)

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        hp = self.hparams
        train_images, train_labels = load_fashion_mnist("train")
        order = torch.randperm(len(train_images), generator=torch.Generator().manual_seed(hp.split_seed))
        val_idx = order[:hp.val_size][:hp.limit_eval or None]
        train_idx = order[hp.val_size:][:hp.limit_train or None]
        test_images, test_labels = load_fashion_mnist("test")
        self._distractor_source = train_images.numpy()
        self._train_source = (train_images[train_idx], train_labels[train_idx])
        self._build("train", *self._train_source, hp.seed)
        self._train_distractors = VARIANTS[self.variant][1]
        self._build("val", train_images[val_idx], train_labels[val_idx], hp.seed + 1)
        # the whole test set's canvases, then cut: a limited evaluation sees the full one's first
        self._build("test", test_images, test_labels, hp.test_seed, keep=hp.limit_eval or None)

    def loader(self, split: str) -> DataLoader:
        if split == "train" and self.hparams.curriculum_epochs:
            # a curriculum's canvases change every epoch (no trainer: the full ones)
            trainer, epoch = self.trainer, self.hparams.curriculum_epochs
            if trainer is not None:
                epoch = trainer.current_epoch
                if trainer.reload_dataloaders_every_n_epochs == 0:
                    trainer.reload_dataloaders_every_n_epochs = 1
                if (every := trainer.reload_dataloaders_every_n_epochs) != 1:
                    raise UserError("curriculum_epochs needs a new training loader every epoch; "
                                    f"trainer.reload_dataloaders_every_n_epochs is {every}")
            count = self.distractors_at(epoch)
            if self._train_distractors != count:
                self._build("train", *self._train_source, self.hparams.seed, count)
                self._train_distractors = count
        return self.plain_loader(self.datasets[split], train=split == "train")

    def distractors_at(self, epoch: int) -> int:
        """Distractors per training canvas at `epoch` (0-based) of the curriculum."""
        full, stages = VARIANTS[self.variant][1], self.hparams.curriculum_epochs
        return full if epoch >= stages else full * epoch // stages

    @classmethod
    def few_examples(cls, n: int) -> dict:
        return {"limit_train": max(n, 2), "limit_eval": max(n, 2)}  # the test split is built whole, then cut

    def boxed_examples(self, split: str, n: int) -> dict:
        """The target item's box (every item's, on multi-item canvases): see SplitDataModule."""
        self.setup()
        images = self.datasets[split].tensors[0][:n].float() / 255.0
        boxes = self.boxes[split][:n].float()
        return {"images": images, "targets": boxes if boxes.dim() == 3 else boxes[:, None]}

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        images, labels, *boxes = batch
        return (images.float().div_(255.0), labels, *boxes)
