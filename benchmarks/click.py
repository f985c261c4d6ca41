"""`python -m benchmarks click`: click to committed mask, next to the model's official predictor.

Ours is the interactive path: `InteractiveSession.add_point` then `commit` (which waits for the
click's decode and returns the full-size mask), with the local engine and through a local Triton
server. The reference is what other napari plugins do on a click: the official `predict`
with the same point (three candidates, the best-scoring one kept). Same random-init weights and
image; the image is encoded beforehand for all; calls alternate so machine noise hits all alike.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import numpy as np

from triton_sam.engines import create_engine
from triton_sam.registry import DEFAULT_MODEL, get_model
from triton_sam.session import InteractiveSession

from . import summarize, timed_call
from .fixtures import BENCH_SHAPE, bench_image, exported_repository, official_predictor
from .parity import mask_iou
from .wire import loopback_server


def _reference_click(reference, x: float, y: float) -> np.ndarray:
    masks, scores, _ = reference.predict(point_coords=np.array([[x, y]]), point_labels=np.array([1]))
    return masks[int(np.argmax(scores))] > 0


def _our_click(session: InteractiveSession, x: float, y: float) -> np.ndarray | None:
    session.add_point(x, y)
    committed = session.commit()
    return None if committed is None else committed.mask


def run(
    model_id: str = DEFAULT_MODEL,
    clicks: int = 20,
    shape: tuple[int, int] = BENCH_SHAPE,
    seed: int = 0,
    backends: tuple[str, ...] = ("local", "triton"),
    workdir: Path = Path(".bench"),
    device: str = "cpu",
) -> dict:
    """Click to committed mask for each backend and for the official predictor on `device`."""
    import torch

    spec = get_model(model_id)
    repository = exported_repository(model_id, seed, workdir)
    image = bench_image(shape)
    rng = np.random.default_rng(seed)
    points = [(rng.uniform(0, shape[1] - 1), rng.uniform(0, shape[0] - 1)) for _ in range(clicks)]
    reference = official_predictor(model_id, seed, device)
    result = {"benchmark": "click", "model": model_id, "image_shape": list(shape), "clicks": clicks, "reference_device": device}
    with ExitStack() as stack, torch.inference_mode():
        sessions = {}
        for backend in backends:
            options = {}
            if backend == "triton":
                options["url"] = stack.enter_context(loopback_server(repository, model_id)).grpc_url
            session = InteractiveSession(create_engine(spec, backend, repository, **options), lambda preview: None)
            stack.callback(session.close)
            session.set_plane("bench", image)
            _our_click(session, *points[0])  # warm-up
            sessions[backend] = session
        reference.set_image(image)
        _reference_click(reference, *points[0])

        times: dict[str, list[float]] = {"reference": [], **{backend: [] for backend in backends}}
        ious: dict[str, list[float]] = {backend: [] for backend in backends}
        for x, y in points:
            masks = {}
            seconds, masks["reference"] = timed_call(_reference_click, reference, x, y)
            times["reference"].append(seconds)
            for backend, session in sessions.items():
                seconds, masks[backend] = timed_call(_our_click, session, x, y)
                times[backend].append(seconds)
                if masks[backend] is not None:
                    ious[backend].append(mask_iou(masks[backend], masks["reference"]))
    result["reference_ms"] = summarize(times["reference"])
    for backend in backends:
        result[backend] = {
            "click_to_commit_ms": summarize(times[backend]),
            "ratio_to_reference": float(np.median(times[backend]) / np.median(times["reference"])),
            "committed": len(ious[backend]),
            "min_iou_to_reference": min(ious[backend], default=None),
        }
    return result
