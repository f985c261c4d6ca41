"""What the benchmarks share: the exported model, the official predictor, images and mouse traces.

Tests use them too (the parity tests' official predictor, the load test's traces).
"""

from __future__ import annotations

import ctypes
import gc
import random
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from triton_sam.contract import CONTRACT_VERSION
from triton_sam.errors import ModelFileError, ModelNotFoundError
from triton_sam.registry import get_model
from triton_sam.repository import ENCODER_FP16, ENCODER_FP32, locate, read_metadata

BENCH_SHAPE = (977, 1531)  # (H, W) of the image every benchmark uses by default
PAUSE_S = (0.2, 0.6)  # in mouse traces, the cursor rests this long between strokes


def _is_current_export(metadata: dict, seed: int, precision: str) -> bool:
    """Whether one exported model's metadata says: random weights of `seed`, this encoder precision,
    written under this triton-sam's tensor contract."""
    return (
        metadata.get("seed") == seed
        and metadata.get("encoder_precision", ENCODER_FP32) == precision
        and metadata.get("contract_version") == CONTRACT_VERSION
    )


def exported_repository(model_id: str, seed: int, workdir: Path, half: bool = False) -> Path:
    """`workdir`/model_repository (`_fp16` with `half`) with `model_id` exported from random-init
    weights of `seed`. Exports only when that exact export, by the current export code, is not there yet.
    """
    from triton_sam.export import write_session_model

    spec = get_model(model_id)
    repository = Path(workdir) / ("model_repository_fp16" if half else "model_repository")
    precision = ENCODER_FP16 if half else ENCODER_FP32
    try:
        exported = locate(spec, repository)
        metadata = [read_metadata(path.parent.parent) for path in (exported.encoder, exported.decoder)]
        video_ready = spec.family != "sam2" or (exported.video_dir / "video.json").is_file()
        if video_ready and all(_is_current_export(m or {}, seed, precision) for m in metadata):
            write_session_model(spec, repository)  # cheap; keeps an older export's session model current
            return repository
    except (ModelNotFoundError, ModelFileError):
        pass
    from triton_sam.export import export_model

    export_model(spec, repository, seed=seed, half=half, progress=lambda message: print(message, file=sys.stderr))
    return repository


def release_memory() -> None:
    """Collect garbage and give the freed heap back to the system (glibc keeps it for reuse
    otherwise, and this process's later work would not use it: gigabytes after an official model)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def official_predictor(model_id: str, seed: int, device: str = "cpu"):
    """The official predictor of `model_id`'s family, with the random-init weights of `seed`, on `device`."""
    spec = get_model(model_id)
    if spec.family == "sam2":
        from sam2.sam2_image_predictor import SAM2ImagePredictor

        from triton_sam.export.sam2_onnx import build_model

        return SAM2ImagePredictor(build_model(spec, seed=seed).to(device))
    if spec.family == "sam3":
        from sam3.model.sam1_task_predictor import SAM3InteractiveImagePredictor

        from triton_sam.export.sam3_onnx import build_model, tracker_of

        return SAM3InteractiveImagePredictor(tracker_of(build_model(spec, seed=seed)).to(device))  # the image model let go
    from triton_sam.export.sam1_onnx import build_model

    if spec.family == "mobile_sam":
        from mobile_sam import SamPredictor
    else:
        from segment_anything import SamPredictor
    return SamPredictor(build_model(spec, seed=seed).to(device))


@contextmanager
def unpinned() -> Iterator[None]:
    """Let sam3's geometry encoder run without CUDA: it pins a 4-value tensor before moving it
    (`Tensor.pin_memory` needs a GPU; `Sam3Processor` fails on a CPU without this); a no-op here."""
    import torch

    pin = torch.Tensor.pin_memory
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.Tensor.pin_memory = pin


def official_video_predictor(model_id: str, seed: int, device: str = "cpu"):
    """The official `SAM2VideoPredictor` of a SAM2.1 `model_id` with the random-init weights of `seed`.

    Its mask memories are stored in bfloat16 and, on GPUs, attended to under bfloat16 autocast. In
    float32 on a CPU its memory attention fails where a plane attends to mask memories alone (no
    object pointer promotes them to float32), so the memories are given to it as float32: the
    values torch's type promotion makes of them whenever a pointer is present.
    """
    from triton_sam.export.sam2_onnx import build_model
    from triton_sam.export.sam2_video_onnx import build_video_model

    spec = get_model(model_id)
    video = build_video_model(build_model(spec, seed=seed), spec).to(device)
    attend = video.memory_attention.forward
    video.memory_attention.forward = lambda curr, memory, *args, **kwargs: attend(curr, memory.float(), *args, **kwargs)
    return video


