import numpy as np
import pytest

from triton_sam.masks import MaskResizer, fill_holes
from triton_sam.registry import get_model


@pytest.fixture(scope="module")
def sam2_resizer():
    return MaskResizer(get_model("sam2.1_hiera_tiny"))


@pytest.mark.parametrize("size", [(777, 1311), (100, 50), (256, 256), (1, 3), (2100, 900)])
def test_logits_match_pytorch_bilinear(sam2_resizer, size):
    torch = pytest.importorskip("torch")
    logits = (np.random.default_rng(0).standard_normal((2, 3, 256, 256)) * 8).astype(np.float32)
    reference = torch.nn.functional.interpolate(torch.from_numpy(logits), size, mode="bilinear", align_corners=False).numpy()
    ours = sam2_resizer.logits(logits, size)
    assert ours.shape == (2, 3, *size) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, reference, atol=2e-3)
    masks = sam2_resizer.masks(logits, size, threshold=0.5)
    assert masks.dtype == np.bool_
    clear = np.abs(reference - 0.5) > 2e-3  # pixels whose side of the threshold rounding cannot change
    assert np.array_equal(masks[clear], reference[clear] > 0.5)


@pytest.mark.parametrize("model", ["sam2.1_hiera_tiny", "sam_vit_b", "sam3_tracker"])
@pytest.mark.parametrize("image_hw", [(777, 1311), (4096, 4096), (300, 2500), (100, 50)])
def test_an_object_mask_is_the_whole_image_mask_computed_only_around_the_object(model, image_hw):
    """Coarse tiles of large planes are committed this way; it must equal `masks` except where
    float rounding decides (logits within 1e-4 of the threshold)."""
    spec = get_model(model)
    resizer = MaskResizer(spec)
    n = spec.low_res_size
    rng = np.random.default_rng(4)
    yy, xx = np.mgrid[:n, :n]
    blob = np.where((yy - 100) ** 2 + (xx - 60) ** 2 < 900, 5.0, -5.0) + rng.normal(0, 1, (n, n))
    noisy = rng.normal(-3, 2, (n, n))  # scattered specks
    for low_res in (blob.astype(np.float32), noisy.astype(np.float32), np.full((n, n), -1.0, np.float32)):
        expected = resizer.masks(low_res, image_hw)
        crop, (y, x) = resizer.object_mask(low_res, image_hw)
        placed = np.zeros(image_hw, bool)
        placed[y : y + crop.shape[0], x : x + crop.shape[1]] = crop
        differ = placed != expected
        assert np.all(np.abs(resizer.logits(low_res, image_hw)[differ]) < 1e-4)
        assert crop.size == 0 or (crop[0].any() and crop[-1].any() and crop[:, 0].any() and crop[:, -1].any())


def test_leading_axes_are_kept_and_a_constant_stays_constant(sam2_resizer):
    assert sam2_resizer.masks(np.zeros((3, 256, 256), np.float32), (40, 30)).shape == (3, 40, 30)
    np.testing.assert_allclose(sam2_resizer.logits(np.full((256, 256), 3.0, np.float32), (31, 47)), 3.0, rtol=1e-6)


def test_sam1_masks_go_through_the_padded_input_as_the_official_postprocessing():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    spec = get_model("sam_vit_b")
    resizer = MaskResizer(spec)
    logits = (np.random.default_rng(2).standard_normal((1, 3, 256, 256)) * 8).astype(np.float32)
    for image_hw in [(300, 400), (2100, 1500), (7, 1000)]:
        h, w = spec.input_hw(image_hw)  # `Sam.postprocess_masks`: to 1024x1024, crop, to the image
        padded = F.interpolate(torch.from_numpy(logits), (1024, 1024), mode="bilinear", align_corners=False)
        reference = F.interpolate(padded[..., :h, :w], image_hw, mode="bilinear", align_corners=False)
        np.testing.assert_allclose(resizer.logits(logits, image_hw), reference.numpy(), atol=2e-3)


def test_sam3_fills_small_holes_as_its_official_postprocessing():
    """Holes of <= 256 low-res pixels become mask before upsampling (`SAM3InteractiveImagePredictor`'s
    default `max_hole_area`); larger holes and the masks' outsides stay as they are."""
    torch = pytest.importorskip("torch")
    sam1_utils = pytest.importorskip("sam3.model.utils.sam1_utils")
    spec = get_model("sam3_tracker")
    resizer = MaskResizer(spec)
    rng = np.random.default_rng(3)
    logits = np.full((1, 3, 288, 288), 5.0, np.float32)
    logits[:, :, :40, :] = -5.0  # background along the top: 11520 pixels, kept
    logits[0, 0, 100:110, 100:110] = -3.0  # a 100-pixel hole: filled
    logits[0, 1, 100:117, 100:117] = -3.0  # 289 pixels: kept
    logits[0, 2, 150:160, 150:160] = -3.0  # two holes touching at a corner (8-connected): 200 pixels, filled
    logits[0, 2, 160:170, 160:170] = -3.0
    logits += rng.normal(0, 0.5, logits.shape).astype(np.float32)
    official = sam1_utils.SAM2Transforms(resolution=1008, mask_threshold=0.0, max_hole_area=spec.fill_hole_area)
    for image_hw in [(777, 1311), (288, 288)]:
        reference = official.postprocess_masks(torch.from_numpy(logits), image_hw).numpy()
        np.testing.assert_allclose(resizer.logits(logits, image_hw), reference, atol=2e-3)
    low = resizer.masks(logits, (288, 288))
    assert low[0, 0, 100:110, 100:110].all() and not low[0, 1, 100:117, 100:117].any()
    assert low[0, 2, 150:170, 150:170].sum() == 400 and not low[0, 0, :40].any()


def test_holes_up_to_the_area_are_filled_with_the_value_asked_for():
    low_res = np.full((1, 1, 16, 16), 5.0, np.float32)
    low_res[0, 0, 2:4, 2:4] = -3.0  # a 4-pixel hole
    low_res[0, 0, 8:12, 8:12] = -3.0  # a 16-pixel hole
    filled = fill_holes(low_res, 8, value=0.1)  # SAM2's video predictor fills with 0.1
    assert np.all(filled[0, 0, 2:4, 2:4] == np.float32(0.1)) and np.all(filled[0, 0, 8:12, 8:12] == -3.0)
    assert np.all(fill_holes(low_res, 8)[0, 0, 2:4, 2:4] == 10.0)  # the image predictors' threshold + 10
    assert low_res[0, 0, 2, 2] == -3.0  # the input is left as it was
