"""Pick ONNX Runtime execution providers that can really start on this machine.

onnxruntime-gpu lists TensorRT and CUDA as available even where no GPU exists, and asking for them
there prints errors before falling back; so we probe the driver and libraries first.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import onnxruntime as ort

from ..contract import CUDA_PROVIDER_OPTIONS
from ..gpu import cuda_device_count, load_library

TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


@functools.cache
def _tensorrt_present() -> bool:
    return load_library(("libnvinfer.so.10", "nvinfer_10.dll")) is not None or bool(ctypes.util.find_library("nvinfer"))


def usable_providers(allow_tensorrt: bool = True) -> list[str]:
    """Providers in order of preference (TensorRT, CUDA, CPU) that can start here."""
    available = set(ort.get_available_providers())
    chosen = []
    if cuda_device_count() > 0:
        if hasattr(ort, "preload_dlls"):
            ort.preload_dlls()
        if allow_tensorrt and TENSORRT in available and _tensorrt_present():
            chosen.append(TENSORRT)
        if CUDA in available:
            chosen.append(CUDA)
    chosen.append(CPU)
    return chosen


def device_of(provider: str) -> str | None:
    """ONNX Runtime's name of the GPU memory `provider` computes in (for IO binding); None for the CPU."""
    return "cuda" if provider in (TENSORRT, CUDA) else None


def provider_options(provider: str, cache_dir: str | None) -> dict[str, str]:
    """Options for `provider`: TensorRT in FP16 with an engine cache so it builds once; CUDA with
    `contract.CUDA_PROVIDER_OPTIONS` (a cheap cuDNN plan on each new batch size)."""
    if provider == TENSORRT and cache_dir:
        return {"trt_fp16_enable": "1", "trt_engine_cache_enable": "1", "trt_engine_cache_path": cache_dir}
    return dict(CUDA_PROVIDER_OPTIONS) if provider == CUDA else {}
