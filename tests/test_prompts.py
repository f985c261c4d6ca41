import numpy as np
import pytest

from triton_sam.errors import InvalidInputError
from triton_sam.prompts import build_request, model_request
from triton_sam.registry import get_model

SIZE = (200, 400)  # H, W


def request(**prompts):
    return build_request(SIZE, (1024, 1024), **prompts)


def test_points_are_scaled_per_axis_to_the_model_input():
    req = request(point_coords=[[100, 50], [400, 200]], point_labels=[1, 0])
    np.testing.assert_allclose(req.point_coords, [[[256, 256], [1024, 1024]]])
    assert req.point_labels.tolist() == [[1, 0]] and req.point_labels.dtype == np.int32
    assert req.mask_input is None and req.batch_size == 1


def test_box_becomes_corner_points_before_the_clicks():
    req = request(box=[0, 0, 200, 100], point_coords=[[100, 50]], point_labels=[1])
    assert req.point_labels.tolist() == [[2, 3, 1]]
    np.testing.assert_allclose(req.point_coords[0, :2], [[0, 0], [512, 512]])


def test_sam1_order_puts_clicks_first_and_pads_only_without_a_box():
    spec = get_model("sam_vit_b")  # a 200x400 image becomes 512x1024: same scale on both axes
    req = model_request(spec, SIZE, box=[0, 0, 200, 100], point_coords=[[100, 50]], point_labels=[1])
    assert req.point_labels.tolist() == [[1, 2, 3]]
    np.testing.assert_allclose(req.point_coords[0], [[256, 128], [0, 0], [512, 256]])
    req = model_request(spec, SIZE, point_coords=[[[100, 50]], [[10, 10]]], point_labels=[[1], [0]])
    assert req.point_labels.tolist() == [[1, -1], [0, -1]]  # SAM1's padding point
    np.testing.assert_allclose(req.point_coords[:, 1], 0)
    assert model_request(spec, SIZE, box=[[0, 0, 10, 10], [5, 5, 20, 20]]).point_labels.tolist() == [[2, 3]] * 2


def test_batches_of_boxes_and_points():
    req = request(box=[[0, 0, 10, 10], [5, 5, 20, 20]])
    assert req.point_coords.shape == (2, 2, 2) and req.batch_size == 2
    req = request(point_coords=np.zeros((3, 2, 2)), point_labels=np.ones((3, 2)), mask_input=np.zeros((1, 256, 256)))
    assert req.mask_input.shape == (3, 1, 256, 256)


def test_unnormalized_coordinates_are_taken_as_fractions():
    req = build_request(SIZE, (1024, 1024), point_coords=[[0.5, 0.25]], point_labels=[1], normalize_coords=False)
    np.testing.assert_allclose(req.point_coords, [[[512, 256]]])


@pytest.mark.parametrize(
    "prompts, message",
    [
        ({}, "at least one point"),
        ({"point_coords": [[1, 1]]}, "together"),
        ({"point_labels": [1]}, "together"),
        ({"point_coords": [[1, 1]], "point_labels": [1, 0]}, "does not match"),
        ({"point_coords": [1, 1], "point_labels": [1]}, "Nx2"),
        ({"point_coords": [[1, 1]], "point_labels": [5]}, "1 \\(positive\\) or 0"),
        ({"point_coords": [[401, 10]], "point_labels": [1]}, "outside"),
        ({"point_coords": [[10, -1]], "point_labels": [1]}, "outside"),
        ({"point_coords": [[np.nan, 1]], "point_labels": [1]}, "NaN"),
        ({"box": [0, 0, 500, 10]}, "outside"),
        ({"box": [10, 0, 5, 10]}, "x0 <= x1"),
        ({"box": [1, 2, 3]}, "shape 4"),
        ({"box": [[0, 0, 1, 1], [0, 0, 2, 2]], "point_coords": [[1, 1]], "point_labels": [1]}, "same number"),
        ({"point_coords": [[1, 1]], "point_labels": [1], "mask_input": np.zeros((1, 64, 64))}, "mask_input"),
    ],
)
def test_bad_prompts_are_rejected(prompts, message):
    with pytest.raises(InvalidInputError, match=message):
        request(**prompts)
