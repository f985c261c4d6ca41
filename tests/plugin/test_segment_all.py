"""Segment all in a real napari viewer under Xvfb, clicked with real Qt events: the synthetic model
(which answers a point with the parts of the bright disks near it) finds the disks of a plane of a
scaled stack;
the objects are placed on that plane, other layers are untouched, and a stopped run writes nothing."""

from __future__ import annotations

import numpy as np
import pytest

from synthetic import disk_image

napari = pytest.importorskip("napari")
from napari.layers import Labels  # noqa: E402
from qtpy.QtCore import Qt  # noqa: E402
from test_widget import start  # noqa: E402

from triton_sam.plugin.automatic import AUTOMATIC_KEY, AUTOMATIC_SUFFIX  # noqa: E402

H, W = 240, 400
DISKS = [(90, 80, 40), (300, 150, 50)]


def _disk(x: float, y: float, r: float) -> np.ndarray:
    yy, xx = np.mgrid[:H, :W]
    return (xx - x) ** 2 + (yy - y) ** 2 <= r**2


def _automatic_layers(viewer) -> list[Labels]:
    return [layer for layer in viewer.layers if layer.name.endswith(AUTOMATIC_SUFFIX)]


def test_segment_all_finds_each_disk_on_the_plane_shown_and_a_stopped_run_writes_nothing(qtbot, viewer, synthetic_repository):
    stack = np.stack([disk_image(H, W, []), disk_image(H, W, DISKS)])
    image = viewer.add_image(stack, scale=(3.0, 0.5, 2.0), translate=(1.0, 10.0, -30.0))
    others = viewer.add_labels(
        np.full((2, H, W), 7, np.uint8), name="someone else's labels", opacity=0.1, scale=image.scale, translate=image.translate
    )
    viewer.dims.set_current_step(0, 1)
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    widget.form.points_per_side_spin.setValue(12)
    qtbot.mouseClick(widget.form.segment_all_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(
        lambda: len(_automatic_layers(viewer)) == 1 and widget.form.segment_all_button.text() == "Segment all", timeout=60000
    )

    qtbot.wait(300)
    assert "objects in the new layer" in widget.form.status.label.text()
    (found,) = _automatic_layers(viewer)
    assert found.data.shape == (1, H, W)
    assert found.data_to_world((0, 0, 0)) == pytest.approx(image.data_to_world((1, 0, 0)))  # on plane 1
    labels = found.data[0]
    disks = [_disk(*disk) for disk in DISKS]
    inside = np.logical_or(*disks)
    assert np.count_nonzero((labels > 0) & inside) >= 0.98 * np.count_nonzero(labels)  # objects are disk pixels
    for disk in disks:
        assert np.count_nonzero((labels > 0) & disk) >= 0.8 * np.count_nonzero(disk)  # every disk is found
    assert labels.max() == len(np.unique(labels)) - 1 >= len(DISKS)  # ids 1..n, none lost
    assert found.metadata[AUTOMATIC_KEY]["plane"] == [1]
    assert np.all(others.data == 7) and "objects" not in " ".join(layer.name for layer in viewer.layers)

    widget.form.points_per_side_spin.setValue(128)  # 256 batches: time enough to stop it
    qtbot.mouseClick(widget.form.segment_all_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "batches" in widget.form.status.label.text(), timeout=30000)
    assert widget.form.segment_all_button.text() == "Stop segmenting"
    qtbot.mouseClick(widget.form.segment_all_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: widget.form.segment_all_button.text() == "Segment all", timeout=30000)
    qtbot.wait(300)  # progress news still on its way (as once in CI) must not replace the outcome
    assert widget.form.status.label.text().startswith("Segment all stopped")
    assert len(_automatic_layers(viewer)) == 1

    qtbot.mouseClick(widget.form.segment_all_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "batches" in widget.form.status.label.text(), timeout=30000)
    image.data = stack[::-1].copy()  # new pixels (a filter, say): its proposals would be for the old ones
    # Said as the run ends; the news of the plane encoded anew (400 ms after the change) may follow it.
    qtbot.waitUntil(lambda: "Segment all stopped (the image's data changed)" in widget.form.status.label.text(), timeout=30000)
    qtbot.waitUntil(lambda: widget.form.segment_all_button.text() == "Segment all", timeout=30000)
    qtbot.wait(300)
    assert len(_automatic_layers(viewer)) == 1
    widget.close_session()


def test_on_a_large_dask_plane_the_tiles_in_view_are_segmented_at_native_resolution(qtbot, viewer, synthetic_repository):
    da = pytest.importorskip("dask.array")
    from test_widget import world

    from triton_sam.plugin import bindings

    big_h, big_w, disk = 2600, 3200, (1400, 900, 60)
    plane = disk_image(big_h, big_w, [disk]).astype(np.uint16) * 250
    image = viewer.add_image(da.from_array(plane, chunks=512))
    camera = bindings.camera(viewer)
    camera.center, camera.zoom = (900, 1400), 1.0  # a few tiles around the disk
    widget = start(qtbot, viewer, repository=synthetic_repository)
    assert widget.tiled
    widget.form.points_per_side_spin.setValue(8)
    qtbot.mouseClick(widget.form.segment_all_button, Qt.MouseButton.LeftButton)
    assert "Visible region" in widget.form.status.label.text()  # the whole large plane is refused, with the way out
    widget.form.region_box.setCurrentText("Visible region")
    qtbot.mouseClick(widget.form.segment_all_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(
        lambda: len(_automatic_layers(viewer)) == 1 and widget.form.segment_all_button.text() == "Segment all", timeout=120000
    )

    (found,) = _automatic_layers(viewer)
    y0, x0, y1, x1 = found.metadata[AUTOMATIC_KEY]["region"]
    assert found.metadata[AUTOMATIC_KEY]["tiles"] >= 1 and found.data.shape == (y1 - y0, x1 - x0)
    assert (y1 - y0) * (x1 - x0) < big_h * big_w  # the tiles in view, not the plane
    at = found.world_to_data(world(image, disk[0], disk[1]))  # the disk's centre, through the layers' placements
    assert found.data[int(round(at[0])), int(round(at[1]))] > 0
    yy, xx = np.mgrid[y0:y1, x0:x1]
    truth = (xx - disk[0]) ** 2 + (yy - disk[1]) ** 2 <= disk[2] ** 2
    labelled = found.data > 0
    assert np.count_nonzero(labelled & truth) >= 0.8 * np.count_nonzero(truth)
    assert np.count_nonzero(labelled & truth) >= 0.9 * np.count_nonzero(labelled)
    widget.close_session()


def test_segment_all_that_keeps_no_mask_adds_no_layer_and_says_which_threshold_to_lower(qtbot, viewer, synthetic_repository):
    viewer.add_image(disk_image(H, W, []))  # nothing bright: the synthetic model finds no object
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    widget.form.points_per_side_spin.setValue(4)
    qtbot.mouseClick(widget.form.segment_all_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "found no object" in widget.form.status.label.text(), timeout=60000)
    assert not _automatic_layers(viewer)
    assert "Predicted IoU >' (now 0.8)" in widget.form.status.label.text()
