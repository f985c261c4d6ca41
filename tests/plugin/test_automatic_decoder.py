"""The decoder mode's maps of a region put together from its crops (a large plane's tiles in view):
each pixel from the crop it lies deepest in, so that every pixel is covered and neighbours meet in
the middle of their overlap."""

from __future__ import annotations

import numpy as np

from triton_sam.plugin.automatic_decoder import paste
from triton_sam.tiles import tile_grid


def _pasted(crops, region, values=None) -> tuple[np.ndarray, np.ndarray]:
    """The region's maps and depths after pasting each crop filled with its number (1, 2, ...)."""
    y0, x0, y1, x1 = region
    maps, depth = np.zeros((3, y1 - y0, x1 - x0), np.float32), np.full((y1 - y0, x1 - x0), -1, np.int32)
    for number, (cx0, cy0, cx1, cy1) in enumerate(crops, 1):
        paste(maps, depth, np.full((3, cy1 - cy0, cx1 - cx0), number, np.float32), (cx0, cy0, cx1, cy1), region)
    return maps, depth


def test_two_overlapping_crops_meet_in_the_middle_of_their_overlap():
    maps, _ = _pasted([(0, 0, 12, 10), (8, 0, 20, 10)], region=(0, 0, 10, 20))  # columns 8..11 shared
    assert np.all(maps[:, :, :10] == 1) and np.all(maps[:, :, 10:] == 2)


def test_one_crop_over_the_region_is_taken_whole():
    maps, _ = _pasted([(30, 20, 50, 35)], region=(20, 30, 35, 50))
    assert np.all(maps == 1)


def test_the_tiles_of_a_large_plane_cover_it_each_pixel_away_from_inner_edges():
    tiles = tile_grid((2600, 3200), 1024)
    maps, depth = _pasted([(t.x0, t.y0, t.x1, t.y1) for t in tiles], region=(0, 0, 2600, 3200))
    assert np.all(maps[0] > 0) and depth.min() >= 100  # every pixel from a tile it lies well inside (overlap 256)
