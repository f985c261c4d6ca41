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
    source samples each reads and the second's weight, to the bit as PyTorch's CPU
    `interpolate(mode="bilinear", align_corners=False)` computes them (half-pixel centres, clamped
    at the edges): float32 scale and centres, the source a fused multiply-add (one rounding; in
    float64 the weights were ~2e-5 off torch's, in float32 without the fused rounding ~8e-6)."""
    stop = n_out if stop is None else stop
    scale, centres = np.float32(n_in) / np.float32(n_out), np.arange(start, stop, dtype=np.float32) + np.float32(0.5)
    source = np.maximum((np.float64(scale) * centres.astype(np.float64) - 0.5).astype(np.float32), 0)
    first = np.minimum(np.floor(source).astype(np.int64), n_in - 1)
    return first, np.minimum(first + 1, n_in - 1), np.clip(source - first, 0, 1).astype(np.float32)


def resized(maps: np.ndarray, out_hw: tuple) -> np.ndarray:
    """`maps` [..., h, w] float32 resized bilinearly to [..., *out_hw] (`bilinear_taps`), rows
    then columns: four samples an output pixel, never a dense matrix."""
    height, width = maps.shape[-2:]
    return resized_crop(maps, (0, 0, height, width), (height, width), out_hw)[1]


def resized_crop(crop: np.ndarray, box: tuple, in_hw: tuple, out_hw: tuple) -> tuple:
    """`crop` [..., y1 - y0, x1 - x0], the part in `box` (y0, x0, y1, x1) of maps of `in_hw`, resized
    as `resized` resizes the whole maps to `out_hw`, samples outside the box weighing 0: (the output
    rows and columns that read the box, (r0, c0, r1, c1); their values [..., r1 - r0, c1 - c0]).
    Equal, to the bit, to the whole maps' resize wherever an output pixel's four samples are in
    the box (the same products and sums in the same order)."""
    (r0, r1, *rows), (c0, c1, *columns) = (_taps_in(int(n), m, lo, hi) for n, m, lo, hi in zip(out_hw, in_hw, box[:2], box[2:]))
    first, second, w_first, w_second = rows
    along = crop[..., first, :] * w_first[:, None] + crop[..., second, :] * w_second[:, None]
    first, second, w_first, w_second = columns
    return (r0, c0, r1, c1), along[..., first] * w_first + along[..., second] * w_second


def _taps_in(n_out: int, n_in: int, lo: int, hi: int) -> tuple:
    """The output samples start:stop of a bilinear n_in -> n_out resize that read source samples
    lo:hi, and for each its two samples counted from lo and their weights (0 for one outside)."""
    first, second, weight = bilinear_taps(n_out, n_in)
    reads = np.flatnonzero(((first >= lo) & (first < hi)) | ((second >= lo) & (second < hi)))
    if not reads.size:
        return 0, 0, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.float32)
    start, stop = int(reads[0]), int(reads[-1]) + 1
    first, second, weight = first[start:stop], second[start:stop], weight[start:stop]
    w_first = np.where((first >= lo) & (first < hi), np.float32(1) - weight, np.float32(0))
    w_second = np.where((second >= lo) & (second < hi), weight, np.float32(0))
    return start, stop, np.clip(first - lo, 0, hi - lo - 1), np.clip(second - lo, 0, hi - lo - 1), w_first, w_second


def concept_scores(logits: np.ndarray, presence: np.ndarray) -> np.ndarray:
    """SAM3's detector queries' scores [Q] from their logits [1, Q] and the presence logit [1, 1]:
    sigmoid(logit) * sigmoid(presence), as `Sam3Processor` scores them."""
    return (_sigmoid(logits[0]) * _sigmoid(presence.reshape(-1)[0])).astype(np.float32)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def cropped_queries(masks: np.ndarray, keep: np.ndarray) -> tuple:
    """The mask logits ([Q, S, S]) of the queries `keep` ([Q] bool) says, each cropped to the box of
    its positive logits grown by 1 sample (a bilinear resize of it is then exact wherever the mask
    is on: `resized_crop`): (the queries int32 [K], their boxes (y0, x0, y1, x1) int32 [K, 4], the
    crops one after the other, row-major, float32 [M])."""
    queries = np.flatnonzero(keep).astype(np.int32)
    boxes = np.array([crop_box([masks[q][None, None]], np.zeros(1, np.float32), 1) for q in queries], np.int32).reshape(-1, 4)
    crops = [masks[q, y0:y1, x0:x1].reshape(-1) for q, (y0, x0, y1, x1) in zip(queries, boxes)]
    return queries, boxes, np.concatenate([np.zeros(0, np.float32), *crops]).astype(np.float32)


def concept_answer(boxes: np.ndarray, logits: np.ndarray, masks: np.ndarray, presence: np.ndarray, floor: float) -> tuple:
    """A concept request's answer (the contract's CONCEPT_OUTPUTS, in order) from the detector's
    outputs (its DETECTOR_OUTPUTS, in order): every query's box and logit and the presence logit as they are, and the mask logits
    ([1, Q, S, S]) of the queries scoring above `floor`, cropped (`cropped_queries`)."""
    queries, crop_boxes, crops = cropped_queries(masks[0], concept_scores(logits, presence) > floor)
    return boxes, logits, presence, queries[None], crop_boxes[None], crops[None]


def split_crops(boxes: np.ndarray, flat: np.ndarray) -> list:
    """The crops `cropped_queries` packed into `flat`, as arrays of their boxes' shapes."""
    sizes = [(int(y1 - y0), int(x1 - x0)) for y0, x0, y1, x1 in np.reshape(boxes, (-1, 4))]
    ends = np.cumsum([h * w for h, w in sizes], dtype=np.int64)
    if len(ends) and ends[-1] != flat.size:
        raise ValueError(f"{flat.size} mask logits sent for crops of {int(ends[-1])}")
    return [flat[end - h * w : end].reshape(h, w) for (h, w), end in zip(sizes, ends)]
