import numpy as np
import pytest

from triton_sam.masks import image_logits, upsample_logits
from triton_sam.registry import get_model


@pytest.mark.parametrize("size", [(777, 1311), (100, 50), (256, 256), (1, 3), (2100, 900)])
def test_upsample_matches_pytorch_bilinear(size):
    torch = pytest.importorskip("torch")
    logits = (np.random.default_rng(0).standard_normal((2, 3, 256, 256)) * 8).astype(np.float32)
    ours = upsample_logits(logits, size)
    reference = torch.nn.functional.interpolate(torch.from_numpy(logits), size, mode="bilinear", align_corners=False)
    assert ours.shape == (2, 3, *size)
    np.testing.assert_allclose(ours, reference.numpy(), atol=1e-3)


def test_upsample_of_a_constant_is_constant():
    assert np.all(upsample_logits(np.full((256, 256), 3.0, np.float32), (31, 47)) == 3.0)


def test_sam1_masks_go_through_the_padded_input_as_the_official_postprocessing():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    spec = get_model("sam_vit_b")
    logits = (np.random.default_rng(2).standard_normal((1, 3, 256, 256)) * 8).astype(np.float32)
    for image_hw in [(300, 400), (2100, 1500), (7, 1000)]:
        h, w = spec.input_hw(image_hw)  # `Sam.postprocess_masks`: to 1024x1024, crop, to the image
        padded = F.interpolate(torch.from_numpy(logits), (1024, 1024), mode="bilinear", align_corners=False)
        reference = F.interpolate(padded[..., :h, :w], image_hw, mode="bilinear", align_corners=False)
        np.testing.assert_allclose(image_logits(logits, image_hw, spec), reference.numpy(), atol=1e-3)


def test_sam3_fills_small_holes_as_its_official_postprocessing():
    """Holes of <= 256 low-res pixels become mask before upsampling (`SAM3InteractiveImagePredictor`'s
    default `max_hole_area`); larger holes and the masks' outsides stay as they are."""
    torch = pytest.importorskip("torch")
    sam1_utils = pytest.importorskip("sam3.model.utils.sam1_utils")
    spec = get_model("sam3_tracker")
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
        ours = image_logits(logits, image_hw, spec)
        np.testing.assert_allclose(ours, reference, atol=1e-3)
    low = image_logits(logits, (288, 288), spec) > 0
    assert low[0, 0, 100:110, 100:110].all() and not low[0, 1, 100:117, 100:117].any()
    assert low[0, 2, 150:170, 150:170].sum() == 400 and not low[0, 0, :40].any()
