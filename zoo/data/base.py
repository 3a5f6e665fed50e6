"""What the zoo's data modules share: the three loaders from one `loader(split)`, the split that
`test_dataloader()` serves, and length-bucketed training batches for captions."""
from __future__ import annotations

import inspect
import re

import lightning as L
import torch
from lightning.pytorch.utilities.parsing import AttributeDict
from torch.utils.data import DataLoader, RandomSampler

from zoo.classes import allow_class
from zoo.data.card import DataCard, dimensions_of, register
from zoo.data.sampling import BucketBatchSampler
from zoo.guards.budget import check_arguments
from zoo.guards.errors import UserError


def as_size(size) -> tuple[int, int]:
    """An image size as (height, width): 64 -> (64, 64), [64, 48] -> (64, 48)."""
    return (int(size), int(size)) if isinstance(size, int) else tuple(int(s) for s in size)


def batch_identity(batch):
    """The collate function of datasets whose `__getitems__` builds the whole batch."""
    return batch


class SplitDataModule(L.LightningDataModule):
    """Subclasses define `loader(split) -> DataLoader` for "train", "val" and "test"; `test_split` is
    the split `test_dataloader()` serves ("val" for eval.py's `--split val`)."""

    test_split = "test"
    #: the data set's facts (zoo.data.card): a subclass declaring its own is a data set
    card: DataCard | None = None

    def __init_subclass__(cls, **kwargs):
        """A concrete data module is allow-listed; one declaring its card is a data set (zoo.data.card)."""
        super().__init_subclass__(**kwargs)
        if "card" in cls.__dict__:
            register(cls)
        if not any(getattr(getattr(cls, name, None), "__isabstractmethod__", False) for name in dir(cls)):
            allow_class(cls, "data")

    def __new__(cls, *args, **kwargs):
        """Absurd sizes are refused in one line before anything is built (its card's `dimensions`)."""
        check_arguments(cls, args, kwargs, "data.init_args", dimensions_of(cls))
        return super().__new__(cls)


    @property
    def hparams_initial(self) -> AttributeDict:
        """Logged as `data.<key>`: Lightning refuses a model's and a data module's equal keys that differ."""
        return AttributeDict({f"data.{k}": v for k, v in super().hparams_initial.items() if not k.startswith("_")})

    @classmethod
    def arguments(cls, **init_args) -> dict:
        """`init_args` with the class defaults filled in, for the facts below."""
        defaults = {name: p.default for name, p in inspect.signature(cls).parameters.items()
                    if p.default is not inspect.Parameter.empty}
        return {**defaults, **init_args}

    # a data set's card sets these (zoo.data.card.CLASS_FACTS)
    image_size_argument: str | None = None
    image_chans: int | None = None
    class_names: list[str] | None = None
    path_arguments: tuple[str, ...] = ()

    @classmethod
    def image_size_for(cls, **init_args) -> tuple[int, int] | None:
        """(height, width) of the images it serves (None: not fixed), from its arguments alone."""
        size = init_args.get(cls.image_size_argument) if cls.image_size_argument else None
        return None if size is None else as_size(size)

    @classmethod
    def class_names_for(cls, **init_args) -> list[str] | None:
        return cls.class_names

    @classmethod
    def image_chans_for(cls, **init_args) -> int | None:
        return cls.image_chans

    @classmethod
    def dataset_for(cls, **init_args) -> tuple[str, str]:
        """(id, name) of the data set it serves, as a Hugging Face model card names one
        ("fashion_mnist", "Fashion-MNIST (cluttered 60x60)"): by default its class's words."""
        words = re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", cls.__name__.removesuffix("DataModule"))
        size = cls.image_size_for(**cls.arguments(**init_args))
        name = " ".join(words[:1] + [w.lower() for w in words[1:]]) + (f" ({size[1]}x{size[0]})" if size else "")
        return "_".join(w.lower() for w in words), name

    @classmethod
    def eval_resize_for(cls, size: tuple[int, int], **init_args) -> int | None:
        """The shorter side an evaluation image is resized to before its centre `size` is cropped, or None."""
        return None

    def summary(self) -> str:
        """One line for the start of training: examples per split, and a vocabulary's size."""
        datasets = getattr(self, "datasets", {}).items()
        parts = [f"{split} {len(data):,}" for split, data in datasets if hasattr(data, "__len__")]
        if getattr(self, "_vocab", None) is not None:
            parts.append(f"vocabulary {len(self._vocab):,} words")
        return f"{type(self).__name__}: " + (", ".join(parts) or "no split built yet")

    def boxed_examples(self, split: str, n: int) -> dict:
        """The first n examples of a split with known item boxes, for scoring attention: {"images"
        float [n, C, H, W] in [0, 1], "targets" float [n, M, 4] (x0, y0, x1, y1; -1 empty), and
        "target_words" (n lists of M words) where a step's label names its box (captions)}."""
        raise UserError(f"{type(self).__name__} has no item boxes to score attention on")

    @classmethod
    def few_examples(cls, n: int) -> dict:
        """Arguments that build little beyond the same first n test examples (`zoo samples`)."""
        return {}

    def train_dataloader(self) -> DataLoader:
        return self.loader("train")

    def val_dataloader(self) -> DataLoader:
        return self.loader("val")

    def test_dataloader(self) -> DataLoader:
        return self.loader(self.test_split)

    predict_dataloader = test_dataloader

    def pin_memory(self) -> bool:
        """Whether loaders pin their batches: only for a trainer on CUDA, the one accelerator whose
        copies pinned host memory speeds up (elsewhere torch warns that it is unused)."""
        from lightning.pytorch.accelerators import CUDAAccelerator

        trainer = self.trainer  # None outside a trainer (`zoo sample`, tests): batches stay on the CPU
        return trainer is not None and isinstance(getattr(trainer, "accelerator", None), CUDAAccelerator)

    def plain_loader(self, dataset, train: bool = False, collate_fn=None, **kwargs) -> DataLoader:
        """A loader over `dataset` at this module's `batch_size` (`eval_batch_size` outside training)."""
        hp = self.hparams
        batch_size = hp.batch_size if train else (hp.eval_batch_size or hp.batch_size)
        return DataLoader(dataset, batch_size=batch_size, shuffle=train, collate_fn=collate_fn,
                          num_workers=hp.num_workers, persistent_workers=hp.num_workers > 0,
                          pin_memory=self.pin_memory(), **kwargs)

    def bucketed_loader(self, data, collate_fn) -> DataLoader:
        """Training batches of captions of similar length (BucketBatchSampler of `data.lengths`)."""
        hp = self.hparams
        sampler = RandomSampler(data, generator=torch.Generator().manual_seed(hp.seed))
        batches = BucketBatchSampler(sampler, data.lengths.numpy(), hp.batch_size, drop_last=False,
                                     pool_batches=hp.bucket_pool, seed=hp.seed)
        return DataLoader(data, batch_sampler=batches, collate_fn=collate_fn, num_workers=hp.num_workers,
                          persistent_workers=hp.num_workers > 0, pin_memory=self.pin_memory())
