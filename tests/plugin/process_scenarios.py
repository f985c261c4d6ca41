"""What a user does that could kill napari's process, run by test_process_survives.py in a process
of its own (a crash then fails that test instead of ending the test run).

Usage: python process_scenarios.py SCENARIO REPOSITORY SETTINGS_DIR [ARGUMENT]
- helper-layers ROUNDS: Start on an image (a box and a click drawn), then the user deletes the
  image and the panel's helper layers (preview, box, prompts), adds another image and presses
  Start again; that many rounds.
- close-mid-work WORK: Start on a stack, start WORK ("encode-all" or "segment-all"), close napari
  while it runs.
Prints "survived" at the end.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import napari
import numpy as np
from qtpy.QtCore import QEvent, QSettings, Qt
from qtpy.QtTest import QTest
from qtpy.QtWidgets import QApplication

from benchmarks.gui import send_mouse
from triton_sam.plugin import layers

LEFT, NONE, CTRL = Qt.MouseButton.LeftButton, Qt.MouseButton.NoButton, Qt.KeyboardModifier.ControlModifier
RNG = np.random.default_rng(0)


def wait_until(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the panel did not get ready")
        QApplication.processEvents()
        time.sleep(0.01)


def settle(rounds: int = 20) -> None:
    """Let Qt and vispy draw (the crash comes at a draw after the layers went)."""
    for _ in range(rounds):
        QApplication.processEvents()
        time.sleep(0.01)


def open_section(widget, key: str) -> None:
    """Unfold the panel's section `key` ("settings", "stacks", "segment_all", "series") as a user does,
    with a click on its title, and wait until it is unfolded (sections start folded)."""
    section = widget.form.sections[key]
    if not section.isExpanded():
        QTest.mouseClick(section.toggleButton(), LEFT)
    content = section.content()
    wait_until(lambda: content.height() >= content.sizeHint().height(), timeout_s=5)


def keep_private(settings_dir: str) -> None:
    """The panel's settings and its disk cache of embeddings go under `settings_dir`: the scenario
    reads nothing the user's panel or another run kept."""
    QSettings.setPath(QSettings.Format.NativeFormat, QSettings.Scope.UserScope, settings_dir)
    os.environ["XDG_CACHE_HOME"] = str(Path(settings_dir) / "cache")


def open_panel(repository: str):
    viewer = napari.Viewer(show=True)
    viewer.window._qt_window.resize(1000, 700)  # as the tests' viewer fixture: a canvas of some size
    settle()
    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    widget.form.backend_box.setCurrentText("Local")
    widget.form.repository_field.setText(repository)
    return viewer, widget


def start_on(widget, image) -> None:
    widget.form.image_box.setCurrentText(image.name)
    widget.connect_engine()
    wait_until(lambda: widget.ready)
    settle()


def prompt(viewer, image) -> None:
    """A Ctrl-drag box and a click, with real Qt mouse events: the box and prompts layers draw something."""
    canvas = viewer.window._qt_viewer.canvas.native

    def at(y: float, x: float):
        return np.asarray(image.data_to_world([y, x]))

    send_mouse(viewer, canvas, QEvent.Type.MouseButtonPress, at(30, 40), LEFT, LEFT, CTRL)
    for t in (0.5, 1.0):
        send_mouse(viewer, canvas, QEvent.Type.MouseMove, at(30 + 60 * t, 40 + 80 * t), LEFT, LEFT, CTRL)
    send_mouse(viewer, canvas, QEvent.Type.MouseButtonRelease, at(90, 120), LEFT, NONE, CTRL)
    settle()
    send_mouse(viewer, canvas, QEvent.Type.MouseButtonPress, at(60, 80), LEFT, LEFT)
    send_mouse(viewer, canvas, QEvent.Type.MouseButtonRelease, at(60, 80), LEFT, NONE)
    send_mouse(viewer, canvas, QEvent.Type.MouseMove, at(50, 70))
    settle()


def helper_layers(repository: str, rounds: str) -> None:
    viewer, widget = open_panel(repository)
    for round_ in range(int(rounds)):
        image = viewer.add_image(RNG.integers(0, 255, (120, 160), np.uint8), name=f"image {round_}")
        start_on(widget, image)
        prompt(viewer, image)
        drawn = len(viewer.layers[layers.PROMPTS_NAME].data), len(viewer.layers[layers.BOX_NAME].data)
        assert drawn == (1, 1), drawn
        viewer.layers.remove(image)
        settle()
        for name in (layers.PREVIEW_NAME, layers.BOX_NAME, layers.PROMPTS_NAME):
            viewer.layers.remove(name)
            settle()
        print(f"round {round_}: layers left {[layer.name for layer in viewer.layers]}", flush=True)
    widget.close_session()
    viewer.close()


def close_mid_work(repository: str, work: str) -> None:
    viewer, widget = open_panel(repository)
    start_on(widget, viewer.add_image(RNG.integers(0, 255, (12, 120, 160), np.uint8), name="stack"))
    button = {"encode-all": widget.form.encode_all_button, "segment-all": widget.form.segment_all_button}[work]
    button.click()
    settle(3)
    print("closing while running:", button.text(), flush=True)
    viewer.close()
    settle(200)  # the work's last results arrive with the panel gone


if __name__ == "__main__":
    scenario, repository, settings_dir, argument = sys.argv[1:5]
    keep_private(settings_dir)
    {"helper-layers": helper_layers, "close-mid-work": close_mid_work}[scenario](repository, argument)
    print("survived", flush=True)
