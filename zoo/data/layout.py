"""Where items go on a canvas: non-overlapping square items, uniform over the valid layouts.
Shared by the captioning scenes, the backbone's item canvases and Fashion-MNIST's two_items60."""
from __future__ import annotations

import numpy as np

from zoo.guards.errors import UserError

CANDIDATES = 64  # layouts tried at once per scene in the vectorised rejection sampler
MAX_ROUNDS = 200  # x CANDIDATES tries per scene; a feasible layout is found long before


def place_items(rng: np.random.Generator, sizes: np.ndarray, n_items: np.ndarray, canvas: int,
           gap: int) -> np.ndarray:
    """Top-left corners [N, K, 2] (x, y) of non-overlapping square items, uniform over valid
    layouts (rejection sampling, CANDIDATES layouts per scene per round, all scenes at once)."""
    n, k = sizes.shape
    corners = np.zeros((n, k, 2), dtype=np.int64)
    pending = np.arange(n)
    active = np.arange(k)[None, :] < n_items[:, None]  # [N, K]
    for _ in range(MAX_ROUNDS):
        if len(pending) == 0:
            return corners
        s = sizes[pending]  # [M, K]
        high = (canvas - s + 1)[:, None, :, None]  # [M, 1, K, 1]
        cand = (rng.random((len(pending), CANDIDATES, k, 2)) * high).astype(np.int64)  # [M, C, K, 2]
        lo, hi = cand, cand + s[:, None, :, None] + gap
        # items i, j are apart when one ends (plus the gap) before the other starts on some axis
        apart = ((hi[:, :, :, None] <= lo[:, :, None, :]) | (hi[:, :, None, :] <= lo[:, :, :, None])).any(-1)
        both = active[pending][:, None, :, None] & active[pending][:, None, None, :]
        clash = both & ~apart & ~np.eye(k, dtype=bool)
        ok = ~clash.any((-1, -2))  # [M, C]
        found = ok.any(1)
        corners[pending[found]] = cand[found, ok.argmax(1)[found]]  # each scene's first layout that fits
        pending = pending[~found]
    raise UserError(f"cannot place {k} items of sizes {sorted(set(sizes.ravel().tolist()))} on a "
                    f"{canvas}x{canvas} canvas without overlap; use a larger canvas or smaller items")
