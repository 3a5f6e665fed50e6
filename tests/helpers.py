"""Test-only classes that subprocess runs name by class_path (conftest puts tests/ on PYTHONPATH).

- DumpingClassifier: the baseline classifier that, at the start and end of fit, saves its
  state_dict and the labels it trained on to $ZOO_TEST_DUMP_DIR/rank<R>_{start,end}.pt (when set),
  so a DDP test can compare what every rank ends with; it also feeds the attention-figure
  logger one figure per validation (the first image, enlarged).
- OtherModel: a different zoo model class, for wrong-model checkpoint tests.
- read_wandb_records: parse a W&B offline run file (.wandb) into protobuf records.
- trainable_through_softmax: an attention score's parameters that a loss through the softmax can train.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

import lightning as L
import torch
from torch import nn

from zoo.models.base import ZooModule
from zoo.models.baselines import Classifier


class DumpingClassifier(Classifier):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._seen: list[torch.Tensor] = []

    def _dump(self, tag: str) -> None:
        if not os.environ.get("ZOO_TEST_DUMP_DIR"):
            return
        directory = Path(os.environ["ZOO_TEST_DUMP_DIR"])
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().clone() for k, v in self.state_dict().items()}
        seen = torch.cat(self._seen) if self._seen else torch.empty(0, dtype=torch.int64)
        torch.save({"state": state, "seen": seen, "world_size": self.trainer.world_size,
                    "global_step": self.trainer.global_step},
                   directory / f"rank{self.global_rank}_{tag}.pt")

    def on_fit_start(self) -> None:
        self._dump("start")

    def training_step(self, batch, batch_idx):
        self._seen.append(batch[1].detach().cpu())
        return super().training_step(batch, batch_idx)

    def on_fit_end(self) -> None:
        self._dump("end")

    def attention_figures(self, batch):
        from PIL import Image

        image = (batch[0][0, 0].detach().cpu().clamp(0, 1) * 255).to(torch.uint8).numpy()
        return {"first image": Image.fromarray(image).resize((56, 56))}


class OtherModel(ZooModule):
    """Not a baseline: a checkpoint of this must not load into a Classifier."""

    family = "other"

    def __init__(self, width: int = 4):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Linear(width, width)

    def forward(self, x):
        return self.net(x)


def read_wandb_records(path: str | os.PathLike) -> list:
    """Records of a W&B transaction log (.wandb): a 7-byte file header, then LevelDB-style
    32 KiB blocks of chunks (crc32, length, type FULL/FIRST/MIDDLE/LAST) holding protobuf
    `Record`s."""
    from wandb.proto import wandb_internal_pb2 as pb

    raw = Path(path).read_bytes()
    assert raw[:4] == b":W&B", f"{path}: not a W&B run file"
    block, pos, pending, payloads = 32768, 7, b"", []
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # block trailer padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        pos += 7
        if length == 0 and kind == 0:
            break
        chunk, pos = raw[pos:pos + length], pos + length
        if kind == 1:
            payloads.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            payloads.append(pending + chunk)
            pending = b""
    records = []
    for payload in payloads:
        record = pb.Record()
        record.ParseFromString(payload)
        records.append(record)
    return records


SHIFT_INVARIANT = {"out.bias"}  # the additive score's output bias: it shifts every score alike


def trainable_through_softmax(score) -> list:
    """The score's parameters whose gradient through a softmax over locations can be non-zero.
    A bias added to every score equally (the additive score's `out.bias`) is ignored by the
    softmax, so its gradient is zero up to rounding and a test must not expect otherwise."""
    return [p for name, p in score.named_parameters() if name not in SHIFT_INVARIANT]


from zoo.data.scenes import FashionScenesDataModule  # noqa: E402


class BoxlessScenes(FashionScenesDataModule):
    """FashionScenes that does not say where the named items are (like COCO captions)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.provides_word_boxes = False


class SigtermInValidation(L.Callback):
    """Sends this process SIGTERM at the first validation batch of epoch `$ZOO_TEST_SIGTERM_EPOCH`
    (not during sanity checking): a scheduler's time limit hitting mid-validation."""

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        import signal

        epoch = int(os.environ.get("ZOO_TEST_SIGTERM_EPOCH", "-1"))
        if not trainer.sanity_checking and trainer.current_epoch == epoch and batch_idx == 0:
            os.kill(os.getpid(), signal.SIGTERM)


def gather_captions_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """One rank of a two-process gloo group: what the captioner's evaluation gathers from this rank.
    DistributedSampler over 5 images on 2 ranks serves rank 0 images 0, 2, 4 and rank 1 images
    1, 3 and 0 again (padding)."""
    import json

    import torch.distributed as dist

    from zoo.models.captioner import _gather

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        ids = [[0, 2, 4], [1, 3, 0]][rank]
        store = {"ids": ids, "words": [[f"word{i}", "a"] for i in ids], "references": [[f"ref {i}"] for i in ids]}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(_gather(store)))
    finally:
        dist.destroy_process_group()
