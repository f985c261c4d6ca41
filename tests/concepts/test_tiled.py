"""Joining a concept's instances found tile by tile (`concepts.tiled`) on hand-made tiles."""

from __future__ import annotations

import numpy as np

from triton_sam.concepts.tiled import joined_labels, tile_pieces

REGION = (0, 0, 100, 300)  # rows 0:100, columns 0:300 of the plane
LEFT, RIGHT = (0, 0, 200, 100), (100, 0, 300, 100)  # x0, y0, x1, y1: two tiles overlapping on columns 100:200


def tile_masks(crop, *rects) -> np.ndarray:
    """bool [N, 1, h, w] masks over the tile `crop`, one a plane rectangle (x0, y0, x1, y1) each."""
    x0, y0, x1, y1 = crop
    masks = np.zeros((len(rects), 1, y1 - y0, x1 - x0), bool)
    for mask, (rx0, ry0, rx1, ry1) in zip(masks, rects, strict=True):
        mask[0, max(ry0 - y0, 0) : ry1 - y0, max(rx0 - x0, 0) : rx1 - x0] = True
    return masks


def test_an_instance_two_tiles_hold_whole_is_one_the_better_scoring():
    both = (130, 40, 170, 60)  # in the overlap, away from both tiles' inner edges
    pieces = tile_pieces(tile_masks(LEFT, both), np.array([0.6]), LEFT, REGION, 0)
    pieces += tile_pieces(tile_masks(RIGHT, both), np.array([0.9]), RIGHT, REGION, 1)
    labels = joined_labels(pieces, REGION)
    assert len(pieces) == 2 and set(np.unique(labels)) == {0, 1}
    assert labels[40:60, 130:170].all() and np.count_nonzero(labels) == 800


def test_an_instance_cut_by_a_tile_s_inner_edge_comes_from_the_tile_that_holds_it_whole():
    crossing = (185, 10, 225, 30)  # crosses the left tile's right edge (200), whole in the right tile
    cut = tile_pieces(tile_masks(LEFT, crossing), np.array([0.99]), LEFT, REGION, 0)
    whole = tile_pieces(tile_masks(RIGHT, crossing), np.array([0.5]), RIGHT, REGION, 1)
    assert cut == [] and len(whole) == 1  # cut: left out however well it scores
    labels = joined_labels(cut + whole, REGION)
    assert np.count_nonzero(labels == 1) == 40 * 20 and labels[10:30, 185:225].all()


def test_instances_on_the_region_s_border_stay_and_a_tile_s_own_overlapping_instances_all_stay():
    border = (0, 0, 30, 30)  # touches the left tile's edges on the plane's border only
    inner, outer = (20, 60, 40, 80), (15, 55, 45, 85)  # one tile's nested instances
    same = (17, 53, 47, 83)  # boxes IoU 0.77 with `outer`'s, same tile: both kept, as a plane encoded whole keeps them
    pieces = tile_pieces(tile_masks(LEFT, border, outer, same, inner), np.array([0.9, 0.8, 0.7, 0.95]), LEFT, REGION, 0)
    labels = joined_labels(pieces, REGION)
    assert len(pieces) == 4 and sorted(np.unique(labels)) == [0, 1, 2, 3, 4]
    assert labels[70, 30] == 1  # the best scoring on top
    assert labels[5, 5] == 2  # the border's instance kept
    assert labels[57, 16] == 3 and labels[54, 30] == 4 and labels[58, 30] == 3  # `outer` above `same` (it scores better)
