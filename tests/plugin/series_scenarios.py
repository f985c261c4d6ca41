"""A day of annotating a series through the panel, in processes of their own (test_series_panel.py).

Usage: python series_scenarios.py SCENARIO REPOSITORY SETTINGS_DIR FOLDER
- annotate: open FOLDER as a series, commit objects with real mouse and key events on a plane, a
  large plane and a stack (Done and Next between them), then click once more and kill the process
  (SIGKILL) before that object is committed. Prints "saved IMAGE ID PIXELS" for each commit saved.
- resume: open FOLDER again: the series resumes at the stack with its saved labels shown; export it
  and check the exported instance labels and COCO JSON against the layers. Prints "survived".
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from pathlib import Path

import numpy as np
import tifffile
from PIL import Image
from process_scenarios import keep_private, open_panel, open_section, settle, wait_until
from qtpy.QtCore import QEvent, Qt
from qtpy.QtTest import QTest

from benchmarks.gui import send_mouse
from triton_sam.plugin import layers

NAMES = ["1.png", "2.png", "3.tif", "4.tif", "5.png"]
LARGE, STACK = 2, 3
OBJECTS = {0: [(40, 40), (110, 70)], 1: [(50, 50)], LARGE: [(1000, 1050)], STACK: [(40, 40)]}  # (x, y) clicked
LEFT, NONE = Qt.MouseButton.LeftButton, Qt.MouseButton.NoButton


def make_images(folder: Path) -> None:
    """Two small planes, a plane just over 2048 x 2048 px (tiled, labels in zarr), a stack of 3, one more plane."""
    yy, xx = np.mgrid[:120, :160]
    plane = np.full((120, 160), 20, np.uint8)
    for x, y in OBJECTS[0]:
        plane[(xx - x) ** 2 + (yy - y) ** 2 <= 15**2] = 230
    Image.fromarray(plane).save(folder / NAMES[0])
    Image.fromarray(np.roll(plane, (10, 10), (0, 1))).save(folder / NAMES[1])
    large = np.full((2100, 2100), 20, np.uint8)
    yy, xx = np.mgrid[:2100, :2100]
    large[(xx - 1000) ** 2 + (yy - 1050) ** 2 <= 60**2] = 230
    tifffile.imwrite(folder / NAMES[LARGE], large)
    tifffile.imwrite(folder / NAMES[STACK], np.stack([plane, plane, plane[::-1]]), photometric="minisblack")
    Image.fromarray(plane).save(folder / NAMES[4])


def click(viewer, image, x: float, y: float) -> None:
    canvas = viewer.window._qt_viewer.canvas.native
    at = np.asarray(image.data_to_world([*viewer.dims.current_step[: image.ndim - 2], y, x]))
    send_mouse(viewer, canvas, QEvent.Type.MouseMove, at)
    send_mouse(viewer, canvas, QEvent.Type.MouseButtonPress, at, LEFT, LEFT)
    send_mouse(viewer, canvas, QEvent.Type.MouseButtonRelease, at, LEFT, NONE)


def press(viewer, key: str) -> None:
    """Press a key as napari names it ("Shift-C", "PageDown") on the canvas."""
    *modifier, name = key.split("-")
    modifiers = Qt.KeyboardModifier.ShiftModifier if modifier else Qt.KeyboardModifier.NoModifier
    QTest.keyClick(viewer.window._qt_viewer.canvas.native, getattr(Qt.Key, f"Key_{name}"), modifiers)


def wait(widget, condition) -> None:
    """`wait_until`, saying on a timeout what the panel showed."""
    try:
        wait_until(condition)
    except TimeoutError:
        encoding = widget.encoding
        plane = encoding.session.plane if encoding.session is not None else "no session"
        print("status:", widget.form.status.label.text(), "| plane:", encoding.index, plane, flush=True)
        raise


def showing(widget, index: int) -> bool:
    """The panel shows series image `index`, started and encoded."""
    panel = widget.series
    return panel.series.index == index and panel.image is not None and widget.image == panel.image and widget.ready


def saved(panel) -> bool:
    settle(2)
    return not panel.saving.pending


def annotate(viewer, widget, folder: Path) -> None:
    panel, keys = widget.series, widget.form.keys
    open_section(widget, "series")
    panel.open(folder)
    for index in range(STACK + 1):
        wait(widget, lambda index=index: showing(widget, index))
        image = panel.image
        if index == STACK:
            viewer.dims.set_current_step(0, 1)
            wait(widget, lambda: widget.ready)
        for number, (x, y) in enumerate(OBJECTS[index], 1):
            click(viewer, image, x, y)
            if index == 0 and number == 1:  # an object in progress: moving on is refused, nothing is lost
                press(viewer, keys["next_image"])
                assert panel.series.index == 0 and "commit it" in widget.form.status.label.text(), widget.form.status.label.text()
            press(viewer, keys["commit"])
            objects = layers.existing_objects_layer(viewer, image)
            wait(widget, lambda objects=objects, number=number: objects is not None and number in objects.data)
            wait(widget, lambda: saved(panel))
            on_disk = panel.series.labels(index)
            print(f"saved {index} {number} {int((on_disk == number).sum())}", flush=True)
        if index < STACK:
            QTest.mouseClick(panel.buttons["done"] if index != 1 else panel.buttons["next"], LEFT)
    click(viewer, panel.image, 110, 70)  # the next object, in progress when the process dies
    settle()
    os.kill(os.getpid(), signal.SIGKILL)


def rle_mask(rle: dict) -> np.ndarray:
    """The mask of COCO's uncompressed RLE (runs in column-major order, zeros first)."""
    height, width = rle["size"]
    flat = np.repeat(np.arange(len(rle["counts"])) % 2 == 1, rle["counts"])
    return flat.reshape(width, height).T