def official_fills_holes() -> bool:
    """Whether the official video predictor can fill small holes here (it needs sam2's CUDA
    extension and skips the step without it)."""
    try:
        from sam2 import _C  # noqa: F401
    except ImportError:
        return False
    return True


def official_volume_state(reference, volume: np.ndarray, contrast_limits=None) -> dict:
    """The official predictor's `init_state` for the planes of `volume` (Z x H x W), each made as
    `SAM2ImagePredictor` makes an image (our uint8 conversion, then its transforms), instead of
    frames read from JPEG files (lossy). Its warm-up encodes plane 0 and keeps its features, as
    `init_state` does with real frames (not the placeholders it is given here)."""
    import tempfile

    import torch
    from PIL import Image
    from sam2.utils.transforms import SAM2Transforms

    from triton_sam.image import to_uint8

    reference._get_image_feature = lambda *args, **kwargs: None  # no warm-up on a placeholder
    try:
        with tempfile.TemporaryDirectory() as frames:
            for i in range(len(volume)):  # init_state reads a folder of frames: tiny placeholders
                Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(f"{frames}/{i:05d}.jpg")
            state = reference.init_state(frames)
    finally:
        del reference._get_image_feature  # the class's own again
    transforms = SAM2Transforms(resolution=reference.image_size, mask_threshold=0.0)
    planes = [np.repeat(to_uint8(plane, contrast_limits)[..., None], 3, axis=2) for plane in volume]
    state["images"] = torch.stack([transforms(plane) for plane in planes]).to(reference.device)
    state["video_height"], state["video_width"] = volume.shape[1:3]
    reference._get_image_feature(state, frame_idx=0, batch_size=1)  # init_state's warm-up, on plane 0
    return state


def bench_volume(planes: int, shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    """A uint16 stack of `planes` textured planes with three bright disks that move and grow or shrink."""
    rng = np.random.default_rng(seed)
    height, width = shape
    yy, xx = np.mgrid[:height, :width]
    volume = np.empty((planes, height, width), np.uint16)
    for z in range(planes):
        plane = 1000 + 150 * rng.standard_normal(shape)
        t = z / max(planes - 1, 1)
        disks = (
            (0.3 + 0.3 * t, 0.25 + 0.2 * t, 0.08 + 0.06 * t),
            (0.7 - 0.2 * t, 0.7, 0.12 - 0.05 * t),
            (0.5, 0.75 - 0.4 * t, 0.07),
        )
        for cy, cx, r in disks:
            plane[(yy - cy * height) ** 2 + (xx - cx * width) ** 2 < (r * min(shape)) ** 2] += 2500
        volume[z] = np.clip(plane, 0, 65535)
    return volume


def official_calls(reference, device: str, autocast: bool = False) -> tuple[Callable, Callable]:
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


def official_bf16_calls(reference, device: str) -> tuple[Callable, Callable]:
    """`official_calls` under bfloat16 autocast, on a second predictor over `reference`'s model (it
    keeps its own bfloat16 features)."""
    return official_calls(type(reference)(reference.model), device, autocast=True)


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


def mouse_trace(shape: tuple[int, int], rate_hz: float, duration_s: float, seed: int = 0) -> list[tuple[float, float, float]]:
    """(t, x, y) events: straight strokes of 0.3-1.0 s between random points, 0.2-0.6 s pauses."""
    rng = random.Random(seed)
    height, width = shape
    events, t = [], 0.0
    x, y = width / 2, height / 2
    while t < duration_s:
        tx, ty = rng.uniform(0, width - 1), rng.uniform(0, height - 1)
        steps = max(1, int(rng.uniform(0.3, 1.0) * rate_hz))
        for i in range(1, steps + 1):
            events.append((t, x + (tx - x) * i / steps, y + (ty - y) * i / steps))
            t += 1.0 / rate_hz
        x, y = tx, ty
        t += rng.uniform(*PAUSE_S)
    return [e for e in events if e[0] < duration_s]


def replay(trace, send) -> None:
    """Call `send(index, x, y, t_event)` at each event's time."""
    start = time.perf_counter()
    for index, (t, x, y) in enumerate(trace):
        delay = start + t - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        send(index, x, y, time.perf_counter())
