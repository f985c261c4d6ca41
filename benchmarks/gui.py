"""`python -m benchmarks gui`: napari as the user feels it, with the local engine and a local Triton server.

For each backend, in a real napari window: Start (engine, layers, first plane) and background
encoding of a 3-plane stack, with the worst event-loop stall; then a scripted 120 Hz hover path
sent as real Qt mouse-move events to the canvas, timing each event to its preview on screen (the
first canvas frame swapped after the widget wrote the preview), with the worst stall meanwhile.
Then the long session (`long_session`): objects committed one after another on one plane, hover
and commit timed at the first and the last (`series_gui`, a benchmark of its own, times a series'
saves). Needs a display (use `xvfb-run -a` on a headless machine).
"""

from __future__ import annotations

import bisect
import functools
import os
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np
from qtpy.QtCore import QEvent, QEventLoop, QObject, QPointF, QSettings, Qt, QTimer
from qtpy.QtGui import QMouseEvent
from qtpy.QtOpenGLWidgets import QOpenGLWidget
from qtpy.QtWidgets import QApplication, QWidget

import benchmarks as bench
from triton_sam.plugin import bindings
from triton_sam.registry import DEFAULT_MODEL

from .fixtures import BENCH_SHAPE


class RunQueueClock:
    """How long the calling thread has waited, runnable, for a CPU (ns, cumulative): the kernel's
    schedstat. Other processes on the same cores (a Triton server beside napari) show up here, not
    as work. 0 where the kernel does not say (not Linux)."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None

    def __call__(self) -> int:
        return int(os.pread(self._fd, 128, 0).split()[1]) if self._fd is not None else 0

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class StallMonitor(QObject):
    """Gaps between ticks of a 1 ms timer on the GUI thread, how much of them the window of
    `canvas` spent drawing (from its update request, or the canvas's paint event, to the frame the
    canvas swapped) and how much the GUI thread waited for a CPU outside drawing. With an OpenGL
    canvas inside, Qt composes the whole window with OpenGL after any repaint (the canvas's, or a
    label's text): a software renderer such as llvmpipe makes that tens of ms; a GPU display, a few."""

    def __init__(self, canvas: QOpenGLWidget | None = None) -> None:
        super().__init__()
        self.ticks: list[float] = []
        self.frames: list[tuple[float, float]] = []  # (drawing started, frame swapped)
        self._waited: list[tuple[float, int]] = []  # (time, run-queue wait so far): at ticks and frame ends
        self._run_queue: RunQueueClock | None = None
        self._painting: float | None = None
        self._timer = QTimer()
        self._timer.setInterval(1)
        self._timer.timeout.connect(self._tick)
        self._drawing_starts = {}  # watched object -> the event type that starts a frame
        if canvas is not None:
            self._drawing_starts = {canvas: QEvent.Type.Paint, canvas.window(): QEvent.Type.UpdateRequest}
            for watched in self._drawing_starts:
                watched.installEventFilter(self)
            canvas.frameSwapped.connect(self._swapped)

    def _now(self) -> float:
        """The time, with the GUI thread's run-queue wait noted at it."""
        now = time.perf_counter()
        if self._run_queue is not None:
            self._waited.append((now, self._run_queue()))
        return now

    def _tick(self) -> None:
        self.ticks.append(self._now())

    def eventFilter(self, watched, event) -> bool:
        if self._painting is None and self._drawing_starts.get(watched) == event.type():
            self._painting = self._now()
        return False

    def _swapped(self) -> None:
        if self._painting is not None:
            self.frames.append((self._painting, self._now()))
            self._painting = None

    def start(self) -> None:
        """Start ticking; call on the GUI thread (its run-queue wait is the one read)."""
        self.frames.clear()
        self._waited.clear()
        self._run_queue = RunQueueClock()
        self.ticks[:] = [self._now()]
        self._timer.start()

    def stop(self) -> dict:
        """The worst gap; the worst gap less the drawing inside it; the worst gap less drawing and
        less the GUI thread's wait for a CPU outside drawing (its own work, napari's and the
        plugin's); the longest frame (ms), the 99th percentile gap and the tick count."""
        self._timer.stop()
        self._run_queue.close()
        ticks = np.asarray(self.ticks)
        gaps = np.diff(ticks)
        samples = np.asarray(self._waited, dtype=float)
        times, waits = samples[:, 0], samples[:, 1] / 1e9

        def waited(t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
            """Seconds the GUI thread waited for a CPU from t0 to t1 (both sampled times)."""
            return np.interp(t1, times, waits) - np.interp(t0, times, waits)

        drawing, waiting = np.zeros_like(gaps), waited(ticks[:-1], ticks[1:])
        for painted, swapped in self.frames:  # frames are few: a loop over them is cheap
            t0, t1 = np.maximum(ticks[:-1], painted), np.minimum(ticks[1:], swapped)
            inside = np.clip(t1 - t0, 0, None)
            drawing += inside
            waiting -= np.where(inside > 0, waited(t0, t1), 0.0)
        frames = [swapped - painted for painted, swapped in self.frames]
        return {
            "max_stall_ms": float(gaps.max() * 1000.0),
            "max_stall_besides_drawing_ms": float((gaps - drawing).max() * 1000.0),
            "max_stall_besides_drawing_and_cpu_wait_ms": float((gaps - drawing - waiting).max() * 1000.0),
            "max_frame_ms": float(max(frames, default=0.0) * 1000.0),
            "p99_gap_ms": float(np.percentile(gaps, 99) * 1000.0),
            "ticks": len(gaps),
        }


class ScreenClock:
    """When previews reached the screen: the first frame the canvas swapped after each was written.

    Records (time of the hover call the preview answers, time on screen) per preview.
    """

    def __init__(self, widget, canvas: QOpenGLWidget, counts=lambda preview: True) -> None:
        """`counts(preview)`: whether a preview is recorded (e.g. only those of coarse tiles)."""
        self.shown: list[tuple[float, float]] = []
        self._written: list[float] = []
        widget.preview_shown.connect(lambda preview: counts(preview) and self._written.append(preview.t_event))
        canvas.frameSwapped.connect(self._swapped)

    def _swapped(self) -> None:
        now = time.perf_counter()
        self.shown += [(t_event, now) for t_event in self._written]
        self._written.clear()


def send_mouse(
    viewer,
    canvas: QWidget,
    kind: QEvent.Type,
    world_yx,
    button: Qt.MouseButton = Qt.MouseButton.NoButton,
    buttons: Qt.MouseButton = Qt.MouseButton.NoButton,
    modifiers: Qt.KeyboardModifier = Qt.KeyboardModifier.NoModifier,
) -> None:
    """Send a real Qt mouse event to napari's canvas at a 2D world point (camera centre + zoom)."""
    camera = bindings.camera(viewer)
    size = np.array([canvas.height(), canvas.width()])
    yx = (np.asarray(world_yx)[-2:] - np.asarray(camera.center[-2:])) * camera.zoom + size / 2
    position = QPointF(float(yx[1]), float(yx[0]))
    QApplication.sendEvent(canvas, QMouseEvent(kind, position, canvas.mapToGlobal(position), button, buttons, modifiers))


def _run_until(condition, timeout_s: float) -> None:
    """Run the Qt event loop (not a busy loop) until `condition()` holds."""
    loop = QEventLoop()
    poll = QTimer()
    poll.setInterval(5)
    poll.timeout.connect(lambda: condition() and loop.quit())
    poll.start()
    QTimer.singleShot(int(timeout_s * 1000), loop.quit)
    loop.exec()
    poll.stop()


def _hover(viewer, widget, image, trace, monitor: StallMonitor) -> dict:
    """Replay `trace` as mouse moves; latency from each move to its preview on screen.

    napari throttles mouse-move callbacks (a burst reaches the widget later, as its last move),
    so a preview is timed from the last Qt event sent before the hover call it answers.
    """
    canvas = _canvas(widget)
    screen = ScreenClock(widget, canvas)
    session = widget.session
    sent_at: list[float] = []
    pending = list(reversed(trace))
    mover = QTimer()
    mover.setTimerType(Qt.TimerType.PreciseTimer)
    mover.setInterval(2)

    def move() -> None:
        """Send the events that are due by the trace's clock (strokes, then pauses without events)."""
        elapsed = time.perf_counter() - started
        while pending and pending[-1][0] <= elapsed:
            _, x, y = pending.pop()
            sent_at.append(time.perf_counter())
            send_mouse(viewer, canvas, QEvent.Type.MouseMove, image.data_to_world([*[0] * (image.ndim - 2), y, x]))
        if not pending:
            mover.stop()

    monitor.start()
    mover.timeout.connect(move)
    started = time.perf_counter()
    mover.start()
    _run_until(lambda: not mover.isActive() and session.idle, trace[-1][0] + 60)
    _run_until(lambda: False, 0.2)  # the last frame
    stalls = monitor.stop()
    latency = [
        on_screen - sent_at[bisect.bisect_right(sent_at, t_hover) - 1]
        for t_hover, on_screen in screen.shown
        if sent_at and t_hover >= sent_at[0]
    ]
    return {
        **stalls,
        "moves": len(trace),
        "previews_on_screen": len(latency),
        "event_to_screen_ms": bench.summarize(latency, percentiles=(50, 95, 99)),
        "scheduler": session.stats.snapshot(),
    }


def _canvas(widget) -> QOpenGLWidget:
    """napari's canvas in the panel's window."""
    return next(w for w in widget.window().findChildren(QOpenGLWidget) if w.isVisible())


def open_widget(viewer, backend: str, url: str | None, model_id: str, repository: Path):
    """The triton-sam panel, docked through napari's plugin API and filled in as a user would. What
    it remembers goes to a directory of the benchmark's own: a run must not leave the user's panel
    pointing at a benchmark's server and model repository. Its disk cache is off: every run encodes
    (a Triton run would otherwise time the local run's features read from disk)."""
    QSettings.setPath(QSettings.Format.NativeFormat, QSettings.Scope.UserScope, _bench_settings().name)
    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    widget.form.disk_cache_check.setChecked(False)
    widget.form.backend_box.setCurrentText(backend)
    widget.form.url_field.setText(url or "")
    widget.form.model_box.setCurrentText(model_id)
    widget.form.repository_field.setText(str(repository.resolve()))
    return widget


@functools.cache
def _bench_settings() -> tempfile.TemporaryDirectory:
    """Where panels opened by benchmarks keep their settings (removed when the process ends)."""
    return tempfile.TemporaryDirectory(prefix="triton-sam-bench-settings-")


def _backend_run(backend: str, url: str | None, model_id: str, repository: Path, stack, trace) -> dict:
    import napari

    viewer = napari.Viewer(show=True)
    try:
        image = viewer.add_image(stack, name="bench", rgb=True)
        widget = open_widget(viewer, backend, url, model_id, repository)
        monitor = StallMonitor(_canvas(widget))
        result = {}

        monitor.start()
        started = time.perf_counter()
        widget.connect_engine()
        _run_until(lambda: widget.ready, 300)
        result["start"] = {**monitor.stop(), "seconds": time.perf_counter() - started, "engine": widget.session.engine.describe()}

        monitor.start()
        started = time.perf_counter()
        widget.toggle_encode_all()
        _run_until(lambda: not widget.encoding.encoding_all, 300)
        result["encode"] = {**monitor.stop(), "seconds": time.perf_counter() - started, "planes": len(stack)}

        result["hover"] = _hover(viewer, widget, image, trace, monitor)
        widget.close_session()
        return result
    finally:
        viewer.close()


def run(
    model_id: str = DEFAULT_MODEL,
    shape: tuple[int, int] = BENCH_SHAPE,
    hover_s: float = 5.0,
    rate_hz: float = 120.0,
    seed: int = 0,
    backends: tuple[str, ...] = ("local", "triton"),
    workdir: Path = Path(".bench"),
    objects: int = 1000,
    planes: int = 3,
) -> dict:
    """The figures of each backend (none: the long session alone) on a stack of `planes` (up to 3),
    and of a long session of `objects` commits (0: none)."""
    from . import long_session
    from .fixtures import bench_image, exported_repository, mouse_trace
    from .wire import loopback_server

    repository = exported_repository(model_id, seed, workdir) if backends else None
    plane = bench_image(shape)
    stack = np.stack([plane, plane[::-1], plane[:, ::-1]][:planes])
    trace = mouse_trace(shape, rate_hz, hover_s, seed)
    result = {"benchmark": "gui", "model": model_id, "image_shape": list(shape), "rate_hz": rate_hz, "hover_s": hover_s}
    for backend in backends:
        with ExitStack() as stack_of_servers:
            url = None
            if backend == "triton":
                url = stack_of_servers.enter_context(loopback_server(repository, model_id)).grpc_url
            label = "Triton" if backend == "triton" else "Local"
            result[backend] = _backend_run(label, url, model_id, repository, stack, trace)
    if objects:
        result["long_session"] = long_session.run(objects, workdir)
    return result
