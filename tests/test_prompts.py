import numpy as np
import pytest

from triton_sam.errors import InvalidInputError
from triton_sam.prompts import Prompts, build_request, model_request
from triton_sam.registry import get_model
from triton_sam.tiles import Tile

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


def test_a_prompts_value_goes_from_the_plane_to_a_tile_to_the_request_as_the_arrays_would():
    prompts = Prompts.of(point_coords=[[1300.5, 900.0]], point_labels=[0], box=[1200, 800, 1400, 1000])
    assert prompts == Prompts(((1300.5, 900.0),), (0,), (1200.0, 800.0, 1400.0, 1000.0)) and not prompts.empty
    np.testing.assert_array_equal(prompts.corners(), [[1300.5, 900.0], [1200, 800], [1400, 1000]])
    in_tile = prompts.in_tile(Tile(768, 1024, 1792, 2048))
    assert in_tile == Prompts(((276.5, 132.0),), (0,), (176.0, 32.0, 376.0, 232.0))
    spec = get_model("sam2.1_hiera_tiny")
    got = in_tile.with_point((10, 20)).request(spec, (1024, 1024), logits_above=0.0)
    expected = model_request(
        spec, (1024, 1024), point_coords=[[276.5, 132], [10, 20]], point_labels=[0, 1], box=[176, 32, 376, 232], logits_above=0.0
    )
    np.testing.assert_array_equal(got.point_coords, expected.point_coords)
    np.testing.assert_array_equal(got.point_labels, expected.point_labels)
    assert got.logits_above == 0.0 and Prompts().empty and Prompts(box=(0, 0, 1, 1)).corners().shape == (2, 2)


def test_a_prompts_value_is_checked_as_a_request_is():
    with pytest.raises(InvalidInputError, match="at least one point"):
        Prompts.of()
    with pytest.raises(InvalidInputError, match="1 \\(positive\\) or 0"):
        Prompts.of(point_coords=[[1, 1]], point_labels=[5])
    with pytest.raises(InvalidInputError, match="one prompt set"):
        Prompts.of(box=[[0, 0, 1, 1], [0, 0, 2, 2]])
    for outside in (Prompts(((-30.0, -30.0),), (1,)), Prompts(box=(0.0, 0.0, 500.0, 10.0))):
        with pytest.raises(InvalidInputError) as refused:
            outside.check_inside(SIZE)
        with pytest.raises(InvalidInputError) as expected:
            outside.request(get_model("sam2.1_hiera_tiny"), SIZE)
        assert str(refused.value) == str(expected.value) and "outside the image (x in 0..400, y in 0..200" in str(refused.value)
    Prompts(((400.0, 200.0),), (1,), (0.0, 0.0, 400.0, 200.0)).check_inside(SIZE)  # the edges are the image's
