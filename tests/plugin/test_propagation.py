"""Propagate in a real napari viewer under Xvfb: a committed object tracked through a stack with the
exported SAM2.1 tiny (random weights), stopped between planes, undone in one step."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from benchmarks.fixtures import bench_volume
from conftest import require_export_extra
from synthetic import disk_image

napari = pytest.importorskip("napari")
from process_scenarios import open_section  # noqa: E402
from qtpy.QtCore import Qt  # noqa: E402
from qtpy.QtTest import QTest  # noqa: E402
from test_widget import click, key, start, world  # noqa: E402

from triton_sam.plugin import layers  # noqa: E402
from triton_sam.plugin.propagation import stack_axis  # noqa: E402
from triton_sam.video import VolumePredictor  # noqa: E402

SHAPE = (120, 160)
OTHER_LABEL = 9


def _commit_on_plane_2(qtbot, viewer, exported_repository, planes: int, disks: list[tuple[int, int]]):
    """A stack of moving disks, the panel started on plane 2 (SAM2.1 tiny), and the disks at
    `disks` (x, y) clicked and committed there as labels 1, 2, ...: (widget, objects layer)."""
    require_export_extra()
    image = viewer.add_image(bench_volume(planes, SHAPE))
    viewer.dims.set_current_step(0, 2)
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=exported_repository("sam2.1_hiera_tiny"))
    open_section(widget, "stacks")
    name = layers.objects_name(image)
    for label, (x, y) in enumerate(disks, start=1):
        click(viewer, world(image, x, y)[-2:])
        key(viewer, "commit")
        qtbot.waitUntil(lambda label=label: name in viewer.layers and np.any(viewer.layers[name].data[2] == label), timeout=60000)
    return widget, viewer.layers[name]


def test_propagate_tracks_the_plane_s_labels_together_stops_between_planes_and_undoes_in_one_step(
    qtbot, viewer, exported_repository
):
    """Propagating "All on this plane" tracks both committed objects, never overlapping, stopped
    after the first plane; closing the viewer lets go of the propagation's predictor."""
    widget, objects = _commit_on_plane_2(qtbot, viewer, exported_repository, 6, [(53, 50), (112, 84)])  # two disks
    assert objects.selected_label == 2  # the last committed; "All on this plane" tracks 1 as well
    objects.data[4, :10, :10] = OTHER_LABEL  # another object, there before: never painted over
    before = objects.data.copy()

    widget.form.propagated_box.setCurrentText("All on this plane")
    widget.form.direction_box.setCurrentText("Forwards")
    QTest.mouseClick(widget.form.propagate_button, Qt.MouseButton.LeftButton)
    assert widget.form.propagate_button.text() == "Stop propagating"
    yielded = {}
    widget._propagation._worker.yielded.connect(lambda result: yielded.setdefault(result[0], result[1]))
    qtbot.waitUntil(lambda: len(yielded) >= 1, timeout=120000)
    QTest.mouseClick(
        widget.form.propagate_button, Qt.MouseButton.LeftButton
    )  # stop: the plane being tracked is finished, no other starts
    qtbot.waitUntil(lambda: not widget._propagation.running, timeout=120000)

    assert widget.form.propagate_button.text() == "Propagate label"
    assert sorted(yielded) == list(range(3, 3 + len(yielded))) and len(yielded) < 3
    assert all(sorted(masks) == [1, 2] for masks in yielded.values())
    assert any(mask.any() for masks in yielded.values() for mask in masks.values())
    for plane, masks in yielded.items():  # each plane written whole, around the other object
        assert not np.any(masks[1] & masks[2])  # one label a pixel
        free = before[plane] == 0
        for label, mask in masks.items():
            np.testing.assert_array_equal(objects.data[plane] == label, mask & free)
    assert np.all(objects.data[4, :10, :10] == OTHER_LABEL)
    np.testing.assert_array_equal(objects.data[2], before[2])  # the prompt plane keeps the user's objects
    assert not np.any(np.isin(objects.data[5], [1, 2]))  # not reached
    records = objects.metadata[layers.PROVENANCE_KEY]
    assert records[1]["propagated"]["from_plane"] == [2]
    assert records[1]["propagated"]["with_labels"] == records[2]["propagated"]["with_labels"] == [1, 2]

    objects.undo()
    np.testing.assert_array_equal(objects.data, before)

    predictor = weakref.ref(widget._propagation._predictor)  # its own video graphs: gigabytes
    viewer.close()  # napari deletes the panel without closing it, and keeps its Python side
    qtbot.waitUntil(lambda: gc.collect() is not None and predictor() is None, timeout=10000)


