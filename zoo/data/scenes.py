"""FashionScenes: an offline captioning dataset with known object boxes.

A scene: 1 to 3 colour-tinted Fashion-MNIST items on a black canvas, with 3 to 5 captions naming
them, their colours and relations ("a red shirt left of a blue bag"; zoo.data.scene_generation,
zoo.data.scene_grammar), and their boxes, so that attention can be scored. Batches are
zoo.data.caption_base's plus `item_boxes float [B, K, 4]` (-1: empty slot) and `word_items int64
[B, T]` (the slot a colour or item word names, -1 elsewhere); val / test add `references`, `boxes`
and `box_words` (each item's head word).
"""
from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from zoo.data.caption_base import CaptionBatches, CaptionDataModule
from zoo.data.card import DataCard
from zoo.data.scene_generation import (BLOCK, FORMAT_VERSION, SPLITS, Scenes, cache_file, generate_scenes,
                                       load_items, split_pool)
from zoo.data.scene_grammar import COLOURS, ITEM_NAMES
from zoo.data.vocab import pad_captions, tokenize
from zoo.guards.errors import UserError
from zoo.guards.writes import atomic_save_image, atomic_write_bytes


class SceneCaptions(CaptionBatches):
    """Every (scene, caption) pair, longest first; or (`references`) each scene once."""

    def __init__(self, scenes: Scenes, captions: torch.Tensor, lengths: torch.Tensor, row_scene: Sequence[int],
                 caption_items: list[list[int]], multiple: int | None, references: bool):
        super().__init__(captions, lengths, row_scene, multiple, longest_first=not references)
        self.scenes, self.references = scenes, references
        # int64 [N, T] aligned with <start> w1 .. wn <end>: -1 at <start>, <end>, pads and non-item words
        self.word_items = pad_captions([[-1, *items, -1] for items in caption_items], pad_value=-1,
                                       multiple=multiple)[0]

    def images(self, image: torch.Tensor) -> torch.Tensor:
        # numpy on purpose: small torch ops on a busy CPU lose most of their time to intra-op thread handoffs
        return torch.from_numpy(self.scenes.images[image.numpy()].astype(np.float32) / np.float32(255.0))

    def extras(self, rows: torch.Tensor, image: torch.Tensor, width: int) -> dict:
        out = {"word_items": self.word_items[rows, :width],
               "item_boxes": torch.from_numpy(self.scenes.boxes[image.numpy()])}  # [B, K, 4]; -1: empty slot
        if self.references:
            out.update(references=[list(self.scenes.captions[i]) for i in image.tolist()],
                       boxes=[torch.from_numpy(self.scenes.item_boxes(i).copy()) for i in image.tolist()],
                       box_words=[self.scenes.item_words(i) for i in image.tolist()])
        return out


