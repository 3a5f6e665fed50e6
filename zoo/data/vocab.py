"""Caption vocabulary, built from TRAINING captions only (Xu et al. 2015), and the one tokenizer
that training captions and the metrics' references share, so a word is spelled as it is scored.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence

import torch

from zoo.guards.errors import UserError

SPECIALS = ("<pad>", "<start>", "<end>", "<unk>")
PAD_ID, START_ID, END_ID, UNK_ID = 0, 1, 2, 3

_NON_WORD = re.compile(r"[^a-z0-9']+")


def tokenize(text: str) -> list[str]:
    """Lowercase, drop punctuation, split on whitespace: inner apostrophes survive ("man's"), hyphens
    separate ("t-shirt" -> ["t", "shirt"]), as coco-caption's PTBTokenizer mostly does."""
    words = _NON_WORD.sub(" ", str(text).lower()).split()
    return [w for w in (w.strip("'") for w in words) if w]


class Vocab:
    """Index <-> word map with the special tokens <pad>=0, <start>=1, <end>=2, <unk>=3."""

    def __init__(self, itos: Sequence[str]):
        itos = [str(w) for w in itos]
        if tuple(itos[:len(SPECIALS)]) != SPECIALS:
            raise UserError(f"vocabulary must start with the special tokens {list(SPECIALS)}, "
                            f"got {itos[:len(SPECIALS)]}")
        if len(set(itos)) != len(itos):
            dupes = sorted(w for w, c in Counter(itos).items() if c > 1)
            raise UserError(f"vocabulary has duplicate entries: {dupes[:5]}")
        self.itos: list[str] = itos
        self.stoi: dict[str, int] = {w: i for i, w in enumerate(itos)}

    @classmethod
    def build(cls, token_lists: Iterable[Sequence[str]], min_freq: int = 1,
              max_size: int | None = None) -> "Vocab":
        """Words seen `min_freq`+ times, most frequent first (ties alphabetical), at most `max_size`."""
        if min_freq < 1:
            raise UserError(f"min_freq must be >= 1, got {min_freq}")
        counts = Counter(word for tokens in token_lists for word in tokens)
        words = sorted((w for w, c in counts.items() if c >= min_freq and w not in SPECIALS),
                       key=lambda w: (-counts[w], w))
        if max_size is not None:
            words = words[:max_size]
        return cls(list(SPECIALS) + words)

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, word: str) -> bool:
        return word in self.stoi

    def __eq__(self, other) -> bool:
        return isinstance(other, Vocab) and self.itos == other.itos

    @property
    def num_words(self) -> int:
        """Entries that are not special tokens."""
        return len(self.itos) - len(SPECIALS)

    def encode(self, tokens: Sequence[str]) -> list[int]:
        """Word ids, no <start>/<end> added; unknown words become <unk>."""
        return [self.stoi.get(t, UNK_ID) for t in tokens]

    def encode_caption(self, tokens: Sequence[str], max_len: int | None = None) -> list[int]:
        """[<start>, w1 .. wn, <end>] with at most `max_len` words (cut if longer)."""
        return [START_ID, *self.encode(tokens[:max_len]), END_ID]

    def decode(self, ids) -> list[str]:
        """Words up to the first <end>; <pad>, <start>, <unk> dropped. Accepts a list or a 1-D tensor."""
        ids = [int(i) for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids)]
        ids = ids[:ids.index(END_ID)] if END_ID in ids else ids
        return [self.itos[i] for i in ids if len(SPECIALS) <= i < len(self.itos)]


def padded_length(longest: int, multiple: int | None, limit: int | None = None) -> int:
    """Columns of a caption batch: the longest, rounded up to a multiple of `multiple` (at most `limit`)."""
    width = -(-longest // multiple) * multiple if multiple else longest
    return width if limit is None or not multiple else min(width, limit)


def pad_captions(encoded: Sequence[Sequence[int]], pad_value: int = PAD_ID,
                 multiple: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoded captions -> (captions int64 [N, T] padded with `pad_value`, lengths int64 [N])."""
    lengths = torch.tensor([len(c) for c in encoded], dtype=torch.long)
    width = padded_length(int(lengths.max()) if len(encoded) else 0, multiple)
    out = torch.full((len(encoded), width), pad_value, dtype=torch.long)
    for row, ids in enumerate(encoded):  # once per dataset, at setup
        out[row, :len(ids)] = torch.as_tensor(ids, dtype=torch.long)
    return out, lengths
