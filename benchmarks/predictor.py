"""`python -m benchmarks predictor`: our local engine next to the model's official predictor
(`SAM2ImagePredictor`, or SAM1's / MobileSAM's `SamPredictor`).

Both get the same random-init weights, image and prompts; calls alternate so that machine noise
hits both alike. With `device="cuda"` the official predictor runs on the GPU in float32 and under
bfloat16 autocast (as its README runs it), and ours on ONNX Runtime's CUDA provider.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from triton_sam.predictor import Predictor
from triton_sam.registry import DEFAULT_MODEL
from triton_sam.repository import ENCODER_FP16, ENCODER_FP32

from . import summarize, timed
from .fixtures import (
    BENCH_SHAPE,
    bench_image,
    exported_repository,
    official_bf16_calls,
    official_calls,
    official_predictor,
    onnx_mib,
)


def run(
    model_id: str = DEFAULT_MODEL,
    encodes: int = 3,
    decodes: int = 30,
    shape: tuple[int, int] = BENCH_SHAPE,
    seed: int = 0,
    workdir: Path = Path(".bench"),
    device: str = "cpu",
    half: bool = False,
    warm_up: bool = True,
) -> dict:
    """Time encode and one-point multimask decode for both implementations (ours with a float16
    encoder backbone if `half`); on "cuda" the official one also under bfloat16 autocast. Without
    `warm_up` (a smoke run: that it runs) the first calls, which load and tune, are timed too."""
    import torch

    repository = exported_repository(model_id, seed, workdir, half=half)
    reference = official_predictor(model_id, seed, device)
    ours = Predictor(model_id, model_repository=repository)
    image = bench_image(shape)
    point = {"point_coords": np.array([[shape[1] * 0.4, shape[0] * 0.45]]), "point_labels": np.array([1])}
    implementations = {"ref": official_calls(reference, device)}
    if device == "cuda":
        implementations["ref_bf16"] = official_bf16_calls(reference, device)
    implementations["ours"] = (ours.set_image, ours.predict)

    times: dict[str, list[float]] = {f"{name}_{step}": [] for name in implementations for step in ("encode", "decode")}
    with torch.inference_mode():
        for set_image, predict in implementations.values() if warm_up else ():  # not timed
            set_image(image)
            predict(**point)
        for _ in range(encodes):
            for name, (set_image, _) in implementations.items():
                times[f"{name}_encode"].append(timed(set_image, image))
        for _ in range(decodes):
            for name, (_, predict) in implementations.items():
                times[f"{name}_decode"].append(timed(predict, **point))

    stats = {key: summarize(values) for key, values in times.items()}
    ratios = {
        f"{step}_ratio{suffix}": stats[f"ours_{step}"]["median_ms"] / stats[f"{name}_{step}"]["median_ms"]
        for name, suffix in (("ref", ""), ("ref_bf16", "_bf16"))
        if name in implementations
        for step in ("encode", "decode")
    }
    return {
        "benchmark": "predictor",
        "model": model_id,
        "image_shape": list(shape),
        "device": device,
        "engine": ours.engine.describe(),
        "encoder_precision": ENCODER_FP16 if half else ENCODER_FP32,
        "onnx_mib": onnx_mib(repository, model_id),
        "torch_threads": torch.get_num_threads(),
        **stats,
        **ratios,
    }
