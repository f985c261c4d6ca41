"""`python -m benchmarks parity`: our masks and scores next to the official predictor's, same weights.

The images and prompts of the parity tests (grey and RGB, small and large, unusual aspect ratios)
go through our local engine and through the model's official predictor in float32 on `device`;
reported as the smallest and median mask IoU and the largest score difference. For our float16
encoder (`half`) this is its measured cost in agreement; on a GPU the official predictor under
bfloat16 autocast (its own fast mode) is compared with its float32 self the same way.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from triton_sam.predictor import Predictor
from triton_sam.registry import DEFAULT_MODEL

from .fixtures import exported_repository, official_bf16_calls, official_predictor


def parity_images() -> dict[str, np.ndarray]:
    """Grayscale and RGB, small and large, of unusual aspect ratios; the smooth one is where
    rounding a client-side resize to whole grey levels moved SAM2's masks most (IoU 0.977)."""
    from PIL import Image
    from skimage import data, filters

    astronaut = data.astronaut()
    smooth = np.asarray(Image.fromarray(data.camera()).resize((2048, 613), Image.BILINEAR))
    return {
        "rgb_777x1311": np.asarray(Image.fromarray(astronaut).resize((1311, 777), Image.BILINEAR)),
        "gray_coins": data.coins(),  # 303x384 grayscale
        "large_2100x1500": np.asarray(Image.fromarray(data.coffee()).resize((1500, 2100), Image.BILINEAR)),
        "gray_smooth_613x2048": filters.gaussian(smooth, sigma=6, preserve_range=True).astype(np.uint8),
        "rgb_2500x1900": np.asarray(Image.fromarray(astronaut).resize((1900, 2500), Image.BILINEAR)),
    }


def prompt_sets(h: int, w: int) -> list[tuple[str, dict]]:
    """One prompt set each: points, boxes, both, and the image's corners (x, y in pixels)."""

    def pt(fx: float, fy: float) -> list[float]:
        return [w * fx, h * fy]

    box = [w * 0.2, h * 0.25, w * 0.7, h * 0.8]
    return [
        ("one point", dict(point_coords=[pt(0.5, 0.5)], point_labels=[1])),
        (
            "pos and neg points",
            dict(point_coords=[pt(0.4, 0.4), pt(0.6, 0.5), pt(0.1, 0.9), pt(0.8, 0.2)], point_labels=[1, 1, 0, 0]),
        ),
        ("box", dict(box=box)),
        ("box and points", dict(box=box, point_coords=[pt(0.5, 0.5), pt(0.25, 0.3)], point_labels=[1, 0])),
        ("image corner", dict(point_coords=[[0.0, 0.0], [w, h]], point_labels=[1, 0])),
    ]


def rgb(image: np.ndarray) -> np.ndarray:
    """What the official predictors take: grayscale repeated to RGB (our client sends it as it is)."""
    return np.repeat(image[..., None], 3, axis=2) if image.ndim == 2 else image


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


def comparison_prompt_sets(h: int, w: int) -> list[tuple[str, dict]]:
    """`prompt_sets` and two batched ones (two prompt sets at once): what the parity tests compare."""
    box = [w * 0.2, h * 0.25, w * 0.7, h * 0.8]
    return prompt_sets(h, w) + [
        ("batched points", dict(point_coords=[[[w * 0.3, h * 0.3]], [[w * 0.7, h * 0.6]]], point_labels=[[1], [1]])),
        ("batched boxes", dict(box=[box, [w * 0.05, h * 0.05, w * 0.4, h * 0.3]])),
    ]


def as_arrays(prompts: dict) -> dict[str, np.ndarray]:
    """A prompt set's values as float32 arrays, as `predict` takes them."""
    return {k: np.asarray(v, dtype=np.float32) for k, v in prompts.items()}


def refinement_prompts(h: int, w: int) -> tuple[dict, dict]:
    """A click, then the click and a negative one refining the best of the first click's masks."""
    first = dict(point_coords=np.array([[w * 0.5, h * 0.5]]), point_labels=np.array([1]))
    second = dict(point_coords=np.array([[w * 0.5, h * 0.5], [w * 0.3, h * 0.7]]), point_labels=np.array([1, 0]))
    return first, second


def official_outputs(reference, image: np.ndarray) -> dict[str, tuple]:
    """The official predictor's (masks, scores, low-res logits) on `image` for each prompt set of
    `comparison_prompt_sets` (multimask and not) and a refinement, by label: tests/export/test_parity.py
    compares ours with them (SAM3's computed in sam3_reference.py's process)."""
    reference.set_image(rgb(image))  # the official predictors take RGB
    (h, w), outputs = image.shape[:2], {}
    for label, prompts in comparison_prompt_sets(h, w):
        for multimask in (True, False):
            outputs[f"{label}, multimask={multimask}"] = reference.predict(multimask_output=multimask, **as_arrays(prompts))
    first, second = refinement_prompts(h, w)
    _, scores, low = reference.predict(**first)
    for multimask in (True, False):
        refined = reference.predict(mask_input=low[np.argmax(scores)][None], multimask_output=multimask, **second)
        outputs[f"refinement, multimask={multimask}"] = refined
    return outputs


def _agreement(reference_outputs: list, outputs: list) -> dict:
    ious, score_diffs = [], []
    for (ref_masks, ref_scores, _), (masks, scores, _) in zip(reference_outputs, outputs):
        ious += [
            mask_iou(a > 0, b > 0)
            for a, b in zip(ref_masks.reshape(-1, *ref_masks.shape[-2:]), masks.reshape(-1, *masks.shape[-2:]))
        ]
        score_diffs.append(float(np.abs(np.asarray(scores, np.float64) - ref_scores).max()))
    return {"min_iou": min(ious), "median_iou": float(np.median(ious)), "max_score_diff": max(score_diffs), "masks": len(ious)}


def run(
    model_id: str = DEFAULT_MODEL,
    device: str = "cpu",
    half: bool = False,
    seed: int = 0,
    workdir: Path = Path(".bench"),
) -> dict:
    """Agreement with the official float32 predictor per image, multimask and single mask."""
    import torch

    reference = official_predictor(model_id, seed, device)
    ours = Predictor(model_id, model_repository=exported_repository(model_id, seed, workdir, half=half))
    candidates = {"ours": (ours.set_image, ours.predict)}  # ours takes the plane as it is, grey or RGB
    if device == "cuda":
        set_bf16, predict_bf16 = official_bf16_calls(reference, device)
        candidates["official_bf16"] = (lambda image: set_bf16(rgb(image)), predict_bf16)
    result: dict = {"benchmark": "parity", "model": model_id, "device": device, "encoder_precision": "fp16" if half else "fp32"}
    with torch.inference_mode():
        for name, image in parity_images().items():
            reference.set_image(rgb(image))
            for set_image, _ in candidates.values():
                set_image(image)
            calls = [
                {k: np.asarray(v, np.float32) for k, v in prompts.items()} | {"multimask_output": multimask}
                for _, prompts in prompt_sets(*image.shape[:2])
                for multimask in (True, False)
            ]
            expected = [reference.predict(**call) for call in calls]
            result[name] = {}
            for candidate, (_, predict) in candidates.items():
                result[name][candidate] = _agreement(expected, [predict(**call) for call in calls])
    return result
