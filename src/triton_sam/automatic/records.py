"""The masks an automatic run finds, kept small (each as its bounding box's pixels), and the records
the official generators return: the mask, its area, box, scores, point and crop."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from skimage.measure import label

from ..errors import InvalidInputError
from .geometry import box_nms, mask_box

BINARY_MASK, UNCOMPRESSED_RLE, COCO_RLE = "binary_mask", "uncompressed_rle", "coco_rle"
OUTPUT_MODES = (BINARY_MASK, UNCOMPRESSED_RLE, COCO_RLE)


@dataclass(frozen=True)
class FoundMask:
    """One mask in image coordinates: `pixels` covers `box` (x0, y0, x1, y1, inclusive)."""

    box: tuple[int, int, int, int]
    pixels: np.ndarray  # bool [y1 - y0 + 1, x1 - x0 + 1]
    predicted_iou: float
    stability_score: float
    point: tuple[float, float]  # (x, y) of the prompt that found it
    crop_box: tuple[int, int, int, int]  # (x0, y0, x1, y1) of the crop it was found in

    @classmethod
    def from_mask(cls, mask: np.ndarray, offset: tuple[int, int], **fields) -> FoundMask:
        """Keep `mask`'s bounding box; `offset` (x, y) places `mask` in the image."""
        return cls(**_pixels_of(mask, offset), **fields)

    @property
    def area(self) -> int:
        return int(np.count_nonzero(self.pixels))

    def full(self, image_hw: tuple[int, int]) -> np.ndarray:
        """The mask as a bool array of the image's size."""
        mask = np.zeros(image_hw, bool)
        x0, y0, x1, y1 = self.box
        mask[y0 : y1 + 1, x0 : x1 + 1] = self.pixels
        return mask


def nms(masks: list[FoundMask], scores: np.ndarray, iou_threshold: float) -> list[FoundMask]:
    """The masks that survive box NMS on `scores`, best first (as the official generators order them)."""
    if not masks:
        return []
    boxes = np.array([m.box for m in masks], np.float32)
    return [masks[i] for i in box_nms(boxes, scores, iou_threshold)]


def remove_small_regions(mask: np.ndarray, max_area: float, holes: bool) -> tuple[np.ndarray, bool]:
    """`mask` with its holes (or islands) under `max_area` pixels removed (8-connected), and whether
    anything changed; islands keep the largest region if all are small. As `sam2.utils.amg`."""
    regions = label(mask ^ holes, connectivity=2)
    sizes = np.bincount(regions.ravel())[1:]
    small = np.flatnonzero(sizes < max_area) + 1
    if small.size == 0:
        return mask, False
    if holes:
        fill = np.concatenate([[0], small])
    else:
        fill = np.setdiff1d(np.arange(1, len(sizes) + 1), small)
        if fill.size == 0:
            fill = np.array([np.argmax(sizes) + 1])
    return np.isin(regions, fill), True


def clean_small_regions(
    masks: list[FoundMask], image_hw: tuple[int, int], min_area: int, nms_threshold: float
) -> list[FoundMask]:
    """SAM1's `postprocess_small_regions`: fill small holes, drop small islands, then NMS again with
    the unchanged masks preferred. Each mask is cleaned within its box and a one-pixel border
    standing for the image around it (large planes never become whole-plane arrays)."""
    cleaned, scores = [], []
    for found in masks:
        mask, origin = _with_border(found, image_hw)
        mask, filled = remove_small_regions(mask, min_area, holes=True)
        mask, dropped = remove_small_regions(mask, min_area, holes=False)
        changed = filled or dropped
        cleaned.append(replace(found, **_pixels_of(mask, origin)) if changed else found)
        scores.append(0.0 if changed else 1.0)
    return nms(cleaned, np.asarray(scores, np.float32), nms_threshold)


