"""Segment all in a real napari viewer under Xvfb, clicked with real Qt events: the synthetic model
(which answers a point with the parts of the bright disks near it) finds the disks of a plane of a
scaled stack;
the objects are placed on that plane, other layers are untouched, and a stopped run writes nothing.
With "All planes" a stack's every plane is segmented into one layer of the stack's shape, planes
written as they are done; a stopped run keeps them. The point grid's fields outlive the panel."""

from __future__ import annotations

import re

import numpy as np
import pytest

from conftest import start_server
from synthetic import disk_image

napari = pytest.importorskip("napari")
from napari.layers import Labels  # noqa: E402
from process_scenarios import open_section  # noqa: E402
from qtpy.QtCore import Qt  # noqa: E402
from test_widget import start, start_on_plane_0_then_slow  # noqa: E402

from triton_sam.plugin import automatic  # noqa: E402
from triton_sam.plugin.automatic import AUTOMATIC_KEY, AUTOMATIC_SUFFIX  # noqa: E402
from triton_sam.plugin.form import SettingsForm  # noqa: E402

H, W = 240, 400
DISKS = [(90, 80, 40), (300, 150, 50)]


def _disk(x: float, y: float, r: float) -> np.ndarray:
    yy, xx = np.mgrid[:H, :W]
    return (xx - x) ** 2 + (yy - y) ** 2 <= r**2


def _automatic_layers(viewer) -> list[Labels]:
    return [layer for layer in viewer.layers if AUTOMATIC_KEY in layer.metadata]  # (napari numbers a second one's name)


def test_segment_all_finds_each_disk_on_the_plane_shown_and_a_stopped_run_writes_nothing(qtbot, viewer, synthetic_repository):
    stack = np.stack([disk_image(H, W, []), disk_image(H, W, DISKS)])
    image = viewer.add_image(stack, scale=(3.0, 0.5, 2.0), translate=(1.0, 10.0, -30.0))
    others = viewer.add_labels(
        np.full((2, H, W), 7, np.uint8), name="someone else's labels", opacity=0.1, scale=image.scale, translate=image.translate
    )
    viewer.dims.set_current_step(0, 1)
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    open_section(widget, "segment_all")
    modes = widget.form.segment_all_modes  # SAM2.1 has no instance decoder: the point grid alone, no chooser
    assert not modes.mode_box.isVisibleTo(widget) and not modes.decoder_fields.isVisibleTo(widget)
    assert widget.form.points_per_side_spin.isVisibleTo(widget) and widget.form.segment_all_mode() == "grid"
    widget.form.points_per_side_spin.setValue(12)
    widget.form.all_planes_check.setChecked(False)  # the plane on screen only
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


def test_with_auto_segment_all_goes_on_locally_once_the_server_is_gone_and_the_label_says_so(qtbot, viewer, synthetic_repository):
    """Segmented through the server; the server stopped, Segment all again runs on the local engine,
    and the engine label says so once it ends (before, only a hover preview refreshed it)."""
    viewer.add_image(disk_image(H, W, DISKS))
    viewer.reset_view()
    server = start_server(synthetic_repository)
    try:
        widget = start(qtbot, viewer, "Auto", repository=synthetic_repository, url=server.grpc_url)
        open_section(widget, "segment_all")
        widget.form.points_per_side_spin.setValue(8)
        engine_label = widget.form.status.engine_label
        qtbot.mouseClick(widget.form.segment_all_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: len(_automatic_layers(viewer)) == 1, timeout=60000)
        assert engine_label.text().startswith("Engine: Triton at")
    finally:
        server.stop()
    qtbot.waitUntil(lambda: widget.form.segment_all_button.text() == "Segment all", timeout=30000)
    qtbot.mouseClick(widget.form.segment_all_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(_automatic_layers(viewer)) == 2, timeout=60000)
    qtbot.waitUntil(lambda: "Triton not used" in engine_label.text(), timeout=10000)
    assert widget.session.engine.fallback_reason is not None
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
    open_section(widget, "segment_all")
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


@pytest.mark.parametrize("planes", [None, 3], ids=["2D", "stack"])
def test_segment_all_that_keeps_no_mask_adds_no_layer_and_says_which_threshold_to_lower(
    qtbot, viewer, synthetic_repository, monkeypatch, planes
):
    blank = disk_image(H, W, [])  # nothing bright: the synthetic model finds no object
    viewer.add_image(blank if planes is None else np.stack([blank] * planes))
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    open_section(widget, "segment_all")
    said = _record_statuses(widget, monkeypatch)
    assert widget.form.all_planes_check.isEnabled() == (planes is not None)  # a 2D image has one plane: nothing to ask
    widget.form.points_per_side_spin.setValue(4)
    qtbot.mouseClick(widget.form.segment_all_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "found no object" in widget.form.status.label.text(), timeout=60000)
    assert not _automatic_layers(viewer)
    assert "Predicted IoU >' (now 0.8)" in widget.form.status.label.text()
    assert any(text.startswith(f"Segment all: plane {planes} of {planes}") for text, _ in said) == (planes is not None)
    widget.close_session()


