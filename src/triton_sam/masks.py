"""Mask post-processing: low-resolution decoder logits back to the original image size."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .registry import LONGEST_SIDE, ModelSpec

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


def upsample_logits(logits: np.ndarray, size: tuple[int, int], crop: tuple[int, int] | None = None) -> np.ndarray:
    """Bilinearly resize the last two axes of `logits` to `size` (H, W), matching PyTorch; with
    `crop` (h, w) only the top-left h x w of that result is computed and returned.

    Columns are interpolated first on the small array; output rows are then filled in blocks
    on a thread pool (numpy releases the GIL), since this runs on every prediction.
    """
    y0, wy = _source_index(logits.shape[-2], size[0])
    x0, wx = _source_index(logits.shape[-1], size[1])
    height, width = crop or size
    y0, wy, x0, wx = y0[:height], wy[:height], x0[:width], wx[:width]
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


def image_logits(low_res: np.ndarray, image_hw: tuple[int, int], spec: ModelSpec) -> np.ndarray:
    """Decoder logits at the image's size, as the model's official predictor computes them:
    straight from low resolution (SAM2), or through the padded encoder input, cropped (SAM1)."""
    if spec.resize == LONGEST_SIDE:
        padded = (spec.input_size, spec.input_size)
        return upsample_logits(upsample_logits(low_res, padded, crop=spec.input_hw(image_hw)), image_hw)
    return upsample_logits(low_res, image_hw)
