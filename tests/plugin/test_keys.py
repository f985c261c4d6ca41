"""The panel's Keys choice in a real napari viewer, driven by real Qt key events: the micro-sam
preset, switching at once, a custom set, saved and restored."""

from __future__ import annotations

import pytest

from synthetic import disk_image

napari = pytest.importorskip("napari")
from napari.utils.key_bindings import coerce_keybinding  # noqa: E402
from qtpy.QtCore import QSettings, Qt  # noqa: E402
from qtpy.QtTest import QTest  # noqa: E402
from test_widget import DISKS, H, W, _canvas, click, move, start, world  # noqa: E402

from triton_sam.plugin import layers  # noqa: E402
from triton_sam.plugin.widget import TritonSamWidget  # noqa: E402


def press(viewer, combo: str) -> None:
    """Press `combo` ("C", "Shift-C") on the canvas."""
    *modifiers, name = combo.split("-")
    shift = Qt.KeyboardModifier.ShiftModifier if "Shift" in modifiers else Qt.KeyboardModifier.NoModifier
    QTest.keyClick(_canvas(viewer).native, getattr(Qt.Key, f"Key_{name}"), shift)


def _status(widget) -> str:
    return widget.form.status.label.text()


def _bound(viewer) -> set[str]:
    return {str(key) for key in viewer.keymap}


def test_micro_sam_keys_t_toggles_negative_points_s_shows_the_prompts_object_shift_c_discards_c_commits(
    qtbot, viewer, synthetic_repository
):
    image = viewer.add_image(disk_image(H, W, DISKS))
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    widget.form.keys_box.setCurrentText("micro-sam")
    assert _status(widget).startswith("Keys (micro-sam): C: commit · Shift-C: discard")
    assert viewer.layers.selection.active is image  # napari gives C to an image layer first (its auto-contrast)
    press(viewer, "T")
    assert _status(widget) == "Next point: negative (T again: positive; Alt-click: positive)."
    click(viewer, world(image, 300, 150))
    press(viewer, "T")
    assert _status(widget) == "Next point: positive."
    click(viewer, world(image, 80, 80))
    qtbot.waitUntil(lambda: widget.session.object.labels == [0, 1], timeout=5000)

    box = viewer.layers[layers.BOX_NAME]
    viewer.layers.selection.active = box  # a shapes layer's T is its path mode
    press(viewer, "T")
    assert widget.interaction.negative_points and box.mode != "add_path"
    press(viewer, "T")
    viewer.layers.selection.active = image

    press(viewer, "Shift-C")  # micro-sam's "clear annotations": the object in progress goes
    assert widget.session.object.empty and not len(viewer.layers[layers.PROMPTS_NAME].data)

    click(viewer, world(image, 80, 80))
    qtbot.waitUntil(lambda: widget.session.object.decoded_version == 1, timeout=10000)
    preview = viewer.layers[layers.PREVIEW_NAME]
    move(viewer, world(image, 300, 150))
    qtbot.waitUntil(lambda: preview.data[150, 300] == 2, timeout=10000)  # the hint: what a click there adds
    press(viewer, "S")  # the object its prompts make, alone
    qtbot.waitUntil(lambda: preview.data[150, 300] == 0, timeout=5000)
    assert preview.data[80, 80] == 1 and layers.objects_name(image) not in viewer.layers  # nothing written yet
    for _ in range(3):  # round the three candidates, back to the first
        press(viewer, "Shift-N")
        assert _status(widget).endswith("Shift-N for the next, C commits it."), _status(widget)  # the keys bound

    press(viewer, "C")
    qtbot.waitUntil(lambda: layers.objects_name(image) in viewer.layers, timeout=10000)
    objects = viewer.layers[layers.objects_name(image)]
    qtbot.waitUntil(lambda: objects.data[80, 80] == 1, timeout=10000)
    assert not objects.data[150, 300]
    viewer.window.remove_dock_widget(widget)
    assert not image.keymap and not _bound(viewer) & {"C", "Shift+C", "T", "S"}  # every key given back


