"""`triton-sam bench predictor`: our local engine next to the model's official predictor
(`SAM2ImagePredictor`, or SAM1's / MobileSAM's `SamPredictor`).

Both get the same random-init weights, image and prompts; calls alternate so that machine noise
hits both alike. With `device="cuda"` the official predictor runs on the GPU in float32 and under
bfloat16 autocast (as its README runs it), and ours on ONNX Runtime's CUDA provider.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from ..errors import ModelFileError, ModelNotFoundError
from ..predictor import Predictor
from ..registry import get_model
from ..repository import ENCODER_FP16, ENCODER_FP32, locate, read_metadata
from . import summarize, timed


def exported_repository(model_id: str, seed: int, workdir: Path, half: bool = False) -> Path:
    """`workdir`/model_repository (`_fp16` with `half`) with `model_id` exported from random-init
    weights of `seed`. Exports only when that exact export is not there yet.
    """
    from ..export import write_session_model

    spec = get_model(model_id)
    repository = Path(workdir) / ("model_repository_fp16" if half else "model_repository")
    precision = ENCODER_FP16 if half else ENCODER_FP32
    try:
        exported = locate(spec, repository)
        metadata = [read_metadata(path.parent.parent) for path in (exported.encoder, exported.decoder)]
        if all(m.get("seed") == seed and m.get("encoder_precision", ENCODER_FP32) == precision for m in metadata):
            write_session_model(spec, repository)  # cheap; keeps an older export's session model current
            return repository
    except (ModelNotFoundError, ModelFileError):
        pass
    from ..export import export_model

    export_model(spec, repository, seed=seed, half=half, progress=lambda message: print(message, file=sys.stderr))
    return repository


def official_predictor(model_id: str, seed: int, device: str = "cpu"):
    """The official predictor of `model_id`'s family, with the random-init weights of `seed`, on `device`."""
    spec = get_model(model_id)
    if spec.family == "sam2":
        from sam2.sam2_image_predictor import SAM2ImagePredictor

        from ..export.sam2_onnx import build_model

        return SAM2ImagePredictor(build_model(spec, seed=seed).to(device))
    if spec.family == "sam3":
        from sam3.model.sam1_task_predictor import SAM3InteractiveImagePredictor

        from ..export.sam3_onnx import build_model

        return SAM3InteractiveImagePredictor(build_model(spec, seed=seed).to(device))
    from ..export.sam1_onnx import build_model

    if spec.family == "mobile_sam":
        from mobile_sam import SamPredictor
    else:
        from segment_anything import SamPredictor
    return SamPredictor(build_model(spec, seed=seed).to(device))


def onnx_mib(repository: Path, model_id: str) -> float:
    """Size of the exported encoder and decoder files (weights included), MiB."""
    exported = locate(get_model(model_id), repository)
    return sum(f.stat().st_size for path in (exported.encoder, exported.decoder) for f in path.parent.iterdir()) / 2**20


def bench_image(shape: tuple[int, int]) -> np.ndarray:
    """A natural RGB image (skimage's astronaut) stretched to `shape`."""
    from PIL import Image
    from skimage import data

    return np.asarray(Image.fromarray(data.astronaut()).resize((shape[1], shape[0]), Image.BILINEAR))


def bench_images(shape: tuple[int, int], count: int) -> Iterator[np.ndarray]:
    """`count` different images of `shape` (the bench image flipped and shifted), made one at a time."""
    base = bench_image(shape)
    for i in range(count):
        yield np.roll(base if i % 2 == 0 else base[:, ::-1], shift=37 * i, axis=(0, 1))


def _official_calls(reference, device: str, autocast: bool) -> tuple[Callable, Callable]:
    """`set_image` and `predict` of the official predictor, each finished when it returns (a GPU's
    queued work included), under bfloat16 autocast if asked."""
    import torch

    def call(method: Callable) -> Callable:
        def timed_call(*args, **kwargs):
            with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
                result = method(*args, **kwargs)
            if device == "cuda":
                torch.cuda.synchronize()
            return result

        return timed_call

    return call(reference.set_image), call(reference.predict)


def run(
    model_id: str = "sam2.1_hiera_tiny",
    encodes: int = 3,
    decodes: int = 30,
    shape: tuple[int, int] = (977, 1531),
    seed: int = 0,
    workdir: Path = Path(".bench"),
    device: str = "cpu",
    half: bool = False,
) -> dict:
    """Time encode and one-point multimask decode for both implementations (ours with a float16
    encoder backbone if `half`); on "cuda" the official one also under bfloat16 autocast."""
    import torch

    repository = exported_repository(model_id, seed, workdir, half=half)
    reference = official_predictor(model_id, seed, device)
    ours = Predictor(model_id, model_repository=repository)
    image = bench_image(shape)
    point = {"point_coords": np.array([[shape[1] * 0.4, shape[0] * 0.45]]), "point_labels": np.array([1])}
    implementations = {"ref": _official_calls(reference, device, autocast=False)}
    if device == "cuda":  # a second predictor on the same model keeps its own (bfloat16) features
        implementations["ref_bf16"] = _official_calls(type(reference)(reference.model), device, autocast=True)
    implementations["ours"] = (ours.set_image, ours.predict)

    times: dict[str, list[float]] = {f"{name}_{step}": [] for name in implementations for step in ("encode", "decode")}
    with torch.inference_mode():
        for set_image, predict in implementations.values():  # warm-up, not timed
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
