"""Instance segmentation with micro-sam's decoder: our path (export -> ONNX Runtime -> our
watershed) against micro-sam's `InstanceSegmentationWithDecoder` with the same random weights, and
tiled (`TiledInstanceSegmenter`) against its `TiledInstanceSegmentationWithDecoder`.

vit_b_lm's files are random (seeded) and written as micro-sam publishes them (`vit_b_lm_export`:
the SAM's state dict, and torch_em's UNETR initialisation in a separate `*_decoder.pt`), exported
through `triton-sam export --decoder`. Random weights give nearly flat maps, so the thresholds are
taken from micro-sam's own maps (their medians, `median_thresholds`) to give many objects. The
same holds through a real Triton server, whose session model runs the decoder next to the
features it keeps; one server serves vit_b_lm and two synthetic micro-sam models it cannot
segment with (exported without the decoder, or before the server computed maps).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy import ndimage

from benchmarks.instance import matched_ious, median_thresholds, micro_sams_segmenter
from conftest import start_server
from synthetic import disk_image, write_repository
from triton_sam.errors import ServerModelError
from triton_sam.export import write_session_model
from triton_sam.instance import InstanceSegmenter, TiledInstanceSegmenter
from triton_sam.predictor import Predictor
from triton_sam.registry import get_model

IMAGE_HW = (320, 384)
MAP_TOLERANCE = 1e-3
TILE_SHAPE, HALO = (320, 192), (32, 32)  # 1 x 2 tiles of IMAGE_HW, each encoded at 1024 x 1024: 2 encodes a side


def blob_image() -> np.ndarray:
    """A grey uint8 plane of blurred blobs (micro-sam's users pass 2-D planes)."""
    blobs = ndimage.gaussian_filter(np.random.default_rng(0).random(IMAGE_HW), 6)
    return (255 * (blobs - blobs.min()) / np.ptp(blobs)).astype(np.uint8)


@pytest.fixture(scope="module")
def theirs(vit_b_lm_export):
    """micro-sam's `InstanceSegmentationWithDecoder`, initialized on the blob image."""
    checkpoint, decoder, _ = vit_b_lm_export
    segmenter = micro_sams_segmenter(checkpoint, decoder, "vit_b_lm")
    segmenter.initialize(blob_image())
    return segmenter


@pytest.fixture(scope="module")
def ours(vit_b_lm_export):
    """Our segmenter on the local engine, initialized on the blob image, and a copy of its maps."""
    with Predictor("vit_b_lm", model_repository=vit_b_lm_export[2]) as predictor:
        segmenter = InstanceSegmenter(predictor)
        segmenter.initialize(blob_image())
        yield segmenter, {name: array.copy() for name, array in segmenter.get_state().items()}


def assert_maps_close(maps: dict, expected: dict, label: str) -> None:
    for name, expected_map in expected.items():
        difference = np.abs(maps[name] - expected_map).max()
        print(f"{label}, {name}: max abs diff {difference:.2e}")
        assert maps[name].shape == expected_map.shape and difference < MAP_TOLERANCE, name


def assert_labels_as_micro_sams(segmenter: InstanceSegmenter, maps: dict, theirs) -> None:
    """Our watershed on `maps` gives micro-sam's objects on its own maps.

    End to end, the maps' ~1.4e-4 differences (float32 sums through vit_b) move a tiny seed or two
    across thresholds cut through random weights' flat maps: micro-sam's own post-processing on our
    maps gives our count (353 vs 354 measured), so there the count may differ by 1%.
    """
    parameters = median_thresholds(theirs.get_state())
    their_labels = theirs.generate(**parameters)
    segmenter.set_state(maps)
    our_labels = segmenter.generate(**parameters)
    ious = matched_ious(our_labels, their_labels)
    print(f"end to end: {our_labels.max()} objects, {np.mean(ious >= 0.99):.3f} of them matched with IoU >= 0.99")
    assert abs(int(our_labels.max()) - int(their_labels.max())) <= 0.01 * their_labels.max()
    assert np.mean(ious >= 0.99) >= 0.95


def test_tiled_instance_segmentation_equals_micro_sams(vit_b_lm_export):
    """Tiles with a halo as micro-sam's, stitched and segmented whole: as close to micro-sam's tiled
    segmenter as untiled (each tile stretched and encoded alone, as micro-sam does); each tile
    encoded once.

    First in the module: it needs none of the module's fixtures, and after them it ran beside
    their two vit_b models and the server (~7.7 GB): 15.1 GB in the test processes at its peak."""
    checkpoint, decoder, repository = vit_b_lm_export
    image = blob_image()
    theirs = micro_sams_segmenter(checkpoint, decoder, "vit_b_lm", is_tiled=True)
    theirs.initialize(image, tile_shape=TILE_SHAPE, halo=HALO)
    with Predictor("vit_b_lm", model_repository=repository) as predictor:
        ours = TiledInstanceSegmenter(predictor)
        steps = list(ours.initialize_steps(image, tile_shape=TILE_SHAPE, halo=HALO))
        assert steps == [(1, 2), (2, 2)] and ours.cache.misses == 2  # a tile a batch locally
        our_maps = {name: array.copy() for name, array in ours.get_state().items()}
        assert_maps_close(our_maps, theirs.get_state(), "tiled")
        assert_labels_as_micro_sams(ours, our_maps, theirs)
        ours.initialize(image, tile_shape=TILE_SHAPE, halo=HALO)
        assert ours.cache.misses == 2  # each tile encoded once


def test_instance_segmentation_equals_micro_sams(theirs, ours):
    """Maps within float32 noise of micro-sam's; our watershed on micro-sam's maps gives its labels."""
    segmenter, our_maps = ours
    their_maps = theirs.get_state()
    assert_maps_close(our_maps, their_maps, "local")

    parameters = median_thresholds(their_maps)
    their_labels = theirs.generate(**parameters)
    segmenter.set_state(their_maps)
    on_their_maps = segmenter.generate(**parameters)
    ious = matched_ious(on_their_maps, their_labels)
    print(f"on micro-sam's maps: {on_their_maps.max()} objects (its {their_labels.max()}), min matched IoU {ious.min():.4f}")
    assert on_their_maps.max() == their_labels.max() > 100
    assert ious.min() >= 0.99

    assert_labels_as_micro_sams(segmenter, our_maps, theirs)


# Synthetic micro-sam models beside vit_b_lm: one exported without its instance decoder, one whose
# session model was exported before the server computed maps (its config does not offer them).
WITHOUT_DECODER, OLD_EXPORT = get_model("vit_t_lm"), get_model("vit_t_em_organelles")


@pytest.fixture(scope="module")
def server(vit_b_lm_export, tmp_path_factory):
    repository = tmp_path_factory.mktemp("instance_served")
    for model_dir in vit_b_lm_export[2].iterdir():
        (repository / model_dir.name).symlink_to(model_dir, target_is_directory=True)
    write_repository(WITHOUT_DECODER, repository)
    write_repository(OLD_EXPORT, repository)
    write_session_model(dataclasses.replace(OLD_EXPORT, decoder_url=None), repository)
    server = start_server(repository, sessions_only=True)  # ViT-B's plain encoder not loaded (nor warmed up) beside it
    yield server
    server.stop()


def test_through_a_triton_server_as_locally(server, theirs, ours):
    """The session model runs the decoder next to the features it keeps (one encode, no features
    sent), loaded by the first request for maps: its maps equal the local engine's, and so
    micro-sam's; `backend="auto"` forwards them."""
    segmenter, local_maps = ours
    loaded = "vit_b_lm: instance decoder loaded on device 0 for its first instance-maps request"
    with Predictor("vit_b_lm", backend="auto", url=server.grpc_url) as remote:
        assert loaded not in server.log_path.read_text()  # started, the model ready: its decoder not loaded
        served = InstanceSegmenter(remote)
        served.initialize(blob_image())
        assert remote.engine.fallback_reason is None
    assert server.log_path.read_text().count(loaded) == 1
    requests = server.session_requests(remote.spec.session_name)
    assert requests.get("encoded") == 1 and requests.get("instance_maps") == 1, requests
    served_maps = served.get_state()
    assert_maps_close(served_maps, local_maps, "Triton vs local")
    assert_maps_close(served_maps, theirs.get_state(), "Triton vs micro-sam")
    assert_labels_as_micro_sams(segmenter, served_maps, theirs)


@pytest.mark.parametrize(
    ("spec", "why"),
    [(WITHOUT_DECODER, "exported without its decoder"), (OLD_EXPORT, "exported before")],
    ids=["no_decoder", "old_export"],
)
def test_a_server_model_without_instance_maps_says_how_to_export_them(server, spec, why):
    with Predictor(spec.model_id, backend="triton", url=server.grpc_url) as remote:
        with pytest.raises(ServerModelError, match=f"{why}.*--decoder PATH"):
            InstanceSegmenter(remote).initialize(disk_image(100, 120, [(50, 50, 20)]))
