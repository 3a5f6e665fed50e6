"""Images in class folders (torchvision's ImageFolder layout), for fine-tuning on your own data:

    ROOT/train/<class_name>/<any name>.jpg     (any image format PIL reads)
    ROOT/val/<class_name>/...                  (same class folder names)
    ROOT/test/<class_name>/...                 (optional; test_dataloader falls back to val)

Batches: (images float [B, in_chans, S, S] in [0, 1], labels int64 [B]). Training: RandomResizedCrop
and a flip; evaluation: zoo.preprocess's "crop" rule (resize to S / crop_pct, centre-crop S)."""
from __future__ import annotations

from functools import partial
from pathlib import Path

from torch.utils.data import DataLoader

from zoo.data.base import SplitDataModule
from zoo.data.card import DataCard
from zoo.guards.errors import UserError
from zoo.guards.files import load_image
from zoo.preprocess import Preprocessing


class ImageFolderDataModule(SplitDataModule):
    # channels: `in_chans`; classes: the class folders' names (image_chans_for, class_names_for)
    card = DataCard(image_size="image_size", path_arguments=("root",),
                    skip={"tiny": "class folders of images on disk: tests/test_vit.py writes a tiny tree"})

    @classmethod
    def image_chans_for(cls, in_chans: int = 3, **_) -> int | None:
        return in_chans

    @classmethod
    def eval_resize_for(cls, size: tuple[int, int], crop_pct: float = 0.875, **_) -> int | None:
        return int(round(min(size) / float(crop_pct)))  # timm's evaluation: resize to S / crop_pct, crop S

    def __init__(self, root: str, image_size: int = 224, batch_size: int = 128, eval_batch_size: int | None = None,
                 num_workers: int = 8, train_dir: str = "train", val_dir: str = "val", test_dir: str | None = "test",
                 crop_scale: list[float] = (0.08, 1.0), crop_pct: float = 0.875, hflip: float = 0.5,
                 in_chans: int = 3):
        super().__init__()
        self.save_hyperparameters()
        self.image_size = image_size
        self.datasets: dict = {}
        self.class_names = self.class_names_for(root, train_dir)
        self.num_classes = len(self.class_names)

    @staticmethod
    def class_names_for(root: str, train_dir: str = "train", **_) -> list[str]:
        """The sorted class folder names under ROOT/train_dir."""
        train = Path(root) / train_dir
        return sorted(p.name for p in train.iterdir() if p.is_dir()) if train.is_dir() else []

    def _folder(self, name: str | None):
        from torchvision import datasets, transforms

        hp = self.hparams
        path = Path(hp.root) / name if name else None
        if path is None or not path.is_dir():
            return None
        if name == hp.train_dir:
            tf = transforms.Compose([
                transforms.RandomResizedCrop(hp.image_size, scale=tuple(hp.crop_scale)),
                transforms.RandomHorizontalFlip(hp.hflip),
                transforms.ToTensor()])
        else:
            tf = Preprocessing(hp.in_chans, (hp.image_size, hp.image_size), "crop", int(round(hp.image_size / hp.crop_pct)))
        try:
            dataset = datasets.ImageFolder(str(path), transform=tf,
                                           loader=partial(load_image, channels=hp.in_chans))
        except FileNotFoundError as exc:  # no class folder, or class folders without images
            raise UserError(f"ImageFolder {path}: {exc} (expected {path}/<class>/<image>)") from None
        if self.class_names and dataset.classes != self.class_names:
            raise UserError(f"{path}: class folders differ from {hp.train_dir}/ "
                            f"({len(dataset.classes)} vs {len(self.class_names)} classes)")
        return dataset

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        hp = self.hparams
        if not (Path(hp.root) / hp.train_dir).is_dir() and not (Path(hp.root) / hp.val_dir).is_dir():
            raise UserError(f"{hp.root}: expected {hp.train_dir}/<class>/*.jpg and {hp.val_dir}/<class>/*.jpg "
                            "(torchvision ImageFolder layout)")
        for split, name in (("train", hp.train_dir), ("val", hp.val_dir), ("test", hp.test_dir)):
            self.datasets[split] = self._folder(name)
        if self.datasets["test"] is None:
            self.datasets["test"] = self.datasets["val"]

    def loader(self, split: str) -> DataLoader:
        shuffle = split == "train"
        dataset = self.datasets.get(split)
        if dataset is None:
            raise UserError(f"no '{split}' images under {self.hparams.root}")
        return self.plain_loader(dataset, train=shuffle, drop_last=shuffle)

