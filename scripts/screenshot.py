"""Take the README screenshot of the real widget: `xvfb-run -a python scripts/screenshot.py REPO OUT.png`.

REPO is a model repository (the synthetic test model or a real export); the hover is simulated
by the same public session call a mouse move makes.
"""

import sys
import time

import napari
import numpy as np
from qtpy.QtWidgets import QApplication
from skimage import data

from triton_sam.plugin import layers


def main(repository: str, out: str) -> None:
    viewer = napari.Viewer(show=True)
    viewer.window._qt_window.resize(1300, 800)
    image = viewer.add_image(data.coins(), name="coins")
    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    widget.backend.setCurrentText("Local")
    widget.repository.setText(repository)
    widget.connect_engine()
    deadline = time.monotonic() + 120
    while not widget.ready and time.monotonic() < deadline:
        QApplication.processEvents()
        time.sleep(0.05)
    widget.session.hover(168, 108)  # a coin in the second row
    preview = viewer.layers[layers.PREVIEW_NAME]
    while not preview.data.any() and time.monotonic() < deadline:
        QApplication.processEvents()
        time.sleep(0.05)
    viewer.screenshot(out, canvas_only=False)
    widget.close_session()
    print(f"saved {out}; preview pixels: {int(np.count_nonzero(preview.data))}; image {image.data.shape}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
