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
