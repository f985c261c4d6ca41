"""Instance segmentation with micro-sam's decoder: our path (export -> ONNX Runtime -> our
watershed) against micro-sam's `InstanceSegmentationWithDecoder` with the same random weights, and
tiled (`TiledInstanceSegmenter`) against its `TiledInstanceSegmentationWithDecoder`.

vit_b_lm's files are random (seeded) and written as micro-sam publishes them (`vit_b_lm_export`:
the SAM's state dict, and torch_em's UNETR initialisation in a separate `*_decoder.pt`), exported
through `triton-sam export --decoder`. Random weights give nearly flat maps, so the thresholds are
taken from micro-sam's own maps (their medians, `median_thresholds`) to give many objects.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from benchmarks.instance import matched_ious, median_thresholds, micro_sams_segmenter
from triton_sam.instance import InstanceSegmenter, TiledInstanceSegmenter
from triton_sam.predictor import Predictor

IMAGE_HW = (320, 384)
TILE_SHAPE, HALO = (160, 192), (32, 32)  # 2 x 2 tiles of IMAGE_HW, each encoded at 1024 x 1024: 4 encodes a side


def blob_image() -> np.ndarray:
    """A grey uint8 plane of blurred blobs (micro-sam's users pass 2-D planes)."""
    blobs = ndimage.gaussian_filter(np.random.default_rng(0).random(IMAGE_HW), 6)
    return (255 * (blobs - blobs.min()) / np.ptp(blobs)).astype(np.uint8)


def test_instance_segmentation_equals_micro_sams(vit_b_lm_export):
    checkpoint, decoder, repository = vit_b_lm_export
    image = blob_image()
    theirs = micro_sams_segmenter(checkpoint, decoder, "vit_b_lm")
    theirs.initialize(image)
    ours = InstanceSegmenter(Predictor("vit_b_lm", model_repository=repository))
    ours.initialize(image)

    assert_same_segmentation(theirs, ours)


@pytest.mark.skip(
    reason="open (#41): the first tile's maps agree (1.1e-4), the other three differ from micro-sam's by up to 0.28 "
    "(97% of their pixels over 1e-3). Not the tiling: micro-sam's tiled equals its untiled on tile 1's crop "
    "(image[0:192, 160:384]) exactly, our untiled InstanceSegmenter differs from it there by 0.185; ~145 s on 2 cores"
)
def test_tiled_instance_segmentation_equals_micro_sams(vit_b_lm_export):
    """Tiles with a halo as micro-sam's, stitched and segmented whole: as close to micro-sam's as
    untiled (its 2 x 2 tiles of 192 x 224 pixels with their halos, each encoded alone); tiles are encoded once."""
    checkpoint, decoder, repository = vit_b_lm_export
    image = blob_image()
    theirs = micro_sams_segmenter(checkpoint, decoder, "vit_b_lm", is_tiled=True)
    theirs.initialize(image, tile_shape=TILE_SHAPE, halo=HALO)
    ours = TiledInstanceSegmenter(Predictor("vit_b_lm", model_repository=repository))
    steps = list(ours.initialize_steps(image, tile_shape=TILE_SHAPE, halo=HALO))
    assert steps == [(1, 4), (2, 4), (3, 4), (4, 4)] and ours.cache.misses == 4  # a tile a batch locally

    assert_same_segmentation(theirs, ours)
    ours.initialize(image, tile_shape=TILE_SHAPE, halo=HALO)
    assert ours.cache.misses == 4  # each tile encoded once


def assert_same_segmentation(theirs, ours) -> None:
    """Maps within float32 noise of micro-sam's; our watershed on micro-sam's maps gives its labels.

    End to end, the maps' ~1.4e-4 differences (float32 sums through vit_b) move a tiny seed or two
    across thresholds cut through random weights' flat maps: micro-sam's own post-processing on our
    maps gives our count (353 vs 354 measured untiled), so there the count may differ by 1%.
    """
    their_maps, our_maps = theirs.get_state(), ours.get_state()
    for name, their_map in their_maps.items():
        difference = np.abs(our_maps[name] - their_map).max()
        print(f"{name}: max abs diff {difference:.2e}")
        assert difference < 1e-3, name

    parameters = median_thresholds(their_maps)
    their_labels = theirs.generate(**parameters)
    ours.set_state(their_maps)
    on_their_maps = ours.generate(**parameters)
    ious = matched_ious(on_their_maps, their_labels)
    print(f"on micro-sam's maps: {on_their_maps.max()} objects (its {their_labels.max()}), min matched IoU {ious.min():.4f}")
    assert on_their_maps.max() == their_labels.max() > 100
    assert ious.min() >= 0.99

    ours.set_state(our_maps)
    our_labels = ours.generate(**parameters)
    ious = matched_ious(our_labels, their_labels)
    print(f"end to end: {our_labels.max()} objects, {np.mean(ious >= 0.99):.3f} of them matched with IoU >= 0.99")
    assert abs(int(our_labels.max()) - int(their_labels.max())) <= 0.01 * their_labels.max()
    assert np.mean(ious >= 0.99) >= 0.95