def _with_border(found: FoundMask, image_hw: tuple[int, int]) -> tuple[np.ndarray, tuple[int, int]]:
    """The mask's pixels with a background border on each side where the image goes on, and the
    (x, y) of its first pixel."""
    x0, y0, x1, y1 = found.box
    height, width = image_hw
    top, left, bottom, right = int(y0 > 0), int(x0 > 0), int(y1 < height - 1), int(x1 < width - 1)
    return np.pad(found.pixels, ((top, bottom), (left, right))), (x0 - left, y0 - top)


def _pixels_of(mask: np.ndarray, origin: tuple[int, int]) -> dict:
    x0, y0, x1, y1 = mask_box(mask)
    dx, dy = origin
    return {"box": (x0 + dx, y0 + dy, x1 + dx, y1 + dy), "pixels": mask[y0 : y1 + 1, x0 : x1 + 1].copy()}


def rle_encode(mask: np.ndarray) -> dict[str, Any]:
    """COCO's uncompressed RLE: run lengths over the mask in column-major order, zeros first."""
    height, width = mask.shape
    flat = np.asarray(mask, bool).ravel(order="F")
    changes = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    bounds = np.concatenate([[0], changes, [flat.size]])
    counts = np.diff(bounds).tolist()
    return {"size": [height, width], "counts": counts if not flat[0] else [0, *counts]}


def rle_decode(rle: dict[str, Any]) -> np.ndarray:
    """The mask of an uncompressed RLE."""
    height, width = rle["size"]
    values = np.arange(len(rle["counts"])) % 2 == 1
    return np.repeat(values, rle["counts"]).reshape(width, height).T


def _segmentation(mask: np.ndarray, output_mode: str):
    if output_mode == BINARY_MASK:
        return mask
    rle = rle_encode(mask)
    if output_mode == UNCOMPRESSED_RLE:
        return rle
    from pycocotools import mask as coco_mask

    encoded = coco_mask.frPyObjects(rle, *rle["size"])
    encoded["counts"] = encoded["counts"].decode("utf-8")
    return encoded


def check_output_mode(output_mode: str) -> None:
    if output_mode not in OUTPUT_MODES:
        raise InvalidInputError(f"output_mode must be one of {', '.join(OUTPUT_MODES)}, got {output_mode!r}.")
    if output_mode == COCO_RLE:
        try:
            import pycocotools  # noqa: F401
        except ImportError as error:
            raise InvalidInputError("output_mode='coco_rle' needs pycocotools (pip install pycocotools).") from error


def _xywh(box: tuple[int, int, int, int]) -> list[int]:
    x0, y0, x1, y1 = box
    return [x0, y0, x1 - x0, y1 - y0]


def to_record(found: FoundMask, image_hw: tuple[int, int], output_mode: str) -> dict[str, Any]:
    """The official generators' record of one mask (boxes as XYWH, as theirs)."""
    return {
        "segmentation": _segmentation(found.full(image_hw), output_mode),
        "area": found.area,
        "bbox": _xywh(found.box),
        "predicted_iou": found.predicted_iou,
        "point_coords": [list(found.point)],
        "stability_score": found.stability_score,
        "crop_box": _xywh(found.crop_box),
    }


def label_image(masks: list[FoundMask], region_hw: tuple[int, int], origin: tuple[int, int] = (0, 0)) -> np.ndarray:
    """One label image of the masks over a region of `region_hw` whose first pixel is `origin`
    (x, y) of the image: painted largest first, so that smaller objects inside larger ones stay
    visible; ids 1..n in painting order, none left for a mask painted over entirely."""
    labels = np.zeros(region_hw, np.uint32)
    dx, dy = origin
    for object_id, found in enumerate(sorted(masks, key=lambda m: m.area, reverse=True), 1):
        x0, y0, x1, y1 = found.box
        labels[y0 - dy : y1 + 1 - dy, x0 - dx : x1 + 1 - dx][found.pixels] = object_id
    present = np.unique(labels)
    lookup = np.zeros(int(present[-1]) + 1, np.uint32)
    lookup[present] = np.arange(len(present), dtype=np.uint32)
    return lookup[labels]
