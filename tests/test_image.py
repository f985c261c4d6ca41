import math
import tracemalloc

import numpy as np
import pytest

from synthetic import ReadLog
from triton_sam.errors import InvalidInputError
from triton_sam.image import ArrayView, encoder_input, lazy_index, read_window, stretch_channels, to_uint8
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


@pytest.mark.parametrize(
    "image",
    [
        np.random.default_rng(0).integers(20, 200, (50, 60), dtype=np.uint8),  # uint8 not spanning 0..255
        np.random.default_rng(1).integers(3, 90, (30, 20, 4), dtype=np.uint8),  # RGBA
        np.random.default_rng(2).random((40, 30, 3)).astype(np.float32) * 1000,
        np.random.default_rng(3).integers(0, 60000, (30, 20, 1), dtype=np.uint16),
    ],
    ids=["uint8", "rgba", "float", "uint16"],
)
def test_micro_sam_models_get_each_channel_stretched_as_micro_sam_does(image):
    """micro-sam stretches every plane (and tile) it encodes, uint8 too (`_to_image`): its models
    get the same bytes here, the raw plane's when no contrast limits are given."""
    util = pytest.importorskip("micro_sam.util")
    theirs = util._to_image(image)  # always three channels
    ours = stretch_channels(image)
    assert np.array_equal(np.repeat(ours[..., None], 3, -1) if ours.ndim == 2 else ours, theirs)
    spec = get_model("vit_b_lm")
    assert spec.channel_stretch and not get_model("sam_vit_b").channel_stretch
    sent = encoder_input(image, spec)
    assert np.array_equal(sent, encoder_input(ours, get_model("sam_vit_b")))


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


def _block_mean(array: np.ndarray, factor: int) -> np.ndarray:
    """Each factor x factor block's mean, one block at a time (the plain definition)."""
    rows, cols = -(-array.shape[0] // factor), -(-array.shape[1] // factor)
    means = np.empty((rows, cols, *array.shape[2:]))
    for r in range(rows):
        for c in range(cols):
            means[r, c] = array[r * factor : (r + 1) * factor, c * factor : (c + 1) * factor].mean(axis=(0, 1))
    return means


def test_a_window_within_the_side_limit_is_read_as_it_is():
    plane = ReadLog(np.random.default_rng(6).integers(0, 65536, (300, 400), dtype=np.uint16))
    window = read_window(plane, 10, 210, 30, 330, max_side=300)
    assert np.array_equal(window, plane.array[10:210, 30:330]) and plane.reads == [(slice(10, 210), slice(30, 330))]


@pytest.mark.parametrize(
    "array",
    [
        np.random.default_rng(7).integers(0, 65536, (203, 157), dtype=np.uint16),
        np.random.default_rng(8).integers(0, 256, (203, 157, 3), dtype=np.uint8),
        np.random.default_rng(9).normal(0, 1, (203, 157)).astype(np.float32),
    ],
    ids=["uint16", "rgb uint8", "float32"],
)
def test_a_window_over_the_side_limit_is_reduced_to_block_means_a_band_of_rows_at_a_time(monkeypatch, array):
    """203 x 157 within 50 px a side: 5 x 5 blocks (the last row and column of blocks smaller), read
    in bands of 10 rows (two block rows each), in the plane's dtype."""
    values = 157 * math.prod(array.shape[2:])
    monkeypatch.setattr("triton_sam.image._BAND_BYTES", 2 * (5 * values * array.itemsize + values * 8))
    plane = ReadLog(array)
    window = read_window(plane, 0, 203, 0, 157, max_side=50)
    expected = _block_mean(array, 5)
    assert window.shape == (41, 32, *array.shape[2:]) and window.dtype == array.dtype
    if array.dtype.kind == "f":
        np.testing.assert_allclose(window, expected, rtol=1e-5, atol=1e-6)
    else:
        assert np.array_equal(window, np.rint(expected))
    assert plane.reads == [(slice(y, min(y + 10, 203)), slice(0, 157)) for y in range(0, 203, 10)]


def test_a_reduced_bool_window_keeps_blocks_mostly_set():
    array = np.zeros((40, 40), bool)
    array[:20, :] = True
    array[20:23, :] = True  # 3 of 4 rows of the next block row: mostly set
    window = read_window(array, 0, 40, 0, 40, max_side=10)
    assert window.dtype == np.bool_ and window[:6].all() and not window[6:].any()


def test_a_zoomed_out_tile_of_a_huge_plane_is_read_without_holding_its_window():
    """A 16384-px window of a 20000x20000 uint16 plane (512 MB) read within 4096 px: 4 x 4 block
    means, in memory near the 32 MB result."""
    plane = np.zeros((20000, 20000), np.uint16)
    plane[5000:9000, 6000:12000] = 50000  # a bright object
    plane[1:4096:8, 2:4096:8] = 4000  # one pixel in each of some 4 x 4 blocks
    tracemalloc.start()
    try:
        window = read_window(plane, 0, 16384, 0, 16384, max_side=4096)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert window.shape == (4096, 4096) and window.dtype == np.uint16 and peak < 3 * window.nbytes
    assert (window[1250:2250, 1500:3000] == 50000).all() and window[1249, 1500:3000].max() == 0
    assert (window[0:1024:2, 0:1024:2] == 250).all() and (window[1:1024:2, :1024] == 0).all()


def test_a_view_of_a_lazy_array_reads_only_what_it_is_indexed_with():
    """A plane of a stack, or a stack through a 4-D array, read a window or a plane at a time:
    zarr reads whatever it is indexed with at once."""
    data = np.arange(3 * 4 * 20 * 30, dtype=np.uint16).reshape(3, 4, 20, 30)
    log = ReadLog(data)
    plane = lazy_index(log, (2, 1))
    assert isinstance(plane, ArrayView) and plane.shape == (20, 30) and plane.dtype == np.uint16 and log.reads == []
    np.testing.assert_array_equal(plane[5:9, ::7], data[2, 1, 5:9, ::7])
    assert log.reads == [(2, 1, slice(5, 9), slice(None, None, 7))]
    stack = ArrayView(log, (2, slice(None)))  # the planes through t = 2 along z
    assert stack.shape == (4, 20, 30) and stack.ndim == 3
    np.testing.assert_array_equal(stack[3], data[2, 3])
    np.testing.assert_array_equal(stack[1:3, ..., 4], data[2, 1:3, :, 4])
    np.testing.assert_array_equal(np.asarray(stack), data[2])
    assert log.reads[1:] == [(2, 3), (2, slice(1, 3), slice(None), 4), (2, slice(None))]
    assert np.shares_memory(lazy_index(data, (0,)), data)  # numpy: a view, as before