def _record_statuses(widget, monkeypatch) -> list[tuple[str, list[bool] | None]]:
    """What the status says from now on, each with which planes of the automatic layer then had
    objects (None: no layer yet)."""
    said, say = [], widget.form.status.say

    def recording(text: str) -> None:
        found = _automatic_layers(widget.viewer)
        data = found[-1].data if found else None
        said.append((text, None if data is None else [bool(np.any(plane)) for plane in data]))
        say(text)

    monkeypatch.setattr(widget.form.status, "say", recording)
    return said


STACK_DISKS = [[(90, 80, 40)], [(300, 150, 50)], [(90, 80, 40), (300, 150, 50)], [(200, 120, 45)]]


def test_segment_all_on_a_stack_fills_one_stack_sized_layer_plane_by_plane_from_the_planes_encoded(
    qtbot, viewer, synthetic_repository, monkeypatch
):
    """Every plane into one layer of the stack's shape, ids unique across planes, planes written
    as they are done with the progress in the status; the planes Encode all planes encoded are not
    encoded again; one Ctrl+Z on the layer undoes the run."""
    stack = np.stack([disk_image(H, W, disks) for disks in STACK_DISKS])
    image = viewer.add_image(stack, scale=(3.0, 0.5, 2.0), translate=(1.0, 10.0, -30.0))
    viewer.dims.set_current_step(0, 1)
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    open_section(widget, "segment_all")
    assert widget.form.all_planes_check.isChecked() and widget.form.all_planes_check.isEnabled()  # on for a stack
    open_section(widget, "stacks")
    qtbot.mouseClick(widget.form.encode_all_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: widget.form.encode_all_button.text() == "Encode all planes", timeout=60000)
    encoded = widget.session.cache.misses
    said = _record_statuses(widget, monkeypatch)
    widget.form.points_per_side_spin.setValue(12)
    qtbot.mouseClick(widget.form.segment_all_button, Qt.MouseButton.LeftButton)
    assert widget.form.segment_all_button.text() == "Stop segmenting"
    qtbot.waitUntil(lambda: widget.form.segment_all_button.text() == "Segment all", timeout=60000)

    qtbot.wait(300)
    (found,) = _automatic_layers(viewer)
    assert found.name == f"{image.name}{AUTOMATIC_SUFFIX}" and found.data.shape == stack.shape
    assert found.data_to_world((0, 0, 0)) == pytest.approx(image.data_to_world((0, 0, 0)))
    assert found.data_to_world((2, 100, 50)) == pytest.approx(image.data_to_world((2, 100, 50)))
    ids = [set(np.unique(plane)) - {0} for plane in found.data]
    assert all(ids)  # objects on every plane
    assert sum(len(plane_ids) for plane_ids in ids) == len(set().union(*ids)) == found.data.max()  # unique, 1..n
    for plane, disks in zip(found.data, STACK_DISKS, strict=True):
        masks = [_disk(*disk) for disk in disks]
        assert np.count_nonzero((plane > 0) & np.logical_or.reduce(masks)) >= 0.98 * np.count_nonzero(plane)
        for mask in masks:
            assert np.count_nonzero((plane > 0) & mask) >= 0.8 * np.count_nonzero(mask)
    assert found.metadata[AUTOMATIC_KEY]["planes"] == [[0], [1], [2], [3]]
    assert widget.session.cache.misses == encoded  # every plane came from the cache

    progress = [re.match(r"Segment all: plane (\d) of 4, (\d+) objects so far\.$", text) for text, _ in said]
    assert {int(m[1]) for m in progress if m} == {1, 2, 3, 4}
    assert max(int(m[2]) for m in progress if m and m[1] == "3") >= 2  # planes 0 and 1's disks, at least
    assert any(planes is not None and planes[0] and not planes[3] for _, planes in said)  # planes written as done
    status = widget.form.status.label.text()
    assert f"{found.data.max()} objects on 4 of 4 planes" in status and "Ctrl+Z" in status
    found.undo()  # one step: the whole run
    assert not found.data.any()
    widget.close_session()


