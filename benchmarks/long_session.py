"""The GUI benchmark's long session: objects committed one after another on one plane through the
panel, with real Qt events (mouse moves, a click, the commit key), each hover and commit timed.

Issue #40: a long session must not slow down (after 1,000 committed objects, hover p95 and commit
time within 1.2x of the first ten). The model is the tests' synthetic one with a short reach, on
a plane of small separated blobs: a click on a blob makes that blob the object, so every commit
adds one object of the same size and the first objects and the last are timed doing the same work.
What grows is what the plugin and napari keep per object; the model's own cost is the other
benchmarks'.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
from napari.layers import Labels
from qtpy.QtCore import QEvent, Qt
from qtpy.QtTest import QTest

import benchmarks as bench
from triton_sam.plugin import layers
from triton_sam.plugin.bindings import KEYS
from triton_sam.registry import get_model

from .gui import StallMonitor, _canvas, _run_until, open_widget, send_mouse

MODEL = "sam2.1_hiera_tiny"  # the synthetic model takes its names
SIDE = 1024  # px a side of the plane: one model unit a pixel
PERIOD = 32  # px between blob centres: 1,024 blobs
RADIUS = 8  # px, a blob's radius
REACH = 4.0  # model units (px here) the synthetic masks reach beyond the point before falling off
HOVER_OFFSETS = ((5, 0), (-4, 4), (0, -5))  # px from a blob's centre: one preview each before its click
WINDOW = 10  # objects at each end of the session compared
TIMEOUT_S = 30.0


def blob_plane() -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The uint8 plane of bright blobs on a dark ground, and each blob's centre (x, y), row by row."""
    yy, xx = np.mgrid[:SIDE, :SIDE] % PERIOD - PERIOD // 2
    plane = np.where(yy**2 + xx**2 <= RADIUS**2, 230, 20).astype(np.uint8)
    centres = [(x, y) for y in range(PERIOD // 2, SIDE, PERIOD) for x in range(PERIOD // 2, SIDE, PERIOD)]
    return plane, centres


def synthetic_repository(directory: Path) -> Path:
    """The tests' synthetic model (a checkout's `tests/synthetic.py`), its masks reaching `REACH`."""
    from tests.synthetic import write_repository

    return write_repository(get_model(MODEL), directory, reach=REACH)


class Annotator:
    """Drives the panel as a user annotating blob after blob, and times what the user waits for."""

    def __init__(self, viewer, widget, image) -> None:
        self.viewer, self.widget, self.image = viewer, widget, image
        self.canvas = _canvas(widget)
        self.monitor = StallMonitor(self.canvas)
        self.previews: list[tuple[float, object]] = []  # (delivered at, preview)
        self.written: list[float] = []  # when the objects layer took each commit
        widget.preview_shown.connect(lambda preview: self.previews.append((time.perf_counter(), preview)))
        viewer.layers.events.inserted.connect(self._layer_added)

    def _layer_added(self, event) -> None:
        layer = event.value
        if isinstance(layer, Labels) and layer.name.endswith(layers.OBJECTS_SUFFIX):
            layer.events.labels_update.connect(lambda event: self.written.append(time.perf_counter()))

    def _world(self, x: float, y: float):
        return self.image.data_to_world([y, x])

    def _delivered(self, since: int, hover: bool) -> float:
        """When the first preview after the `since`-th came (of a hover, or else of the prompts)."""
        found = lambda: next((t for t, p in self.previews[since:] if (p.point is not None) == hover), None)  # noqa: E731
        _run_until(lambda: found() is not None, TIMEOUT_S)
        if found() is None:
            raise RuntimeError(f"no {'hover' if hover else 'prompt'} preview in {TIMEOUT_S:.0f} s")
        return found()

    def hover(self, x: float, y: float) -> float:
        """Seconds from a mouse move to image pixel (x, y) to its preview delivered to the layer."""
        since, sent = len(self.previews), time.perf_counter()
        send_mouse(self.viewer, self.canvas, QEvent.Type.MouseMove, self._world(x, y))
        return self._delivered(since, hover=True) - sent

    def click(self, x: float, y: float) -> None:
        """A click at image pixel (x, y), and its object's preview delivered."""
        since, left, world = len(self.previews), Qt.MouseButton.LeftButton, self._world(x, y)
        send_mouse(self.viewer, self.canvas, QEvent.Type.MouseButtonPress, world, left, left)
        send_mouse(self.viewer, self.canvas, QEvent.Type.MouseButtonRelease, world, left)
        self._delivered(since, hover=False)

    def commit(self) -> tuple[float, dict]:
        """Seconds from the commit key to the object written into the objects layer, and the GUI
        thread's stalls meanwhile (until the next frame on screen)."""
        since = len(self.written)
        key = KEYS["commit"]
        modifier = Qt.KeyboardModifier.ShiftModifier if key.startswith("Shift-") else Qt.KeyboardModifier.NoModifier
        self.monitor.start()
        pressed = time.perf_counter()
        QTest.keyClick(self.canvas, getattr(Qt.Key, f"Key_{key.split('-')[-1]}"), modifier)

        def shown() -> bool:
            return len(self.written) > since and any(swapped > self.written[since] for _, swapped in self.monitor.frames)

        _run_until(shown, TIMEOUT_S)
        stalls = self.monitor.stop()
        if len(self.written) == since:
            raise RuntimeError(f"nothing written in {TIMEOUT_S:.0f} s: {self.widget.form.status.label.text()}")
        return self.written[since] - pressed, stalls

    def annotate(self, x: int, y: int) -> dict:
        """One object: hovers near the blob at (x, y), a click on it, the commit key."""
        hovers = [self.hover(x + dx, y + dy) for dx, dy in HOVER_OFFSETS]
        self.click(x, y)
        commit_s, stalls = self.commit()
        return {"hover_s": hovers, "commit_s": commit_s, "commit_gui_ms": stalls["max_stall_besides_drawing_ms"]}


def _span(objects: list[dict]) -> dict:
    """Hover (each move to its preview) and commit figures of `objects`, in ms."""
    return {
        "hover": bench.summarize([h for o in objects for h in o["hover_s"]], percentiles=(50, 95)),
        "commit": bench.summarize([o["commit_s"] for o in objects], percentiles=(50, 95)),
        "commit_gui_ms": float(np.median([o["commit_gui_ms"] for o in objects])),
    }


def summary(objects: list[dict]) -> dict:
    """The first `WINDOW` objects against the last, and each hundred: the ratios issue #40 bounds."""
    window = min(WINDOW, max(1, len(objects) // 2))
    first, last = _span(objects[:window]), _span(objects[-window:])
    return {
        "objects": len(objects),
        "window": window,
        "first": first,
        "last": last,
        "ratio": {
            "hover_p95": last["hover"]["p95_ms"] / first["hover"]["p95_ms"],
            "commit_median": last["commit"]["median_ms"] / first["commit"]["median_ms"],
            "commit_gui_median": last["commit_gui_ms"] / first["commit_gui_ms"],
        },
        "per_hundred": [_span(objects[i : i + 100]) for i in range(0, len(objects), 100)],
    }


def annotate(viewer, objects: int, repository: Path) -> tuple[list[dict], np.ndarray]:
    """Start the panel on the blob plane in `viewer` and annotate `objects` blobs (at most 1,024),
    row by row: each object's timings, and the objects layer's labels at the end."""
    plane, centres = blob_plane()
    image = viewer.add_image(plane, name="blobs")
    widget = open_widget(viewer, "Local", None, MODEL, repository)
    widget.connect_engine()
    _run_until(lambda: widget.ready, 120)
    try:
        annotator = Annotator(viewer, widget, image)
        done = [annotator.annotate(x, y) for x, y in centres[:objects]]
        return done, layers.existing_objects_layer(viewer, image).data
    finally:
        widget.close_session()
        viewer.window.remove_dock_widget(widget)  # the panel must not outlive its viewer


def run(objects: int, workdir: Path = Path(".bench")) -> dict:
    """`annotate` in a napari window of its own; the figures of `summary`."""
    import napari

    Path(workdir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=workdir) as directory:
        repository = synthetic_repository(Path(directory))
        viewer = napari.Viewer(show=True)
        try:
            done, labels = annotate(viewer, objects, repository)
        finally:
            viewer.close()
    if len(np.unique(labels)) != len(done) + 1:
        raise RuntimeError(f"{len(np.unique(labels)) - 1} objects on the plane after {len(done)} commits")
    return {"plane": [SIDE, SIDE], "blob_radius": RADIUS, **summary(done)}
