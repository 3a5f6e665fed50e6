"""Length-bucketed batching for caption data (the authors' length-bucketed minibatches, Xu et al. 2015)."""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
from torch.utils.data import BatchSampler, Sampler

from zoo.guards.errors import UserError


class BucketBatchSampler(BatchSampler):
    """Batches of similar caption length: `sampler`'s indices (Lightning swaps in a DistributedSampler
    under DDP) in pools of `batch_size * pool_batches`, each sorted by length, cut into batches, and
    its batches shuffled: little padding, a random epoch order."""

    def __init__(self, sampler: Sampler[int] | Iterable[int], lengths: Sequence[int] | np.ndarray,
                 batch_size: int, drop_last: bool = False, pool_batches: int = 50, seed: int = 0):
        if batch_size < 1:
            raise UserError(f"batch_size must be >= 1, got {batch_size}")
        super().__init__(sampler, batch_size, drop_last)
        self.lengths = np.asarray(lengths)
        self.pool_batches = max(1, int(pool_batches))
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        rng = np.random.default_rng([self.seed, self.epoch])
        self.epoch += 1  # a new batch order each epoch even when nobody calls set_epoch
        order = np.fromiter(iter(self.sampler), dtype=np.int64)
        pool = self.batch_size * self.pool_batches
        for start in range(0, len(order), pool):
            chunk = order[start:start + pool]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches = [chunk[i:i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
            if self.drop_last and len(batches[-1]) < self.batch_size:
                batches.pop()
            for b in rng.permutation(len(batches)):
                yield batches[b].tolist()

    def __len__(self) -> int:
        n = len(self.sampler)
        if not self.drop_last:
            return -(-n // self.batch_size)
        # drop_last drops at most one short batch per pool
        pool = self.batch_size * self.pool_batches
        full, rest = divmod(n, pool)
        return full * self.pool_batches + rest // self.batch_size
