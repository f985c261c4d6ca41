"""Our export + local engine + Predictor against each family's official predictor, same weights:
`SAM2ImagePredictor` (SAM2.1), `mobile_sam.SamPredictor` (SAM1's code with MobileSAM's encoder)
and `SAM3InteractiveImagePredictor` (SAM3's tracker).

Random weights stand in for the checkpoints that cannot be downloaded here: identical weights in
must give identical masks out. Every binary mask must reach IoU >= 0.99 and every score must be
within 1e-3 of the reference. SAM1's ViTs are checked against `segment_anything`'s own predictor
in test_microsam_parity.py (micro-sam's vit_b_lm is SAM1's vit_b, built and run by
`segment_anything`; vit_l and vit_h differ only in sizes), and their client, pre-processing (resize,
grey to RGB, padding) and decoder are MobileSAM's, which sees every image here; sam_vit_b's export
is checked for batching below. SAM3 (a 450M-parameter ViT at 1008 px, ~40 s an encode here) sees
one image.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from sam3_reference import TRACKER_FILE, TRACKER_IMAGES

from benchmarks.parity import (
    as_arrays,
    comparison_prompt_sets,
    mask_iou,
    official_outputs,
    parity_images,
    refinement_prompts,
    rgb,
)
from conftest import PARITY_SEED, release_memory, require_export_extra
from triton_sam import Predictor
from triton_sam.errors import InvalidInputError
from triton_sam.registry import get_model

pytestmark = pytest.mark.parity
MIN_IOU = 0.99
SCORE_TOL = 1e-3
LOW_RES_TOL = 1e-3
MODELS = ["sam2.1_hiera_tiny", "mobile_sam", "sam3_tracker"]
# The images each model sees where it is not all of them (time). The small grayscale image,
# upscaled 3x to 1008 px, is where SAM3 is most sensitive to its input (resizing on the client and
# rounding to whole grey levels gave IoU 0.987 there).
SOME_IMAGES = {"sam3_tracker": TRACKER_IMAGES}


class _Sam1Reference:
    """The official SAM1/MobileSAM `SamPredictor`; batched prompts go through its `predict_torch`
    (its `predict` takes one prompt set), with coordinates transformed by its own transform."""

    def __init__(self, predictor) -> None:
        self.predictor = predictor

    def set_image(self, image: np.ndarray) -> None:
        self.predictor.set_image(image)

    def predict(self, point_coords=None, point_labels=None, box=None, mask_input=None, multimask_output=True):
        batched = (box is not None and box.ndim == 2) or (point_coords is not None and point_coords.ndim == 3)
        if not batched:
            return self.predictor.predict(point_coords, point_labels, box, mask_input, multimask_output)
        import torch

        transform, size = self.predictor.transform, self.predictor.original_size
        coords = None if point_coords is None else torch.as_tensor(transform.apply_coords(point_coords, size), dtype=torch.float)
        labels = None if point_labels is None else torch.as_tensor(point_labels, dtype=torch.int)
        boxes = None if box is None else torch.as_tensor(transform.apply_boxes(box, size), dtype=torch.float)
        return tuple(t.numpy() for t in self.predictor.predict_torch(coords, labels, boxes, None, multimask_output))


def _reference(model_id: str):
    from benchmarks.fixtures import official_predictor

    reference = official_predictor(model_id, PARITY_SEED)
    return reference if get_model(model_id).family in ("sam2", "sam3") else _Sam1Reference(reference)


def _images(model_id: str) -> tuple[str, ...]:
    return SOME_IMAGES.get(model_id, tuple(parity_images()))


# Model by model (each model's predictors are built once, see `predictors`), each on its images.
CASES = [(model_id, name) for model_id in MODELS for name in _images(model_id)]


@pytest.fixture(scope="module")
def predictors(exported_repository):
    """`predictors(model_id, reference)`: (the official predictor's outputs by image and label, our
    predictor), built when a model's first case comes and kept for its next ones; one model's at a
    time. The official model is let go before ours is loaded: the two never take memory together
    (SAM3's: gigabytes each). SAM3's outputs come from `reference()` (the `sam3_reference` folder:
    sam3 is built once a test session, in a process of its own)."""
    require_export_extra()
    import torch

    torch.set_grad_enabled(False)
    held: dict[str, tuple[dict, Predictor]] = {}

    def let_go() -> None:
        for _, ours in held.values():
            ours.close()
        held.clear()
        release_memory()  # our sessions' buffers (SAM3's: gigabytes); let them go before the next model

    def build(model_id: str, reference: Callable[[], Path]) -> tuple[dict, Predictor]:
        if model_id not in held:
            let_go()
            if model_id == "sam3_tracker":
                expected = _saved_outputs(reference() / TRACKER_FILE)
            else:
                official = _reference(model_id)
                expected = {name: official_outputs(official, parity_images()[name]) for name in _images(model_id)}
                del official
                release_memory()
            held[model_id] = expected, Predictor(model_id, model_repository=exported_repository(model_id))
        return held[model_id]

    yield build
    let_go()


def _saved_outputs(path: Path) -> dict[str, dict[str, tuple]]:
    """sam3_reference.py's `official_outputs` of SAM3's tracker, by image and label."""
    with np.load(path) as saved:
        keys = sorted(saved.files)
        labels = dict.fromkeys(key.rsplit("/", 1)[0] for key in keys)
        outputs = {label: tuple(saved[f"{label}/{i}"] for i in range(3)) for label in labels}
    by_image: dict[str, dict[str, tuple]] = {}
    for label, output in outputs.items():
        image, comparison = label.split("/", 1)
        by_image.setdefault(image, {})[comparison] = output
    return by_image


@pytest.fixture(scope="module", params=CASES, ids=[f"{name}-{model_id}" for model_id, name in CASES])
def image_pair(request, predictors):
    model_id, name = request.param
    expected, ours = predictors(model_id, lambda: request.getfixturevalue("sam3_reference"))
    image = parity_images()[name]
    ours.set_image(image)  # grayscale is sent as one channel
    return expected[name], ours, image.shape[:2]


def _assert_same(reference_out, ours_out, label: str) -> None:
    ref_masks, ref_scores, ref_low = reference_out
    masks, scores, low = ours_out
    assert masks.shape == ref_masks.shape and scores.shape == ref_scores.shape and low.shape == ref_low.shape, label
    ref_bool = ref_masks > 0
    flat_ours = masks.reshape(-1, *masks.shape[-2:])
    flat_ref = ref_bool.reshape(-1, *masks.shape[-2:])
    for ours_mask, ref_mask in zip(flat_ours, flat_ref):
        iou = mask_iou(ours_mask, ref_mask)
        assert iou >= MIN_IOU, f"{label}: mask IoU {iou:.4f}"
    np.testing.assert_allclose(scores, ref_scores, atol=SCORE_TOL, err_msg=label)
    # The low-res logits too, as `predict` returns them (a user's next mask_input): the same clamp
    # as the official predictor's (SAM2/SAM3 clamp to +-32, SamPredictor does not); measured
    # differences are at most 1.2e-5 with these random weights (logits up to ~0.5).
    np.testing.assert_allclose(low, ref_low, rtol=0, atol=LOW_RES_TOL, err_msg=label)


@pytest.mark.parametrize("multimask", [True, False])
def test_masks_and_scores_match_the_official_predictor(image_pair, multimask):
    expected, ours, (h, w) = image_pair
    for label, prompts in comparison_prompt_sets(h, w):
        label = f"{label}, multimask={multimask}"
        _assert_same(expected[label], ours.predict(multimask_output=multimask, **as_arrays(prompts)), label)


def test_refinement_with_previous_low_res_logits(image_pair):
    expected, ours, (h, w) = image_pair
    first, second = refinement_prompts(h, w)
    _, scores, low = ours.predict(**first)
    for multimask in (True, False):
        refined = ours.predict(mask_input=low[np.argmax(scores)][None], multimask_output=multimask, **second)
        _assert_same(expected[f"refinement, multimask={multimask}"], refined, f"refinement, multimask={multimask}")


def test_masks_are_not_trivial(image_pair):
    """Guard against a vacuous comparison: random weights still give masks that vary by prompt."""
    _, ours, (h, w) = image_pair
    a = ours.predict(point_coords=[[w * 0.2, h * 0.2]], point_labels=[1])[0]
    b = ours.predict(point_coords=[[w * 0.8, h * 0.8]], point_labels=[1])[0]
    assert 0 < a.mean() < 1 and (a != b).any()


# SAM3 left out for time (three 1008-px encodes, ~3 min here); checked by hand: a batch of 2 gave
# exactly the features of each image alone.
@pytest.mark.parametrize("model_id", ["sam2.1_hiera_tiny", "sam_vit_b", "mobile_sam"])
def test_exported_encoder_batches_like_triton_dynamic_batching_needs(model_id, exported_repository):
    import onnxruntime as ort

    from triton_sam.repository import locate

    spec = get_model(model_id)
    session = ort.InferenceSession(str(locate(spec, exported_repository(model_id)).encoder))
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (2, *spec.sent_hw((768, 1024)), 3), dtype=np.uint8)
    batched = session.run(None, {"image": images})
    single = session.run(None, {"image": images[1:]})
    for b, s in zip(batched, single):
        assert b.shape[0] == 2
        np.testing.assert_allclose(b[1:], s, atol=1e-4)


def test_a_batch_of_images_gives_what_the_official_set_image_batch_and_predict_batch_give(exported_repository):
    """`set_image_batch` / `predict_batch` as `SAM2ImagePredictor`'s: each image with its own
    prompts (a point; a box), grayscale and RGB of different sizes in one batch."""
    require_export_extra()
    import torch

    from benchmarks.fixtures import official_predictor

    torch.set_grad_enabled(False)
    model_id = "sam2.1_hiera_tiny"
    images = [parity_images()[name] for name in ("rgb_777x1311", "gray_coins")]
    (h0, w0), (h1, w1) = (image.shape[:2] for image in images)
    points = [np.array([[w0 * 0.4, h0 * 0.3]], np.float32), None]
    labels = [np.array([1], np.int32), None]
    boxes = [None, np.array([w1 * 0.2, h1 * 0.25, w1 * 0.7, h1 * 0.8], np.float32)]
    reference = official_predictor(model_id, PARITY_SEED)
    reference.set_image_batch([rgb(image) for image in images])
    expected = reference.predict_batch(points, labels, box_batch=boxes)
    with Predictor(model_id, model_repository=exported_repository(model_id)) as ours:
        with pytest.raises(RuntimeError, match="set_image_batch"):
            ours.predict_batch(points, labels, box_batch=boxes)
        ours.set_image_batch(images)
        assert ours.original_size == (h1, w1)  # the last image's, as `predict` uses it
        got = ours.predict_batch(points, labels, box_batch=boxes)
        for number in range(2):
            _assert_same([out[number] for out in expected], [out[number] for out in got], f"image {number}")
        with pytest.raises(InvalidInputError, match="one item per image"):
            ours.predict_batch(points[:1], labels[:1])
