"""`python -m benchmarks volume`: planes per second propagated through a stack, next to `SAM2VideoPredictor`.

One object is clicked on the first plane and tracked to the last, by `VolumePredictor` (locally,
and through a local Triton server whose session model keeps the memories; planes encoded as they
are reached, as a user's first run does) and by the official video predictor (on `device`), same
random-init weights and planes; the runs alternate so that machine noise hits all alike. Each run
starts with no plane encoded (the server's cache holds more planes than a run: it gets a new
stack each run). The masks are compared as a check; where the official predictor cannot fill
holes (no sam2 CUDA extension) ours does not either, so both do the same work.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from triton_sam.registry import DEFAULT_MODEL
from triton_sam.video import VolumePredictor

from .fixtures import bench_volume, exported_repository, official_fills_holes, official_video_predictor, official_volume_state
from .parity import mask_iou
from .wire import loopback_server


def _ours(predictor: VolumePredictor, volume: np.ndarray, point: list[float]) -> tuple[float, list[float], list[np.ndarray]]:
    started = time.perf_counter()
    state = predictor.init_state(volume)
    predictor.add_new_points_or_box(state, 0, 1, points=[point], labels=[1])
    return _timed_planes(predictor.propagate_in_video(state), started, lambda masks: masks)


def _official(reference, volume: np.ndarray, contrast_limits, point: list[float], device: str):
    import torch

    started = time.perf_counter()
    state = official_volume_state(reference, volume, contrast_limits)
    reference.add_new_points_or_box(state, 0, 1, points=[point], labels=[1])

    def host(masks) -> np.ndarray:
        if device == "cuda":
            torch.cuda.synchronize()
        return masks.cpu().numpy()

    return _timed_planes(reference.propagate_in_video(state), started, host)


def _timed_planes(planes, started: float, to_numpy) -> tuple[float, list[float], list[np.ndarray]]:
    """(total seconds, seconds per plane, masks) of a propagation run."""
    per_plane, masks, last = [], [], time.perf_counter()
    for _, _, plane_masks in planes:
        masks.append(to_numpy(plane_masks)[0, 0] > 0)
        now = time.perf_counter()
        per_plane.append(now - last)
        last = now
    return time.perf_counter() - started, per_plane, masks


def run(
    model_id: str = DEFAULT_MODEL,
    planes: int = 20,
    shape: tuple[int, int] = (512, 512),
    repeats: int = 2,
    seed: int = 0,
    workdir: Path = Path(".bench"),
    device: str = "cpu",
    backends: tuple[str, ...] = ("local", "triton"),
) -> dict:
    """Propagation through `planes` planes of `shape`, ours on each backend and the official, `repeats` runs each."""
    import torch

    repository = exported_repository(model_id, seed, workdir)
    point = [0.3 * shape[1], 0.3 * shape[0]]  # the first disk on the first plane
    reference = official_video_predictor(model_id, seed, device)
    runs: dict[str, list] = {"official": [], **{backend: [] for backend in backends}}
    with ExitStack() as stack, torch.inference_mode():
        predictors = {}
        for backend in backends:
            options = {"model_repository": repository, "fill_hole_area": None if official_fills_holes() else 0}
            if backend == "triton":
                options["url"] = stack.enter_context(loopback_server(repository, model_id)).grpc_url
            predictors[backend] = stack.enter_context(VolumePredictor(model_id, backend, **options))
        for repeat in range(repeats):
            volume = bench_volume(planes, shape, seed + repeat)
            limits = predictors[backends[0]].init_state(volume).contrast_limits
            for backend, predictor in predictors.items():
                runs[backend].append(_ours(predictor, volume, point))
            runs["official"].append(_official(reference, volume, limits, point, device))
    result = {
        "benchmark": "volume",
        "model": model_id,
        "planes": planes,
        "plane_shape": list(shape),
        "repeats": repeats,
        "reference_device": device,
        "holes_filled": official_fills_holes(),
    }
    for name, measured in runs.items():
        totals = [total for total, _, _ in measured]
        per_plane = [s for _, seconds, _ in measured for s in seconds[1:]]  # the first plane is the prompted one
        result[name] = {
            "planes_per_s": round(planes / float(np.median(totals)), 3),
            "run_s_median": round(float(np.median(totals)), 2),
            "plane_ms_p50": round(float(np.median(per_plane)) * 1000, 1),
        }
        if name != "official":
            ious = [mask_iou(a, b) for a, b in zip(measured[-1][2], runs["official"][-1][2])]
            result[name]["min_iou_vs_official"] = round(float(min(ious)), 5)
            result[name]["speedup"] = round(result[name]["planes_per_s"] / result["official"]["planes_per_s"], 2)
    return result
