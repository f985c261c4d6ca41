import tracemalloc

import numpy as np
import pytest

from triton_sam.errors import InvalidInputError
from triton_sam.image import model_input, resize_square, to_rgb_uint8


def test_uint8_rgb_is_used_as_is():
    image = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    assert np.array_equal(to_rgb_uint8(image), image)


def test_grayscale_is_repeated_and_rgba_drops_alpha():
    gray = np.arange(12, dtype=np.uint8).reshape(3, 4)
    rgb = to_rgb_uint8(gray)
    assert rgb.shape == (3, 4, 3) and all(np.array_equal(rgb[..., c], gray) for c in range(3))
    rgba = np.dstack([rgb, np.full((3, 4), 7, np.uint8)])
    assert np.array_equal(to_rgb_uint8(rgba), rgb)
    assert np.array_equal(to_rgb_uint8(gray[..., None]), rgb)


def test_uint16_and_float_are_scaled_from_min_max_or_contrast_limits():
    image = np.array([[100, 1100], [600, 1100]], np.uint16)
    assert to_rgb_uint8(image)[..., 0].tolist() == [[0, 255], [128, 255]]
    limited = to_rgb_uint8(image, contrast_limits=(100, 600))
    assert limited[..., 0].tolist() == [[0, 255], [255, 255]]
    floats = np.array([[-1.0, 1.0]], np.float32)
    assert to_rgb_uint8(floats)[0, :, 0].tolist() == [0, 255]


def test_bool_and_constant_images():
    assert to_rgb_uint8(np.array([[True, False]]))[0, :, 0].tolist() == [255, 0]
    assert to_rgb_uint8(np.full((2, 2), 5.0)).max() == 0


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
        to_rgb_uint8(image)


def test_resize_square_matches_torchvision_antialiased_resize():
    torch = pytest.importorskip("torch")
    from torchvision.transforms import Resize

    image = np.random.default_rng(1).integers(0, 256, (300, 2100, 3), dtype=np.uint8)
    tensor = torch.from_numpy(image).permute(2, 0, 1).float()
    reference = Resize((1024, 1024), antialias=True)(tensor).permute(1, 2, 0).numpy()
    ours = resize_square(image, 1024)
    assert ours.shape == (1024, 1024, 3) and ours.dtype == np.uint8
    assert np.abs(ours - reference).max() <= 0.5 + 1e-3  # rounding to whole grey levels only
    fine = resize_square(image, 1024, steps=128)  # SAM3's input: 1/128 grey levels
    assert fine.dtype == np.int16 and fine.max() <= 255 * 128
    assert np.abs(fine / 128 - reference).max() <= 0.5 / 128 + 1e-3


def test_fine_steps_of_an_image_already_at_size_are_exact():
    image = np.random.default_rng(4).integers(0, 256, (64, 64), dtype=np.uint8)
    assert resize_square(image, 64) is image
    assert np.array_equal(resize_square(image, 64, steps=128), image.astype(np.int16) * 128)
    assert np.array_equal(model_input(image, 64, steps=128)[..., 2], image.astype(np.int16) * 128)


def test_scaling_in_blocks_of_rows_equals_scaling_at_once(monkeypatch):
    image = np.random.default_rng(2).integers(0, 65536, (301, 203), dtype=np.uint16)
    whole = to_rgb_uint8(image, contrast_limits=(1000, 60000))
    monkeypatch.setattr("triton_sam.image._BLOCK_PIXELS", 203 * 7)  # 43 blocks of 7 rows
    assert np.array_equal(to_rgb_uint8(image, contrast_limits=(1000, 60000)), whole)


def test_grayscale_model_input_equals_the_rgb_path():
    gray = np.random.default_rng(3).integers(0, 4096, (500, 700), dtype=np.uint16)
    assert np.array_equal(model_input(gray, 256), resize_square(to_rgb_uint8(gray), 256))


def test_a_huge_uint16_plane_becomes_a_model_input_without_float_copies(monkeypatch):
    """20000x20000 uint16 (800 MB): numpy never holds more than a uint8 copy of the plane."""
    rng = np.random.default_rng(4)
    plane = np.zeros((20000, 20000), np.uint16)
    plane[::97, ::89] = rng.integers(0, 65536, plane[::97, ::89].shape, dtype=np.uint16)
    plane[5000:9000, 6000:12000] = 50000  # a bright object
    tracemalloc.start()
    try:
        result = model_input(plane, 1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.shape == (1024, 1024, 3) and result.dtype == np.uint8
    assert peak < 1.2 * plane.size  # a float32 copy would be 1.6 GB; the uint8 plane is 400 MB
    y0, y1, x0, x1 = (round(v * 1024 / 20000) for v in (5000, 9000, 6000, 12000))
    assert (result[y0 + 2 : y1 - 2, x0 + 2 : x1 - 2] == round(50000 * 255 / plane.max())).all()
    # Resizing from uint8 stays within a grey level of the float path (checked on a smaller copy).
    small = plane[:4200, :4200]
    monkeypatch.setattr("triton_sam.image.LARGE_PLANE_PIXELS", 10**9)
    exact = model_input(small, 1024).astype(int)
    monkeypatch.undo()
    assert np.abs(model_input(small, 1024).astype(int) - exact).max() <= 1
