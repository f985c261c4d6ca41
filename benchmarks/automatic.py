"""`python -m benchmarks automatic`: seconds to segment everything in an image, ours (local, and through
a local Triton server) next to the official `SAM2AutomaticMaskGenerator`, same random-init weights.

Random weights give low, smooth logits, so the official default thresholds keep nothing; the
parameters here keep most masks through the predicted-IoU filter (which ours applies before
upsampling), so both sides upsample and score nearly every mask: the same work. Runs alternate so
that machine noise hits all alike; each run encodes the image anew. The masks are compared as a
check, and the Triton server's own statistics give the batch sizes its session model ran.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from triton_sam.automatic import AutomaticMaskGenerator
from triton_sam.registry import DEFAULT_MODEL, get_model

from .fixtures import bench_image, exported_repository, official_predictor
from .parity import mask_iou
from .triton import server_batch_sizes
from .wire import loopback_server

# Keep most masks of random weights (see the module's docstring); the grid and batches are the official defaults'.
OPTIONS = dict(
    points_per_side=32,
    points_per_batch=64,
    pred_iou_thresh=0.45,
    stability_score_thresh=0.05,
    stability_score_offset=0.02,
    mask_threshold=0.2,
)


def _timed(generate, image) -> tuple[float, list[dict]]:
    started = time.perf_counter()
    records = generate(image)
    return time.perf_counter() - started, records


def _agreement(ours: list[dict], theirs: list[dict]) -> dict:
    ious = [mask_iou(a["segmentation"], b["segmentation"]) for a, b in zip(ours, theirs)]
    return {"masks": len(ours), "same_count": len(ours) == len(theirs), "min_iou_vs_official": round(min(ious, default=1.0), 5)}


def run(
    model_id: str = DEFAULT_MODEL,
    shape: tuple[int, int] = (512, 512),
    repeats: int = 2,
    seed: int = 0,
    workdir: Path = Path(".bench"),
    device: str = "cpu",
    backends: tuple[str, ...] = ("local", "triton"),
    points_per_side: int = OPTIONS["points_per_side"],
) -> dict:
    """Segment-all on a `shape` image, ours on each backend and the official, `repeats` runs each."""
    import torch
    from sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator

    options = {**OPTIONS, "points_per_side": points_per_side}
    repository = exported_repository(model_id, seed, workdir)
    image = bench_image(shape)
    official = SAM2AutomaticMaskGenerator(official_predictor(model_id, seed, device).model, **options)
    runs: dict[str, list] = {"official": [], **{backend: [] for backend in backends}}
    batches = {}
    with ExitStack() as stack, torch.inference_mode():
        generators, url = {}, None
        for backend in backends:
            where = {"model_repository": repository}
            if backend == "triton":
                url = stack.enter_context(loopback_server(repository, model_id)).grpc_url
                where = {"url": url}
            generators[backend] = stack.enter_context(AutomaticMaskGenerator(model_id, backend, **where, **options))
        for _ in range(repeats):
            for backend, generator in generators.items():
                runs[backend].append(_timed(generator.generate, image))
            runs["official"].append(_timed(official.generate, image))
        if url is not None:
            batches = server_batch_sizes(url, get_model(model_id))
    result = {
        "benchmark": "automatic",
        "model": model_id,
        "image_shape": list(shape),
        "repeats": repeats,
        "reference_device": device,
        "parameters": options,
        "decoder_calls": -(-(points_per_side**2) // options["points_per_batch"]),
        "prompt_sets_per_call": options["points_per_batch"],
        "server_batch_sizes": {str(size): count for size, count in batches.items()},
    }
    for name, measured in runs.items():
        seconds = [s for s, _ in measured]
        result[name] = {"seconds_median": round(float(np.median(seconds)), 2)}
        if name != "official":
            result[name].update(_agreement(measured[-1][1], runs["official"][-1][1]))
            result[name]["speedup"] = round(result["official"]["seconds_median"] / result[name]["seconds_median"], 2)
        else:
            result[name]["masks"] = len(measured[-1][1])
    return result
