"""Mask post-processing: low-resolution decoder logits back to the original image size."""

from __future__ import annotations

import numpy as np


def _source_index(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Neighbour indices and weight of the upper neighbour, as `F.interpolate(align_corners=False)`."""
    scale = np.float32(n_in / n_out)
    src = (np.arange(n_out, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
    src = np.maximum(src, 0)
    lower = np.minimum(src.astype(np.int64), n_in - 1)
    upper = np.minimum(lower + 1, n_in - 1)
    return lower, upper, (src - lower).astype(np.float32)


def upsample_logits(logits: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Bilinearly resize the last two axes of `logits` to `size` (H, W), matching PyTorch."""
    height, width = size
    y0, y1, wy = _source_index(logits.shape[-2], height)
    x0, x1, wx = _source_index(logits.shape[-1], width)
    # Columns first on the small array, then whole-row gathers, which are plain memory copies.
    cols = logits[..., x0] * (1 - wx) + logits[..., x1] * wx
    out = cols[..., y0, :]
    out *= (1 - wy)[:, None]
    upper = cols[..., y1, :]
    upper *= wy[:, None]
    out += upper
    return out
