"""Item canvases: FashionScenes' pictures without the captions (zoo.data.scene_generation), for
pretraining a backbone on item labels: 1 to `max_items` tinted Fashion-MNIST items per canvas.
Train and val items are Fashion-MNIST train's (`val_items` held out by a fixed permutation), test's
are its test items; layouts are drawn per split at setup, deterministic in (seed, split), and
painted per batch. Batches: `images float [B, 3, S, S]` in [0, 1], `labels`, `colours int64 [B, K]`
and `boxes float [B, K, 4]` per item slot (-1: empty slot).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch.utils.data import Dataset

from zoo.data.base import SplitDataModule, batch_identity
from zoo.data.card import DataCard
from zoo.data.fashion_mnist import CLASS_NAMES
from zoo.data.scene_generation import draw_layouts, load_items, paint
from zoo.guards.errors import UserError

SPLIT_CODES = {"train": 10, "val": 11, "test": 12}  # RNG streams apart from the scenes' (0, 1, 2)
LAYOUT_BLOCK = 4096  # canvases per RNG block: a split's first K canvases do not depend on its size


class ItemCanvases(Dataset):
    """One split's canvases, painted a batch at a time."""

    def __init__(self, items: np.ndarray, labels: np.ndarray, layouts: dict[str, np.ndarray], canvas_size: int):
        self.items, self.labels, self.layouts, self.canvas_size = items, labels, layouts, canvas_size

    def __len__(self) -> int:
        return len(self.layouts["n_items"])

    def __getitems__(self, indices):
        lay = {key: value[np.asarray(indices, dtype=np.int64)] for key, value in self.layouts.items()}
        images, boxes = paint(self.items, lay, self.canvas_size)
        labels = np.where(lay["source_index"] >= 0, self.labels[np.maximum(lay["source_index"], 0)], -1)
        return {"images": torch.from_numpy(images.astype(np.float32) / np.float32(255.0)),
                "labels": torch.from_numpy(labels.astype(np.int64)),
                "colours": torch.from_numpy(lay["colours"].astype(np.int64)),
                "boxes": torch.from_numpy(boxes)}

    def __getitem__(self, i):
        return {k: v[0] for k, v in self.__getitems__([i]).items()}


class ItemCanvasesDataModule(SplitDataModule):
    """`item_loader(split) -> (uint8 [N, 28, 28], int64 [N])` replaces Fashion-MNIST (tests)."""

    card = DataCard(image_size="canvas_size", channels=3, class_names=CLASS_NAMES,  # the items' classes
                    dimensions={"canvas_size": 1_024, "max_items": 1_000},
                    tiny=dict(num_train=16, num_val=8, num_test=8, val_items=100, batch_size=8))

    def __init__(self, num_train: int = 60000, num_val: int = 2000, num_test: int = 5000, val_items: int = 5000,
                 seed: int = 0, test_seed: int = 1234, batch_size: int = 128, eval_batch_size: int | None = None,
                 canvas_size: int = 64, item_sizes: tuple[int, ...] = (28,), min_items: int = 1,
                 max_items: int = 3, gap: int = 0, num_workers: int = 0, item_loader: Callable | None = None):
        super().__init__()
        self.save_hyperparameters(ignore=["item_loader"])
        for name in ("num_train", "num_val", "num_test", "val_items"):
            if self.hparams[name] < 1:
                raise UserError(f"ItemCanvases: {name} must be >= 1, got {self.hparams[name]}")
        if not 1 <= min_items <= max_items <= 3:
            raise UserError(f"ItemCanvases: need 1 <= min_items <= max_items <= 3, got {min_items}..{max_items}")
        self.item_loader = item_loader
        self.image_size = canvas_size
        self.datasets: dict[str, ItemCanvases] = {}

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        hp = self.hparams
        train = load_items(self.item_loader, "train", "ItemCanvases")  # (items, labels)
        if hp.val_items >= len(train[0]):
            raise UserError(f"ItemCanvases: val_items={hp.val_items} leaves no training items "
                            f"(the source has {len(train[0])})")
        order = np.random.default_rng([hp.test_seed, 98]).permutation(len(train[0]))
        test = load_items(self.item_loader, "test", "ItemCanvases")
        pools = {"train": np.sort(order[hp.val_items:]), "val": np.sort(order[:hp.val_items]),
                 "test": np.arange(len(test[0]))}
        for split, pool in pools.items():
            items, labels = test if split == "test" else train
            seed = {"train": hp.seed, "val": hp.seed + 1, "test": hp.test_seed}[split]
            num = hp[f"num_{split}"]  # in blocks, block b from the RNG (seed, split, b)
            blocks = [draw_layouts(np.random.default_rng([seed, SPLIT_CODES[split], b]), pool,
                                   min(LAYOUT_BLOCK, num - b * LAYOUT_BLOCK), hp.canvas_size, hp.item_sizes,
                                   hp.min_items, hp.max_items, hp.gap)
                      for b in range(-(-num // LAYOUT_BLOCK))]
            layouts = {key: np.concatenate([block[key] for block in blocks]) for key in blocks[0]}
            self.datasets[split] = ItemCanvases(items, labels, layouts, hp.canvas_size)

    @classmethod
    def few_examples(cls, n: int) -> dict:
        return {"num_train": 1, "num_val": 1}  # a split's first canvases do not depend on its size

    def boxed_examples(self, split: str, n: int) -> dict:
        """Every item's box (see SplitDataModule)."""
        self.setup()
        batch = self.datasets[split].__getitems__(list(range(min(n, len(self.datasets[split])))))
        return {"images": batch["images"], "targets": batch["boxes"]}

    def loader(self, split: str):
        if split not in self.datasets:
            raise UserError(f"ItemCanvases: no split '{split}' (train, val or test)")
        return self.plain_loader(self.datasets[split], train=split == "train", collate_fn=batch_identity)
