"""The allow-list: the only model and data classes a file may name. A weights file, checkpoint,
manifest or downloaded config is data, not code: each class_path it carries is looked up here
BEFORE anything is imported, and anything else is refused. (zoo.registry re-exports these names.)"""
from __future__ import annotations

import importlib

from zoo.errors import UserError
from zoo.limits import shorten

# (A recipe a user passes to train.py on the command line is their own code and stays free;
# train.py never instantiates a class named by a checkpoint.)
ALLOWED_CLASSES: dict[str, set[str]] = {
    "model": {
        "zoo.models.baselines.Classifier",
        "zoo.models.ram.RAM",
        "zoo.models.draw.DRAW",
        "zoo.models.draw.DRAWClassifier",
        "zoo.models.vit.ViTClassifier",
        "zoo.models.captioner.Captioner",
        "zoo.models.item_grid.ItemGridClassifier",
    },
    "data": {
        "zoo.data.fashion_mnist.FashionMNISTDataModule",
        "zoo.data.scenes.FashionScenesDataModule",
        "zoo.data.captions.CaptionsDataModule",
        "zoo.data.imagefolder.ImageFolderDataModule",
        "zoo.data.item_canvases.ItemCanvasesDataModule",
    },
}


def allow_class(cls: type, kind: str = "model") -> type:
    """Let files name `cls` (a model family or data module of your own, registered from Python
    code, never from a file). Returns `cls`, so it works as a class decorator."""
    ALLOWED_CLASSES[kind].add(f"{cls.__module__}.{cls.__qualname__}")
    return cls


def check_allowed(path, kind: str = "model") -> str:
    """`path` when it names an allow-listed class (nothing is imported); else one refusing line."""
    if not isinstance(path, str) or path not in ALLOWED_CLASSES[kind]:
        raise UserError(f"refused: the file names {kind} class {shorten(path)!r}, which is not one of the zoo's "
                        f"{kind} classes; a file may not choose code to run")
    return path


def resolve_class(path: str, kind: str = "model") -> type:
    """The allow-listed class `path` names, imported only after the check."""
    module, _, name = check_allowed(path, kind).rpartition(".")
    return getattr(importlib.import_module(module), name)
