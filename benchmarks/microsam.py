"""`python -m benchmarks microsam`: micro-sam's microscopy models, ours next to micro-sam's own functions.

For each model and plane, with the same random-init weights written as micro-sam publishes them (a
plain state dict) and exported once by our export: the encode (micro-sam's
`precompute_image_embeddings`; our `Predictor.set_image`, locally and through a local Triton server)
and a one-point predict (micro-sam's `segment_from_points`, which keeps the best of three masks; our
`predict` of three masks, the best kept). Medians, ratios ours / micro-sam, and each mask's IoU to
micro-sam's, so that a speed figure never hides a wrong answer. Calls alternate so that machine
noise hits all alike.

Each measured thing is one function of `MEASURES` (sides, plane, repeats -> its figures), run on
every plane: instance segmentation (ours vs micro-sam's `InstanceSegmentationWithDecoder`,
`benchmarks.instance`) joins as one more where the sides are given a segmenter (`segment`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from triton_sam.contract import CONTRACT_VERSION
from triton_sam.download import file_sha256
from triton_sam.errors import ModelFileError, ModelNotFoundError
from triton_sam.predictor import Predictor
from triton_sam.registry import get_model
from triton_sam.repository import instance_decoder_path, locate, read_metadata

from . import summarize, timed_call
from .fixtures import bench_image
from .instance import measure_instance, micro_sams_decoder_segmenter
from .microsam_checkpoints import write_checkpoint, write_decoder
from .parity import mask_iou
from .wire import loopback_server

MODELS = ("vit_b_lm", "vit_t_lm")
SHAPES = ((1024, 1024), (2048, 2048))
REFERENCE = "micro_sam"
DEFAULT_REPEATS = {"encode": 3, "predict": 10}


@dataclass(frozen=True)
class Side:
    """One implementation under test: `encode(plane)` keeps the plane's features, `predict((y, x))`
    returns the one-point mask (H x W, bool) from them; `segmenter` (where measured) segments a
    plane's instances with micro-sam's `InstanceSegmentationWithDecoder` API."""

    encode: Callable[[np.ndarray], object]
    predict: Callable[[tuple[float, float]], np.ndarray]
    segmenter: object | None = None


def exported(model_id: str, seed: int, workdir: Path, decoder: Path | None = None) -> tuple[Path, Path]:
    """(`model_id`'s checkpoint of random weights from `seed` in micro-sam's format, the repository
    our export wrote from it, with the instance decoder in `decoder` if given), under
    `workdir`/microsam; each written only when not there yet."""
    spec = get_model(model_id)
    folder = Path(workdir) / "microsam"
    checkpoint = folder / f"{model_id}-seed{seed}.pt"
    if not checkpoint.is_file():  # written aside, then moved: an interrupted run leaves no half file
        write_checkpoint(checkpoint.with_suffix(".part"), spec.config, seed).rename(checkpoint)
    repository = folder / "model_repository"
    if not _is_export_of(checkpoint, model_id, repository, decoder):
        from triton_sam.export import export_model

        export_model(spec, repository, checkpoint=checkpoint, decoder=decoder, progress=lambda line: print(line, file=sys.stderr))
    return checkpoint, repository


def decoder_file(model_id: str, seed: int, workdir: Path) -> Path:
    """`model_id`'s instance decoder of random weights (the SAM's from `seed`, then torch_em's
    init) as micro-sam publishes it, under `workdir`/microsam; written only when not there yet."""
    path = Path(workdir) / "microsam" / f"{model_id}-seed{seed}_decoder.pt"
    if not path.is_file():
        write_decoder(path.with_suffix(".part"), get_model(model_id).config, seed).rename(path)
    return path


def _is_export_of(checkpoint: Path, model_id: str, repository: Path, decoder: Path | None) -> bool:
    """Whether `repository` holds `model_id` exported from `checkpoint` (and `decoder`) under the
    current tensor contract."""
    spec = get_model(model_id)
    try:
        found = locate(spec, repository)
    except (ModelNotFoundError, ModelFileError):
        return False
    metadata = [read_metadata(path.parent.parent) or {} for path in (found.encoder, found.decoder)]
    expected = {"checkpoint_sha256": file_sha256(checkpoint), "contract_version": CONTRACT_VERSION}
    if decoder is not None:
        instance = read_metadata(instance_decoder_path(repository, spec).parent) or {}
        if instance.get("decoder_sha256") != file_sha256(decoder):
            return False
    return all(expected.items() <= m.items() for m in metadata)


def micro_sam_side(model_id: str, checkpoint: Path, device: str, decoder: Path | None = None) -> Side:
    """micro-sam's own path on `device`: `get_sam_model` on the checkpoint, its embeddings,
    `segment_from_points`, and its `InstanceSegmentationWithDecoder` with `decoder` if given."""
    from micro_sam.prompt_based_segmentation import segment_from_points
    from micro_sam.util import get_sam_model, precompute_image_embeddings

    predictor = get_sam_model(model_type=model_id, device=device, checkpoint_path=checkpoint)
    embeddings = {}

    def encode(plane: np.ndarray) -> None:
        embeddings["plane"] = precompute_image_embeddings(predictor, plane, ndim=2, verbose=False)

    def predict(point: tuple[float, float]) -> np.ndarray:
        masks = segment_from_points(predictor, np.array([point]), np.array([1]), image_embeddings=embeddings["plane"])
        return masks[0]

    segmenter = micro_sams_decoder_segmenter(predictor, decoder) if decoder is not None else None
    return Side(encode, predict, segmenter)


def our_side(predictor: Predictor, segment: bool = False) -> Side:
    """Our predictor (local or through Triton) as micro-sam answers one positive point: the best of
    three masks; an `InstanceSegmenter` on it if `segment`."""
    from triton_sam.instance import InstanceSegmenter

    def predict(point: tuple[float, float]) -> np.ndarray:
        coords = np.array([point[::-1]], np.float32)  # (x, y), as SAM takes it
        masks, scores, _ = predictor.predict(point_coords=coords, point_labels=np.array([1]), multimask_output=True)
        return masks[int(np.argmax(scores))]

    return Side(predictor.set_image, predict, InstanceSegmenter(predictor) if segment else None)


def _timings(samples: dict[str, list[float]]) -> dict:
    """Each side's median (and p95), and ours / micro-sam's median by side."""
    stats = {name: summarize(seconds) for name, seconds in samples.items()}
    reference = stats[REFERENCE]["median_ms"]
    ratios = {name: round(s["median_ms"] / reference, 3) for name, s in stats.items() if name != REFERENCE}
    return {**stats, "ratio": ratios}


def shifted(plane: np.ndarray, step: int) -> np.ndarray:
    """`plane` rolled `step` times 7 pixels along x: other pixels (a Triton server answers a plane
    it has encoded from its cache), the same work."""
    return np.roll(plane, 7 * step, axis=1)


def measure_encode(sides: dict[str, Side], plane: np.ndarray, repeats: int) -> dict:
    """Time each side's encode of `repeats` shifted planes, `plane` itself last (each side keeps
    its features for the measures after this one)."""
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for step in reversed(range(repeats)):
        image = shifted(plane, step)
        for name, side in sides.items():
            samples[name].append(timed_call(side.encode, image)[0])
    return _timings(samples)


def measure_predict(sides: dict[str, Side], plane: np.ndarray, repeats: int) -> dict:
    """Time each side's one-point predict on the encoded `plane`; IoU of its mask to micro-sam's."""
    point = (plane.shape[0] * 0.45, plane.shape[1] * 0.4)
    samples: dict[str, list[float]] = {name: [] for name in sides}
    masks = {}
    for _ in range(repeats):
        for name, side in sides.items():
            seconds, masks[name] = timed_call(side.predict, point)
            samples[name].append(seconds)
    iou = {name: round(mask_iou(mask, masks[REFERENCE]), 5) for name, mask in masks.items() if name != REFERENCE}
    return {**_timings(samples), "iou_vs_micro_sam": iou, "micro_sam_mask_fraction": round(float(masks[REFERENCE].mean()), 4)}


def measure_segment(sides: dict[str, Side], plane: np.ndarray, repeats: int) -> dict:
    """Time each side's instance segmentation of `plane` (`benchmarks.instance.measure_instance`)."""
    return measure_instance({name: side.segmenter for name, side in sides.items()}, plane, repeats)


