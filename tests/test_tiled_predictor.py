"""`TiledPredictor` on the synthetic model: native-resolution tiles, objects on tile borders,
masks placed on the plane, and small planes exactly as `Predictor` does them."""

from __future__ import annotations

import numpy as np
import pytest

from synthetic import SlowReads, disk_image, slow_encodes
from triton_sam import Predictor
from triton_sam.errors import InvalidInputError
from triton_sam.planes import sampled_limits
from triton_sam.tiled_predictor import TiledPredictor
from triton_sam.tiles import Tile

H, W = 2600, 3000  # tiled: over 2 x 1024 px; tiles start at x 0, 768, 1536, 1976 and y 0, 768, 1536, 1576
DISKS = [(300, 300, 60), (896, 1400, 70), (1790, 700, 50), (2900, 2500, 40)]  # the second lies in an overlap


@pytest.fixture(scope="module")
def plane():
    return disk_image(H, W, DISKS)


@pytest.fixture
def tiled(synthetic_repository):
    with TiledPredictor(model_repository=synthetic_repository) as predictor:
        yield predictor


@pytest.mark.parametrize("disk", DISKS, ids=["corner", "overlap", "border", "far-corner"])
def test_a_click_gives_its_object_at_its_place_on_the_plane_as_the_predictor_does_on_that_tile(
    tiled, synthetic_repository, plane, disk
):
    x, y, r = disk
    tiled.set_image(plane)
    masks, scores, _ = tiled.predict(point_coords=[[x, y]], point_labels=[1])
    best = masks[int(np.argmax(scores))]
    yy, xx = np.mgrid[:H, :W]
    inside = (xx - x) ** 2 + (yy - y) ** 2 <= r**2
    assert best.shape == (H, W) and best[inside].mean() > 0.95 and best[~inside].mean() < 0.001  # that disk, there

    crop_masks, crop_scores, _, tile = tiled.predict_in_tile(point_coords=[[x, y]], point_labels=[1])
    with Predictor(model_repository=synthetic_repository) as predictor:  # the same tile, set as an image
        predictor.set_image(plane[tile.window])
        expected, expected_scores, _ = predictor.predict(point_coords=[[x - tile.x0, y - tile.y0]], point_labels=[1])
    np.testing.assert_array_equal(crop_masks, expected)
    np.testing.assert_allclose(crop_scores, expected_scores)
    np.testing.assert_array_equal(masks[:, tile.y0 : tile.y1, tile.x0 : tile.x1], expected)


def test_tiles_are_encoded_once_when_first_needed_and_ahead_on_request(tiled, plane):
    tiled.set_image(plane)
    assert len(tiled.tiles) == 16 and len(tiled.cache) == 0  # nothing encoded by set_image
    tiled.predict(point_coords=[[300, 300]], point_labels=[1])
    tiled.predict(box=[250, 250, 350, 350])
    assert len(tiled.cache) == 1
    progress = []
    tiled.encode_tiles(tiled.tiles[:3], on_progress=lambda done, total: progress.append((done, total)))
    assert progress == [(1, 3), (2, 3), (3, 3)] and len(tiled.cache) == 3


def test_encoding_ahead_reads_each_tile_while_the_one_before_it_is_encoded(tiled, plane, monkeypatch):
    """From slow storage, a tile's read overlaps the encode of the tile before it."""
    slow = SlowReads(plane, 0.2)
    encoded = slow_encodes(tiled.engine, 0.2, monkeypatch)
    tiled.set_image(slow)
    tiled.encode_tiles(tiled.tiles[:3])
    read = [slow.read_at(tile.window) for tile in tiled.tiles[:3]]
    assert len(encoded) == 3 and all(read[k + 1] < encoded[k] for k in range(2))


def test_prompts_that_no_tile_holds_are_refused_with_a_message_and_change_nothing(tiled, plane):
    tiled.set_image(plane)
    with pytest.raises(InvalidInputError, match="no 1024x1024 tile holds them all"):
        tiled.predict(point_coords=[[300, 300], [2900, 2500]], point_labels=[1, 1])
    assert len(tiled.cache) == 0


def test_a_small_plane_is_one_tile_and_gives_exactly_what_the_predictor_gives(tiled, synthetic_repository):
    small = disk_image(700, 1300, [(300, 200, 50), (1000, 500, 80)])
    tiled.set_image(small)
    assert len(tiled.tiles) == 1
    got = tiled.predict(point_coords=[[1000, 500]], point_labels=[1], box=[900, 400, 1100, 600])
    with Predictor(model_repository=synthetic_repository) as predictor:
        predictor.set_image(small)
        expected = predictor.predict(point_coords=[[1000, 500]], point_labels=[1], box=[900, 400, 1100, 600])
    for ours, theirs in zip(got, expected):
        np.testing.assert_array_equal(ours, theirs)


