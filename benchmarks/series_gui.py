"""`python -m benchmarks series_gui`: commits on a 4096 x 4096 series plane saved while napari runs.

Issue #40: saving a commit never blocks the GUI thread more than 50 ms for a 4096 x 4096 plane. In a
real napari window with the panel, objects (disks of 20 to 150 px radius at random places) are
written into the objects layer of a series image as a commit writes them, and the panel's saving
(`SeriesSaving`: the commit at once, then the layer's change once it rests) saves each to disk
(zarr chunks, journal, fsyncs) on its worker threads. The GUI thread's longest stall is measured
from the commit's save request, made once napari has drawn the commit (drawing it is the commit's
cost, which the long session times), until all is saved, for each commit, with `gui.StallMonitor`.
Needs a display (use `xvfb-run -a` on a headless machine).
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
from triton_sam.registry import DEFAULT_MODEL
from triton_sam.series import AnnotationSeries

from .gui import StallMonitor, _canvas, _run_until, open_widget

SIDE = 4096
TIMEOUT_S = 60.0
DRAWN_S = 5.0  # the longest a commit's frame is waited for


def run(model_id: str = DEFAULT_MODEL, commits: int = 20, workdir: Path = Path(".bench"), seed: int = 0) -> dict:
    """Stalls of the GUI thread while each of `commits` commits on a `SIDE` x `SIDE` plane is saved
    (`model_id`: the panel's model, never started: the objects are written as its commits would be)."""
    import napari

    workdir.mkdir(parents=True, exist_ok=True)
    viewer = napari.Viewer(show=True)
    try:
        with tempfile.TemporaryDirectory(dir=workdir) as folder:
            return measure(viewer, commits, Path(folder), seed, model_id)
    finally:
        viewer.close()


def measure(viewer, commits: int, folder: Path, seed: int = 0, model_id: str = DEFAULT_MODEL) -> dict:
    """`run` in `viewer`, the series made in `folder`."""
    rng = np.random.default_rng(seed)
    tifffile.imwrite(folder / "large.tif", np.zeros((SIDE, SIDE), np.uint8))
    series = AnnotationSeries.open(folder)
    image = viewer.add_image(np.zeros((SIDE, SIDE), np.uint8), name="large")
    objects = layers.objects_layer(viewer, image, np.uint16)
    widget = open_widget(viewer, "Local", None, model_id, folder)
    saving = widget.series.saving
    saving.watch(series, 0, objects)
    canvas, swapped = _canvas(widget), []
    canvas.frameSwapped.connect(lambda: swapped.append(time.perf_counter()))
    monitor, stalls, seconds = StallMonitor(canvas), [], []
    for object_id in range(1, commits + 1):
        radius = int(rng.integers(20, 151))
        yy, xx = np.mgrid[-radius : radius + 1, -radius : radius + 1]
        y, x = (int(v) for v in rng.integers(0, SIDE - 2 * radius - 1, 2))
        committed = Committed(None, yy**2 + xx**2 <= radius**2, object_id, {"model_id": "bench"}, (y, x))
        written = time.perf_counter()
        layers.write_object(objects, (), committed.mask, object_id, committed.provenance, committed.offset)
        # napari draws the commit, then the save is asked for
        _run_until(lambda written=written: swapped and swapped[-1] > written, DRAWN_S)
        _run_until(lambda: False, 0.05)
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
        "benchmark": "series_gui",
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
