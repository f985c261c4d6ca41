"""`triton-sam bench gui`: how long napari's event loop stalls while triton-sam encodes and previews.

A 1 ms Qt timer records the gaps between its ticks (a stall is a long gap) in three phases: Start
(engine, preview and output layers, first plane), encoding the other planes of a 3-plane stack in
the background, and a 120 Hz stream of cursor moves through the widget's own move handler.
Needs a display (use `xvfb-run -a` on a headless machine).
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from qtpy.QtCore import QEventLoop, QTimer


class StallMonitor:
    """Gaps between ticks of a 1 ms timer on the GUI thread."""

    def __init__(self) -> None:
        self.gaps_s: list[float] = []
        self._last = time.perf_counter()
        self._timer = QTimer()
        self._timer.setInterval(1)
        self._timer.timeout.connect(self._tick)

    def _tick(self) -> None:
        now = time.perf_counter()
        self.gaps_s.append(now - self._last)
        self._last = now

    def start(self) -> None:
        self.gaps_s.clear()
        self._last = time.perf_counter()
        self._timer.start()

    def stop(self) -> dict:
        self._timer.stop()
        gaps = np.asarray(self.gaps_s) * 1000.0
        return {"max_stall_ms": float(gaps.max()), "p99_gap_ms": float(np.percentile(gaps, 99)), "ticks": len(gaps)}


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


def run(
    model_id: str = "sam2.1_hiera_tiny",
    shape: tuple[int, int] = (977, 1531),
    hover_s: float = 3.0,
    rate_hz: float = 120.0,
    seed: int = 0,
    workdir: Path = Path(".bench"),
) -> dict:
    import napari

    from ..bench.hover import mouse_trace
    from ..bench.predictor import bench_image, ensure_export

    repository = Path(workdir) / "model_repository"
    ensure_export(model_id, seed, repository)
    viewer = napari.Viewer(show=True)
    plane = bench_image(shape)
    image = viewer.add_image(np.stack([plane, plane[::-1], plane[:, ::-1]]), name="bench", rgb=True)
    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    widget.backend.setCurrentText("Local")
    widget.model.setCurrentText(model_id)
    widget.repository.setText(str(repository.resolve()))
    monitor = StallMonitor()
    result = {"benchmark": "gui", "model": model_id, "image_shape": list(shape)}

    monitor.start()
    started = time.perf_counter()
    widget.connect_engine()
    _run_until(lambda: widget.ready, 300)
    result["start"] = {**monitor.stop(), "seconds": time.perf_counter() - started}

    monitor.start()
    started = time.perf_counter()
    widget.toggle_encode_all()
    _run_until(lambda: widget._encode_all_worker is None, 300)
    result["encode"] = {**monitor.stop(), "seconds": time.perf_counter() - started, "planes": len(widget.session.cache)}

    trace = iter(mouse_trace(shape, rate_hz, hover_s, seed))
    mover = QTimer()
    mover.setInterval(int(1000 / rate_hz))
    done = []

    def move() -> None:
        event = next(trace, None)
        if event is None:
            done.append(True)
            mover.stop()
            return
        _, x, y = event
        widget._on_move(viewer, SimpleNamespace(position=image.data_to_world([0, y, x])))

    monitor.start()
    mover.timeout.connect(move)
    mover.start()
    _run_until(lambda: bool(done) and widget.session.decoder.idle, hover_s + 60)
    result["hover"] = {**monitor.stop(), **widget.session.decoder.stats.snapshot()}
    widget.close_session()
    viewer.close()
    return result
