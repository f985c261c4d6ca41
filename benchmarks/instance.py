"""`python -m benchmarks instance`: micro-sam's vit_b_lm with its instance-segmentation decoder,
ours next to micro-sam's own functions on a 1024 x 1024 and a 2048 x 2048 plane, in one run:
encode, interactive predict (as `benchmarks.microsam` measures them) and instance segmentation
(micro-sam's `InstanceSegmentationWithDecoder` vs our `InstanceSegmenter`, locally and through a
local Triton server).

The weights are random (seeded), written as micro-sam publishes them: the SAM's state dict and
torch_em's UNETR initialisation in a separate `*_decoder.pt`. Random weights give nearly flat maps,
so the thresholds are micro-sam's maps' medians (many objects), the same for every side. Both
segment the whole plane (micro-sam's untiled path, which its `automatic_instance_segmentation`
takes without a tile shape): the plane resized to the encoder's input, the maps resized back.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import summarize, timed_call

MODEL = "vit_b_lm"
DEFAULT_REPEATS = {"encode": 1, "predict": 5, "instance": 2}
REFERENCE = "micro_sam"


def decoder_state(sam) -> dict:
    """A decoder state for `sam` as micro-sam publishes it (`*_decoder.pt`): torch_em's UNETR on
    `sam`'s image encoder, its initialisation drawn from torch's current seed, less the encoder."""
    from torch_em.model import UNETR

    unetr = UNETR(
        backbone="sam",
        encoder=sam.image_encoder,
        out_channels=3,
        use_sam_stats=True,
        final_activation="Sigmoid",
        use_skip_connection=False,
        resize_input=True,
    )
    return {k: v for k, v in unetr.state_dict().items() if not k.startswith("encoder")}


def micro_sams_decoder_segmenter(predictor, decoder: Path, is_tiled: bool = False):
    """micro-sam's `InstanceSegmentationWithDecoder` (`is_tiled`: the tiled one) on its `predictor`
    with the decoder file `decoder`, as its users make it, where the predictor runs."""
    import torch
    from micro_sam.instance_segmentation import get_decoder, get_instance_segmentation_generator

    state = torch.load(decoder, map_location="cpu", weights_only=True)
    decoder_model = get_decoder(predictor.model.image_encoder, state, device=predictor.device)
    return get_instance_segmentation_generator(predictor, is_tiled, decoder_model, segmentation_mode="ais")


def micro_sams_segmenter(checkpoint: Path, decoder: Path, model_type: str = "vit_b", is_tiled: bool = False):
    """micro-sam's segmenter for `model_type` from its checkpoint and decoder files."""
    from micro_sam.util import get_sam_model

    predictor = get_sam_model(model_type=model_type, checkpoint_path=checkpoint, device="cpu")
    return micro_sams_decoder_segmenter(predictor, decoder, is_tiled)


def median_thresholds(state: dict[str, np.ndarray]) -> dict[str, float]:
    """Thresholds that cut random weights' nearly flat maps into many objects."""
    return {
        "center_distance_threshold": float(np.median(state["center_distances"])),
        "boundary_distance_threshold": float(np.median(state["boundary_distances"])),
        "foreground_threshold": float(np.quantile(state["foreground"], 0.3)),
    }


def matched_ious(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """For each of our objects (in label order), its IoU with the object of `theirs` it overlaps
    most (0 where that is the background), from one count of label pairs (thousands of objects
    on a 2048 x 2048 plane)."""
    ours, theirs = ours.astype(np.int64).ravel(), theirs.astype(np.int64).ravel()
    pairs, overlap = np.unique(ours[ours > 0] * (theirs.max() + 1) + theirs[ours > 0], return_counts=True)
    mine, other = np.divmod(pairs, theirs.max() + 1)
    order = np.lexsort((-overlap, mine))  # by our label, the largest overlap first
    first = order[np.r_[True, mine[order][1:] != mine[order][:-1]]]
    sizes, their_sizes = np.bincount(ours), np.bincount(theirs)
    union = sizes[mine[first]] + their_sizes[other[first]] - overlap[first]
    return np.where(other[first] > 0, overlap[first] / union, 0.0)


def _segment(segmenter, image: np.ndarray, parameters: dict | None) -> tuple[float, float, np.ndarray, dict]:
    """Seconds to initialize and to generate, the labels and the thresholds (`parameters`, or
    `median_thresholds` of the segmenter's own maps, taken untimed)."""
    initialize_s, _ = timed_call(segmenter.initialize, image)
    parameters = parameters or median_thresholds(segmenter.get_state())
    generate_s, labels = timed_call(segmenter.generate, **parameters)
    return initialize_s, generate_s, labels, parameters


def label_check(labels: np.ndarray, reference: np.ndarray) -> dict:
    """How `labels` compare with micro-sam's `reference`: counts, matched IoUs, equality."""
    ious = matched_ious(labels, reference)
    return {
        "objects": int(labels.max()),
        "micro_sam_objects": int(reference.max()),
        "share_matched_iou_0.99": round(float(np.mean(ious >= 0.99)), 4) if ious.size else None,
        "median_matched_iou": round(float(np.median(ious)), 4) if ious.size else None,
        "identical": bool(np.array_equal(labels, reference)),
    }


def measure_instance(segmenters: dict, plane: np.ndarray, repeats: int) -> dict:
    """Time each segmenter's `initialize` + `generate` on `repeats` planes shifted from `plane`
    (other pixels than the encodes before: a Triton server would answer those from its cache),
    micro-sam's first, its thresholds for all; medians, ratios, and the last labels compared."""
    samples: dict[str, dict[str, list[float]]] = {name: {"initialize": [], "generate": []} for name in segmenters}
    labels: dict[str, np.ndarray] = {}
    for step in range(repeats):
        image = np.roll(plane, -7 * (step + 2), axis=1)
        parameters = None
        for name, segmenter in segmenters.items():  # micro-sam's first: its maps give the thresholds
            initialize_s, generate_s, labels[name], parameters = _segment(segmenter, image, parameters)
            samples[name]["initialize"].append(initialize_s)
            samples[name]["generate"].append(generate_s)
    figures = {}
    for name, parts in samples.items():
        totals = [a + b for a, b in zip(parts["initialize"], parts["generate"], strict=True)]
        figures[name] = {
            **summarize(totals),
            **{f"{part}_median_ms": float(np.median(seconds)) * 1000 for part, seconds in parts.items()},
        }
    reference = figures[REFERENCE]["median_ms"]
    figures["ratio"] = {name: round(f["median_ms"] / reference, 3) for name, f in figures.items() if name != REFERENCE}
    figures["labels_vs_micro_sam"] = {
        name: label_check(found, labels[REFERENCE]) for name, found in labels.items() if name != REFERENCE
    }
    return figures


def run(model_id: str | None = None, repeats: dict[str, int] | None = None, **options) -> dict:
    """`benchmarks.microsam.run` on vit_b_lm with its decoder (its other `options`: planes, backends,
    ...): encode, predict and instance segmentation, `repeats` timed calls of each by name
    (default `DEFAULT_REPEATS`). The suite's `model_id` is unused."""
    from . import microsam  # which measures this module's segmenters

    result = microsam.run(models=(MODEL,), repeats={**DEFAULT_REPEATS, **(repeats or {})}, segment=True, **options)
    return {**result, "benchmark": "instance"}
