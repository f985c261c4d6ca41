import numpy as np
import pytest

from triton_sam.errors import InvalidInputError
from triton_sam.image import resize_square, to_rgb_uint8


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
    ours = resize_square(image, 1024).astype(np.float32)
    tensor = torch.from_numpy(image).permute(2, 0, 1).float()
    reference = Resize((1024, 1024), antialias=True)(tensor).permute(1, 2, 0).numpy()
    assert ours.shape == (1024, 1024, 3)
    assert np.abs(ours - reference).max() <= 0.51 + 1e-3  # rounding to uint8 only
