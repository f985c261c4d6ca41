"""Benchmarks run side by side with a reference in one process; results are medians and ratios."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np

T = TypeVar("T")


def summarize(samples_s: list[float], percentiles: tuple[int, ...] = (95,)) -> dict[str, float | None]:
    """Median, percentiles and count of timings given in seconds, reported in milliseconds."""
    ms = np.asarray(samples_s, dtype=float) * 1000.0
    stats = {"median_ms": float(np.median(ms)) if ms.size else None}
    stats.update({f"p{p}_ms": float(np.percentile(ms, p)) if ms.size else None for p in percentiles})
    return {**stats, "n": len(ms)}


def timed_call(fn: Callable[..., T], *args, **kwargs) -> tuple[float, T]:
    """Seconds one call `fn(*args, **kwargs)` takes, and what it returned."""
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - start, result


def timed(fn: Callable[..., object], *args, **kwargs) -> float:
    """Seconds one call `fn(*args, **kwargs)` takes."""
    return timed_call(fn, *args, **kwargs)[0]
