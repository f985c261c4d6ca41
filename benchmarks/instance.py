"""`python -m benchmarks instance`: seconds to segment every object of a plane with micro-sam's
instance-segmentation decoder, ours (local ONNX Runtime) next to micro-sam's own
`InstanceSegmentationWithDecoder`, same random-init weights, in one run.

SAM vit_b's weights are random (seeded), written as a segment_anything checkpoint; the decoder's are
torch_em's UNETR initialisation, saved as micro-sam publishes its `*_decoder.pt`. Random weights
give nearly flat maps, so the thresholds are the maps' medians (many objects). Each run encodes the
plane anew (initialize + generate), runs alternate; the labels are compared as a check.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from triton_sam.registry import get_model

from .fixtures import bench_image

MODEL = "sam_vit_b"


def write_checkpoints(folder: Path, seed: int = 0) -> tuple[Path, Path]:
    """A random SAM vit_b checkpoint (segment_anything's format) and a random micro-sam decoder file."""
    import torch
    from segment_anything import sam_model_registry

    torch.manual_seed(seed)
    sam = sam_model_registry["vit_b"]()
    checkpoint = folder / "sam_vit_b_random.pth"
    torch.save(sam.state_dict(), checkpoint)
    decoder = folder / "vit_b_decoder.pt"
    torch.save(decoder_state(sam), decoder)
    return checkpoint, decoder


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


def export_with_decoder(checkpoint: Path, decoder: Path, repository: Path) -> None:
    """SAM vit_b from `checkpoint` (as a user exports it, in a process of its own) and the decoder."""
    from triton_sam.export.instance_decoder_onnx import export_instance_decoder

    command = ["export", MODEL, "--checkpoint", str(checkpoint), "--output", str(repository)]
    done = subprocess.run([sys.executable, "-m", "triton_sam.cli", *command], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"triton-sam {' '.join(command)} failed:\n{done.stderr[-4000:]}")
    export_instance_decoder(get_model(MODEL), decoder, repository)


def micro_sams_segmenter(checkpoint: Path, decoder: Path, model_type: str = "vit_b", is_tiled: bool = False):
    """micro-sam's `InstanceSegmentationWithDecoder` (`is_tiled`: `TiledInstanceSegmentationWithDecoder`)
    for `model_type` as its users make it, on the CPU."""
    import torch
    from micro_sam.instance_segmentation import get_decoder, get_instance_segmentation_generator
    from micro_sam.util import get_sam_model

    predictor = get_sam_model(model_type=model_type, checkpoint_path=checkpoint, device="cpu")
    state = torch.load(decoder, map_location="cpu", weights_only=True)
    decoder_model = get_decoder(predictor.model.image_encoder, state, device="cpu")
    return get_instance_segmentation_generator(predictor, is_tiled, decoder_model, segmentation_mode="ais")


def median_thresholds(state: dict[str, np.ndarray]) -> dict[str, float]:
    """Thresholds that cut random weights' nearly flat maps into many objects."""
    return {
        "center_distance_threshold": float(np.median(state["center_distances"])),
        "boundary_distance_threshold": float(np.median(state["boundary_distances"])),
        "foreground_threshold": float(np.quantile(state["foreground"], 0.3)),
    }


def matched_ious(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """For each of our objects, its IoU with the object of `theirs` it overlaps most (0 if none)."""
    ious = []
    for value in np.unique(ours[ours > 0]):
        mine = ours == value
        match = np.bincount(theirs[mine].astype(np.int64)).argmax()
        other = theirs == match
        ious.append((mine & other).sum() / (mine | other).sum() if match else 0.0)
    return np.array(ious)


def _segment(segmenter, image: np.ndarray, parameters: dict | None) -> tuple[float, float, np.ndarray]:
    """Seconds to initialize and to generate, and the labels."""
    started = time.perf_counter()
    segmenter.initialize(image)
    initialized = time.perf_counter()
    labels = segmenter.generate(**(parameters or median_thresholds(segmenter.get_state())))
    return initialized - started, time.perf_counter() - initialized, labels


def run(
    model_id: str = MODEL, shape: tuple[int, int] = (1024, 1024), repeats: int = 2, seed: int = 0, workdir: Path = Path(".bench")
) -> dict:
    """Median seconds of ours and micro-sam's (initialize, generate, total) on a `shape` plane, and the check."""
    from triton_sam.instance import InstanceSegmenter
    from triton_sam.predictor import Predictor

    folder = Path(workdir) / f"micro_sam_vit_b_seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    checkpoint, decoder = write_checkpoints(folder, seed)
    export_with_decoder(checkpoint, decoder, folder / "repo")
    image = bench_image(tuple(shape))
    theirs = micro_sams_segmenter(checkpoint, decoder)
    ours = InstanceSegmenter(Predictor(model_id, model_repository=folder / "repo"))
    times: dict[str, list[tuple[float, float]]] = {"ours": [], "micro_sam": []}
    for _ in range(repeats):
        *their_times, their_labels = _segment(theirs, image, None)
        parameters = median_thresholds(theirs.get_state())
        *our_times, our_labels = _segment(ours, image, parameters)
        times["micro_sam"].append(tuple(their_times))
        times["ours"].append(tuple(our_times))
    result = {"model": model_id, "shape": list(shape), "repeats": repeats}
    for side, samples in times.items():
        initialize, generate = (round(float(value), 3) for value in np.median(np.array(samples), axis=0))
        result[side] = {"initialize_s": initialize, "generate_s": generate, "total_s": round(initialize + generate, 3)}
    result["ratio_ours_to_micro_sam"] = round(result["ours"]["total_s"] / result["micro_sam"]["total_s"], 3)
    ious = matched_ious(our_labels, their_labels)
    result["check"] = {  # random weights' flat maps: float32 noise moves tiny seeds (tests/instance)
        "objects": int(our_labels.max()),
        "micro_sam_objects": int(their_labels.max()),
        "share_matched_iou_0.99": round(float(np.mean(ious >= 0.99)), 4),
    }
    return result
