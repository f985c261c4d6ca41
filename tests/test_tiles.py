"""Tile geometry: the grid, micro-sam's tiles with a halo, the tile that decodes a prompt set, masks
placed back on the plane."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from triton_sam.errors import InvalidInputError
from triton_sam.prompts import Prompts
from triton_sam.tiles import TILE_OVERLAP, Tile, halo_tiles, needs_tiling, place, tile_for_prompts, tile_grid


@given(st.integers(1, 6000), st.integers(1, 6000))
def test_the_grid_covers_the_plane_with_whole_tiles_that_overlap(height, width):
    size = 1024
    tiles = tile_grid((height, width), size)
    covered = np.zeros((height, width), np.uint8)
    for tile in tiles:
        covered[tile.window] += 1
        assert tile.shape == (min(size, height), min(size, width))  # whole tiles, flush with the edges
    assert covered.min() >= 1
    for axis, length in ((0, height), (1, width)):  # neighbours share at least the overlap
        starts = sorted({(t.y0, t.x0)[axis] for t in tiles})
        assert starts[0] == 0 and starts[-1] + min(size, length) == length
        assert all(b - a <= size - TILE_OVERLAP for a, b in zip(starts, starts[1:]))


@given(st.integers(1, 40000), st.integers(1, 40000), st.sampled_from([1, 2, 4, 8, 16]))
def test_a_coarse_grid_is_the_reduced_planes_grid_in_plane_pixels(height, width, step):
    """Zoomed out: tiles `step` times larger, starting on multiples of `step`, covering the plane;
    reduced `step` times each is at most a model input (what its encoder and previews see)."""
    reduced = tile_grid((-(-height // step), -(-width // step)), 1024)
    tiles = tile_grid((height, width), 1024, step=step)
    assert len(tiles) == len(reduced)
    for tile, small in zip(tiles, reduced):
        assert tile.step == step and (tile.y0, tile.x0) == (small.y0 * step, small.x0 * step)
        assert tile.reduced_shape == small.shape and tile.y1 == min(small.y1 * step, height)
    assert max(t.y1 for t in tiles) == height and max(t.x1 for t in tiles) == width
    assert tile_grid((height, width), 1024, step=1) == tile_grid((height, width), 1024)


def test_small_planes_are_one_tile_and_encoded_whole():
    assert not needs_tiling((2048, 1500), 1024) and needs_tiling((2049, 100), 1024)
    assert tile_grid((900, 700), 1024) == [Tile(0, 0, 900, 700)]


def pairs(low: int, high: int) -> st.SearchStrategy[tuple[int, int]]:
    return st.tuples(st.integers(low, high), st.integers(low, high))


@given(pairs(1, 300), pairs(1, 80), pairs(0, 40))
def test_halo_tiles_are_micro_sams_blocks_with_halo(shape, tile_shape, halo):
    """The outer and inner blocks of bioimage_cpp's `Blocking` (micro-sam's tiling), in its order."""
    blocking = pytest.importorskip("bioimage_cpp.utils").Blocking([0, 0], list(shape), list(tile_shape))
    theirs = [blocking.get_block_with_halo(i, list(halo)) for i in range(blocking.number_of_blocks)]
    ours = halo_tiles(shape, tile_shape, halo)
    assert len(ours) == len(theirs)
    for (outer, inner), block in zip(ours, theirs):
        assert [outer.y0, outer.x0, outer.y1, outer.x1] == [*block.outer_block.begin, *block.outer_block.end]
        assert [inner.y0, inner.x0, inner.y1, inner.x1] == [*block.inner_block.begin, *block.inner_block.end]
        rows, columns = inner.within(outer)
        local = [rows.start, columns.start, rows.stop, columns.stop]
        assert local == [*block.inner_block_local.begin, *block.inner_block_local.end]


def test_the_prompts_go_to_the_tile_that_holds_them_all_farthest_from_its_edges():
    tiles = tile_grid((3000, 3000), 1024)
    near_a_border = Prompts(((1000.0, 500.0),), (1,)).corners()  # inside tiles starting at x 0 and 768
    assert tile_for_prompts(tiles, near_a_border).x0 == 768  # 232 px from that tile's edge, 23 from the other's
    with_box = Prompts(((1500.0, 1500.0),), (1,), (1300.0, 1300.0, 1700.0, 1750.0)).corners()
    chosen = tile_for_prompts(tiles, with_box)
    assert chosen.holds(with_box) and (chosen.x0 <= 1300 and chosen.x1 > 1700 and chosen.y0 <= 1300 and chosen.y1 > 1750)
    in_the_middle = Prompts(((896.0, 500.0),), (1,)).corners()  # of the overlap of the tiles at x 0 and 768
    assert tile_for_prompts(tiles, in_the_middle).x0 == 768  # 128.5 px from its edge as the model sees it, 127.5
    with pytest.raises(InvalidInputError, match="x 100..2000, y 100..100: no 1024x1024 tile holds them all"):
        tile_for_prompts(tiles, Prompts(((100.0, 100.0), (2000.0, 100.0)), (1, 1)).corners())
    with pytest.raises(InvalidInputError, match="at least one point"):
        tile_for_prompts(tiles, Prompts().corners())


def test_a_tile_holds_the_points_an_image_of_its_size_takes_edges_included():
    """A tile holds x0..x1, y0..y1 as an image of w x h pixels takes prompts x 0..w, y 0..h."""
    tile = Tile(100, 200, 1124, 1224)
    assert tile.holds(np.array([[200.0, 100.0], [1224.0, 1124.0], [1223.75, 500.0]]))
    assert not tile.holds(np.array([[199.75, 500.0]])) and not tile.holds(np.array([[500.0, 1124.25]]))
    assert tile.margin(np.array([[700.0, 600.0]])) == 500.5  # from the edges at x0 - 0.5, y0 - 0.5, as SAM sees the tile
    last_column = Prompts(((2999.75, 1400.0),), (1,)).corners()
    assert tile_for_prompts(tile_grid((2600, 3000), 1024), last_column).x1 == 3000


def test_masks_and_logits_are_placed_at_the_tile_on_the_plane():
    tile = Tile(10, 20, 14, 25)
    masks = np.ones((3, 4, 5), bool)
    plane = place(masks, tile, (30, 40))
    assert plane.shape == (3, 30, 40) and plane.sum() == 3 * 20 and plane[:, 10:14, 20:25].all()
    logits = place(np.zeros((4, 5), np.float32), tile, (30, 40), fill=-np.inf)
    assert (logits[10:14, 20:25] == 0).all() and np.isneginf(logits[0, 0])
    np.testing.assert_allclose(tile.to_tile([[25.0, 12.0]]), [[5.0, 2.0]])