def test_a_uint16_plane_is_scaled_to_uint8_alike_in_every_tile(tiled, synthetic_repository):
    yy, xx = np.mgrid[:3000, :3000]
    plane = np.full((3000, 3000), 1000, np.uint16)
    plane[(xx - 300) ** 2 + (yy - 300) ** 2 <= 60**2] = 20000  # dim: ~0.32 of the plane's range
    plane[(xx - 2700) ** 2 + (yy - 2700) ** 2 <= 60**2] = 60000  # the brightest object, tiles away
    assert sampled_limits(plane) == (1000, 60000)
    tiled.set_image(plane)
    masks, _, _, tile = tiled.predict_in_tile(point_coords=[[300, 300]], point_labels=[1])
    at = (300 - tile.y0, 300 - tile.x0)
    # The synthetic masks threshold brightness at 0.3 / 0.5 / 0.7 of the range: scaled with its own
    # tile's limits the dim disk would be white and in all three.
    assert [bool(m[at]) for m in masks] == [True, False, False]
    with Predictor(model_repository=synthetic_repository) as predictor:
        predictor.set_image(plane[tile.window], contrast_limits=(1000, 60000))
        expected, _, _ = predictor.predict(point_coords=[[300 - tile.x0, 300 - tile.y0]], point_labels=[1])
    np.testing.assert_array_equal(masks, expected)


def test_a_coarse_tile_over_the_read_limit_decodes_as_the_predictor_does_its_block_averaged_crop(tiled, synthetic_repository):
    """Step 8 on a 4600-px plane: one tile whose 4600-px crop (over the 4096 px read whole) is
    reduced 2 x 2 while read; the masks are the predictor's on that reduced crop, scaled back up."""
    side = 4600
    plane = disk_image(side, side, [(2300, 2200, 1200)])
    tiled.set_image(plane, step=8)
    assert tiled.tiles == [Tile(0, 0, side, side, 8)]
    masks, _, _, tile = tiled.predict_in_tile(point_coords=[[2300, 2200]], point_labels=[1])
    reduced = plane.reshape(side // 2, 2, side // 2, 2).mean(axis=(1, 3))
    with Predictor(model_repository=synthetic_repository) as predictor:
        predictor.set_image(np.rint(reduced).astype(np.uint8))
        expected, _, _ = predictor.predict(point_coords=[[1150, 1100]], point_labels=[1])
    assert masks.shape == (3, side, side)
    for ours, theirs in zip(masks, expected):
        upscaled = theirs.repeat(2, axis=0).repeat(2, axis=1)
        assert np.count_nonzero(ours != upscaled) < 0.002 * ours.size  # the edges, upsampled from different sizes


def test_through_triton_the_server_encodes_the_tiles_and_the_masks_are_the_same(synthetic_server, synthetic_repository, plane):
    with (
        TiledPredictor(backend="triton", url=synthetic_server.grpc_url) as remote,
        TiledPredictor(model_repository=synthetic_repository) as local,
    ):
        remote.set_image(plane)
        local.set_image(plane)
        got = remote.predict_in_tile(point_coords=[[896, 1400]], point_labels=[1])
        expected = local.predict_in_tile(point_coords=[[896, 1400]], point_labels=[1])
    assert got[3] == expected[3] and remote.engine.describe().startswith("Triton")
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_allclose(got[1], expected[1], atol=1e-5)


@pytest.mark.parametrize("x", [1299.75, 1300.0], ids=["in-the-last-pixel-column", "on-the-right-edge"])
def test_a_point_on_a_small_planes_last_pixel_column_is_taken_as_the_predictor_takes_it(tiled, synthetic_repository, x):
    """The plane spans x 0..W, y 0..H for tiles as for prompts (`Predictor` takes x = W)."""
    small = disk_image(700, 1300, [(1250, 500, 80)])
    tiled.set_image(small)
    got = tiled.predict(point_coords=[[x, 500]], point_labels=[1])
    with Predictor(model_repository=synthetic_repository) as predictor:
        predictor.set_image(small)
        expected = predictor.predict(point_coords=[[x, 500]], point_labels=[1])
    for ours, theirs in zip(got, expected):
        np.testing.assert_array_equal(ours, theirs)


def test_a_point_in_a_large_planes_last_pixel_column_is_decoded_with_the_last_tile(tiled, plane):
    tiled.set_image(plane)
    masks, _, _, tile = tiled.predict_in_tile(point_coords=[[W - 0.25, 1400]], point_labels=[1])
    assert tile.x1 == W and masks.shape == (3, *tile.shape)


@pytest.mark.parametrize("size", [(700, 1300), (H, W)], ids=["small", "tiled"])
@pytest.mark.parametrize(
    "prompts",
    [
        {"point_coords": [[-30, -30]], "point_labels": [1]},
        {"point_coords": [[100, 100]], "point_labels": [1], "box": [50, 50, 90, 99999]},
    ],
    ids=["point", "box"],
)
def test_prompts_outside_the_plane_are_refused_with_the_predictors_message(tiled, synthetic_repository, size, prompts):
    tiled.set_image(np.zeros(size, np.uint8))
    with pytest.raises(InvalidInputError) as refused:
        tiled.predict(**prompts)
    with Predictor(model_repository=synthetic_repository) as predictor:
        predictor.set_image(np.zeros(size, np.uint8))
        with pytest.raises(InvalidInputError) as expected:
            predictor.predict(**prompts)
    assert str(refused.value) == str(expected.value) and "lies outside the image" in str(refused.value)
    assert len(tiled.cache) == 0
