"""Whether this machine has a CUDA GPU, asked of the driver itself (no CUDA toolkit needed)."""

from __future__ import annotations

import ctypes
import functools
import sys


def load_library(names: tuple[str, ...]) -> ctypes.CDLL | None:
    """The first of `names` that loads as a shared library, or None."""
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


@functools.cache
def cuda_device_count() -> int:
    """Number of CUDA devices the driver reports; 0 without a driver."""
    driver = load_library(("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so"))
    if driver is None or driver.cuInit(0) != 0:
        return 0
    count = ctypes.c_int(0)
    return count.value if driver.cuDeviceGetCount(ctypes.byref(count)) == 0 else 0
