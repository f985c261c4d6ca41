"""Pick ONNX Runtime execution providers that can really start on this machine.

onnxruntime-gpu lists TensorRT and CUDA as available even where no GPU exists, and asking for them
there prints errors before falling back; so we probe the driver and libraries first.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

import onnxruntime as ort

TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


def _load(names: tuple[str, ...]) -> ctypes.CDLL | None:
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


@functools.cache
def cuda_device_count() -> int:
    """Number of CUDA devices the driver reports; 0 without a driver."""
    driver = _load(("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so"))
    if driver is None or driver.cuInit(0) != 0:
        return 0
    count = ctypes.c_int(0)
    return count.value if driver.cuDeviceGetCount(ctypes.byref(count)) == 0 else 0


@functools.cache
def _tensorrt_present() -> bool:
    return _load(("libnvinfer.so.10", "nvinfer_10.dll")) is not None or bool(ctypes.util.find_library("nvinfer"))


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
    """Options for `provider`: TensorRT in FP16 with an engine cache so it builds once."""
    if provider == TENSORRT and cache_dir:
        return {"trt_fp16_enable": "1", "trt_engine_cache_enable": "1", "trt_engine_cache_path": cache_dir}
    return {}