def test_stopping_segment_all_on_a_stack_keeps_the_planes_done_and_new_pixels_stop_it_too(
    qtbot, viewer, synthetic_repository, monkeypatch
):
    """Stop while a plane (slow to encode) is under way: the planes done stay in the layer and no
    plane follows; new pixels stop a run the same way."""
    stack = np.stack([disk_image(H, W, [(60 + 50 * n, 120, 40)]) for n in range(6)])
    image, widget, encoded = start_on_plane_0_then_slow(qtbot, viewer, stack, synthetic_repository, monkeypatch)
    open_section(widget, "segment_all")
    said = _record_statuses(widget, monkeypatch)
    widget.form.points_per_side_spin.setValue(8)
    button = widget.form.segment_all_button
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: widget.form.status.label.text().startswith("Segment all: plane 4 of 6"), timeout=30000)
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)  # while plane 3 is encoded
    qtbot.waitUntil(lambda: button.text() == "Segment all", timeout=30000)

    (found,) = _automatic_layers(viewer)
    written = [bool(plane.any()) for plane in found.data]
    assert written == [True, True, True, False, False, False]
    assert found.metadata[AUTOMATIC_KEY]["planes"] == [[0], [1], [2]]
    status = widget.form.status.label.text()
    assert status.startswith("Segment all stopped: ") and "on 3 of 6 planes" in status
    data, encodes = found.data.copy(), len(encoded)
    qtbot.wait(1500)
    assert np.array_equal(found.data, data) and len(encoded) == encodes  # it stopped

    said.clear()
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)  # planes 0 to 3 are cached: plane 4 is slow
    qtbot.waitUntil(lambda: widget.form.status.label.text().startswith("Segment all: plane 5 of 6"), timeout=30000)
    image.data = stack[::-1].copy()
    qtbot.waitUntil(lambda: button.text() == "Segment all", timeout=30000)
    assert any(text.startswith("Segment all stopped (the image's data changed): ") for text, _ in said)
    (again,) = (layer for layer in _automatic_layers(viewer) if layer is not found)
    assert [bool(plane.any()) for plane in again.data] == [True] * 4 + [False] * 2
    widget.close_session()


def test_segment_all_on_a_stack_of_large_planes_does_the_tiles_in_view_of_every_plane(
    qtbot, viewer, synthetic_repository, monkeypatch
):
    """Large planes: the same tiles in view of each plane, at native resolution, into a layer of
    the stack's planes over their region; a layer too large to hold is refused with the way out,
    and one too large to undo says so."""
    da = pytest.importorskip("dask.array")
    from triton_sam.plugin import bindings

    big_h, big_w, disks = 2600, 3200, [(1400, 900, 60), (1500, 950, 50)]
    planes = [da.from_array(disk_image(big_h, big_w, [disk]).astype(np.uint16) * 250, chunks=512) for disk in disks]
    image = viewer.add_image(da.stack(planes))
    camera = bindings.camera(viewer)
    camera.center, camera.zoom = (900, 1400), 1.0  # a few tiles around the disks
    widget = start(qtbot, viewer, repository=synthetic_repository)
    open_section(widget, "segment_all")
    assert widget.tiled
    widget.form.points_per_side_spin.setValue(8)
    widget.form.region_box.setCurrentText("Visible region")
    limit = automatic.MAX_STACK_LAYER_BYTES
    monkeypatch.setattr(automatic, "MAX_STACK_LAYER_BYTES", 2**20)
    qtbot.mouseClick(widget.form.segment_all_button, Qt.MouseButton.LeftButton)
    assert "would make a labels layer" in widget.form.status.label.text() and "'All planes'" in widget.form.status.label.text()
    assert widget.form.segment_all_button.text() == "Segment all" and not _automatic_layers(viewer)
    monkeypatch.setattr(automatic, "MAX_STACK_LAYER_BYTES", limit)
    monkeypatch.setattr(automatic, "UNDO_HISTORY_BYTES", 1)
    qtbot.mouseClick(widget.form.segment_all_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(
        lambda: len(_automatic_layers(viewer)) == 1 and widget.form.segment_all_button.text() == "Segment all", timeout=120000
    )

    (found,) = _automatic_layers(viewer)
    y0, x0, y1, x1 = found.metadata[AUTOMATIC_KEY]["region"]
    assert found.metadata[AUTOMATIC_KEY]["tiles"] >= 1 and found.data.shape == (2, y1 - y0, x1 - x0)
    assert (y1 - y0) * (x1 - x0) < big_h * big_w  # the tiles in view, not the plane
    assert not set(np.unique(found.data[0])) & set(np.unique(found.data[1])) - {0}
    for plane, (x, y, r) in enumerate(disks):
        at = found.world_to_data(image.data_to_world((plane, y, x)))  # the disk's centre, on its plane
        assert found.data[plane, int(round(at[1])), int(round(at[2]))] > 0
        yy, xx = np.mgrid[y0:y1, x0:x1]
        truth = (xx - x) ** 2 + (yy - y) ** 2 <= r**2
        labelled = found.data[plane] > 0
        assert np.count_nonzero(labelled & truth) >= 0.8 * np.count_nonzero(truth)
        assert np.count_nonzero(labelled & truth) >= 0.9 * np.count_nonzero(labelled)
    assert "too large to undo" in widget.form.status.label.text()
    widget.close_session()


def test_the_point_grid_s_fields_are_restored_in_the_next_session_s_panel(qtbot, private_settings):
    form = SettingsForm()
    qtbot.addWidget(form)
    defaults = form.automatic_options()
    form.points_per_side_spin.setValue(12)
    form.pred_iou_spin.setValue(0.55)
    form.stability_spin.setValue(0.7)
    form.min_area_spin.setValue(40)
    tuned = form.automatic_options()
    assert tuned == {"points_per_side": 12, "pred_iou_thresh": 0.55, "stability_score_thresh": 0.7, "min_mask_region_area": 40}
    remembered = SettingsForm()  # the next session's panel
    qtbot.addWidget(remembered)
    assert remembered.automatic_options() == tuned != defaults
