"""Our post-processing against micro-sam's own `InstanceSegmentationWithDecoder.generate` on the same maps."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from triton_sam.instance import InstanceSegmenter, WatershedSettings, instance_labels

micro_sam_segmentation = pytest.importorskip("micro_sam.instance_segmentation")


def smooth_maps(shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    """Foreground, center and boundary maps in 0..1 that vary over ~10 pixels: many objects."""
    rng = np.random.default_rng(seed)
    maps = ndimage.gaussian_filter(rng.random((3, *shape)), (0, 4, 4))
    low, high = maps.min(axis=(1, 2), keepdims=True), maps.max(axis=(1, 2), keepdims=True)
    return ((maps - low) / (high - low)).astype(np.float32)


def micro_sam_labels(maps: np.ndarray, **parameters):
    segmenter = micro_sam_segmentation.InstanceSegmentationWithDecoder(None, None)
    segmenter.set_state(dict(zip(("foreground", "center_distances", "boundary_distances"), maps, strict=True)))
    return segmenter.generate(**parameters)


@pytest.mark.parametrize(
    "parameters",
    [
        {},  # micro-sam's defaults
        {"center_distance_threshold": 0.4, "boundary_distance_threshold": 0.45, "foreground_threshold": 0.35, "min_size": 30},
        {"foreground_smoothing": 0, "distance_smoothing": 0, "foreground_threshold": 0.3},
    ],
)
def test_labels_equal_micro_sams(parameters):
    maps = smooth_maps((300, 257))
    theirs = micro_sam_labels(maps, **parameters)
    ours = instance_labels(maps, WatershedSettings(**parameters))
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    assert ours.max() > 20
    np.testing.assert_array_equal(ours, theirs)


def test_binary_mask_records_are_micro_sams():
    """Our records of our labels are micro-sam's records of them (its `_to_masks`), as many as its own."""
    maps = smooth_maps((200, 240), seed=1)
    segmenter = InstanceSegmenter(predictor=None)
    segmenter.set_state(dict(zip(("foreground", "center_distances", "boundary_distances"), maps, strict=True)))
    ours = segmenter.generate(output_mode="binary_mask", foreground_threshold=0.3)
    labels = segmenter.generate(foreground_threshold=0.3)
    theirs = micro_sam_segmentation.InstanceSegmentationWithDecoder(None, None)._to_masks(labels, "binary_mask")
    assert len(ours) == len(theirs) == len(micro_sam_labels(maps, output_mode="binary_mask", foreground_threshold=0.3)) > 10
    for mine, other in zip(ours, theirs, strict=True):
        assert mine.keys() == other.keys()
        assert all(np.array_equal(mine[key], other[key]) for key in mine)
