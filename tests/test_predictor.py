"""The Predictor API on the synthetic model: shapes, placement, refinement and bad input."""

import numpy as np
import pytest

from synthetic import disk_image
from triton_sam import Predictor
from triton_sam.errors import InvalidInputError

H, W = 200, 400
DISKS = [(300, 50, 30), (80, 150, 40)]


def disk_mask(x, y, r):
    yy, xx = np.mgrid[:H, :W]
    return (xx - x) ** 2 + (yy - y) ** 2 <= r**2


def iou(a, b):
    return (a & b).sum() / (a | b).sum()


@pytest.fixture
def predictor(synthetic_repository):
    predictor = Predictor("sam2.1_hiera_tiny", model_repository=synthetic_repository)
    predictor.set_image(disk_image(H, W, DISKS))
    return predictor


@pytest.mark.parametrize("x, y, r", DISKS)
def test_click_inside_a_disk_returns_that_disk_in_a_non_square_image(predictor, x, y, r):
    masks, scores, low_res = predictor.predict(point_coords=[[x, y]], point_labels=[1])
    assert masks.shape == (3, H, W) and masks.dtype == bool
    assert scores.shape == (3,) and low_res.shape == (3, 256, 256)
    best = masks[np.argmax(scores)]
    assert iou(best, disk_mask(x, y, r)) > 0.97
    other = next(d for d in DISKS if d[:2] != (x, y))
    assert not (best & disk_mask(*other)).any()


def test_single_mask_batches_and_logits(predictor):
    masks, scores, low_res = predictor.predict(point_coords=[[300, 50]], point_labels=[1], multimask_output=False)
    assert masks.shape == (1, H, W) and scores.shape == (1,) and low_res.shape == (1, 256, 256)
    batch = predictor.predict(point_coords=[[[300, 50]], [[80, 150]]], point_labels=[[1], [1]])
    assert batch[0].shape == (2, 3, H, W) and batch[1].shape == (2, 3)
    logits, _, _ = predictor.predict(point_coords=[[300, 50]], point_labels=[1], return_logits=True)
    assert logits.dtype == np.float32
    assert np.array_equal(logits[1] > 0, predictor.predict(point_coords=[[300, 50]], point_labels=[1])[0][1])


def test_low_res_logits_are_clamped_and_refine_the_next_round(predictor):
    before, _, low_res = predictor.predict(point_coords=[[300, 50]], point_labels=[1])
    assert np.abs(low_res).max() <= 32.0
    strong = np.full((1, 256, 256), 30.0, np.float32)
    after, _, _ = predictor.predict(point_coords=[[300, 50]], point_labels=[1], mask_input=strong)
    # The synthetic decoder adds a quarter of mask_input to its logits: the mask can only grow.
    assert after[1].sum() > before[1].sum() and not (before[1] & ~after[1]).any()


def test_box_prompt_uses_its_corners(predictor):
    # The synthetic decoder ignores box corners (labels 2/3): no positive point, no mask.
    masks, _, _ = predictor.predict(box=[250, 10, 350, 90])
    assert not masks.any()


def test_other_dtypes_and_rgba_give_the_same_masks(predictor, synthetic_repository):
    expected, _, _ = predictor.predict(point_coords=[[300, 50]], point_labels=[1])
    image = disk_image(H, W, DISKS).astype(np.uint16) * 200
    other = Predictor(model_repository=synthetic_repository)
    for variant in (image, image.astype(np.float64) / 7, np.dstack([disk_image(H, W, DISKS)] * 3 + [np.zeros((H, W), np.uint8)])):
        other.set_image(variant)
        assert iou(other.predict(point_coords=[[300, 50]], point_labels=[1])[0][1], expected[1]) > 0.99


def test_bad_input_changes_nothing(predictor):
    before = predictor.get_image_embedding()
    with pytest.raises(InvalidInputError):
        predictor.set_image(np.zeros((0, 10), np.uint8))
    with pytest.raises(InvalidInputError):
        predictor.set_image(np.full((10, 10), np.nan))
    with pytest.raises(InvalidInputError, match="outside"):
        predictor.predict(point_coords=[[W + 5, 10]], point_labels=[1])
    assert predictor.get_image_embedding() is before and predictor.original_size == (H, W)


def test_predict_before_set_image_is_an_error(synthetic_repository):
    predictor = Predictor(model_repository=synthetic_repository)
    with pytest.raises(RuntimeError, match="set_image"):
        predictor.predict(point_coords=[[1, 1]], point_labels=[1])
    predictor.set_image(np.zeros((5, 5), np.uint8))
    predictor.reset_predictor()
    assert not predictor.is_image_set


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (5, 1), (2, 3, 3)])
def test_one_pixel_wide_images_give_masks_of_their_own_size(predictor, shape):
    predictor.set_image(np.full(shape, 200, np.uint8))
    masks, scores, _ = predictor.predict(point_coords=[[0, 0]], point_labels=[1])
    assert masks.shape == (3, *shape[:2]) and scores.shape == (3,)
    with pytest.raises(InvalidInputError, match="outside"):
        predictor.predict(point_coords=[[shape[1] + 1, 0]], point_labels=[1])
