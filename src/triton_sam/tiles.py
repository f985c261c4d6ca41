"""Large planes at native resolution: model-sized tiles with overlap, the tile that decodes a set
of prompts, and masks placed back on the plane.

Qt-free. A plane whose longer side is over `TILING_FACTOR` x the model's input is covered by tiles
of the model's input size (1024 px for SAM2.1), neighbours sharing `TILE_OVERLAP` pixels, the last
tile of a row or column flush with the plane's edge so that every tile is whole. Zoomed out, the
plane is tiled coarser: a tile with `step` s covers s times as many pixels a side and is encoded
from the plane reduced s times (a pyramid level, or its crop reduced by the encoder's own resize;
crops over 4x the input a side are first block-averaged while read, `image.read_window`),
so that the view needs few tiles and objects as large as the view fit one. All prompts of one
object are decoded with one tile: of the tiles that hold every point and the whole box, the one
whose nearest edge is farthest from them (the most context around the object). Prompts that no
tile holds (an object wider than a tile less its overlap) are refused with a message that says so.
A tile holds the points x0..x1, y0..y1, edges included, as an image of its size takes prompts
x 0..W, y 0..H (`prompts`); its context around them is measured as the model sees the tile (SAM
takes a point at x for the centre of pixel x: the tile's edges lie at x0 - 0.5 and x1 - 0.5).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .errors import InvalidInputError

TILE_OVERLAP = 256  # pixels shared by neighbouring tiles: an object this wide on a border lies whole in one
TILING_FACTOR = 2  # planes up to this many times the model's input are encoded whole, as before


@dataclass(frozen=True)
class Tile:
    """A window of the plane: rows y0:y1, columns x0:x1 (plane pixels), encoded from the plane
    reduced `step` times (1: native resolution)."""

    y0: int
    x0: int
    y1: int
    x1: int
    step: int = 1

    @property
    def shape(self) -> tuple[int, int]:
        return self.y1 - self.y0, self.x1 - self.x0

    @property
    def reduced_shape(self) -> tuple[int, int]:
        """(h, w) of the tile reduced `step` times: the size its masks are previewed at."""
        return -(-(self.y1 - self.y0) // self.step), -(-(self.x1 - self.x0) // self.step)

    @property
    def offset(self) -> tuple[int, int]:
        """(row, column) of the tile's first pixel on the plane."""
        return self.y0, self.x0

    @property
    def window(self) -> tuple[slice, slice]:
        """Index of the tile in a plane array: `plane[tile.window]`."""
        return slice(self.y0, self.y1), slice(self.x0, self.x1)

    def holds(self, xy: np.ndarray) -> bool:
        """Whether all the points `xy` (N x 2, (x, y)) lie on the tile: x0..x1, y0..y1, edges included."""
        x, y = xy[:, 0], xy[:, 1]
        return bool(np.all((x >= self.x0) & (x <= self.x1) & (y >= self.y0) & (y <= self.y1)))

    def margin(self, xy: np.ndarray) -> float:
        """The context around the points `xy` (N x 2, (x, y)): the distance of the nearest to an
        edge of the tile as the model sees it (at x0 - 0.5, x1 - 0.5, y0 - 0.5, y1 - 0.5)."""
        x, y = xy[:, 0], xy[:, 1]
        return float(np.min([x - (self.x0 - 0.5), (self.x1 - 0.5) - x, y - (self.y0 - 0.5), (self.y1 - 0.5) - y]))

    def to_tile(self, xy: np.ndarray) -> np.ndarray:
        """Plane (x, y) coordinates (any shape ending in 2) in tile coordinates."""
        return np.asarray(xy, np.float64) - (self.x0, self.y0)

    def within(self, outer: Tile) -> tuple[slice, slice]:
        """Index of this tile in an array of `outer` (a tile that holds it): `outer_array[tile.within(outer)]`."""
        return slice(self.y0 - outer.y0, self.y1 - outer.y0), slice(self.x0 - outer.x0, self.x1 - outer.x0)


def needs_tiling(shape: tuple[int, int], input_size: int) -> bool:
    """Whether a plane of `shape` (H, W) is tiled rather than encoded whole."""
    return max(shape) > TILING_FACTOR * input_size


def _starts(length: int, size: int, overlap: int) -> list[int]:
    if length <= size:
        return [0]
    starts = list(range(0, length - size, size - overlap))
    return starts + [length - size]


