"""A concept's instances on a large plane, found tile by tile (each tile at the model's native
resolution) and joined over the region the tiles cover.

Neighbouring tiles overlap (`tiles.TILE_OVERLAP`), so an instance cut by a tile's inner edge lies
whole in a neighbour: as SAM's automatic generator does with its crops, an instance whose box
touches an edge of its tile inside the region is left out, and of an instance two tiles both
hold whole, the better-scoring one is kept (box NMS across tiles).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..automatic.geometry import mask_box, near_crop_edge

TILES_NMS_IOU = 0.7  # SAM's crop_nms_thresh: boxes of two tiles' instances overlapping more are one instance
Crop = tuple[int, int, int, int]  # x0, y0, x1, y1 of the plane (a tile)
Region = tuple[int, int, int, int]  # rows y0:y1, columns x0:x1 of the plane


class Piece(NamedTuple):
    """One instance in plane coordinates: `mask` covers `box` (x0, y0, x1, y1, inclusive)."""

    box: tuple[int, int, int, int]
    mask: np.ndarray  # bool [y1 - y0 + 1, x1 - x0 + 1]
    score: float
    tile: int  # which tile found it


def tile_pieces(masks: np.ndarray, scores: np.ndarray, crop: Crop, region: Region, tile: int) -> list[Piece]:
    """The instances of the tile `crop` (`masks` bool [N, 1, h, w] or [N, h, w] over the tile, as
    `ConceptProcessor` gives them) in plane coordinates, less those cut by an edge of the tile
    inside `region` (a neighbour holds them whole)."""
    masks = masks.reshape(len(masks), *masks.shape[-2:])
    x0, y0 = crop[:2]
    y_start, x_start, y_stop, x_stop = region
    pieces = []
    for mask, score in zip(masks, scores, strict=True):
        if not mask.any():
            continue
        bx0, by0, bx1, by1 = mask_box(mask)
        box = (bx0 + x0, by0 + y0, bx1 + x0, by1 + y0)
        inner = (crop[0], crop[1], crop[2] - 1, crop[3] - 1)  # the tile's last pixels, as boxes are inclusive
        if near_crop_edge(np.array([box]), inner, (x_start, y_start, x_stop - 1, y_stop - 1))[0]:
            continue
        pieces.append(Piece(box, mask[by0 : by1 + 1, bx0 : bx1 + 1], float(score), tile))
    return pieces


def joined_labels(pieces: list[Piece], region: Region) -> np.ndarray:
    """One uint32 label image of `region` from the tiles' pieces, ids 1..N from the best score
    down, the better on top where they overlap; a piece whose box overlaps a better piece of
    another tile by more than TILES_NMS_IOU (IoU) is that instance again and is left out (a tile's
    own instances are all kept, as on a plane encoded whole)."""
    order = sorted(range(len(pieces)), key=lambda i: -pieces[i].score)
    boxes = np.array([p.box for p in pieces], np.float64).reshape(-1, 4)
    tiles = np.array([p.tile for p in pieces])
    kept: list[int] = []
    for index in order:
        others = [k for k in kept if tiles[k] != tiles[index]]
        if not others or _iou(boxes[index], boxes[others]).max() <= TILES_NMS_IOU:
            kept.append(index)
    y0, x0, y1, x1 = region
    labels = np.zeros((y1 - y0, x1 - x0), np.uint32)
    for rank, index in reversed(list(enumerate(kept, start=1))):
        (bx0, by0, bx1, by1), mask = pieces[index].box, pieces[index].mask
        labels[by0 - y0 : by1 + 1 - y0, bx0 - x0 : bx1 + 1 - x0][mask] = rank
    return labels


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of the inclusive pixel box `box` (x0, y0, x1, y1) with each of `boxes`."""
    width = np.clip(np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]) + 1, 0, None)
    height = np.clip(np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1]) + 1, 0, None)
    inter = width * height
    areas = (boxes[:, 2] - boxes[:, 0] + 1) * (boxes[:, 3] - boxes[:, 1] + 1)
    return inter / ((box[2] - box[0] + 1) * (box[3] - box[1] + 1) + areas - inter)
