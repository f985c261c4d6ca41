"""The generator on a large plane's tiles (`find(..., crops=...)`), with the synthetic model (it
answers a point with the bright disks near it): objects inside a tile and on the border between
two tiles are found whole and placed on the plane; and SAM1's small-region clean-up works within
each mask's box."""

from __future__ import annotations

import numpy as np

from synthetic import disk_image
from triton_sam.automatic import AutomaticMaskGenerator, FoundMask
from triton_sam.automatic.records import clean_small_regions
from triton_sam.tiles import tile_grid

H, W = 1000, 2600  # tiled: longer than twice the model's input
DISKS = [(300, 500, 60), (1600, 400, 70)]  # (x, y, r): inside the first tile; on the first two tiles' shared strip


def _disk(x: float, y: float, r: float) -> np.ndarray:
    yy, xx = np.mgrid[:H, :W]
    return (xx - x) ** 2 + (yy - y) ** 2 <= r**2


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    return np.count_nonzero(a & b) / np.count_nonzero(a | b)


def test_tiles_find_objects_inside_and_across_tile_borders_whole_on_the_plane(synthetic_repository):
    plane = disk_image(H, W, DISKS)
    tiles = tile_grid((H, W), 1024)
    assert len(tiles) > 1 and any(t.x0 < 1600 - 70 and 1600 + 70 < t.x1 for t in tiles)
    crops = [(t.x0, t.y0, t.x1, t.y1) for t in tiles]
    with AutomaticMaskGenerator(model_repository=synthetic_repository, points_per_side=16) as generator:
        seen = []
        found = generator.find(plane, crops=crops, progress=lambda done, total: seen.append((done, total)))
        assert seen[-1] == (generator.batches((H, W), crops), generator.batches((H, W), crops)) == (len(crops) * 4,) * 2
    disks = [_disk(*disk) for disk in DISKS]
    inside = np.logical_or(*disks)
    for mask in found:
        full = mask.full((H, W))
        assert np.count_nonzero(full & inside) >= 0.98 * mask.area  # masks are disk pixels, on the plane
    for (x, y, _), disk in zip(DISKS, disks, strict=True):  # each found whole (the synthetic encoder blurs edges)
        best = max((mask.full((H, W)) for mask in found), key=lambda full: _iou(full, disk))
        assert _iou(best, disk) >= 0.8
        rows, cols = np.nonzero(best)
        assert abs(cols.mean() - x) <= 10 and abs(rows.mean() - y) <= 10  # on the plane (tiles start hundreds of px apart)
    assert {m.crop_box for m in found} <= set(crops)


def test_tiles_go_together_to_an_engine_that_encodes_several_at_once_and_find_the_same(synthetic_repository, monkeypatch):
    """Where the engine encodes several images at once (a GPU server's `encode_batch`), the crops
    go to it that many together; what is found does not change."""
    plane = disk_image(H, W, DISKS)
    crops = [(t.x0, t.y0, t.x1, t.y1) for t in tile_grid((H, W), 1024)]
    with AutomaticMaskGenerator(model_repository=synthetic_repository, points_per_side=8) as generator:
        expected = generator.find(plane, crops=crops)
        batches, encode_many = [], generator.engine.encode_many
        monkeypatch.setattr(generator.engine, "encode_batch", 2, raising=False)
        monkeypatch.setattr(generator.engine, "encode_many", lambda images: batches.append(len(images)) or encode_many(images))
        found = generator.find(plane, crops=crops)
    assert len(crops) == 4 and batches == [2, 2] and expected
    assert [(m.box, m.predicted_iou, m.point) for m in found] == [(m.box, m.predicted_iou, m.point) for m in expected]


def test_small_holes_and_islands_are_cleaned_within_each_masks_box():
    mask = np.zeros((50, 60), bool)
    mask[10:30, 20:45] = True
    mask[15:17, 25:27] = False  # a hole
    mask[40, 5] = True  # an island
    found = FoundMask.from_mask(mask, (0, 0), predicted_iou=0.9, stability_score=0.9, point=(30.0, 20.0), crop_box=(0, 0, 60, 50))
    edge = np.zeros((50, 60), bool)
    edge[0:10, 0:60] = True  # touches three edges of the image: left alone
    at_edge = FoundMask.from_mask(edge, (0, 0), predicted_iou=0.8, stability_score=0.9, point=(1.0, 1.0), crop_box=(0, 0, 60, 50))
    cleaned = clean_small_regions([found, at_edge], (50, 60), 10, 0.7)
    assert len(cleaned) == 2 and cleaned[0] is at_edge  # unchanged masks first, as SAM1's NMS on 1/0 scores
    expected = np.zeros((50, 60), bool)
    expected[10:30, 20:45] = True
    assert np.array_equal(cleaned[1].full((50, 60)), expected) and cleaned[1].box == (20, 10, 44, 29)
