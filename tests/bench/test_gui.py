"""The GUI benchmark's instruments in a real napari window under Xvfb."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("napari")
from qtpy.QtCore import QEvent, QObject, QTimer  # noqa: E402
from qtpy.QtWidgets import QLabel  # noqa: E402

from benchmarks import long_session, series_gui  # noqa: E402
from benchmarks.gui import RunQueueClock, StallMonitor, _canvas, _run_until, open_widget  # noqa: E402


class SlowPaint(QObject):
    """Makes each paint of the canvas `seconds` longer, as a slow software renderer would."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def eventFilter(self, watched, event) -> bool:
        if event.type() == QEvent.Type.Paint:
            time.sleep(self.seconds)
        return False


def test_a_benchmark_s_panel_never_changes_what_the_user_s_panel_remembers(viewer, tmp_path, synthetic_repository):
    """`private_settings` (the viewer fixture's) stands for the user's own settings here."""
    widget = open_widget(viewer, "Triton", "127.0.0.1:1", "sam2.1_hiera_tiny", synthetic_repository)
    widget.form.save_settings()  # as Start does
    widget.form._settings.sync()  # written now
    assert not list(tmp_path.rglob("*.conf"))
    widget.close_session()


def test_a_stall_is_split_into_drawing_the_window_and_the_rest(viewer):
    viewer.add_image(np.random.default_rng(0).random((200, 300)))
    label = QLabel("a panel's status line")
    viewer.window.add_dock_widget(label)
    canvas = _canvas(label)
    _run_until(lambda: False, 0.3)  # the first frames (shaders compiled)
    monitor = StallMonitor(canvas)
    monitor.start()
    for widget, change in ((canvas, canvas.update), (label, lambda: label.setText("changed"))):
        slow = SlowPaint(0.12)  # as a slow software renderer would draw the canvas, or compose the window
        widget.installEventFilter(slow)
        frames = len(monitor.frames)
        change()
        _run_until(lambda frames=frames: len(monitor.frames) > frames, 5)
        widget.removeEventFilter(slow)
    QTimer.singleShot(50, lambda: time.sleep(0.08))  # work on the GUI thread that is not drawing
    _run_until(lambda: False, 0.3)
    stalls = monitor.stop()

    assert stalls["max_frame_ms"] >= 120 and stalls["max_stall_ms"] >= 120
    assert 80 <= stalls["max_stall_besides_drawing_ms"] < 120, stalls
    assert 60 <= stalls["max_stall_besides_drawing_and_cpu_wait_ms"] <= stalls["max_stall_besides_drawing_ms"]
    assert stalls["ticks"] > 100


def _busy(cpu_seconds: float) -> None:
    """Work on the calling thread until it has run `cpu_seconds` on a CPU."""
    end = time.thread_time() + cpu_seconds
    while time.thread_time() < end:
        pass


def test_a_stall_spent_waiting_for_a_cpu_is_told_from_work(qapp):
    clock = RunQueueClock()
    if clock() == 0:
        pytest.skip("the kernel does not report how long a thread waited for a CPU")
    clock.close()
    cpus = os.sched_getaffinity(0)
    cpu = min(cpus)
    os.sched_setaffinity(0, {cpu})  # the GUI thread and another process share one CPU
    hog = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    try:
        _run_until(lambda: False, 0.5)  # the other process is up and running
        monitor = StallMonitor()
        monitor.start()
        QTimer.singleShot(50, lambda: _busy(0.06))  # 60 ms of work, stretched by the other process
        _run_until(lambda: False, 0.5)
        stalls = monitor.stop()
    finally:
        hog.kill()
        hog.wait()
        os.sched_setaffinity(0, cpus)

    assert stalls["max_stall_besides_drawing_ms"] >= 90, stalls  # the work took longer than 60 ms
    assert 55 <= stalls["max_stall_besides_drawing_and_cpu_wait_ms"] <= 80, stalls


def test_the_long_session_commits_each_blob_as_an_object_of_its_own_and_times_it(viewer, tmp_path):
    repository = long_session.synthetic_repository(tmp_path / "repository")
    done, labels = long_session.annotate(viewer, 3, repository)

    plane, centres = long_session.blob_plane()
    yy, xx = np.mgrid[: plane.shape[0], : plane.shape[1]]
    for object_id, (x, y) in enumerate(centres[:3], start=1):
        blob = (xx - x) ** 2 + (yy - y) ** 2 <= long_session.RADIUS**2
        written = labels == object_id
        # The synthetic mask falls off a pixel inside the blob's rim (a disc of radius ~7 of 8): most of it, nothing beside it.
        assert (written & blob).sum() >= 0.75 * blob.sum() and (written & ~blob).sum() <= 0.3 * blob.sum()
    assert labels[centres[3][1], centres[3][0]] == 0
    assert all(len(o["hover_s"]) == len(long_session.HOVER_OFFSETS) and min(o["hover_s"]) > 0 and o["commit_s"] > 0 for o in done)
    summary = long_session.summary(done)
    assert summary["window"] == 1 and summary["ratio"]["commit_median"] > 0


def test_the_series_saves_are_timed_and_end_equal_to_the_layer(viewer, tmp_path):
    result = series_gui.measure(viewer, 2, tmp_path)
    assert result["saved_equal_to_layer"] and result["save_s"]["n"] == 2
    assert 0 < result["max_stall_besides_drawing_ms"] <= result["max_stall_ms"]
