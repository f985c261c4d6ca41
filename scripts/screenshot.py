"""Take the README screenshot of the real widget: `xvfb-run -a python -m scripts.screenshot REPO OUT.png`.

Run from the checkout's root (it moves the mouse as the benchmarks do). REPO is a model repository
(the synthetic test model or a real export). A coin is clicked and committed, then the cursor rests
on another, all as real Qt mouse and key events on the canvas.
"""

import sys
import time

import napari
import numpy as np
from qtpy.QtCore import QEvent, Qt
from qtpy.QtTest import QTest
from qtpy.QtWidgets import QApplication
from skimage import data

from benchmarks.gui import send_mouse
from triton_sam.plugin import layers

TIMEOUT_S = 120


def _wait(condition) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the widget did not get there in time")
        QApplication.processEvents()
        time.sleep(0.05)


def main(repository: str, out: str) -> None:
    viewer = napari.Viewer(show=True)
    viewer.window._qt_window.resize(1300, 950)
    image = viewer.add_image(data.coins(), name="coins")
    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    widget.form.backend_box.setCurrentText("Local")
    widget.form.repository_field.setText(repository)
    widget.connect_engine()
    _wait(lambda: widget.ready)
    canvas = viewer.window._qt_viewer.canvas.native
    left, none = Qt.MouseButton.LeftButton, Qt.MouseButton.NoButton

    def mouse(kind, x, y, button=none, buttons=none) -> None:
        send_mouse(viewer, canvas, kind, image.data_to_world([y, x]), button, buttons)

    mouse(QEvent.Type.MouseMove, 102, 125)  # a coin in the second row: clicked and committed
    mouse(QEvent.Type.MouseButtonPress, 102, 125, left, left)
    mouse(QEvent.Type.MouseButtonRelease, 102, 125, left)
    _wait(lambda: widget.session.object.decoded_version == widget.session.object.version)
    QTest.keyClick(canvas, Qt.Key.Key_C, Qt.KeyboardModifier.ShiftModifier)
    objects = layers.objects_name(image)
    _wait(lambda: objects in viewer.layers and viewer.layers[objects].data.any())
    preview = viewer.layers[layers.PREVIEW_NAME]
    mouse(QEvent.Type.MouseMove, 270, 118)  # the cursor rests on another coin of that row
    _wait(lambda: preview.data[118, 270])
    viewer.layers.selection.active = image
    viewer.screenshot(out, canvas_only=False)
    widget.close_session()
    print(f"saved {out}; preview pixels: {int(np.count_nonzero(preview.data))}; image {image.data.shape}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
