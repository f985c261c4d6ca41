"""`AutomaticMaskGenerator` against the official generators, same random-init weights:
`SAM2AutomaticMaskGenerator` (SAM2.1 tiny, locally and through a real Triton server) and
MobileSAM's `SamAutomaticMaskGenerator` (the SAM1 family's code). The same image and parameters
must give the same masks in the same order (mask IoU >= 0.99), the same predicted IoUs and
stability scores (within 1e-3), points and crop boxes.

Random weights give low, smooth logits: at the default mask threshold every mask covers most of
the image and box NMS keeps one. The scenarios therefore threshold higher (SAM2.1) or keep every
mask (SAM1 family, whose threshold is fixed at 0), so that many masks, crops, the edge filter and
NMS are all compared.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.parity import mask_iou, parity_images, rgb
from conftest import PARITY_SEED, require_export_extra
from triton_sam.automatic import AutomaticMaskGenerator
from triton_sam.engines import CancelToken
from triton_sam.errors import DecodeCancelled, InvalidInputError

pytestmark = pytest.mark.parity
MIN_IOU = 0.99
SCORE_TOL = 1e-3
SAM2 = "sam2.1_hiera_tiny"
SMALL_MASKS = dict(pred_iou_thresh=0.45, stability_score_thresh=0.05, stability_score_offset=0.02, mask_threshold=0.2)

# name: (model, image name, (rows, cols) to cut from it or None, parameters)
SCENARIOS = {
    "SAM2.1, grayscale, one crop layer": (
        SAM2,
        "gray_coins",
        None,
        dict(points_per_side=8, points_per_batch=24, crop_n_layers=1, crop_n_points_downscale_factor=2, **SMALL_MASKS),
    ),
    "SAM2.1, RGB, mask-to-mask refinement": (
        SAM2,
        "rgb_777x1311",
        (260, 420),
        dict(points_per_side=6, points_per_batch=16, use_m2m=True, box_nms_thresh=0.95, **SMALL_MASKS),
    ),
    "MobileSAM (SAM1 code), grayscale, one crop layer, every mask kept": (
        "mobile_sam",
        "gray_coins",
        None,
        dict(
            points_per_side=4,
            crop_n_layers=1,
            crop_n_points_downscale_factor=2,
            pred_iou_thresh=0.0,
            stability_score_thresh=0.0,
            stability_score_offset=0.05,
            box_nms_thresh=1.0,
            crop_nms_thresh=1.0,
        ),
    ),
}


def _image(name: str, cut) -> np.ndarray:
    image = parity_images()[name]
    return image[: cut[0], : cut[1]] if cut else image


def _official_generator(model_id: str, options: dict):
    from benchmarks.fixtures import official_predictor

    model = official_predictor(model_id, PARITY_SEED).model
    if model_id == SAM2:
        from sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator

        return SAM2AutomaticMaskGenerator(model, **options)
    from mobile_sam import SamAutomaticMaskGenerator

    return SamAutomaticMaskGenerator(model, **options)


@pytest.fixture(scope="module")
def official_records():
    """The official generator's records of each scenario, computed once."""
    require_export_extra()
    import torch

    torch.set_grad_enabled(False)
    cache = {}

    def records(name: str) -> list[dict]:
        if name not in cache:
            model_id, image, cut, options = SCENARIOS[name]
            cache[name] = _official_generator(model_id, options).generate(rgb(_image(image, cut)))
        return cache[name]

    return records


# Through Triton the RGB scenario only: what a server computes for the generator (encodes, batched
# point decodes, decodes with mask prompts, the client's resizing of their logits) is the same for
# a crop as for a whole image, crops are cut and prompted by the same client code for either engine,
# and one-channel planes through Triton are tests/engines/test_triton.py's (as the local engine's).
RUNS = [(name, "local") for name in SCENARIOS] + [("SAM2.1, RGB, mask-to-mask refinement", "triton")]


def _backend_options(backend: str, model_id: str, request) -> dict:
    if backend == "local":
        return dict(model_repository=request.getfixturevalue("exported_repository")(model_id))
    return dict(backend="triton", url=request.getfixturevalue("models_server").grpc_url)


@pytest.mark.parametrize("name, backend", RUNS)
def test_the_masks_are_the_official_generators(name, backend, official_records, request):
    require_export_extra()
    model_id, image, cut, options = SCENARIOS[name]
    with AutomaticMaskGenerator(model_id, **options, **_backend_options(backend, model_id, request)) as generator:
        ours = generator.generate(_image(image, cut))
    theirs = official_records(name)
    assert len(theirs) >= 5, "the scenario should find several masks"
    assert len(ours) == len(theirs)
    for mine, reference in zip(ours, theirs, strict=True):
        assert mask_iou(mine["segmentation"], reference["segmentation"]) >= MIN_IOU
        assert abs(mine["predicted_iou"] - reference["predicted_iou"]) <= SCORE_TOL
        assert abs(mine["stability_score"] - reference["stability_score"]) <= SCORE_TOL
        assert np.allclose(mine["point_coords"], reference["point_coords"])
        assert mine["crop_box"] == reference["crop_box"]
        assert np.allclose(mine["bbox"], reference["bbox"], atol=1)
        assert mine["area"] == np.count_nonzero(mine["segmentation"])


def test_progress_counts_batches_and_cancel_stops_between_them(exported_repository):
    require_export_extra()
    image = _image("gray_coins", None)
    cancel, seen = CancelToken(), []

    def progress(done: int, total: int) -> None:
        seen.append((done, total))
        if done == 2:
            cancel.cancel()

    repository = exported_repository(SAM2)
    with AutomaticMaskGenerator(SAM2, model_repository=repository, points_per_side=4, points_per_batch=4) as generator:
        assert generator.batches(image.shape) == 4
        with pytest.raises(DecodeCancelled):
            generator.generate(image, progress=progress, cancel=cancel)
    assert seen == [(1, 4), (2, 4)]


def test_bad_parameters_are_refused(exported_repository):
    require_export_extra()
    repository = exported_repository(SAM2)
    with pytest.raises(InvalidInputError, match="exactly one"):
        AutomaticMaskGenerator(SAM2, model_repository=repository, points_per_side=None)
    with pytest.raises(InvalidInputError, match="output_mode"):
        AutomaticMaskGenerator(SAM2, model_repository=repository, output_mode="polygons")
    with pytest.raises(InvalidInputError, match="points_per_batch"):
        AutomaticMaskGenerator(SAM2, model_repository=repository, points_per_batch=0)
