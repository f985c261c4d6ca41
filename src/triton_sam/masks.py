"""Mask post-processing: low-resolution decoder logits back to the original image size."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_ROWS_PER_TASK = 256
_POOL = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="triton-sam-upsample")


def _source_index(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Neighbour indices and weight of the upper neighbour, as `F.interpolate(align_corners=False)`."""
    scale = np.float32(n_in / n_out)
    src = (np.arange(n_out, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
    src = np.maximum(src, 0)
    lower = np.minimum(src.astype(np.int64), n_in - 1)
    upper = np.minimum(lower + 1, n_in - 1)
    return lower, upper, (src - lower).astype(np.float32)


def upsample_logits(logits: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Bilinearly resize the last two axes of `logits` to `size` (H, W), matching PyTorch.

    Columns are interpolated first on the small array; output rows are then filled in blocks
    on a thread pool (numpy releases the GIL), since this runs on every prediction.
    """
    height, width = size
    y0, y1, wy = _source_index(logits.shape[-2], height)
    x0, x1, wx = _source_index(logits.shape[-1], width)
    cols = logits[..., x0] * (1 - wx) + logits[..., x1] * wx
    steps = np.diff(cols, axis=-2, append=cols[..., -1:, :])  # row r+1 minus row r
    out = np.empty((*logits.shape[:-2], height, width), np.float32)

    def fill(start: int) -> None:
        rows = slice(start, start + _ROWS_PER_TASK)
        block = out[..., rows, :]
        np.take(cols, y0[rows], axis=-2, out=block)
        # y1 is y0 + 1 except at the clamped last row, where the weight's step is zero anyway.
        block += np.take(steps, y0[rows], axis=-2) * np.where(y1[rows] > y0[rows], wy[rows], 0)[:, None]

    list(_POOL.map(fill, range(0, height, _ROWS_PER_TASK)))
    return out
