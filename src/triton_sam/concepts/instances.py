"""The detector's per-query outputs to instances, as `Sam3Processor._forward_grounding` post-processes them.

Both engines hand the post-processing a `Found`: every query's box and score, and the mask logits
only of the queries scoring above a floor, each cropped to the box of its positive logits grown by
one sample (`triton_sam_arrays.cropped_queries`; a Triton server sends no more). Resizing such a
crop to the image with the samples outside it weighing 0 (`triton_sam_arrays.resized_crop`) gives
exactly the mask `Sam3Processor` gives: a bilinear output pixel reads 2 x 2 neighbouring samples; if
one is positive, all are within one sample of it, so in the crop, and the pixel's logit is computed
as from the whole map; if none is, its logit is <= 0 (off) from the whole map, and from the crop a
partial sum of those non-positive samples, or nothing (0 probability): off too. So "masks" are
exact, and "masks_logits" wherever the mask is on.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import contract
from ..server.models.triton_sam_arrays import concept_scores, resized_crop, split_crops

LOGITS_HW = (288, 288)  # the detector's mask logits (contract.QUERY_MASKS)


class Found(NamedTuple):
    """One detection as the post-processing needs it: valid for thresholds >= `floor`."""

    boxes: np.ndarray  # float32 [Q, 4]: every query's cx, cy, w, h in [0, 1]
    scores: np.ndarray  # float32 [Q]
    queries: np.ndarray  # int [K]: the queries scoring above `floor`, ascending
    crop_boxes: np.ndarray  # int [K, 4]: their crops' y0, x0, y1, x1 in the 288 x 288 logits
    crops: list  # K float32 arrays: their mask logits in those boxes
    floor: float


def found_answered(answer: dict[str, np.ndarray], floor: float) -> Found:
    """A `Found` from the session model's answer to a concept request (`contract.CONCEPT_OUTPUTS`)."""
    boxes = answer[contract.MASK_CROP_BOXES].reshape(-1, 4)
    scores = concept_scores(answer[contract.QUERY_LOGITS], answer[contract.PRESENCE_LOGIT])
    queries = answer[contract.CROPPED_QUERIES].reshape(-1)
    crops = split_crops(boxes, answer[contract.MASK_CROPS].reshape(-1))
    return Found(answer[contract.QUERY_BOXES].reshape(-1, 4), scores, queries, boxes, crops, floor)


def instances(found: Found, threshold: float, image_hw: tuple[int, int]) -> dict[str, np.ndarray]:
    """The queries scoring above `threshold` (>= `found.floor`) as `Sam3Processor`'s state keys:
    "scores" [N], "boxes" [N, 4] (x0, y0, x1, y1 in pixels), "masks_logits" (sigmoid of the mask
    logits resized bilinearly to the image, [N, 1, H, W]; 0 where no sample of the crop is read)
    and "masks" (those above 0.5)."""
    if threshold < found.floor:
        raise ValueError(f"threshold {threshold} is below the floor {found.floor} the masks were kept above")
    kept = [i for i, query in enumerate(found.queries) if found.scores[query] > threshold]
    queries = found.queries[kept]
    cx, cy, w, h = np.moveaxis(found.boxes[queries], -1, 0)
    height, width = image_hw
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1) * np.array([width, height, width, height])
    probabilities = np.zeros((len(kept), 1, height, width), np.float32)
    for row, i in enumerate(kept):
        (r0, c0, r1, c1), logits = resized_crop(found.crops[i], tuple(found.crop_boxes[i]), LOGITS_HW, image_hw)
        probabilities[row, 0, r0:r1, c0:c1] = 1 / (1 + np.exp(-logits))
    return {
        "scores": found.scores[queries],
        "boxes": boxes.astype(np.float32).reshape(-1, 4),
        "masks_logits": probabilities,
        "masks": probabilities > 0.5,
    }


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
            if labelled_already(mask, labelled, covered):
                continue
            mask = mask & ~labelled
        labels[mask] = rank
    return labels


def labelled_already(mask: np.ndarray, labelled: np.ndarray, covered: float = 0.5) -> bool:
    """Whether more than `covered` of instance `mask` (bool H x W) is `labelled` already: found
    again, not new (`label_image` leaves it out)."""
    return bool((mask & labelled).sum() > covered * max(mask.sum(), 1))
