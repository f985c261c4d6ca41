"""The detector's per-query outputs to instances, as `Sam3Processor._forward_grounding` post-processes them."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Detections(NamedTuple):
    """The detector's outputs for one image (contract.DETECTOR_OUTPUTS), before any threshold."""

    boxes: np.ndarray  # float32 [1, Q, 4]: cx, cy, w, h in [0, 1]
    logits: np.ndarray  # float32 [1, Q]
    masks: np.ndarray  # float32 [1, Q, 288, 288] logits
    presence: np.ndarray  # float32 [1, 1]


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def scores(detections: Detections) -> np.ndarray:
    """Each query's score [Q]: sigmoid(logit) * sigmoid(presence)."""
    return sigmoid(detections.logits[0]) * sigmoid(detections.presence[0, 0])


def instances(detections: Detections, threshold: float, image_hw: tuple[int, int]) -> dict[str, np.ndarray]:
    """The queries scoring above `threshold` as `Sam3Processor`'s state keys: "scores" [N], "boxes"
    [N, 4] (x0, y0, x1, y1 in pixels), "masks_logits" (sigmoid of the mask logits resized bilinearly
    to the image, [N, 1, H, W]) and "masks" (those above 0.5)."""
    score = scores(detections)
    keep = score > threshold
    cx, cy, w, h = np.moveaxis(detections.boxes[0, keep], -1, 0)
    height, width = image_hw
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1) * np.array([width, height, width, height])
    probabilities = sigmoid(resize_bilinear(detections.masks[0, keep], image_hw))[:, None]
    return {"scores": score[keep], "boxes": boxes.astype(np.float32), "masks_logits": probabilities, "masks": probabilities > 0.5}


def resize_bilinear(maps: np.ndarray, size_hw: tuple[int, int]) -> np.ndarray:
    """[N, h, w] -> [N, H, W] as torch's `interpolate(mode="bilinear", align_corners=False)` (no antialias)."""
    rows, columns = (_weights(out, size) for out, size in zip(size_hw, maps.shape[1:], strict=True))
    return np.einsum("yh,nhw,xw->nyx", rows, maps, columns, optimize=True).astype(np.float32)


def _weights(out_size: int, in_size: int) -> np.ndarray:
    """[out, in] linear interpolation weights with half-pixel centres, sources clamped to the edges."""
    scale = np.float32(in_size / out_size)  # in float32, as torch computes the sources (else ~1e-4 off)
    source = np.maximum((np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5), 0)
    low = np.minimum(np.floor(source).astype(int), in_size - 1)
    high = np.minimum(low + 1, in_size - 1)
    fraction = source - low
    weights = np.zeros((out_size, in_size))
    np.add.at(weights, (np.arange(out_size), low), 1 - fraction)
    np.add.at(weights, (np.arange(out_size), high), fraction)
    return weights


def label_image(masks: np.ndarray, scores: np.ndarray, labelled: np.ndarray | None = None, covered: float = 0.5) -> np.ndarray:
    """Instances (`masks` bool [N, 1, H, W] or [N, H, W]) as one uint16 label image, ids 1..N from
    the best score down, the better on top where they overlap. With `labelled` (bool H x W: pixels
    that have a label already) an instance of which more than `covered` is labelled is left out
    (found again, not new) and the others take only unlabelled pixels: labels are never painted over."""
    masks = masks.reshape(len(masks), *masks.shape[-2:])
    labels = np.zeros(masks.shape[1:], np.uint16)
    for rank, instance in reversed(list(enumerate(np.argsort(-scores, kind="stable"), start=1))):
        mask = masks[instance]
        if labelled is not None:
            if (mask & labelled).sum() > covered * max(mask.sum(), 1):
                continue
            mask = mask & ~labelled
        labels[mask] = rank
    return labels
