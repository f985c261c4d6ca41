"""`TiledPredictor` on a large uint16 plane against `SAM2ImagePredictor` on the tile's crop, same
(seeded random) weights: a tile is decoded exactly as the official predictor decodes that crop,
and the masks land at the tile's place on the plane. Coarse tiles (step 2: 2048 px, as napari uses
zoomed out) too: their crop is reduced as the official predictor reduces a whole image."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.parity import mask_iou, rgb
from conftest import PARITY_SEED, require_export_extra
from triton_sam.image import to_uint8
from triton_sam.tiled_predictor import TiledPredictor

pytestmark = pytest.mark.parity
MODEL = "sam2.1_hiera_tiny"
H, W = 2600, 3100  # 4 x 4 tiles of 1024 px
LIMITS = (1000.0, 60000.0)
PROMPTS = {
    "point in an overlap": dict(point_coords=[[1400, 896]], point_labels=[1]),
    "points near a border": dict(point_coords=[[1780, 1540], [1700, 1600]], point_labels=[1, 0]),
    "box over a tile border": dict(box=[700, 700, 1000, 900]),
    "box and point at the far corner": dict(box=[2700, 2200, 3050, 2550], point_coords=[[2900, 2400]], point_labels=[1]),
}


@pytest.fixture(scope="module")
def plane() -> np.ndarray:
    """A textured 16-bit plane (the camera image stretched over it, plus fine noise)."""
    from PIL import Image
    from skimage import data

    camera = np.asarray(Image.fromarray(data.camera()).resize((W, H), Image.BILINEAR), np.float64)
    noise = np.random.default_rng(0).normal(0, 500, (H, W))
    return np.clip(2000 + camera * 220 + noise, 0, 65535).astype(np.uint16)


@pytest.fixture(scope="module")
def predictors(exported_repository):
    require_export_extra()
    import torch

    from benchmarks.fixtures import official_predictor

    torch.set_grad_enabled(False)
    with TiledPredictor(MODEL, model_repository=exported_repository(MODEL)) as tiled:
        yield official_predictor(MODEL, PARITY_SEED), tiled


@pytest.mark.parametrize("step", [1, 2])
@pytest.mark.parametrize("name", list(PROMPTS))
def test_a_tile_decodes_as_the_official_predictor_decodes_its_crop(predictors, plane, name, step):
    official, tiled = predictors
    prompts = {key: np.asarray(value, np.float64) for key, value in PROMPTS[name].items()}
    tiled.set_image(plane, contrast_limits=LIMITS, step=step)
    masks, scores, low_res, tile = tiled.predict_in_tile(**prompts)
    assert tile.shape == (1024 * step, 1024 * step) and tile.step == step

    official.set_image(rgb(to_uint8(plane[tile.window], LIMITS)))
    in_tile = dict(prompts)
    if "point_coords" in in_tile:
        in_tile["point_coords"] = tile.to_tile(in_tile["point_coords"])
    if "box" in in_tile:
        in_tile["box"] = tile.to_tile(in_tile["box"].reshape(2, 2)).reshape(4)
    expected, expected_scores, expected_low_res = official.predict(**in_tile)
    assert masks.shape == expected.shape and low_res.shape == expected_low_res.shape
    for ours, theirs in zip(masks, expected > 0):
        assert mask_iou(ours, theirs) >= 0.99
    np.testing.assert_allclose(scores, expected_scores, atol=1e-3)

    placed, placed_scores, _ = tiled.predict(**prompts)  # the same masks, at the tile's place
    np.testing.assert_array_equal(placed[:, tile.y0 : tile.y1, tile.x0 : tile.x1], masks)
    outside = placed.copy()
    outside[:, tile.y0 : tile.y1, tile.x0 : tile.x1] = False
    assert placed.shape == (3, H, W) and not outside.any()
    np.testing.assert_array_equal(placed_scores, scores)