def check_export(panel, out: Path, index: int, shown: np.ndarray) -> None:
    """The exported label TIFF and COCO objects of image `index` equal `shown` (its objects layer)."""
    coco = json.loads((out / "coco.json").read_text())
    name = panel.series.images[index].name
    entries = [image for image in coco["images"] if image["file_name"].endswith(name)]
    exported = tifffile.imread(out / entries[0]["labels"])
    assert np.array_equal(exported.reshape(shown.shape), shown), name
    from_coco = np.zeros(shown.shape, np.uint32)
    for entry in entries:
        plane = from_coco[entry.get("plane", ...)]
        for annotation in coco["annotations"]:
            if annotation["image_id"] == entry["id"]:
                plane[rle_mask(annotation["segmentation"])] = annotation["label"]
    assert np.array_equal(from_coco, shown), name


def resume(viewer, widget, folder: Path) -> None:
    panel = widget.series
    panel.open(folder)
    wait(widget, lambda: showing(widget, STACK))
    objects = layers.existing_objects_layer(viewer, panel.image)
    assert np.array_equal(objects.data, panel.series.labels(STACK)), "the stack's saved labels are shown"
    assert widget.session.next_object_id == int(objects.data.max()) + 1, "ids go on from those saved"
    wait(widget, lambda: saved(panel))
    print("progress:", panel.progress_label.text(), flush=True)
    out = Path(tempfile.mkdtemp())
    panel.export(out)
    wait(widget, lambda: (out / "coco.json").exists() and saved(panel))
    check_export(panel, out, STACK, np.asarray(objects.data))
    press(viewer, widget.form.keys["previous_image"])
    wait(widget, lambda: showing(widget, LARGE))
    check_export(panel, out, LARGE, np.asarray(layers.existing_objects_layer(viewer, panel.image).data))
    panel.show(0)
    wait(widget, lambda: showing(widget, 0))
    check_export(panel, out, 0, np.asarray(layers.existing_objects_layer(viewer, panel.image).data))
    widget.close_session()
    viewer.close()


if __name__ == "__main__":
    scenario, repository, settings_dir, folder = sys.argv[1:5]
    keep_private(settings_dir)
    viewer, widget = open_panel(repository)
    {"annotate": annotate, "resume": resume}[scenario](viewer, widget, Path(folder))
    print("survived", flush=True)