def test_new_pixels_stop_a_propagation_and_the_next_one_tracks_through_them(qtbot, viewer, exported_repository, monkeypatch):
    """The image's data replaced (a filter, say) while propagating: the run stops after the plane
    being tracked and says why; the next run reads the new planes, not the old ones its tracking
    state held."""
    volumes, init_state = [], VolumePredictor.init_state

    def recorded(self, volume, **options):
        volumes.append(volume)
        return init_state(self, volume, **options)

    monkeypatch.setattr(VolumePredictor, "init_state", recorded)
    widget, objects = _commit_on_plane_2(qtbot, viewer, exported_repository, 8, [(53, 50)])
    image = widget.image
    widget.form.direction_box.setCurrentText("Forwards")
    QTest.mouseClick(widget.form.propagate_button, Qt.MouseButton.LeftButton)
    planes = []
    widget._propagation._worker.yielded.connect(lambda result: planes.append(result[0]))
    qtbot.waitUntil(lambda: len(planes) >= 1, timeout=120000)
    filtered = bench_volume(8, SHAPE, seed=1)
    image.data = filtered
    qtbot.waitUntil(lambda: not widget._propagation.running, timeout=120000)
    assert len(planes) <= 2 and "stopped: the image's data changed" in widget.form.status.label.text()
    assert not np.any(objects.data[5:] == 1)  # not reached

    widget.form.max_planes_spin.setValue(1)
    qtbot.waitUntil(lambda: widget.ready, timeout=60000)  # the plane on screen encoded anew
    QTest.mouseClick(widget.form.propagate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not widget._propagation.running, timeout=120000)
    assert len(volumes) == 2
    np.testing.assert_array_equal(np.asarray(volumes[1]), filtered)


def test_propagate_explains_what_it_needs_and_a_model_without_video_graphs_changes_nothing(qtbot, viewer, synthetic_repository):
    stack = np.stack([disk_image(*SHAPE, [(60, 50, 25)])] * 3)
    image = viewer.add_image(stack)
    viewer.dims.set_current_step(0, 1)
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    open_section(widget, "stacks")
    QTest.mouseClick(widget.form.propagate_button, Qt.MouseButton.LeftButton)
    assert "Commit an object on this plane" in widget.form.status.label.text()

    click(viewer, world(image, 60, 50)[-2:])
    key(viewer, "commit")
    objects_name = layers.objects_name(image)
    qtbot.waitUntil(lambda: objects_name in viewer.layers and np.any(viewer.layers[objects_name].data[1] == 1), timeout=30000)
    before = viewer.layers[objects_name].data.copy()
    QTest.mouseClick(widget.form.propagate_button, Qt.MouseButton.LeftButton)  # the synthetic model has no video graphs
    qtbot.waitUntil(lambda: not widget._propagation.running, timeout=30000)
    assert "no video graphs" in widget.form.status.label.text() and widget.form.propagate_button.text() == "Propagate label"
    np.testing.assert_array_equal(viewer.layers[objects_name].data, before)

    flat = viewer.add_image(np.zeros(SHAPE, np.uint8))
    assert stack_axis(flat, 0, 2) is None
    assert widget.form.stacks_group.isEnabled()  # the stack, chosen at Start
    widget.form.image_box.setCurrentText(flat.name)  # a single plane: nothing to go through
    assert not widget.form.stacks_group.isEnabled() and "stack of planes" in widget.form.stacks_group.toolTip()
    widget.form.image_box.setCurrentText(image.name)
    assert widget.form.stacks_group.isEnabled()
    assert stack_axis(image, viewer.dims.last_used, viewer.dims.ndim) == 0