MEASURES: dict[str, Callable[[dict[str, Side], np.ndarray, int], dict]] = {
    "encode": measure_encode,  # first: the measures after it use the features it leaves
    "predict": measure_predict,
    "instance": measure_segment,  # where the sides have segmenters (`segment`)
}


def bench_plane(shape: tuple[int, int]) -> np.ndarray:
    """The bench image at `shape`, each channel stretched to 0..255: micro-sam stretches each
    channel so before its encoder (`micro_sam.util._to_image`) and ours takes uint8 as it is, so
    such a plane is the same pixels to both."""
    image = bench_image(shape).astype(np.float64)
    low, high = image.min(axis=(0, 1)), image.max(axis=(0, 1))
    return np.round((image - low) / (high - low) * 255).astype(np.uint8)


def run_model(
    model_id: str,
    shapes: tuple,
    repeats: dict[str, int],
    seed: int,
    workdir: Path,
    backends: tuple[str, ...],
    warm_up: bool,
    device: str,
    segment: bool = False,
) -> dict:
    """Every measure of `MEASURES` (`repeats[its name]` timed calls; instance segmentation only if
    `segment`) on a plane of each of `shapes`, micro-sam (on `device`) and ours on each of
    `backends`; after an untimed encode and predict of each if `warm_up`."""
    import torch

    decoder = decoder_file(model_id, seed, workdir) if segment else None
    checkpoint, repository = exported(model_id, seed, workdir, decoder)
    measures = {what: measure for what, measure in MEASURES.items() if segment or what != "instance"}
    planes = {f"{h}x{w}": bench_plane((h, w)) for h, w in shapes}
    result = {}
    with ExitStack() as stack, torch.inference_mode():
        sides = {REFERENCE: micro_sam_side(model_id, checkpoint, device, decoder)}
        for backend in backends:
            where = {"model_repository": repository}
            if backend == "triton":
                where = {"url": stack.enter_context(loopback_server(repository, model_id)).grpc_url}
            sides[backend] = our_side(stack.enter_context(Predictor(model_id, backend, **where)), segment)
        first = shifted(next(iter(planes.values())), -1)  # a plane not timed later
        for side in sides.values() if warm_up else ():  # first calls load and tune
            side.encode(first)
            side.predict((first.shape[0] / 2, first.shape[1] / 2))
        for name, plane in planes.items():
            result[name] = {what: measure(sides, plane, repeats[what]) for what, measure in measures.items()}
    return result