def tile_grid(shape: tuple[int, int], size: int, overlap: int = TILE_OVERLAP, step: int = 1) -> list[Tile]:
    """Tiles of `size` x `size` covering a plane of `shape` (H, W) reduced `step` times, row by
    row, in plane pixels (every tile starts on a multiple of `step`); a side shorter than `size`
    gives tiles as long as that side."""
    if not 0 <= overlap < size:
        raise ValueError(f"overlap must be in [0, {size}), got {overlap}")
    if step < 1:
        raise ValueError(f"step must be at least 1, got {step}")
    height, width = shape
    reduced_h, reduced_w = -(-height // step), -(-width // step)
    return [
        Tile(y0 * step, x0 * step, min((y0 + size) * step, height), min((x0 + size) * step, width), step)
        for y0 in _starts(reduced_h, size, overlap)
        for x0 in _starts(reduced_w, size, overlap)
    ]


def halo_tiles(shape: tuple[int, int], tile_shape: tuple[int, int], halo: tuple[int, int]) -> list[tuple[Tile, Tile]]:
    """micro-sam's tiling (`precompute_image_embeddings(tile_shape=, halo=)`, bioimage_cpp's
    `Blocking.get_block_with_halo`): a plane of `shape` (H, W) cut from its top left into inner
    tiles of `tile_shape` (h, w), the last of a row or column shorter, each grown by `halo` (h, w)
    on every side within the plane. Pairs (outer, inner), row by row: the outer tile is what is
    encoded, the inner one what it contributes to the plane."""
    if min(tile_shape) < 1 or min(halo) < 0:
        raise InvalidInputError(f"tile_shape must be positive and halo at least 0, got {tile_shape} and {halo}.")
    (height, width), (tile_h, tile_w), (halo_h, halo_w) = shape, tile_shape, halo
    inners = [
        Tile(y0, x0, min(y0 + tile_h, height), min(x0 + tile_w, width))
        for y0 in range(0, height, tile_h)
        for x0 in range(0, width, tile_w)
    ]
    return [
        (Tile(max(t.y0 - halo_h, 0), max(t.x0 - halo_w, 0), min(t.y1 + halo_h, height), min(t.x1 + halo_w, width)), t)
        for t in inners
    ]


def tile_for_prompts(tiles: Sequence[Tile], corners: np.ndarray) -> Tile:
    """Of the tiles that hold all of `corners` ((x, y) [N, 2]: see `Prompts.corners`), the one with
    the most context around them (`Tile.holds`, `Tile.margin`)."""
    if not len(corners):
        raise InvalidInputError("Give at least one point or a box.")
    bounds = np.array([(t.x0, t.y0, t.x1, t.y1) for t in tiles], np.float64)[:, :, None]
    x, y = corners[:, 0], corners[:, 1]
    edge_distances = np.array([x - bounds[:, 0], bounds[:, 2] - x, y - bounds[:, 1], bounds[:, 3] - y])  # 4 x tiles x corners
    holds = edge_distances.min(axis=(0, 2)) >= 0  # Tile.holds of every tile at once
    as_seen = edge_distances + np.array([0.5, -0.5, 0.5, -0.5])[:, None, None]  # from the edges as the model sees them
    margins = np.where(holds, as_seen.min(axis=(0, 2)), -np.inf)  # Tile.margin of the tiles that hold them
    best = int(np.argmax(margins))
    if not holds[best]:
        (x0, y0), (x1, y1) = corners.min(axis=0), corners.max(axis=0)
        tile_h, tile_w = tiles[0].shape
        raise InvalidInputError(
            f"The prompts span x {x0:g}..{x1:g}, y {y0:g}..{y1:g}: no {tile_w}x{tile_h} tile holds them all. "
            "Segment the object in parts (prompts close together), or with coarser tiles (in napari: zoom out)."
        )
    return tiles[best]


def place(masks: np.ndarray, tile: Tile, shape: tuple[int, int], fill: float = 0) -> np.ndarray:
    """Masks (or logits) of a tile ([..., h, w]) on the whole plane ([..., H, W], `fill` outside)."""
    plane = np.full(masks.shape[:-2] + tuple(shape), fill, masks.dtype)
    plane[(..., *tile.window)] = masks
    return plane


def view_order(tiles: Sequence[Tile], view: Tile, around: int) -> tuple[list[Tile], list[Tile]]:
    """The tiles that meet `view` and, apart, those that come within `around` pixels of it (its
    neighbours), each nearest to the view's centre first: the order to encode them in."""
    cy, cx = (view.y0 + view.y1) / 2, (view.x0 + view.x1) / 2

    def meets(tile: Tile, pad: int) -> bool:
        return tile.x0 < view.x1 + pad and tile.x1 > view.x0 - pad and tile.y0 < view.y1 + pad and tile.y1 > view.y0 - pad

    def distance(tile: Tile) -> float:
        return math.hypot((tile.y0 + tile.y1) / 2 - cy, (tile.x0 + tile.x1) / 2 - cx)

    inside = sorted((t for t in tiles if meets(t, 0)), key=distance)
    near = sorted((t for t in tiles if meets(t, around) and not meets(t, 0)), key=distance)
    return inside, near
