"""COCO / Flickr captioning data from the standard files, in two formats:
- `coco`: the COCO captions JSON (`captions_train2014.json`), through pycocotools; one file per
  split, each with its image folder (`<split>_image_root`, else `image_root`);
- `karpathy`: Karpathy's split JSON (`dataset_coco.json`, `dataset_flickr30k.json`), image paths
  `image_root/filepath/filename`; `restval_in_train` folds restval into train (113,287 COCO images).
Images: the shorter side resized to `resize_size`, then cropped to `image_size` (random for
training; never flipped, which would swap "left" and "right"); evaluation is zoo.preprocess's "crop".
"""
from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from zoo.data.caption_base import CaptionBatches, CaptionDataModule
from zoo.data.card import DataCard
from zoo.data.vocab import tokenize
from zoo.guards.errors import UserError
from zoo.guards.files import load_image, read_json

FORMATS = ("coco", "karpathy")
KARPATHY_SPLITS = ("train", "restval", "val", "test")


@dataclass
class CaptionedImage:
    image_id: int | str
    path: Path
    references: list[str] = field(default_factory=list)  # raw strings, for scoring
    tokens: list[list[str]] = field(default_factory=list)  # tokenised, for training


# ----------------------------------------------------------------------------- readers
#: the largest caption file read (Karpathy's COCO split: 150 MB) and the most values it may hold
MAX_CAPTION_FILE_BYTES = 256 * 2**20
MAX_CAPTION_VALUES = 50_000_000


def _read_json(path: str | os.PathLike, what: str):
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file ({what})")
    return read_json(path, str(path), max_bytes=MAX_CAPTION_FILE_BYTES, max_nodes=MAX_CAPTION_VALUES)


def _looks_like(data) -> str | None:
    """'coco' or 'karpathy' when a parsed JSON has that format's signature, else None."""
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        return None
    first = data["images"][0] if data["images"] and isinstance(data["images"][0], dict) else {}
    if isinstance(data.get("annotations"), list) and "file_name" in first:
        return "coco"
    if "sentences" in first and "filename" in first:
        return "karpathy"
    return None


def read_coco_captions(annotation_file: str | os.PathLike, image_root: str | os.PathLike) -> list[CaptionedImage]:
    """Images with their captions from a COCO captions JSON, through pycocotools' index."""
    from pycocotools.coco import COCO

    path = Path(annotation_file)
    data = _read_json(path, "COCO captions annotations")
    if _looks_like(data) == "karpathy":
        raise UserError(f"{path}: this is a Karpathy split file, not COCO captions; use format: karpathy "
                        f"with karpathy_json: {path}")
    if not isinstance(data, dict) or not isinstance(data.get("images"), list) \
            or not isinstance(data.get("annotations"), list):
        raise UserError(f"{path}: not a COCO captions file (needs 'images' and 'annotations' lists)")
    def is_id(value) -> bool:  # pycocotools indexes by these: a number or a string, never a structure
        return isinstance(value, (int, str)) and not isinstance(value, bool)

    for k, img in enumerate(data["images"]):
        if not isinstance(img, dict) or not is_id(img.get("id")) or not isinstance(img.get("file_name"), str):
            raise UserError(f"{path}: images[{k}] needs an 'id' (a number or string) and a 'file_name'")
    for k, ann in enumerate(data["annotations"]):
        if not isinstance(ann, dict) or not is_id(ann.get("image_id")) or not isinstance(ann.get("caption"), str):
            raise UserError(f"{path}: annotations[{k}] needs an 'image_id' (a number or string) and a 'caption' string")
        ann.setdefault("id", k)  # pycocotools indexes annotations by id
        if not is_id(ann["id"]):
            raise UserError(f"{path}: annotations[{k}]: its 'id' must be a number or string")
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
        coco = COCO()
        coco.dataset = data
        coco.createIndex()
    unknown = [a["image_id"] for a in data["annotations"] if a["image_id"] not in coco.imgs]
    if unknown:
        raise UserError(f"{path}: {len(unknown)} captions refer to images not listed (e.g. image_id {unknown[0]})")
    root = Path(image_root)
    out = []
    for image_id in sorted(coco.imgs):
        captions = [a["caption"] for a in coco.imgToAnns.get(image_id, [])]
        if not captions:
            continue  # nothing to learn from or score against
        out.append(CaptionedImage(image_id, root / coco.imgs[image_id]["file_name"], captions,
                                  [tokenize(c) for c in captions]))
    if not out:
        raise UserError(f"{path}: no captioned images")
    return out