class FashionScenesDataModule(CaptionDataModule):
    """FashionScenes splits as caption batches; `dm.vocab` before `setup()` builds the training split.
    `item_loader(split) -> (uint8 [N, 28, 28], int64 [N])` replaces Fashion-MNIST (tests)."""

    label = "FashionScenes"
    card = DataCard(image_size="canvas_size", channels=3, path_arguments=("cache_dir",),
                    dimensions={"canvas_size": 1_024, "max_items": 1_000},
                    tiny=dict(num_train=16, num_val=8, num_test=8, batch_size=8, cache=False))
    provides_word_boxes = True  # batches carry item_boxes + word_items (supervised attention)

    #: bytes a scene holds besides its canvas: captions as Python strings, their encoded rows, boxes
    SCENE_OVERHEAD = 4096

    @classmethod
    def memory_for(cls, num_train: int = 10000, num_val: int = 500, num_test: int = 1000, canvas_size: int = 64,
                   **_) -> dict[str, float]:
        """What the splits would hold: canvases twice while generated, and SCENE_OVERHEAD per scene."""
        per_scene = 2 * 3 * int(canvas_size) ** 2 + cls.SCENE_OVERHEAD
        return {f"data.init_args.{name}={int(n):,} scenes of 3x{canvas_size}x{canvas_size} px": float(n) * per_scene
                for name, n in (("num_train", num_train), ("num_val", num_val), ("num_test", num_test))}

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
        for name in ("num_train", "num_val", "num_test", "max_len", "pad_to_multiple"):
            if self.hparams[name] is not None and self.hparams[name] < 1:
                raise UserError(f"FashionScenes: {name} must be >= 1, got {self.hparams[name]}")
        self.item_loader = item_loader
        self.image_size = canvas_size
        self.scenes: dict[str, Scenes] = {}
        self._sources: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    # ------------------------------------------------------------------ generation + cache
    def _source(self, fm_split: str) -> tuple[np.ndarray, np.ndarray]:
        if fm_split not in self._sources:
            self._sources[fm_split] = load_items(self.item_loader, fm_split, "FashionScenes")
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
        source = None if self.item_loader is None else self._source("train" if split == "train" else "test")
        return cache_file(self._settings(split), source, self.hparams.cache_dir)

    def build_split(self, split: str) -> Scenes:
        """Generate (or load from the cache) one split."""
        if split in self.scenes:
            return self.scenes[split]
        hp, settings = self.hparams, self._settings(split)
        path = self.cache_path(split) if hp.cache else None
        scenes = None
        if path is not None and path.is_file():
            with contextlib.suppress(Exception):  # a stale or damaged cache file is rebuilt, not trusted
                scenes = Scenes.load(path, hp.canvas_size, settings["num"])
        if scenes is None:
            items, labels = self._source("train" if split == "train" else "test")
            scenes = generate_scenes(items, labels, split_pool(split, len(items), hp.test_seed),
                                     settings["num"], settings["seed"], split, hp.canvas_size, hp.item_sizes,
                                     hp.min_items, hp.max_items, hp.min_captions, hp.max_captions, hp.gap)
            if path is not None:
                try:
                    atomic_write_bytes(path, scenes.to_bytes())
                except OSError as exc:
                    raise UserError(f"the scenes cache {path.parent}: cannot write there ({exc.strerror or exc}); set "
                                    "ZOO_DATA_DIR or data cache_dir to a writable folder, or cache: false") from None
        self.scenes[split] = scenes
        return scenes

    def prepare_data(self) -> None:
        for split in SPLITS:
            self.build_split(split)

    # ------------------------------------------------------------------ datasets
    def training_tokens(self) -> list[list[list[str]]]:
        return [[tokenize(c) for c in caps] for caps in self.build_split("train").captions]

    def setup(self, stage: str | None = None) -> None:
        max_len, multiple = self.hparams.max_len, self.hparams.pad_to_multiple
        if "train" not in self.datasets:
            train = self.build_split("train")
            captions, lengths, pairs = self.encode_pairs(self.training_tokens())
            items = [train.caption_items[i][j] for i, j in pairs]
            self.datasets["train"] = SceneCaptions(train, captions, lengths, [i for i, _ in pairs], items, multiple,
                                                   references=False)
        for split in ("val", "test"):
            if split not in self.datasets:
                scenes = self.build_split(split)
                captions, lengths = self.encode_first([tokenize(caps[0]) for caps in scenes.captions])
                items = [each[0][:max_len] for each in scenes.caption_items]
                self.datasets[split] = SceneCaptions(scenes, captions, lengths, range(len(scenes)), items, multiple,
                                                     references=True)

    @classmethod
    def few_examples(cls, n: int) -> dict:
        return {"num_train": 1, "num_val": 1, "cache": False}  # the test scenes do not depend on the others

    def boxed_examples(self, split: str, n: int) -> dict:
        """Every item's box and head word (a word's attention is scored on the boxes it names)."""
        self.setup()
        batch = self.datasets[split].__getitems__(list(range(min(n, len(self.datasets[split])))))
        return {"images": batch["images"], "targets": batch["item_boxes"].float(),
                "target_words": [words + [""] * (batch["item_boxes"].shape[1] - len(words))
                                 for words in batch["box_words"]]}

    # ------------------------------------------------------------------ demo helper
    def export_pngs(self, split: str, directory: str | os.PathLike, count: int) -> list[Path]:
        """Write the first `count` scenes of `split` as PNGs plus references.json (the demo, the CLI)."""
        scenes = self.build_split(split)
        directory, refs = Path(directory), {}
        paths = [directory / f"{split}_{i:05d}.png" for i in range(min(count, len(scenes)))]
        for i, path in enumerate(paths):
            atomic_save_image(Image.fromarray(scenes.images[i].transpose(1, 2, 0)), path)
            refs[path.name] = {"references": scenes.captions[i], "boxes": scenes.item_boxes(i).tolist(),
                               "box_words": scenes.item_words(i)}
        atomic_write_bytes(directory / "references.json", (json.dumps(refs, indent=1) + "\n").encode())
        return paths
