"""Where the automatic generator prompts and how it compares masks: point grids, crop boxes, mask
boxes and box non-maximum suppression, computed as `sam2.utils.amg` and torchvision compute them."""

from __future__ import annotations

import math
from itertools import product

import numpy as np

EDGE_TOLERANCE_PX = 20.0  # a box this close to a crop's inner edge was cut by the crop


def point_grid(n_per_side: int) -> np.ndarray:
    """n x n points (x, y) evenly spread over [0, 1]^2, half a step from the borders; row by row."""
    offset = 1 / (2 * n_per_side)
    side = np.linspace(offset, 1 - offset, n_per_side)
    xs, ys = np.meshgrid(side, side)
    return np.stack([xs, ys], axis=-1).reshape(-1, 2)


def layer_point_grids(n_per_side: int, n_layers: int, downscale: int) -> list[np.ndarray]:
    """One grid per crop layer, `downscale` times sparser a side each layer down."""
    return [point_grid(int(n_per_side / downscale**layer)) for layer in range(n_layers + 1)]


def crop_boxes(image_hw: tuple[int, int], n_layers: int, overlap_ratio: float) -> list[tuple[tuple[int, int, int, int], int]]:
    """(x0, y0, x1, y1) crops and their layer: the whole image, then 2^k x 2^k overlapping crops in layer k."""
    height, width = image_hw
    crops = [((0, 0, width, height), 0)]
    for layer in range(1, n_layers + 1):
        per_side = 2**layer
        overlap = int(overlap_ratio * min(height, width) * (2 / per_side))
        crop_w = math.ceil((overlap * (per_side - 1) + width) / per_side)
        crop_h = math.ceil((overlap * (per_side - 1) + height) / per_side)
        x0s = [int((crop_w - overlap) * i) for i in range(per_side)]
        y0s = [int((crop_h - overlap) * i) for i in range(per_side)]
        crops += [((x0, y0, min(x0 + crop_w, width), min(y0 + crop_h, height)), layer) for x0, y0 in product(x0s, y0s)]
    return crops


def mask_box(mask: np.ndarray) -> tuple[int, int, int, int]:
    """(x0, y0, x1, y1) of a mask's pixels, inclusive; (0, 0, 0, 0) for an empty mask."""
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    if rows.size == 0:
        return (0, 0, 0, 0)
    return (int(cols[0]), int(rows[0]), int(cols[-1]), int(rows[-1]))


def near_crop_edge(boxes: np.ndarray, crop: tuple[int, int, int, int], image_box: tuple[int, int, int, int]) -> np.ndarray:
    """Which boxes (image coordinates) touch an edge of `crop` that is not an edge of the image."""
    boxes = boxes.astype(np.float32)
    near_crop = np.abs(boxes - np.asarray(crop, np.float32)) <= EDGE_TOLERANCE_PX
    near_image = np.abs(boxes - np.asarray(image_box, np.float32)) <= EDGE_TOLERANCE_PX
    return (near_crop & ~near_image).any(axis=1)


def box_area(boxes: np.ndarray) -> np.ndarray:
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def box_nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Indices of the boxes kept, best score first: a box goes when its IoU with a better kept box
    exceeds `iou_threshold` (torchvision's `nms`; equal scores keep their order)."""
    boxes = boxes.astype(np.float32)
    order = np.argsort(-np.asarray(scores), kind="stable")
    areas = box_area(boxes)
    suppressed = np.zeros(len(boxes), bool)
    keep = []
    for position, i in enumerate(order):
        if suppressed[i]:
            continue
        keep.append(i)
        rest = order[position + 1 :]
        width = np.clip(np.minimum(boxes[i, 2], boxes[rest, 2]) - np.maximum(boxes[i, 0], boxes[rest, 0]), 0, None)
        height = np.clip(np.minimum(boxes[i, 3], boxes[rest, 3]) - np.maximum(boxes[i, 1], boxes[rest, 1]), 0, None)
        inter = width * height
        with np.errstate(invalid="ignore", divide="ignore"):
            iou = inter / (areas[i] + areas[rest] - inter)
        suppressed[rest[iou > np.float64(iou_threshold)]] = True  # float32 IoU vs the threshold in double, as torchvision
    return np.asarray(keep, dtype=np.int64)
