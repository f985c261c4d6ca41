"""Mask post-processing: low-resolution decoder logits back to the original image size.

Bilinear resizing is separable and linear, so each axis is a list of taps (source indices and
weights per output position). Two resizings in a row (SAM1: to the padded input, crop, to the
image) compose into one set of taps per axis, applied once at the image's size. SAM3's predictor
also fills small holes at low resolution first.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from skimage.measure import label

from .registry import STRETCH, ModelSpec

_ROWS_PER_TASK = 256
_POOL = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="triton-sam-upsample")

Taps = tuple[np.ndarray, np.ndarray]  # source indices int64 [K, n_out], weights float32 [K, n_out]


def bilinear_taps(n_in: int, n_out: int) -> Taps:
    """Taps of `F.interpolate(mode="bilinear", align_corners=False)` along one axis."""
    scale = np.float32(n_in / n_out)
    src = np.maximum((np.arange(n_out, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5), 0)
    lower = np.minimum(src.astype(np.int64), n_in - 1)
    fraction = (src - lower).astype(np.float32)
    return np.stack([lower, np.minimum(lower + 1, n_in - 1)]), np.stack([1 - fraction, fraction])


def compose_taps(first: Taps, then: Taps) -> Taps:
    """Taps of resampling with `first`, then resampling that result with `then`."""
    (first_index, first_weight), (then_index, then_weight) = first, then
    index = first_index[:, then_index]  # [K1, K2, n_out]
    weight = first_weight[:, then_index] * then_weight[None]
    return index.reshape(-1, index.shape[-1]), weight.reshape(-1, weight.shape[-1])


def resample(logits: np.ndarray, rows: Taps, cols: Taps) -> np.ndarray:
    """Apply taps to the last two axes of `logits`.

    Columns are resampled first on the small array; output rows are then filled in blocks on a
    thread pool (numpy releases the GIL), since this runs on every prediction.
    """
    (col_index, col_weight), (row_index, row_weight) = cols, rows
    by_cols = sum(logits[..., index] * weight for index, weight in zip(col_index, col_weight))
    out = np.empty((*logits.shape[:-2], row_index.shape[1], col_index.shape[1]), np.float32)

    def fill(start: int) -> None:
        block = slice(start, start + _ROWS_PER_TASK)
        target = out[..., block, :]
        np.multiply(np.take(by_cols, row_index[0, block], axis=-2), row_weight[0, block, None], out=target)
        for index, weight in zip(row_index[1:], row_weight[1:]):
            target += np.take(by_cols, index[block], axis=-2) * weight[block, None]

    list(_POOL.map(fill, range(0, out.shape[-2], _ROWS_PER_TASK)))
    return out


def upsample_logits(logits: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Bilinearly resize the last two axes of `logits` to `size` (H, W), matching PyTorch."""
    return resample(logits, bilinear_taps(logits.shape[-2], size[0]), bilinear_taps(logits.shape[-1], size[1]))


def fill_holes(low_res: np.ndarray, max_area: int, threshold: float = 0.0) -> np.ndarray:
    """`low_res` with each background region (logits <= `threshold`, 8-connected) of at most
    `max_area` pixels raised to `threshold` + 10, as SAM2/SAM3's `postprocess_masks` does."""
    filled = np.array(low_res, dtype=np.float32, copy=True)
    for mask in filled.reshape(-1, *filled.shape[-2:]):
        regions = label(mask <= threshold, connectivity=2)
        small = np.bincount(regions.ravel()) <= max_area
        small[0] = False  # label 0 is the foreground
        mask[small[regions]] = threshold + 10.0
    return filled


def image_logits(low_res: np.ndarray, image_hw: tuple[int, int], spec: ModelSpec, threshold: float = 0.0) -> np.ndarray:
    """Decoder logits at the image's size, as the model's official predictor computes them:
    straight from low resolution (SAM2, SAM3 after filling holes), or to the padded encoder input,
    cropped to the image's part of it and resized to the image (SAM1), in one pass. `threshold`
    is the mask threshold, which tells holes from the mask."""
    if spec.fill_hole_area:
        low_res = fill_holes(low_res, spec.fill_hole_area, threshold)
    if spec.resize == STRETCH:
        return upsample_logits(low_res, image_hw)
    taps = []
    for n_low, n_input, n_image in zip(low_res.shape[-2:], spec.input_hw(image_hw), image_hw):
        index, weight = bilinear_taps(n_low, spec.input_size)
        taps.append(compose_taps((index[:, :n_input], weight[:, :n_input]), bilinear_taps(n_input, n_image)))
    return resample(low_res, *taps)
