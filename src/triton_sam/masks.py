"""Mask post-processing: low-resolution decoder logits back to the original image size."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_ROWS_PER_TASK = 256
_POOL = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="triton-sam-upsample")


def _source_index(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Lower neighbour index and weight of the next one, as `F.interpolate(align_corners=False)`."""
    scale = np.float32(n_in / n_out)
    src = (np.arange(n_out, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
    src = np.maximum(src, 0)
    lower = np.minimum(src.astype(np.int64), n_in - 1)
    return lower, (src - lower).astype(np.float32)


def _steps(array: np.ndarray, axis: int) -> np.ndarray:
    """Difference to the next element along `axis`; zero at the last one (the clamped edge)."""
    return np.diff(array, axis=axis, append=np.take(array, [-1], axis=axis))


def upsample_logits(logits: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Bilinearly resize the last two axes of `logits` to `size` (H, W), matching PyTorch.

    Columns are interpolated first on the small array; output rows are then filled in blocks
    on a thread pool (numpy releases the GIL), since this runs on every prediction.
    """
    height, width = size
    y0, wy = _source_index(logits.shape[-2], height)
    x0, wx = _source_index(logits.shape[-1], width)
    cols = logits[..., x0] + _steps(logits, -1)[..., x0] * wx
    row_steps = _steps(cols, -2)
    out = np.empty((*logits.shape[:-2], height, width), np.float32)

    def fill(start: int) -> None:
        rows = slice(start, start + _ROWS_PER_TASK)
        block = out[..., rows, :]
        np.take(cols, y0[rows], axis=-2, out=block)
        block += np.take(row_steps, y0[rows], axis=-2) * wy[rows, None]

    list(_POOL.map(fill, range(0, height, _ROWS_PER_TASK)))
    return out
