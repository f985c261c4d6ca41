import numpy as np
import pytest

from triton_sam.masks import upsample_logits


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
