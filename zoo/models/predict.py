"""What a model answers for each image (`ZooModule.predict_step`), and `train.py predict`'s writer of
those answers: JSON lines, one per image in the data's order, in the file `--predictions` names (whole
or not at all). Each line says which image it answers: `index` (its line number, from 0), `split`
(the split the data module serves for predict, its `test_split`: "test" for `train.py predict`;
null for loaders given without a data module) and `path` (the
image's file, where the data reads files: ImageFolder, caption files) or else `data_index` (its
index in the split's data set); then the answer, by the family's card (`card.output`):
- "logits": `{"index": 0, "split": "test", "path": "ROOT/test/cat/1.jpg", "classes": [{"class": 7,
  "name": "Sneaker", "prob": 0.43}, ...]}`, the `top_k` most probable classes; an output per position
  ([B, L, classes]) gives `"cells"`;
- "caption": `{"index": 0, "split": "test", "data_index": 0, "image_id": 0, "caption": "a red shirt",
  "words": [...]}`;
- "sample": refused in one line (a generator answers no image: `zoo sample` draws from it).
"""
from __future__ import annotations

import json
import os
from contextlib import ExitStack
from pathlib import Path

import torch
from lightning.pytorch.callbacks import BasePredictionWriter

from zoo.guards.errors import UserError
from zoo.guards.writes import check_output, replacing

TOP_K = 5  # classes per image written by default (--top_k)


def check_predicts(model) -> None:
    """A model answers images (a classifier, a captioner), or a one-line refusal."""
    if model.card.output == "sample":
        raise UserError(f"predict: {type(model).__name__} ({model.family}) is a generator: it answers no image; "
                        "draw samples with `zoo sample` instead")


def check_target(path: str | None, overwrite: bool) -> Path:
    """The predictions file: named, not there already (unless `overwrite`), writable, not a link
    (zoo.guards.writes.check_output, as every command's output file)."""
    if not path:
        raise UserError("predict writes its predictions to a file: give --predictions FILE (JSON lines)")
    return check_output(path, "--predictions", overwrite)


@torch.no_grad()
def predictions(model, images: torch.Tensor, top_k: int = TOP_K) -> list[dict]:
    """Plain per-image answers of `model` for images float [B, C, H, W] (module docstring)."""
    check_predicts(model)
    if model.card.output == "caption":
        return [{"caption": " ".join(r["words"]), "words": list(r["words"])} for r in model.caption(images)]
    outputs = model.export_forward(images)
    scores = outputs[0] if isinstance(outputs, (tuple, list)) else outputs  # [B, ..., classes]
    probs = scores.float().softmax(-1).flatten(1, -2) if scores.dim() > 2 else scores.float().softmax(-1)[:, None]
    names = model.class_names or []
    top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    records = []
    for values, indices in zip(top.values.tolist(), top.indices.tolist()):  # per image: [cells][k]
        ranked = [[{"class": c, "name": names[c] if c < len(names) else None, "prob": round(p, 6)}
                   for p, c in zip(cell_values, cell_indices)] for cell_values, cell_indices in zip(values, indices)]
        records.append({"classes": ranked[0]} if scores.dim() == 2 else {"cells": [cell[0] for cell in ranked]})
    return records


def item_source(dataset, index: int) -> dict:
    """Where a data set's item `index` comes from: {"path": its file} where the data set reads files
    (a `file_of(index)` method, or torchvision's DatasetFolder `samples`), else {"data_index": index}."""
    path = None
    if hasattr(dataset, "file_of"):
        path = dataset.file_of(index)
    elif isinstance(getattr(dataset, "samples", None), list):  # torchvision's ImageFolder: (path, class) pairs
        path = dataset.samples[index][0]
    return {"path": str(path)} if path is not None else {"data_index": int(index)}


class PredictionWriter(BasePredictionWriter):
    """Writes each predict batch's records (`predict_step`'s list of dicts) as JSON lines, numbered
    in the data's order, to a temporary file renamed over `path` when prediction ends."""

    def __init__(self, path: str | os.PathLike, overwrite: bool = False, top_k: int = TOP_K):
        super().__init__(write_interval="batch")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise UserError(f"--top_k must be a positive integer, got {top_k!r}")
        self.path, self.overwrite, self.top_k = Path(path), overwrite, top_k
        self._stack, self._file, self._count = None, None, 0

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "predict":
            return
        check_predicts(pl_module)
        if trainer.world_size > 1:
            raise UserError("predict writes one file from one process: run it with --trainer.devices 1")
        check_target(str(self.path), self.overwrite)
        pl_module.predict_top_k = self.top_k

    def on_predict_start(self, trainer, pl_module) -> None:
        self._stack, self._count = ExitStack(), 0
        self._temp = self._stack.enter_context(replacing(self.path))  # renamed over the path when the stack closes
        self._file = self._stack.enter_context(open(self._temp, "w"))

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        loaders = trainer.predict_dataloaders
        loader = loaders[dataloader_idx] if isinstance(loaders, (list, tuple)) else loaders
        dataset = getattr(loader, "dataset", None)
        split = getattr(trainer.datamodule, "test_split", None)  # SplitDataModule: predict serves test_split
        # Lightning's batch indices: the data set's items this batch holds (none from an iterable data set)
        known = batch_indices is not None and len(batch_indices) == len(prediction)
        for k, record in enumerate(prediction):
            source = item_source(dataset, batch_indices[k] if known else self._count)
            self._file.write(json.dumps({"index": self._count, "split": split, **source, **record}) + "\n")
            self._count += 1

    def on_predict_end(self, trainer, pl_module) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._stack.close()
        print(f"predict: {self._count:,} predictions in {self.path}", flush=True)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if self._stack is not None:
            # the temporary goes, never renamed over the path: no half-written file
            self._stack.__exit__(type(exception), exception, exception.__traceback__)
