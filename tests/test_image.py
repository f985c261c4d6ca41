import tracemalloc

import numpy as np
import pytest

from triton_sam.errors import InvalidInputError
from triton_sam.image import encoder_input, to_uint8
from triton_sam.registry import get_model

SAM2 = get_model("sam2.1_hiera_tiny")


def test_uint8_rgb_is_used_as_is():
    image = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    sent = encoder_input(image, SAM2)
    assert np.array_equal(sent, image) and np.shares_memory(sent, image)  # no copy


def test_grayscale_stays_one_channel_and_rgba_drops_alpha():
    gray = np.arange(12, dtype=np.uint8).reshape(3, 4)
    assert np.array_equal(encoder_input(gray, SAM2), gray[..., None])
    assert np.array_equal(encoder_input(gray[..., None], SAM2), gray[..., None])
    rgb = np.dstack([gray, gray + 1, gray + 2])
    rgba = np.dstack([rgb, np.full((3, 4), 7, np.uint8)])
    assert np.array_equal(encoder_input(rgba, SAM2), rgb)


def test_uint16_and_float_are_scaled_from_min_max_or_contrast_limits():
    image = np.array([[100, 1100], [600, 1100]], np.uint16)
    assert to_uint8(image).tolist() == [[0, 255], [128, 255]]
    limited = to_uint8(image, contrast_limits=(100, 600))
    assert limited.tolist() == [[0, 255], [255, 255]]
    floats = np.array([[-1.0, 1.0]], np.float32)
    assert to_uint8(floats)[0].tolist() == [0, 255]


def test_bool_and_constant_images():
    assert to_uint8(np.array([[True, False]]))[0].tolist() == [255, 0]
    assert to_uint8(np.full((2, 2), 5.0)).max() == 0


@pytest.mark.parametrize(
    "image, message",
    [
        (np.zeros((0, 5), np.uint8), "empty"),
        (np.zeros(5, np.uint8), "shape"),
        (np.zeros((2, 3, 4, 5), np.uint8), "shape"),
        (np.zeros((4, 4, 2), np.uint8), "shape"),
        (np.array([[1.0, np.nan]]), "NaN"),
        (np.array([[1.0, np.inf]]), "NaN or infinite"),
        (np.array([["a"]]), "dtype"),
    ],
)
def test_bad_images_are_rejected_with_a_clear_message(image, message):
    with pytest.raises(InvalidInputError, match=message):
        encoder_input(image, SAM2)


def test_scaling_in_blocks_of_rows_equals_scaling_at_once(monkeypatch):
    image = np.random.default_rng(2).integers(0, 65536, (301, 203), dtype=np.uint16)
    whole = to_uint8(image, contrast_limits=(1000, 60000))
    monkeypatch.setattr("triton_sam.image._BLOCK_PIXELS", 203 * 7)  # 43 blocks of 7 rows
    assert np.array_equal(to_uint8(image, contrast_limits=(1000, 60000)), whole)


@pytest.mark.parametrize(
    "model_id, image_hw, sent_hw",
    [
        ("sam2.1_hiera_tiny", (977, 1531), (977, 1531)),  # sent as it is: the encoder resizes
        ("sam2.1_hiera_tiny", (5000, 300), (4096, 300)),  # only a side over 4x the input size is reduced here
        ("sam3_tracker", (9000, 9000), (4032, 4032)),
        ("sam_vit_b", (300, 400), (768, 1024)),  # SAM1: ResizeLongestSide on the client
    ],
)
def test_the_client_sends_stretched_models_the_plane_and_sam1_its_resized_image(model_id, image_hw, sent_hw):
    spec = get_model(model_id)
    image = np.random.default_rng(5).integers(0, 256, (*image_hw, 3), dtype=np.uint8)
    sent = encoder_input(image, spec)
    assert sent.shape == (*sent_hw, 3) and sent.dtype == np.uint8 and spec.sent_hw(image_hw) == sent_hw


def test_sam1_resize_of_grayscale_equals_its_rgb_resize():
    """SAM1's official transform resizes RGB; resizing one grey channel gives each channel of that."""
    spec = get_model("sam_vit_b")
    gray = np.random.default_rng(3).integers(0, 4096, (500, 700), dtype=np.uint16)
    rgb = np.repeat(to_uint8(gray)[..., None], 3, axis=2)
    assert np.array_equal(np.repeat(encoder_input(gray, spec), 3, axis=2), encoder_input(rgb, spec))


def test_a_huge_uint16_plane_becomes_an_encoder_input_without_float_copies():
    """20000x20000 uint16 (800 MB): numpy never holds more than a uint8 copy of the plane."""
    rng = np.random.default_rng(4)
    plane = np.zeros((20000, 20000), np.uint16)
    plane[::97, ::89] = rng.integers(0, 65536, plane[::97, ::89].shape, dtype=np.uint16)
    plane[5000:9000, 6000:12000] = 50000  # a bright object
    tracemalloc.start()
    try:
        result = encoder_input(plane, SAM2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.shape == (4096, 4096, 1) and result.dtype == np.uint8
    assert peak < 1.2 * plane.size  # a float32 copy would be 1.6 GB; the uint8 plane is 400 MB
    y0, y1, x0, x1 = (round(v * 4096 / 20000) for v in (5000, 9000, 6000, 12000))
    assert (result[y0 + 2 : y1 - 2, x0 + 2 : x1 - 2] == round(50000 * 255 / plane.max())).all()
