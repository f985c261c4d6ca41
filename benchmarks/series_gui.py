"""The GUI benchmark's series saves: commits on a 4096 x 4096 plane saved while napari runs.

Issue #40: saving a commit never blocks the GUI thread more than 50 ms for a 4096 x 4096 plane. In a
real napari window with the panel, objects (disks of 20 to 150 px radius at random places) are
written into the objects layer of a series image as a commit writes them, and the panel's saving
(`SeriesSaving`: the commit at once, then the layer's change once it rests) saves each to disk
(zarr chunks, journal, fsyncs) on its worker threads. The GUI thread's longest stall is measured
from the commit's save request until all is saved, for each commit, with `gui.StallMonitor`.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import tifffile

import benchmarks as bench
from triton_sam.objects import Committed
from triton_sam.plugin import layers
from triton_sam.series import AnnotationSeries

from .gui import StallMonitor, _canvas, _run_until, open_widget

SIDE = 4096
TIMEOUT_S = 60.0


def run(commits: int = 20, workdir: Path = Path(".bench"), seed: int = 0) -> dict:
    """Stalls of the GUI thread while each of `commits` commits on a `SIDE` x `SIDE` plane is saved."""
    import napari

    workdir.mkdir(parents=True, exist_ok=True)
    viewer = napari.Viewer(show=True)
    try:
        with tempfile.TemporaryDirectory(dir=workdir) as folder:
            return measure(viewer, commits, Path(folder), seed)
    finally:
        viewer.close()


def measure(viewer, commits: int, folder: Path, seed: int = 0) -> dict:
    """`run` in `viewer`, the series made in `folder`."""
    rng = np.random.default_rng(seed)
    tifffile.imwrite(folder / "large.tif", np.zeros((SIDE, SIDE), np.uint8))
    series = AnnotationSeries.open(folder)
    image = viewer.add_image(np.zeros((SIDE, SIDE), np.uint8), name="large")
    objects = layers.objects_layer(viewer, image, np.uint16)
    widget = open_widget(viewer, "Local", None, "sam2.1_hiera_tiny", folder)
    saving = widget.series.saving
    saving.watch(series, 0, objects)
    monitor, stalls, seconds = StallMonitor(_canvas(widget)), [], []
    for object_id in range(1, commits + 1):
        radius = int(rng.integers(20, 151))
        yy, xx = np.mgrid[-radius : radius + 1, -radius : radius + 1]
        y, x = (int(v) for v in rng.integers(0, SIDE - 2 * radius - 1, 2))
        committed = Committed(None, yy**2 + xx**2 <= radius**2, object_id, {"model_id": "bench"}, (y, x))
        layers.write_object(objects, (), committed.mask, object_id, committed.provenance, committed.offset)
        _run_until(lambda: False, 0.05)  # napari draws the commit
        monitor.start()
        started = time.perf_counter()
        saving.committed(committed, ())
        _run_until(lambda: not saving.pending, TIMEOUT_S)
        seconds.append(time.perf_counter() - started)
        stalls.append(monitor.stop())
    saved = np.array_equal(series.labels(0), objects.data)
    widget.close_session()
    worst = [s["max_stall_ms"] for s in stalls]
    return {
        "side": SIDE,
        "commits": commits,
        "labels": "zarr",
        "saved_equal_to_layer": bool(saved),
        "max_stall_ms": max(worst),
        "median_max_stall_ms": float(np.median(worst)),
        "max_stall_besides_drawing_ms": max(s["max_stall_besides_drawing_ms"] for s in stalls),
        "max_stall_besides_drawing_and_cpu_wait_ms": max(s["max_stall_besides_drawing_and_cpu_wait_ms"] for s in stalls),
        "save_s": bench.summarize(seconds, (95,)),
    }
