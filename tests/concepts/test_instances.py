"""The detector's outputs become instances as `Sam3Processor._forward_grounding` makes them (torch's
bilinear `interpolate`, sam3's box conversion), here without the model; masks cropped to their
positive logits grown by one sample give the same masks."""

from __future__ import annotations

import numpy as np
import pytest

from triton_sam import contract
from triton_sam.concepts.instances import found_answered, instances, label_image
from triton_sam.server.models.triton_sam_arrays import concept_answer, resized


@pytest.mark.parametrize("size_hw", [(300, 700), (517, 211), (288, 288), (40, 1000)])
def test_masks_resize_as_torch_bilinear_interpolate(size_hw):
    torch = pytest.importorskip("torch")
    maps = np.random.default_rng(0).normal(0, 1, (3, 288, 288)).astype(np.float32)
    expected = torch.nn.functional.interpolate(torch.from_numpy(maps)[:, None], size_hw, mode="bilinear", align_corners=False)
    assert np.abs(resized(maps, size_hw) - expected[:, 0].numpy()).max() < 1e-6  # to the float32 rounding of the sums


def found_in(detections: tuple, floor: float):
    """The `Found` of a concept request's answer to the detector's outputs (boxes, logits, masks, presence)."""
    return found_answered(dict(zip(contract.CONCEPT_OUTPUTS, concept_answer(*detections, floor))), floor)


def test_instances_above_the_threshold_with_pixel_boxes_and_masks():
    boxes = np.array([[[0.5, 0.5, 0.2, 0.4], [0.25, 0.75, 0.5, 0.5], [0.1, 0.1, 0.1, 0.1]]], np.float32)
    masks = np.full((1, 3, 288, 288), -10, np.float32)
    masks[0, 0, :144] = 10  # the top half
    detections = (boxes, np.array([[3.0, 0.5, -2.0]], np.float32), masks, np.array([[2.0]], np.float32))
    found = instances(found_in(detections, -np.inf), 0.5, (100, 200))
    presence = 1 / (1 + np.exp(-2.0))
    np.testing.assert_allclose(found["scores"], presence / (1 + np.exp([-3.0, -0.5])), rtol=1e-6)
    np.testing.assert_allclose(found["boxes"], [[80, 30, 120, 70], [0, 50, 100, 100]], atol=1e-4)
    assert found["masks"].shape == (2, 1, 100, 200) and found["masks"].dtype == bool
    assert found["masks"][0, 0, :50].all() and not found["masks"][0, 0, 50:].any() and not found["masks"][1].any()
    assert len(instances(found_in(detections, -np.inf), 0.99, (100, 200))["masks"]) == 0


@pytest.mark.parametrize("size_hw", [(300, 700), (517, 211), (40, 1000), (1000, 97)])
def test_masks_from_crops_equal_masks_resized_whole(size_hw):
    """The crops a Triton server sends (positive logits' box grown by 1) resized with the outside
    weighing 0: the same masks as the whole logits resized, and the same probabilities where on."""
    rng = np.random.default_rng(sum(size_hw))
    masks = np.full((1, 4, 288, 288), -5.0, np.float32) + rng.normal(0, 1, (1, 4, 288, 288)).astype(np.float32)
    masks[0, 0, 100:140, 7:60] += 8  # a blob; query 1 a few specks, 2 touching the edges, 3 nothing
    masks[0, 1, [3, 200, 287], [280, 5, 150]] = [1.0, 0.01, 3.0]
    masks[0, 2, :20, 270:] += 9
    boxes = np.tile([0.5, 0.5, 0.2, 0.2], (1, 4, 1)).astype(np.float32)
    detections = (boxes, np.full((1, 4), 2.0, np.float32), masks, np.array([[5.0]], np.float32))
    ours = instances(found_in(detections, 0.5), 0.5, size_hw)
    whole = 1 / (1 + np.exp(-resized(masks[0], size_hw)))
    assert ours["masks"].shape == (4, 1, *size_hw) and (ours["masks"][:, 0] == (whole > 0.5)).all()
    assert ours["masks"][[0, 2]].any(axis=(1, 2, 3)).all() and not ours["masks"][3].any()  # (specks may fall between pixels)
    assert (ours["masks_logits"][:, 0][whole > 0.5] == whole[whole > 0.5]).all()
    with pytest.raises(ValueError, match="below the floor"):
        instances(found_in(detections, 0.5), 0.4, size_hw)


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
