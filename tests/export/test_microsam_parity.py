"""micro-sam's fine-tunes, exported from checkpoints in micro-sam's own layouts through the real
`triton-sam export`, against micro-sam's own prompt-based segmentation (`get_sam_model`,
`precompute_image_embeddings`, `segment_from_points`, `segment_from_box`) on the same file.

Random weights (written by `microsam_checkpoints`) stand in for the published ones, which cannot be
downloaded here: identical weights in must give identical masks out. Every mask must reach IoU
>= 0.99 and every score must be within 1e-3 of micro-sam's. One small image per model keeps it
cheap (a random vit_b encodes in seconds here); a light-microscopy model in each of two layouts and
a histopathology one in the third; vit_t_lm is also checked through a real Triton server.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.microsam_checkpoints import MODEL_STATE, PLAIN, TORCH_EM, write_checkpoint
from benchmarks.parity import mask_iou, parity_images
from conftest import PARITY_SEED, cli_export, release_memory, require_export_extra, start_server
from triton_sam import Predictor

pytestmark = pytest.mark.parity
MIN_IOU = 0.99
SCORE_TOL = 1e-3
# (model, the layout its checkpoint is written in, the image it sees)
CASES = {
    "vit_b_lm": (PLAIN, "rgb_astronaut_small"),
    "vit_t_lm": (TORCH_EM, "gray_coins"),
    "vit_b_histopathology": (MODEL_STATE, "rgb_astronaut_small"),  # its files' layout; an RGB image, as stained tissue
}


def _image(name: str) -> np.ndarray:
    """A small grey or RGB uint8 image whose channels each span 0..255: micro-sam stretches every
    image's channels to that range before its encoder (`micro_sam.util._to_image`), which leaves
    such an image as it is, so both sides encode the same pixels."""
    if name == "rgb_astronaut_small":
        from skimage import data, transform

        image = transform.resize(data.astronaut(), (256, 320), anti_aliasing=True)
    else:
        image = parity_images()[name].astype(np.float64)
    low, high = image.min(axis=(0, 1)), image.max(axis=(0, 1))
    return np.round((image - low) / (high - low) * 255).astype(np.uint8)


def _prompts(h: int, w: int) -> list[tuple[str, dict]]:
    """micro-sam's prompts, in its (y, x) order; boxes as (y0, x0, y1, x1) in whole pixels (it rounds)."""
    return [
        ("one positive point", dict(points=np.array([[h * 0.5, w * 0.45]]), labels=np.array([1]))),
        (
            "a positive and a negative point",
            dict(points=np.array([[h * 0.4, w * 0.5], [h * 0.7, w * 0.3]]), labels=np.array([1, 0])),
        ),
        ("box", dict(box=np.array([h // 5, w // 4, h * 3 // 4, w * 7 // 10]))),
        ("box, multimask", dict(box=np.array([h // 3, w // 5, h * 4 // 5, w // 2]), multimask_output=True)),
    ]


def _micro_sam_outputs(checkpoint, model_id: str, image: np.ndarray) -> dict[str, tuple]:
    """(masks, scores) from micro-sam's functions for each prompt of `_prompts`, by label."""
    from micro_sam.prompt_based_segmentation import segment_from_box, segment_from_points
    from micro_sam.util import get_sam_model, precompute_image_embeddings

    predictor = get_sam_model(model_type=model_id, device="cpu", checkpoint_path=checkpoint)
    embeddings = precompute_image_embeddings(predictor, image, ndim=2, verbose=False)
    outputs = {}
    for label, prompt in _prompts(*image.shape[:2]):
        segment = segment_from_box if "box" in prompt else segment_from_points
        masks, scores, _ = segment(predictor, image_embeddings=embeddings, return_all=True, **prompt)
        outputs[label] = (masks, scores)
    return outputs


def _ours(predictor: Predictor, image: np.ndarray) -> dict[str, tuple]:
    """(masks, scores) from our predictor for the same prompts (x, y order, as SAM takes them)."""
    predictor.set_image(image)
    outputs = {}
    for label, prompt in _prompts(*image.shape[:2]):
        multimask = prompt.get("multimask_output", False) or label == "one positive point"
        if "box" in prompt:
            y0, x0, y1, x1 = prompt["box"]
            masks, scores, _ = predictor.predict(box=np.array([x0, y0, x1, y1], np.float32), multimask_output=multimask)
        else:
            coords = prompt["points"][:, ::-1].astype(np.float32)
            masks, scores, _ = predictor.predict(point_coords=coords, point_labels=prompt["labels"], multimask_output=multimask)
        if label == "one positive point":  # micro-sam keeps the best of the three masks, and all scores
            masks = masks[np.argmax(scores)][None]
        outputs[label] = (masks, scores)
    return outputs


def _agreement(expected: dict, got: dict) -> tuple[float, float]:
    """(lowest mask IoU, largest score difference) over all prompts; asserted to be within bounds."""
    ious, deltas = [], []
    for label, (ref_masks, ref_scores) in expected.items():
        masks, scores = got[label]
        assert masks.shape == ref_masks.shape and scores.shape == ref_scores.shape, label
        ious += [mask_iou(ours, ref) for ours, ref in zip(masks, ref_masks)]
        deltas.append(float(np.abs(scores - ref_scores).max()))
        assert 0 < ref_masks.mean() < 1, f"{label}: a trivial mask would make the comparison vacuous"
    assert min(ious) >= MIN_IOU and max(deltas) <= SCORE_TOL, (ious, deltas)
    return min(ious), max(deltas)


@pytest.fixture(scope="module", params=list(CASES))
def exported(request, tmp_path_factory):
    """(model id, its image, micro-sam's outputs on it, the repository our export wrote from the same checkpoint)."""
    require_export_extra()
    pytest.importorskip("micro_sam")
    import torch

    torch.set_grad_enabled(False)
    model_id = request.param
    layout, image_name = CASES[model_id]
    if model_id == "vit_b_lm":  # its plain layout as the instance tests' export: shared (~35 s)
        checkpoint, _, repository = request.getfixturevalue("vit_b_lm_export")
    else:
        folder = tmp_path_factory.mktemp(model_id)
        checkpoint = write_checkpoint(folder / f"{model_id}.pt", model_id[:5], PARITY_SEED, layout)
        repository = folder / "repo"
        cli_export(model_id, repository, "--checkpoint", str(checkpoint))
    image = _image(image_name)
    expected = _micro_sam_outputs(checkpoint, model_id, image)
    release_memory()
    return model_id, image, expected, repository


def test_prompt_masks_and_scores_match_micro_sams(exported):
    model_id, image, expected, repository = exported
    with Predictor(model_id, model_repository=repository) as ours:
        iou, delta = _agreement(expected, _ours(ours, image))
    print(f"{model_id} local: min IoU {iou:.5f}, max score difference {delta:.2e}")


# One model through Triton (time): the server runs the same exported files, whatever layout they came from.
@pytest.mark.parametrize("exported", ["vit_t_lm"], indirect=True)
def test_through_a_triton_server_as_locally(exported):
    model_id, image, expected, repository = exported
    server = start_server(repository)
    try:
        with Predictor(model_id, backend="triton", url=server.grpc_url) as remote:
            iou, delta = _agreement(expected, _ours(remote, image))
    finally:
        server.stop()
    print(f"{model_id} Triton: min IoU {iou:.5f}, max score difference {delta:.2e}")
