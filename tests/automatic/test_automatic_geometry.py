"""The generator's building blocks against sam2's own (`sam2.utils.amg`) and torchvision's NMS, on
random inputs; and what the small-region clean-ups and the label image do."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import require_export_extra
from triton_sam.automatic import FoundMask, label_image
from triton_sam.automatic.geometry import box_nms, crop_boxes, layer_point_grids, mask_box, near_crop_edge
from triton_sam.automatic.records import remove_small_regions, rle_decode, rle_encode
from triton_sam.masks import remove_holes_and_specks


@pytest.fixture(scope="module")
def amg():
    require_export_extra()
    from sam2.utils import amg

    return amg


def test_point_grids_and_crop_boxes_are_sam2s(amg):
    for side, layers, downscale in ((32, 0, 1), (8, 2, 2), (5, 1, 1)):
        ours = layer_point_grids(side, layers, downscale)
        theirs = amg.build_all_layer_point_grids(side, layers, downscale)
        assert len(ours) == len(theirs) and all(np.array_equal(a, b) for a, b in zip(ours, theirs))
    for shape in ((303, 384), (777, 1311), (64, 2000)):
        for layers in (0, 1, 2):
            boxes, layer_ids = amg.generate_crop_boxes(shape, layers, 512 / 1500)
            assert crop_boxes(shape, layers, 512 / 1500) == [(tuple(b), i) for b, i in zip(boxes, layer_ids)]


def test_mask_boxes_edges_and_rle_are_sam2s(amg):
    import torch

    rng = np.random.default_rng(0)
    masks = np.zeros((6, 40, 50), bool)
    for mask in masks[1:]:  # the first stays empty
        y, x = rng.integers(0, 35), rng.integers(0, 45)
        mask[y : y + rng.integers(1, 6), x : x + rng.integers(1, 6)] = True
        mask[rng.integers(0, 40), rng.integers(0, 50)] = True
    theirs = amg.batched_mask_to_box(torch.as_tensor(masks)).numpy()
    ours = np.array([mask_box(mask) for mask in masks])
    assert np.array_equal(ours, theirs)
    crop, image_box = (10, 5, 40, 35), (0, 0, 50, 40)
    expected = amg.is_box_near_crop_edge(torch.as_tensor(ours), list(crop), list(image_box)).numpy()
    shifted = ours + np.array([crop[0], crop[1], crop[0], crop[1]])
    assert np.array_equal(near_crop_edge(shifted, crop, image_box), expected)
    for mask, rle in zip(masks, amg.mask_to_rle_pytorch(torch.as_tensor(masks)), strict=True):
        assert rle_encode(mask) == rle
        assert np.array_equal(rle_decode(rle), mask)


def test_box_nms_keeps_what_torchvision_keeps_in_its_order():
    require_export_extra()
    import torch
    from torchvision.ops import nms

    rng = np.random.default_rng(1)
    corners = rng.integers(0, 100, size=(300, 2, 2))
    boxes = np.concatenate([corners.min(axis=1), corners.max(axis=1)], axis=1).astype(np.float32)
    for scores in (rng.random(300).astype(np.float32), np.repeat(rng.random(30), 10).astype(np.float32)):  # ties too
        for threshold in (0.3, 0.7):
            expected = nms(torch.as_tensor(boxes), torch.as_tensor(scores), threshold).numpy()
            assert np.array_equal(box_nms(boxes, scores, threshold), expected)


def test_small_holes_are_filled_and_small_islands_dropped():
    mask = np.zeros((30, 30), bool)
    mask[5:25, 5:25] = True
    mask[10:12, 10:12] = False  # a 4-pixel hole
    mask[0, 0] = True  # a 1-pixel island
    filled, changed = remove_small_regions(mask, 5, holes=True)
    assert changed and filled[10:12, 10:12].all() and filled[0, 0]
    cleaned, changed = remove_small_regions(filled, 5, holes=False)
    assert changed and not cleaned[0, 0] and cleaned[5:25, 5:25].all()
    assert remove_small_regions(cleaned, 5, holes=True) == (cleaned, False)

    logits = np.where(mask, 3.0, -3.0).astype(np.float32)[None]
    low_res = remove_holes_and_specks(logits, 5)[0]
    assert (low_res[10:12, 10:12] == 10.0).all() and low_res[0, 0] == -10.0  # as SAM2's postprocess_masks
    untouched = np.abs(low_res) != 10.0
    assert np.count_nonzero(~untouched) == 5 and np.array_equal(low_res[untouched], logits[0][untouched])


def test_the_label_image_draws_small_objects_over_the_large_ones_that_hold_them():
    big = np.zeros((20, 20), bool)
    big[2:18, 2:18] = True
    small = np.zeros((20, 20), bool)
    small[5:8, 5:8] = True
    hidden = small.copy()  # the same pixels again: painted over entirely, its id is not kept

    def found(mask):
        scores = dict(predicted_iou=0.9, stability_score=0.9)
        return FoundMask.from_mask(mask, (0, 0), **scores, point=(0.0, 0.0), crop_box=(0, 0, 20, 20))

    labels = label_image([found(small), found(big), found(hidden)], (20, 20))
    assert set(np.unique(labels)) == {0, 1, 2}
    assert (labels[small] == 2).all() and (labels[big & ~small] == 1).all() and (labels[~big] == 0).all()
