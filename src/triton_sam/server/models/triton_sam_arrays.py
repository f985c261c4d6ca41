"""The array computations the client and the session model must do alike: content and logits
signatures (the keys each side names features and kept logits by), the crop of mask logits a
masks-only decode answers and its undoing, the best multimask candidate, and the bilinear resize
of instance-segmentation maps (done on whichever side the maps are smaller).

One file for both sides: triton-sam imports it from here, and the export writes it next to the
session model's `model.py`. numpy only.
"""

import hashlib

import numpy as np


def content_signature(image: np.ndarray, model_id: str) -> str:
    """Hash of one encoder input for one model (hex): the handle of its features on a server, and
    their key in a feature cache; equal images share one entry."""
    digest = hashlib.blake2b(np.ascontiguousarray(image).tobytes(), digest_size=16)
    digest.update(f"{image.shape}{model_id}".encode())  # SAM1 inputs vary in shape
    return digest.hexdigest()


def logits_signature(logits: np.ndarray) -> str:
    """Signature of one mask's low-res logits ([S, S] float32): their key as a later mask input."""
    return hashlib.blake2b(np.ascontiguousarray(logits, np.float32).tobytes(), digest_size=16).hexdigest()


def best_candidate(masks: np.ndarray, scores: np.ndarray) -> tuple:
    """Each row's multimask candidate (of `masks` [B, C, ...] and `scores` [B, C]) with the highest
    predicted IoU (the first of equals, as `torch.argmax`), as one-mask arrays [B, 1, ...], [B, 1]."""
    rows, best = np.arange(len(scores)), np.argmax(scores, axis=1)
    return masks[rows, best][:, None], scores[rows, best][:, None]


def crop_box(masks: list, thresholds: np.ndarray, margin: int) -> tuple:
    """The box (y0, x0, y1, x1) around the samples of `masks` (arrays [B, C, S, S]) above each
    row's threshold (`thresholds` [B]) in any row and candidate, grown by `margin` on every side;
    (0, 0, 1, 1) if none is above."""
    above = np.zeros(masks[0].shape[-2:], bool)
    for logits in masks:
        above |= (logits > thresholds.reshape(-1, 1, 1, 1)).any(axis=(0, 1))
    rows, cols = np.flatnonzero(above.any(axis=1)), np.flatnonzero(above.any(axis=0))
    if not rows.size:
        return 0, 0, 1, 1
    height, width = above.shape
    y0, y1 = max(rows[0] - margin, 0), min(rows[-1] + 1 + margin, height)
    x0, x1 = max(cols[0] - margin, 0), min(cols[-1] + 1 + margin, width)
    return int(y0), int(x0), int(y1), int(x1)


def uncropped(crop: np.ndarray, box: np.ndarray, threshold: float, size: int) -> np.ndarray:
    """Low-res logits [B, C, size, size] from a crop [B, C, h, w] in `box` ([B, 4] or [4]: y0, x0,
    y1, x1): the crop in its box, below `threshold` elsewhere."""
    logits = np.full((*crop.shape[:2], size, size), np.float32(threshold) - 1, np.float32)
    y0, x0, y1, x1 = (int(v) for v in np.reshape(box, (-1, 4))[0])
    logits[:, :, y0:y1, x0:x1] = crop
    return logits


def bilinear_taps(n_out: int, n_in: int, start: int = 0, stop: "int | None" = None) -> tuple:
    """For output samples `start:stop` of a bilinear resize of n_in samples to n_out: the two
    source samples each reads and the second's weight (float64), as PyTorch's
    `interpolate(mode="bilinear", align_corners=False)` (half-pixel centres, clamped at the edges)."""
    stop = n_out if stop is None else stop
    source = np.clip((np.arange(start, stop) + 0.5) * (n_in / n_out) - 0.5, 0, n_in - 1)
    first = np.floor(source).astype(np.int64)
    return first, np.minimum(first + 1, n_in - 1), source - first


def resized(maps: np.ndarray, out_hw: tuple) -> np.ndarray:
    """`maps` [..., h, w] float32 resized bilinearly to [..., *out_hw] (`bilinear_taps`), rows
    then columns: four samples an output pixel, never a dense matrix."""
    (r0, r1, dy), (c0, c1, dx) = (bilinear_taps(int(n), m) for n, m in zip(out_hw, maps.shape[-2:]))
    wy, wx = (np.stack([1 - d, d]).astype(np.float32) for d in (dy, dx))
    rows = maps[..., r0, :] * wy[0][:, None] + maps[..., r1, :] * wy[1][:, None]
    return rows[..., c0] * wx[0] + rows[..., c1] * wx[1]
