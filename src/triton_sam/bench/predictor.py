"""`triton-sam bench predictor`: our local engine next to the model's official predictor
(`SAM2ImagePredictor`, or SAM1's / MobileSAM's `SamPredictor`).

Both get the same random-init weights, image and prompts; calls alternate so that machine noise
hits both alike.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..errors import ModelFileError, ModelNotFoundError
from ..predictor import Predictor
from ..registry import get_model
from ..repository import locate, read_metadata
from . import summarize, timed


def exported_repository(model_id: str, seed: int, workdir: Path) -> Path:
    """`workdir`/model_repository with `model_id` exported from random-init weights of `seed`.

    Exports only when that exact export is not there yet.
    """
    from ..export import write_session_model

    spec = get_model(model_id)
    repository = Path(workdir) / "model_repository"
    try:
        exported = locate(spec, repository)
        if all(read_metadata(path.parent.parent).get("seed") == seed for path in (exported.encoder, exported.decoder)):
            write_session_model(spec, repository)  # cheap; keeps an older export's session model current
            return repository
    except (ModelNotFoundError, ModelFileError):
        pass
    from ..export import export_model

    export_model(spec, repository, seed=seed, progress=lambda message: print(message, file=sys.stderr))
    return repository


def official_predictor(model_id: str, seed: int):
    """The official predictor of `model_id`'s family, with the random-init weights of `seed`."""
    spec = get_model(model_id)
    if spec.family == "sam2":
        from sam2.sam2_image_predictor import SAM2ImagePredictor

        from ..export.sam2_onnx import build_model

        return SAM2ImagePredictor(build_model(spec, seed=seed))
    if spec.family == "sam3":
        from sam3.model.sam1_task_predictor import SAM3InteractiveImagePredictor

        from ..export.sam3_onnx import build_model

        return SAM3InteractiveImagePredictor(build_model(spec, seed=seed))
    from ..export.sam1_onnx import build_model

    if spec.family == "mobile_sam":
        from mobile_sam import SamPredictor
    else:
        from segment_anything import SamPredictor
    return SamPredictor(build_model(spec, seed=seed))


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


def run(
    model_id: str = "sam2.1_hiera_tiny",
    encodes: int = 3,
    decodes: int = 30,
    shape: tuple[int, int] = (977, 1531),
    seed: int = 0,
    workdir: Path = Path(".bench"),
) -> dict:
    """Time encode and one-point multimask decode for both implementations."""
    import torch

    repository = exported_repository(model_id, seed, workdir)
    reference = official_predictor(model_id, seed)
    ours = Predictor(model_id, model_repository=repository)
    image = bench_image(shape)
    point = {"point_coords": np.array([[shape[1] * 0.4, shape[0] * 0.45]]), "point_labels": np.array([1])}

    times: dict[str, list[float]] = {"ref_encode": [], "ours_encode": [], "ref_decode": [], "ours_decode": []}
    with torch.inference_mode():
        reference.set_image(image)  # warm-up, not timed
        ours.set_image(image)
        for _ in range(encodes):
            times["ref_encode"].append(timed(lambda: reference.set_image(image)))
            times["ours_encode"].append(timed(lambda: ours.set_image(image)))
        for _ in range(decodes):
            times["ref_decode"].append(timed(lambda: reference.predict(**point)))
            times["ours_decode"].append(timed(lambda: ours.predict(**point)))

    stats = {key: summarize(values) for key, values in times.items()}
    return {
        "benchmark": "predictor",
        "model": model_id,
        "image_shape": list(shape),
        "engine": ours.engine.describe(),
        "onnx_mib": onnx_mib(repository, model_id),
        "torch_threads": torch.get_num_threads(),
        **stats,
        "encode_ratio": stats["ours_encode"]["median_ms"] / stats["ref_encode"]["median_ms"],
        "decode_ratio": stats["ours_decode"]["median_ms"] / stats["ref_decode"]["median_ms"],
    }