def read_karpathy(split_file: str | os.PathLike, image_root: str | os.PathLike,
                  restval_in_train: bool = True) -> dict[str, list[CaptionedImage]]:
    """{"train", "val", "test"} -> images with captions, from a Karpathy split JSON."""
    path = Path(split_file)
    data = _read_json(path, "Karpathy split")
    if _looks_like(data) == "coco":
        raise UserError(f"{path}: this is a COCO captions file, not a Karpathy split; use format: coco with "
                        f"train_annotations: {path} (and val_annotations / test_annotations)")
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise UserError(f"{path}: not a Karpathy split file (needs an 'images' list)")
    root = Path(image_root)
    splits: dict[str, list[CaptionedImage]] = {"train": [], "val": [], "test": []}
    for k, img in enumerate(data["images"]):
        if not isinstance(img, dict) or not isinstance(img.get("filename"), str) \
                or img.get("split") not in KARPATHY_SPLITS or not isinstance(img.get("sentences"), list):
            raise UserError(f"{path}: images[{k}] needs 'filename', 'sentences' and a 'split' in "
                            f"{list(KARPATHY_SPLITS)}")
        if not isinstance(img.get("filepath", ""), str):
            raise UserError(f"{path}: images[{k}]: its 'filepath' must be a folder name (a string)")
        if img["split"] == "restval" and not restval_in_train:
            continue
        split = "train" if img["split"] == "restval" else img["split"]
        refs, tokens = [], []
        for s in img["sentences"]:
            if not isinstance(s, dict) or not ("raw" in s or "tokens" in s):
                raise UserError(f"{path}: images[{k}].sentences needs 'tokens' or 'raw' per sentence")
            raw = s.get("raw") if isinstance(s.get("raw"), str) else " ".join(map(str, s.get("tokens", [])))
            refs.append(raw)
            # the file's tokens when given (already lowercased, punctuation-free), through the same
            # tokenizer so both formats spell words alike
            tokens.append(tokenize(" ".join(map(str, s["tokens"]))) if isinstance(s.get("tokens"), list)
                          else tokenize(raw))
        if not refs:
            continue
        image_id = img.get("cocoid", img.get("imgid", k))
        if not isinstance(image_id, (int, str)) or isinstance(image_id, bool):
            raise UserError(f"{path}: images[{k}]: its 'cocoid' / 'imgid' must be a number or string")
        splits[split].append(CaptionedImage(image_id, root / img.get("filepath", "") / img["filename"],
                                            refs, tokens))
    return splits


def build_transform(image_size: int, resize_size: int | None, train: bool, random_crop: bool):
    """PIL image -> float [3, image_size, image_size] in [0, 1]: random crops, or zoo.preprocess's rule."""
    from torchvision import transforms as T

    from zoo.preprocess import Preprocessing

    if train and random_crop:
        return T.Compose([T.Resize(resize_size or image_size), T.RandomCrop(image_size), T.ToTensor()])
    return Preprocessing(3, (image_size, image_size), "crop", resize_size or image_size)


# ----------------------------------------------------------------------------- datasets
class CaptionedFiles(CaptionBatches):
    """Caption rows of image files, read a batch at a time (`references`: each image once)."""

    def __init__(self, records: list[CaptionedImage], captions: torch.Tensor, lengths: torch.Tensor,
                 row_image: Sequence[int], transform, references: bool = False):
        super().__init__(captions, lengths, row_image)
        self.records, self.transform, self.references = records, transform, references

    def images(self, image: torch.Tensor) -> torch.Tensor:
        paths = [self.records[k].path for k in image.tolist()]
        return torch.stack([self.transform(load_image(path, channels=3)) for path in paths])

    def image_ids(self, image: torch.Tensor) -> list:
        return [self.records[k].image_id for k in image.tolist()]

    def file_of(self, row: int):
        return self.records[int(self.row_image[row])].path

    def extras(self, rows: torch.Tensor, image: torch.Tensor, width: int) -> dict:
        return {"references": [list(self.records[k].references) for k in image.tolist()]} if self.references else {}