def run(
    model_id: str | None = None,
    models: tuple[str, ...] = MODELS,
    shapes: tuple[tuple[int, int], ...] = SHAPES,
    repeats: dict[str, int] | None = None,
    seed: int = 0,
    workdir: Path = Path(".bench"),
    backends: tuple[str, ...] = ("local", "triton"),
    warm_up: bool = True,
    device: str = "cpu",
    segment: bool = False,
) -> dict:
    """Each of `models` on planes of `shapes`, `repeats` timed calls of each measure by its name
    (default: 3 encodes, 10 predicts; instance segmentation with each model's decoder if
    `segment`), micro-sam's functions on `device`. The suite's `model_id` is not one of micro-sam's: unused."""
    import torch

    repeats = {**DEFAULT_REPEATS, **(repeats or {})}
    load_before = os.getloadavg()[0]
    by_model = {
        model: run_model(model, tuple(shapes), repeats, seed, Path(workdir), tuple(backends), warm_up, device, segment)
        for model in models
    }
    return {
        "benchmark": "microsam",
        "models": list(models),
        "shapes": [list(shape) for shape in shapes],
        "repeats": repeats,
        "backends": list(backends),
        "warm_up": warm_up,
        "reference_device": device,
        "torch_threads": torch.get_num_threads(),
        # the 1-minute load average before and after: above the cores' count, others ran beside it
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "by_model": by_model,
    }