def test_switching_keys_unbinds_the_old_ones_at_once(qtbot, viewer, synthetic_repository):
    image = viewer.add_image(disk_image(H, W, DISKS))
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    widget.form.keys_box.setCurrentText("micro-sam")
    press(viewer, "T")
    widget.form.keys_box.setCurrentText("triton-sam")
    assert not widget.interaction.negative_points and not image.keymap
    click(viewer, world(image, 80, 80))
    qtbot.waitUntil(lambda: widget.session.object.decoded_version == 1, timeout=10000)
    press(viewer, "C")  # micro-sam's commit: the image layer's auto-contrast again
    press(viewer, "T")
    qtbot.wait(300)
    assert layers.objects_name(image) not in viewer.layers and widget.session.object.labels == [1]
    assert not widget.interaction.negative_points
    press(viewer, "Shift-C")
    qtbot.waitUntil(lambda: layers.objects_name(image) in viewer.layers, timeout=10000)
    assert viewer.layers[layers.objects_name(image)].data[80, 80] == 1
    widget.close_session()


def test_the_keys_chosen_are_saved_and_bound_again_in_the_next_panel(qtbot, viewer):
    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    widget.form.keys_box.setCurrentText("Custom")  # starts from the keys bound
    field = widget.form.custom_keys_field
    assert field.isEnabled() and field.text() == (
        "commit=Shift-C, discard=Shift-X, undo=Shift-U, cycle=Shift-N, "
        "next_image=PageDown, previous_image=PageUp, image_done=Shift-D"
    )
    field.clear()
    qtbot.keyClicks(field, "commit=K, negative=J")
    qtbot.keyClick(field, Qt.Key.Key_Return)
    assert _bound(viewer) == {"K", "J"} and "K: commit" in widget.form.keys_label.text()
    viewer.window.remove_dock_widget(widget)
    assert not _bound(viewer)

    again = TritonSamWidget(viewer)
    assert again.form.keys_box.currentText() == "Custom" and again.form.custom_keys_field.text() == "commit=K, negative=J"
    assert _bound(viewer) == {"K", "J"}
    again.form.keys_box.setCurrentText("micro-sam")
    again.close()
    assert TritonSamWidget(viewer).form.keys_box.currentText() == "micro-sam"


def test_a_custom_set_that_cannot_be_bound_says_why_and_changes_nothing(qtbot, viewer):
    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    widget.form.keys_box.setCurrentText("Custom")
    bound, saved = _bound(viewer), QSettings("triton-sam", "triton-sam").value("custom_keys")
    field = widget.form.custom_keys_field
    field.clear()
    qtbot.keyClicks(field, "commit=C, undo=V")
    qtbot.keyClick(field, Qt.Key.Key_Return)
    assert _status(widget) == (
        "Custom keys not used: V is one of napari's own viewer keys. "
        "Keys: Shift-C: commit · Shift-X: discard · Shift-U: undo prompt · Shift-N: next candidate · "
        "PageDown: next image of the series · PageUp: previous image of the series · Shift-D: image done, next."
    )
    assert _bound(viewer) == bound and widget.form.keys["commit"] == "Shift-C"
    assert QSettings("triton-sam", "triton-sam").value("custom_keys") == saved
    field.clear()
    qtbot.keyClicks(field, "comit=C")
    qtbot.keyClick(field, Qt.Key.Key_Return)
    assert "'comit' is no action; the actions are commit, discard, undo, cycle, negative, segment" in _status(widget)
    assert _bound(viewer) == bound
    widget.close()


def test_keys_come_from_the_environment_first(monkeypatch, viewer):
    monkeypatch.setenv("TRITON_SAM_KEYS", "micro-sam")
    widget = TritonSamWidget(viewer)
    assert widget.form.keys_box.currentText() == "micro-sam" and coerce_keybinding("T") in viewer.keymap
    widget.close()
    monkeypatch.setenv("TRITON_SAM_KEYS", "commit=K,commit=J")
    widget = TritonSamWidget(viewer)
    assert widget.form.keys_box.currentText() == "Custom" and _bound(viewer) == {
        "Shift+C",
        "Shift+X",
        "Shift+U",
        "Shift+N",
        "PageDown",
        "PageUp",
        "Shift+D",
    }
    assert _status(widget).startswith("Custom keys not used: commit is given two keys. Keys: Shift-C: commit")
    widget.close()