# ----------------------------------------------------------------------------- datamodule
class CaptionsDataModule(CaptionDataModule):
    """COCO or Flickr captions; `dm.vocab` before `setup()` reads the training annotations only."""

    card = DataCard(image_size="image_size", channels=3,
                    path_arguments=("karpathy_json", "train_annotations", "val_annotations", "test_annotations",
                                    "image_root", "train_image_root", "val_image_root", "test_image_root"),
                    skip={"tiny": "COCO or Flickr files: tests/test_captions_data.py writes tiny ones"})

    @classmethod
    def eval_resize_for(cls, size: tuple[int, int], resize_size: int | None = None, **_) -> int | None:
        return resize_size or min(size)

    def __init__(self, format: str = "karpathy", karpathy_json: str | None = None,
                 train_annotations: str | None = None, val_annotations: str | None = None,
                 test_annotations: str | None = None, image_root: str = "data/coco",
                 train_image_root: str | None = None, val_image_root: str | None = None,
                 test_image_root: str | None = None, restval_in_train: bool = True,
                 image_size: int = 224, resize_size: int | None = 256, random_crop: bool = True,
                 batch_size: int = 64, eval_batch_size: int | None = None,
                 max_len: int = 20, min_freq: int = 5, max_vocab: int | None = 10000,
                 num_workers: int = 4, seed: int = 0, bucket_pool: int = 50,
                 limit_train: int | None = None, limit_eval: int | None = None, check_files: bool = True,
                 vocab: list[str] | None = None):
        super().__init__()
        self.save_hyperparameters()
        if format not in FORMATS:
            raise UserError(f"captions: unknown format '{format}' (choose from {', '.join(FORMATS)})")
        if format == "karpathy" and not karpathy_json:
            raise UserError("captions: format 'karpathy' needs karpathy_json (e.g. data/coco/dataset_coco.json)")
        if format == "coco" and not train_annotations:
            raise UserError("captions: format 'coco' needs train_annotations (e.g. captions_train2014.json)")
        if max_len < 1 or min_freq < 1:
            raise UserError(f"captions: max_len and min_freq must be >= 1, got {max_len} and {min_freq}")
        self.image_size = image_size
        self._records: dict[str, list[CaptionedImage]] = {}

    # ------------------------------------------------------------------ annotations
    def records(self, split: str) -> list[CaptionedImage]:
        """Images + captions of "train", "val" or "test" (annotations only, no pixels)."""
        if split in self._records:
            return self._records[split]
        hp = self.hparams
        if hp.format == "karpathy":
            self._records.update(read_karpathy(hp.karpathy_json, hp.image_root, hp.restval_in_train))
            for name, records in self._records.items():
                if not records and (name == "train" or name == split):
                    raise UserError(f"{hp.karpathy_json}: no images in the '{name}' split")
        else:
            annotations = hp[f"{split}_annotations"]
            if not annotations:
                raise UserError(f"captions: no {split}_annotations given for format 'coco'")
            root = getattr(hp, f"{split}_image_root") or hp.image_root
            self._records[split] = read_coco_captions(annotations, root)
        return self._records[split]

    def training_tokens(self) -> list[list[list[str]]]:
        return [r.tokens for r in self.records("train")]

    def _check_files(self, split: str, records: Sequence[CaptionedImage]) -> None:
        hp = self.hparams
        key = f"{split}_image_root" if hp.get(f"{split}_image_root") else "image_root"
        root = Path(hp[key])
        if not root.is_dir():
            raise UserError(f"captions: image root {root} ({split}) is not a directory; "
                            f"set data.init_args.{key}")
        missing = [r.path for r in records if not r.path.is_file()]
        if missing:
            raise UserError(f"captions: {len(missing)} of {len(records)} {split} images are missing, "
                            f"e.g. {missing[0]} (check image_root)")

    # ------------------------------------------------------------------ datasets
    def setup(self, stage: str | None = None) -> None:
        hp = self.hparams
        if "train" not in self.datasets and stage in (None, "fit"):
            records = self.records("train")[:hp.limit_train or None]
            if hp.check_files:
                self._check_files("train", records)
            captions, lengths, pairs = self.encode_pairs([r.tokens for r in records])
            transform = build_transform(hp.image_size, hp.resize_size, True, hp.random_crop)
            self.datasets["train"] = CaptionedFiles(records, captions, lengths, [i for i, _ in pairs], transform)
        wanted = {"fit": ["val"], "validate": ["val"], "test": [self.test_split], "predict": [self.test_split]}.get(stage, ["val", "test"])
        for split in wanted:
            if split in self.datasets:
                continue
            if hp.format == "coco" and not getattr(hp, f"{split}_annotations") and stage is None:
                continue  # optional split not configured
            records = self.records(split)[:hp.limit_eval or None]
            if hp.check_files:
                self._check_files(split, records)
            transform = build_transform(hp.image_size, hp.resize_size, False, False)
            self.datasets[split] = CaptionedFiles(records, *self.encode_first([r.tokens[0] for r in records]),
                                                  range(len(records)), transform, references=True)
