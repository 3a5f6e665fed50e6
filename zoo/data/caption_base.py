"""What the caption data modules share: (image, caption) pairs for training (length-bucketed) and
each image once with its references for evaluation, through a vocabulary of the training captions.
Batches: `images float [B, 3, H, W]` in [0, 1], `captions int64 [B, T]` (<start> w1 .. wn <end>
<pad>..; T rounded up to `pad_to_multiple` where given), `lengths int64 [B]` and `image_ids`.
"""
from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch
from torch.utils.data import DataLoader, Dataset

from zoo.data.base import SplitDataModule, batch_identity
from zoo.data.vocab import Vocab, pad_captions, padded_length
from zoo.guards.errors import UserError

log = logging.getLogger("zoo")


class CaptionBatches(Dataset, ABC):
    """Caption rows (captions int64 [N, T], lengths int64 [N], row_image int64 [N]), a whole batch per
    `__getitems__`; a subclass serves `images` and `extras`. `longest_first`: each batch sorted so,
    with `host_lengths` (plain ints: a model skips finished rows without reading a tensor)."""

    def __init__(self, captions: torch.Tensor, lengths: torch.Tensor, row_image: Sequence[int],
                 multiple: int | None = None, longest_first: bool = False):
        self.captions, self.lengths = captions, lengths
        self.row_image = torch.as_tensor(row_image, dtype=torch.long)
        self.multiple, self.longest_first = multiple, longest_first

    def __len__(self) -> int:
        return len(self.lengths)

    @abstractmethod
    def images(self, image: torch.Tensor) -> torch.Tensor:
        """Image indices int64 [B] -> float [B, 3, H, W] in [0, 1]."""

    def image_ids(self, image: torch.Tensor) -> list:
        return image.tolist()

    def file_of(self, row: int):
        """The image file of caption row `row`, or None where images are not files (predict records)."""
        return None

    def extras(self, rows: torch.Tensor, image: torch.Tensor, width: int) -> dict:
        """What else the batch of caption `rows` (of images `image`, `width` columns) holds."""
        return {}

    def __getitems__(self, indices) -> dict:
        rows = torch.as_tensor(indices, dtype=torch.long)
        if self.longest_first:
            rows = rows[torch.argsort(self.lengths[rows], descending=True, stable=True)]
        image, lengths = self.row_image[rows], self.lengths[rows]
        width = padded_length(int(lengths.max()), self.multiple, self.captions.shape[1])
        batch = {"images": self.images(image), "captions": self.captions[rows, :width], "lengths": lengths}
        if self.longest_first:
            batch["host_lengths"] = lengths.tolist()
        return {**batch, "image_ids": self.image_ids(image), **self.extras(rows, image, width)}

    def __getitem__(self, i: int) -> dict:
        return {k: v[0] for k, v in self.__getitems__([i]).items()}


class CaptionDataModule(SplitDataModule, ABC):
    """A vocabulary, pairs encoded through it, and `datasets` of CaptionBatches. A subclass saves
    `max_len`, `min_freq`, `max_vocab`, `vocab`, the loader settings, `seed` and `bucket_pool`, and
    gives `training_tokens()` and a `setup()` that fills `datasets`."""

    label = "captions"  # what its error messages start with
    provides_word_boxes = False  # whether batches say where each word's item is (supervised attention)

    def __init__(self):
        super().__init__()
        self._vocab: Vocab | None = None
        self.datasets: dict[str, CaptionBatches] = {}

    @abstractmethod
    def training_tokens(self) -> Sequence[Sequence[Sequence[str]]]:
        """Per training image, the tokens of each of its captions: what the vocabulary counts."""

    @property
    def vocab(self) -> Vocab:
        """The training captions' words (`min_freq`, `max_vocab`), or the fixed list `vocab`."""
        hp = self.hparams
        if self._vocab is None and hp.get("vocab"):
            self._vocab = Vocab(hp.vocab)
        if self._vocab is None:
            vocab = Vocab.build((tokens for image in self.training_tokens() for tokens in image),
                                min_freq=hp.min_freq, max_size=hp.max_vocab)
            if vocab.num_words == 0:
                raise UserError(f"{self.label}: empty vocabulary: no training word occurs {hp.min_freq}+ times")
            self._vocab = vocab
        return self._vocab

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def _pad(self, encoded: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        return pad_captions(encoded, multiple=self.hparams.get("pad_to_multiple"))

    def encode_pairs(self, tokens: Sequence[Sequence[Sequence[str]]]):
        """Training pairs: every caption of 1..max_len words (never cut mid-sentence) of
        `tokens[image][caption]` -> (captions int64 [P, T], lengths int64 [P], each pair's indices)."""
        max_len = self.hparams.max_len
        pairs = [(i, j) for i, image in enumerate(tokens) for j, caption in enumerate(image)
                 if 0 < len(caption) <= max_len]
        if not pairs:
            raise UserError(f"{self.label}: no training caption has 1..max_len={max_len} words")
        if self.hparams.get("vocab"):  # a release's words: say what this data loses to <unk>
            words = [w for i, j in pairs for w in tokens[i][j]]
            unknown = [w for w in words if w not in self.vocab]
            log.warning("%s: %d of %d training caption words (%d distinct) are not in the given vocabulary "
                        "of %d words: they read as <unk>", self.label, len(unknown), len(words),
                        len(set(unknown)), self.vocab.num_words)
        return *self._pad([self.vocab.encode_caption(tokens[i][j]) for i, j in pairs]), pairs

    def encode_first(self, tokens: Sequence[Sequence[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Each evaluation image's first reference, cut to max_len words -> (captions, lengths)."""
        return self._pad([self.vocab.encode_caption(t, self.hparams.max_len) for t in tokens])

    def loader(self, split: str) -> DataLoader:
        if split not in self.datasets:
            raise UserError(f"{self.label}: the '{split}' split is not set up (setup() builds train, val "
                            "and test where their data is given)")
        if split == "train":
            return self.bucketed_loader(self.datasets["train"], batch_identity)
        return self.plain_loader(self.datasets[split], collate_fn=batch_identity)
