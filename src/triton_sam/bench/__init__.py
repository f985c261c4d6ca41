"""Benchmarks run side by side with a reference in one process; results are medians and ratios."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def summarize(samples_s: list[float]) -> dict[str, float]:
    """Median, p95 and count of timings given in seconds, reported in milliseconds."""
    ms = np.asarray(samples_s) * 1000.0
    return {"median_ms": float(np.median(ms)), "p95_ms": float(np.percentile(ms, 95)), "n": len(ms)}


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of `fn` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
