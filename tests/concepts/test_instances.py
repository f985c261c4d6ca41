"""The detector's outputs become instances as `Sam3Processor._forward_grounding` makes them (torch's
bilinear `interpolate`, sam3's box conversion), here without the model."""

from __future__ import annotations

import numpy as np
import pytest

from triton_sam.concepts.instances import Detections, instances, label_image, resize_bilinear


@pytest.mark.parametrize("size_hw", [(300, 700), (517, 211), (288, 288), (40, 1000)])
def test_masks_resize_as_torch_bilinear_interpolate(size_hw):
    torch = pytest.importorskip("torch")
    maps = np.random.default_rng(0).normal(0, 1, (3, 288, 288)).astype(np.float32)
    expected = torch.nn.functional.interpolate(torch.from_numpy(maps)[:, None], size_hw, mode="bilinear", align_corners=False)
    assert np.abs(resize_bilinear(maps, size_hw) - expected[:, 0].numpy()).max() < 1e-4


def test_instances_above_the_threshold_with_pixel_boxes_and_masks():
    boxes = np.array([[[0.5, 0.5, 0.2, 0.4], [0.25, 0.75, 0.5, 0.5], [0.1, 0.1, 0.1, 0.1]]], np.float32)
    masks = np.full((1, 3, 288, 288), -10, np.float32)
    masks[0, 0, :144] = 10  # the top half
    detections = Detections(boxes, np.array([[3.0, 0.5, -2.0]], np.float32), masks, np.array([[2.0]], np.float32))
    found = instances(detections, 0.5, (100, 200))
    presence = 1 / (1 + np.exp(-2.0))
    np.testing.assert_allclose(found["scores"], presence / (1 + np.exp([-3.0, -0.5])), rtol=1e-6)
    np.testing.assert_allclose(found["boxes"], [[80, 30, 120, 70], [0, 50, 100, 100]], atol=1e-4)
    assert found["masks"].shape == (2, 1, 100, 200) and found["masks"].dtype == bool
    assert found["masks"][0, 0, :50].all() and not found["masks"][0, 0, 50:].any() and not found["masks"][1].any()
    assert len(instances(detections, 0.99, (100, 200))["masks"]) == 0


def test_label_image_numbers_by_score_and_never_paints_over_labels():
    masks = np.zeros((3, 1, 10, 10), bool)
    masks[0, 0, :4, :4] = True  # overlaps the best one
    masks[1, 0, 2:6, 2:6] = True  # the best
    masks[2, 0, 7:, 7:] = True  # labelled already, all but one pixel
    scores = np.array([0.6, 0.9, 0.7])
    labels = label_image(masks, scores)
    assert labels.dtype == np.uint16 and labels[3, 3] == 1 and labels[0, 0] == 3 and labels[9, 9] == 2
    labelled = np.zeros((10, 10), bool)
    labelled[7:, 7:] = True
    labelled[7, 7] = False
    labelled[0, 0] = True
    kept = label_image(masks, scores, labelled)
    assert not kept[7:, 7:].any() and kept[0, 0] == 0 and kept[0, 1] == 3 and kept[3, 3] == 1
