"""The dock widget in a real napari viewer under Xvfb, driven by real Qt mouse and key events."""

from __future__ import annotations

import contextlib
import gc
import os
import re
import signal
import threading
import time
import weakref

import numpy as np
import pytest
from scipy import ndimage

from conftest import SERVED_MODELS, start_server
from synthetic import disk_image, slow_encodes, write_repository
from triton_sam import Predictor
from triton_sam.image import encoder_input
from triton_sam.registry import get_model

napari = pytest.importorskip("napari")
from process_scenarios import open_section  # noqa: E402
from qtpy.QtCore import QEvent, Qt, QTimer  # noqa: E402
from qtpy.QtTest import QTest  # noqa: E402

from benchmarks.gui import send_mouse  # noqa: E402
from triton_sam.plugin import bindings, layers  # noqa: E402
from triton_sam.plugin import preview as previews  # noqa: E402
from triton_sam.plugin.bindings import KEYS  # noqa: E402
from triton_sam.plugin.keys import PRESETS  # noqa: E402
from triton_sam.plugin.widget import TritonSamWidget  # noqa: E402

H, W = 240, 400
DISKS = [(80, 80, 40), (300, 150, 50)]


def _canvas(viewer):
    return viewer.window._qt_viewer.canvas  # the vispy canvas: tests need its Qt widget


def _send(
    viewer,
    kind,
    world_yx,
    button=Qt.MouseButton.NoButton,
    buttons=Qt.MouseButton.NoButton,
    modifiers=Qt.KeyboardModifier.NoModifier,
):
    send_mouse(viewer, _canvas(viewer).native, kind, world_yx, button, buttons, modifiers)


# vispy drops a mouse move that comes within 10 ms of the last one it took (`_vispy_mouse_move`),
# as a hand's mouse sends them faster; a test's deliberate move (right after a key whose wait found
# its condition already true) must not be one: its hover never ran, a test waited for it in vain.
MOVE_INTERVAL_S = 0.011
_last_move = [0.0]


def move(viewer, world_yx) -> None:
    """A mouse move napari handles (at least `MOVE_INTERVAL_S` after the last one sent here)."""
    time.sleep(max(0.0, _last_move[0] + MOVE_INTERVAL_S - time.perf_counter()))
    _send(viewer, QEvent.Type.MouseMove, world_yx)
    _last_move[0] = time.perf_counter()


def click(viewer, world_yx, modifiers=Qt.KeyboardModifier.NoModifier) -> None:
    left = Qt.MouseButton.LeftButton
    _send(viewer, QEvent.Type.MouseButtonPress, world_yx, left, left, modifiers)
    _send(viewer, QEvent.Type.MouseButtonRelease, world_yx, left, Qt.MouseButton.NoButton, modifiers)


def drag_box(viewer, image, start_xy, end_xy, before_release=lambda: None, ctrl=Qt.KeyboardModifier.ControlModifier) -> None:
    """Ctrl-drag (or with the modifiers `ctrl`) from image pixel `start_xy` to `end_xy` in five moves."""
    left = Qt.MouseButton.LeftButton
    start_pos, end_pos = world(image, *start_xy), world(image, *end_xy)
    _send(viewer, QEvent.Type.MouseButtonPress, start_pos, left, left, ctrl)
    for t in np.linspace(0, 1, 6)[1:]:
        _send(viewer, QEvent.Type.MouseMove, start_pos + (end_pos - start_pos) * float(t), left, left, ctrl)
    before_release()
    _send(viewer, QEvent.Type.MouseButtonRelease, end_pos, left, Qt.MouseButton.NoButton, ctrl)


def key(viewer, action: str) -> None:
    """Press the key bound to `action` ("commit", "undo", ...) on the canvas."""
    name = KEYS[action].split("-")[-1]
    modifiers = Qt.KeyboardModifier.ShiftModifier if KEYS[action].startswith("Shift-") else Qt.KeyboardModifier.NoModifier
    QTest.keyClick(_canvas(viewer).native, getattr(Qt.Key, f"Key_{name}"), modifiers)


def world(layer, x: float, y: float) -> np.ndarray:
    """World (y, x) of image pixel (x, y) of a 2D layer."""
    return np.asarray(layer.data_to_world([y, x]))


def start(qtbot, viewer, backend: str = "Local", ready_ms: int = 30000, **fields) -> TritonSamWidget:
    """The panel started on `backend` with its `fields` set, once its first plane is encoded (within `ready_ms`)."""
    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    widget.form.backend_box.setCurrentText(backend)
    for name, value in fields.items():
        getattr(widget.form, f"{name}_field").setText(str(value))
    widget.connect_engine()
    qtbot.waitUntil(lambda: widget.ready, timeout=ready_ms)
    return widget


def start_on_plane_0_then_slow(qtbot, viewer, stack, repository, monkeypatch, seconds: float = 1.0):
    """Start on plane 0 of `stack`, and once plane 1 is encoded ahead make encodes `seconds`
    slower: the image layer, the widget and the list of when each slow encode ended."""
    image = viewer.add_image(stack)
    viewer.dims.set_current_step(0, 0)
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=repository)
    qtbot.waitUntil(lambda: widget.session.cache.misses == 2, timeout=10000)  # plane 1, encoded ahead
    return image, widget, slow_encodes(widget.session.engine, seconds, monkeypatch)


def test_the_dock_widget_opens_by_plugin_name(viewer):
    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    assert isinstance(widget, TritonSamWidget)
    widget.close_session()


def _decode_threads() -> list[threading.Thread]:
    """The threads of live sessions (a closed session ends its thread)."""
    return [t for t in threading.enumerate() if t.name.startswith("triton-sam-decode")]


def _between_start_s_layers(viewer, action) -> list[str]:
    """Run `action` at the first timer after Start made the preview layer (timers run with input,
    after posted events); the names of the layers made, and "event loop" where the action ran."""
    made = []
    timer = QTimer(viewer.window._qt_window, singleShot=True, interval=0)  # a timer (QTimer.singleShot(0) posts)
    timer.timeout.connect(lambda: (made.append("event loop"), action()))

    def inserted(event) -> None:
        made.append(event.value.name)
        if event.value.name == layers.PREVIEW_NAME:
            timer.start()

    viewer.layers.events.inserted.connect(inserted)
    return made


def test_start_lets_the_window_answer_between_making_its_layers(qtbot, viewer, synthetic_repository):
    """napari takes ~0.1 s a layer: Start's layers are made in two turns of the event loop, not
    one (the window froze for all of them at once)."""
    viewer.add_image(disk_image(H, W, DISKS))
    made = _between_start_s_layers(viewer, lambda: None)
    widget = start(qtbot, viewer, repository=synthetic_repository)
    assert made == [layers.PREVIEW_NAME, "event loop", layers.PROMPTS_NAME, layers.BOX_NAME]
    widget.close_session()


@pytest.mark.parametrize("meanwhile", ["close the panel", "remove the image"])
def test_start_interrupted_between_its_layers_lets_go_of_its_session(qtbot, viewer, synthetic_repository, meanwhile):
    image = viewer.add_image(disk_image(H, W, DISKS))
    before = _decode_threads()
    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    widget.form.backend_box.setCurrentText("Local")
    widget.form.repository_field.setText(str(synthetic_repository))
    action = widget.close_session if meanwhile == "close the panel" else lambda: viewer.layers.remove(image)
    made = _between_start_s_layers(viewer, action)
    widget.connect_engine()
    qtbot.waitUntil(lambda: "event loop" in made, timeout=30000)
    qtbot.wait(200)
    assert made == [layers.PREVIEW_NAME, "event loop"]  # no prompt layers
    assert widget.session is None and not widget.ready and _decode_threads() == before
    if meanwhile == "remove the image":
        assert "image layer was removed" in widget.form.status.label.text()


def test_start_with_the_image_removed_while_connecting_changes_nothing(qtbot, viewer, synthetic_repository):
    image = viewer.add_image(disk_image(H, W, DISKS))
    before = _decode_threads()
    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    widget.form.backend_box.setCurrentText("Local")
    widget.form.repository_field.setText(str(synthetic_repository))
    widget.connect_engine()  # the engine is made on a worker thread
    viewer.layers.remove(image)
    qtbot.waitUntil(lambda: "image layer was removed" in widget.form.status.label.text(), timeout=30000)
    assert len(viewer.layers) == 0 and widget.session is None and _decode_threads() == before


def test_every_field_of_the_panel_shows_its_text_whole(qtbot, viewer):
    """In a window shorter than the panel (a laptop's), no button, list or number is cut or
    squeezed: the panel scrolls (the planes field once showed "planes" for "all planes", and the
    fields overlapped when the panel outgrew the window)."""
    from qtpy.QtWidgets import QAbstractSpinBox, QComboBox, QLineEdit, QPushButton

    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    qtbot.waitUntil(lambda: widget.isVisible() and widget.width() > 0, timeout=5000)
    qtbot.wait(100)  # laid out with napari's style
    for key in widget.form.sections:  # every section unfolded: the panel at its tallest
        open_section(widget, key)
    fields = widget.findChildren(QPushButton) + widget.findChildren(QComboBox) + widget.findChildren(QAbstractSpinBox)

    def squeezed():
        return [f for f in fields + widget.findChildren(QLineEdit) if f.height() < f.minimumSizeHint().height()]

    with contextlib.suppress(qtbot.TimeoutError):  # the last unfolding's layout may still be pending
        qtbot.waitUntil(lambda: not squeezed(), timeout=5000)
    assert not squeezed(), [(f.objectName() or type(f).__name__, f.height()) for f in squeezed()]
    cut = []
    for field in fields:
        if not field.isVisibleTo(widget):
            continue
        if isinstance(field, QAbstractSpinBox):
            edit = field.lineEdit()
            text, room = edit.text(), edit.width()
        else:
            text, room = field.currentText() if isinstance(field, QComboBox) else field.text(), field.width()
        if field.fontMetrics().horizontalAdvance(text) > room:
            cut.append(text)
    assert not cut, cut
    widget.close_session()


def test_hover_previews_the_object_under_the_cursor_on_a_scaled_non_square_image(qtbot, viewer, synthetic_repository):
    image = viewer.add_image(disk_image(H, W, DISKS), scale=(0.5, 2.0), translate=(10.0, -30.0))
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    preview = viewer.layers[layers.PREVIEW_NAME]
    assert tuple(preview.scale) == (0.5, 2.0) and tuple(preview.translate) == (10.0, -30.0)

    move(viewer, world(image, 300, 150))
    qtbot.waitUntil(lambda: preview.data[150, 300] == 1, timeout=10000)
    with Predictor(model_repository=synthetic_repository) as predictor:
        predictor.set_image(image.data)
        x, y = widget.session.cursor.decoded
        expected, _, _ = predictor.predict(point_coords=[[x, y]], point_labels=[1], multimask_output=False)
    np.testing.assert_array_equal(preview.data.astype(bool), expected[0])
    assert not preview.data[80, 80]
    assert re.search(r"preview in \d+ ms · \d+ of \d+ mouse moves previewed$", widget.form.status.label.toolTip())  # plain words
    np.testing.assert_allclose(preview.colormap.map(previews.OUTLINE), previews.OUTLINE_COLOR)  # one fixed colour, an outline

    move(viewer, world(image, -40, 150))  # off the image: the preview goes
    qtbot.waitUntil(lambda: not preview.data.any(), timeout=5000)
    widget.close_session()


def test_click_and_commit_key_write_an_undoable_label(qtbot, viewer, synthetic_repository):
    image = viewer.add_image(disk_image(H, W, DISKS))
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    click(viewer, world(image, 80, 80))
    preview = viewer.layers[layers.PREVIEW_NAME]
    qtbot.waitUntil(lambda: preview.data[80, 80] == 1, timeout=10000)
    shown, moves = map(int, re.search(r"(\d+) of (\d+) mouse moves previewed", widget.form.status.label.toolTip()).groups())
    assert shown <= moves  # a click's mask is no mouse move's preview
    qtbot.keyClick(_canvas(viewer).native, Qt.Key.Key_C, Qt.KeyboardModifier.ShiftModifier)
    qtbot.waitUntil(lambda: layers.objects_name(image) in viewer.layers, timeout=10000)  # made at the first commit
    objects = viewer.layers[layers.objects_name(image)]
    qtbot.waitUntil(lambda: objects.data[80, 80] == 1, timeout=10000)
    assert not objects.data[150, 300] and widget.session.next_object_id == 2
    made = objects.metadata[layers.PROVENANCE_KEY][1]  # how the object was made, kept with the layer
    assert (
        made["labels"] == [1]
        and np.allclose(made["points"], [[80, 80]], atol=1)
        and made["model_id"] == widget.form.model_box.currentText()
    )
    objects.undo()
    assert not objects.data.any()
    widget.close_session()


def test_it_works_whichever_layer_is_active_and_alt_click_excludes(qtbot, viewer, synthetic_repository):
    image = viewer.add_image(disk_image(H, W, DISKS))
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    other = viewer.add_labels(np.zeros((H, W), np.uint8), name="someone else's labels")
    viewer.layers.selection.active = other
    click(viewer, world(image, 80, 80))
    click(viewer, world(image, 300, 150), Qt.KeyboardModifier.AltModifier)
    qtbot.waitUntil(lambda: len(widget.session.object.labels) == 2, timeout=5000)
    assert widget.session.object.labels == [1, 0]
    assert not other.data.any()  # pan/zoom mode: napari's tool did nothing to it
    move(viewer, world(image, 300, 150))
    preview = viewer.layers[layers.PREVIEW_NAME]
    qtbot.waitUntil(lambda: preview.data.any(), timeout=10000)
    widget.close_session()


def _zarr(data: np.ndarray):
    """`data` as an in-memory zarr array, a plane a chunk (napari shows zarr arrays as they are)."""
    zarr = pytest.importorskip("zarr")
    array = zarr.create_array(store={}, shape=data.shape, chunks=(1, *data.shape[1:]), dtype=data.dtype)
    array[:] = data
    return array


@pytest.mark.parametrize("stored", ["numpy", "zarr"])
def test_planes_of_a_stack_use_their_own_cached_embedding_and_never_show_another_plane(
    qtbot, viewer, synthetic_repository, stored
):
    stack = np.stack([disk_image(H, W, [(80, 80, 40)]), disk_image(H, W, [(300, 150, 50)])])
    image = viewer.add_image(stack if stored == "numpy" else _zarr(stack))
    viewer.dims.set_current_step(0, 0)
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    preview = viewer.layers[layers.PREVIEW_NAME]
    move(viewer, world(image, 80, 80)[-2:])
    qtbot.waitUntil(lambda: preview.data[80, 80] == 1, timeout=10000)

    viewer.dims.set_current_step(0, 1)
    assert not preview.data.any()  # cleared at once: never another plane's mask
    qtbot.waitUntil(lambda: widget.ready and widget.encoding.index == (1,), timeout=30000)
    move(viewer, world(image, 300, 150)[-2:])
    qtbot.waitUntil(lambda: preview.data[150, 300] == 1, timeout=10000)
    assert not preview.data[80, 80]

    hits = widget.session.cache.hits
    viewer.dims.set_current_step(0, 0)
    qtbot.waitUntil(lambda: widget.ready and widget.encoding.index == (0,), timeout=30000)
    assert widget.session.cache.hits > hits and widget.session.cache.misses == 2  # from the cache
    widget.close_session()


def _cross_canvas(viewer, kind) -> None:
    """The cursor enters or leaves the canvas (napari sets `viewer.mouse_over_canvas`)."""
    from qtpy.QtWidgets import QApplication

    QApplication.sendEvent(_canvas(viewer).native, QEvent(kind))


def test_leaving_the_canvas_takes_the_hover_preview_and_keeps_the_object_in_progress(qtbot, viewer, synthetic_repository):
    stack = np.stack([disk_image(H, W, DISKS)] * 2)
    image = viewer.add_image(stack)
    viewer.dims.set_current_step(0, 0)
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    preview = viewer.layers[layers.PREVIEW_NAME]
    _cross_canvas(viewer, QEvent.Type.Enter)
    move(viewer, world(image, 300, 150)[-2:])
    qtbot.waitUntil(lambda: preview.data[150, 300] == 1, timeout=10000)
    _cross_canvas(viewer, QEvent.Type.Leave)  # to the panel, say
    assert not preview.data.any()  # no object under a cursor that is not there

    _cross_canvas(viewer, QEvent.Type.Enter)
    click(viewer, world(image, 80, 80)[-2:])
    move(viewer, world(image, 300, 150)[-2:])
    qtbot.waitUntil(lambda: preview.data[80, 80] == 1 and preview.data[150, 300] == 2, timeout=10000)  # object, hint
    _cross_canvas(viewer, QEvent.Type.Leave)
    assert preview.data[80, 80] == 1 and not _hint(preview).any()  # the object stays, its hint goes

    viewer.dims.set_current_step(0, 1)  # the slider, dragged with the cursor off the canvas
    assert not preview.data.any()  # at once: never another plane's object
    qtbot.waitUntil(lambda: widget.ready and widget.encoding.index == (1,), timeout=30000)
    qtbot.wait(300)
    assert not preview.data.any()  # not previewed where the cursor was before it left
    viewer.dims.set_current_step(0, 0)  # back, the cursor still off the canvas
    qtbot.waitUntil(lambda: widget.ready and widget.encoding.index == (0,), timeout=30000)
    qtbot.waitUntil(lambda: preview.data[80, 80] == 1, timeout=10000)  # the plane's object in progress
    assert not _hint(preview).any()
    widget.close_session()


def test_scrubbing_back_to_a_cached_plane_while_another_encodes_keeps_the_plane_on_screen(
    qtbot, viewer, synthetic_repository, monkeypatch
):
    """Plane 2 (slow to encode) is passed on the way back to plane 0 (cached): the panel stays on
    plane 0, ready, and previews it (the late encode once took the session to plane 2 and the panel
    ignored the mouse until the slider moved again)."""
    stack = np.stack([disk_image(H, W, [(80, 80, 40)]), disk_image(H, W, [(300, 150, 50)]), disk_image(H, W, [(200, 100, 30)])])
    image, widget, encoded = start_on_plane_0_then_slow(qtbot, viewer, stack, synthetic_repository, monkeypatch)
    viewer.dims.set_current_step(0, 2)
    qtbot.wait(200)
    viewer.dims.set_current_step(0, 0)
    qtbot.waitUntil(lambda: len(encoded) == 1, timeout=10000)
    qtbot.wait(100)
    assert widget.ready and widget.encoding.index == (0,)
    preview = viewer.layers[layers.PREVIEW_NAME]
    move(viewer, world(image, 80, 80)[-2:])
    qtbot.waitUntil(lambda: preview.data[80, 80] == 1, timeout=10000)
    widget.close_session()


def test_changing_contrast_limits_encodes_the_plane_as_now_shown_and_decodes_the_object_again(
    qtbot, viewer, synthetic_repository
):
    """The model sees what the user sees: a uint16 plane whose disks are grey under its first
    contrast limits is encoded again once a burst of changes rests (one encode), and the object in
    progress is decoded from its prompts on it; commit stores what then shows."""
    image = viewer.add_image(disk_image(H, W, DISKS).astype(np.uint16) * 10, contrast_limits=(0, 9000))  # disks at 2300
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    preview = viewer.layers[layers.PREVIEW_NAME]
    click(viewer, world(image, 300, 150))
    obj = widget.session.object
    qtbot.waitUntil(lambda: obj.decoded_version == obj.version, timeout=10000)
    assert not preview.data[150, 300]  # grey: not bright enough for the synthetic model
    encodes = widget.session.cache.misses
    for high in (7000, 4000, 2300):  # a slider drag
        image.contrast_limits = (0, high)
        qtbot.wait(50)
    qtbot.waitUntil(lambda: preview.data[150, 300] == 1, timeout=10000)  # the object, decoded again
    assert widget.session.cache.misses == encodes + 1
    key(viewer, "commit")
    qtbot.waitUntil(lambda: layers.objects_name(image) in viewer.layers, timeout=10000)
    objects = viewer.layers[layers.objects_name(image)]
    qtbot.waitUntil(lambda: objects.data[150, 300] == 1, timeout=10000)
    widget.close_session()


def test_replacing_the_layer_s_data_encodes_the_plane_anew_and_another_shape_needs_start(qtbot, viewer, synthetic_repository):
    """A filter or plugin that replaces the layer's data: the model sees the new pixels (it kept
    segmenting the old ones); data of another shape stops the panel with a message."""
    image = viewer.add_image(disk_image(H, W, DISKS))
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    preview = viewer.layers[layers.PREVIEW_NAME]
    move(viewer, world(image, 80, 80))
    qtbot.waitUntil(lambda: preview.data[80, 80] == 1, timeout=10000)

    encodes = widget.session.cache.misses
    image.data = disk_image(H, W, [(200, 60, 30)])  # other objects, the same shape
    qtbot.waitUntil(lambda: widget.session.cache.misses == encodes + 1 and widget.ready, timeout=10000)
    move(viewer, world(image, 200, 60))
    qtbot.waitUntil(lambda: preview.data[60, 200] == 1, timeout=10000)
    assert not preview.data[80, 80]

    image.data = disk_image(H // 2, W, DISKS[:1])
    assert widget.session is None and "changed shape" in widget.form.status.label.text()
    assert not preview.data.any()  # cleared, and no more previews
    move(viewer, world(image, 80, 80))
    qtbot.wait(300)
    assert not preview.data.any()
    widget.close_session()


def test_a_plane_shown_by_the_slider_previews_where_the_cursor_rests(qtbot, viewer, synthetic_repository):
    """Scrolling through a stack with the keys or the wheel, the cursor still: each plane's
    preview appears once it is encoded, without a move."""
    stack = np.stack([disk_image(H, W, []), disk_image(H, W, [(200, 60, 30)])])
    image = viewer.add_image(stack)
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    preview = viewer.layers[layers.PREVIEW_NAME]
    move(viewer, world(image, 200, 60)[-2:])
    qtbot.wait(300)
    assert not preview.data[60, 200]  # nothing there on plane 0
    viewer.dims.set_current_step(0, 1)
    qtbot.waitUntil(lambda: preview.data[60, 200] == 1, timeout=10000)
    widget.close_session()


def test_renaming_the_image_layer_keeps_its_objects_in_one_layer(qtbot, viewer, synthetic_repository):
    image = viewer.add_image(disk_image(H, W, DISKS), name="cells")
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    for number, (x, y, _) in enumerate(DISKS, start=1):
        if number == 2:
            image.name = "cells, day 2"
        click(viewer, world(image, x, y))
        key(viewer, "commit")
        name = layers.objects_name(image)
        qtbot.waitUntil(lambda x=x, y=y, name=name: name in viewer.layers and viewer.layers[name].data[y, x] > 0, timeout=10000)
    objects = viewer.layers[layers.objects_name(image)]
    assert objects.name == "cells, day 2 [triton-sam objects]" and "cells [triton-sam objects]" not in viewer.layers
    assert objects.data[80, 80] == 1 and objects.data[150, 300] == 2
    assert layers.existing_objects_layer(viewer, image) is objects  # what Propagate tracks from
    widget.close_session()


def test_the_triton_backend_against_a_local_server(qtbot, viewer, synthetic_server):
    image = viewer.add_image(disk_image(H, W, DISKS))
    viewer.reset_view()
    widget = start(qtbot, viewer, backend="Triton", url=synthetic_server.grpc_url)
    assert widget.session.engine.describe().startswith("Triton at")
    move(viewer, world(image, 300, 150))
    preview = viewer.layers[layers.PREVIEW_NAME]
    qtbot.waitUntil(lambda: preview.data[150, 300] == 1, timeout=10000)
    widget.close_session()


def test_settings_come_from_the_environment_first(monkeypatch, viewer):
    monkeypatch.setenv("TRITON_SAM_BACKEND", "triton")
    monkeypatch.setenv("TRITON_SAM_URL", "gpu-box:8001")
    monkeypatch.setenv("TRITON_SAM_MODEL", "sam2.1_hiera_small")
    widget = TritonSamWidget(viewer)
    assert widget.form.backend_box.currentText() == "Triton" and widget.form.url_field.text() == "gpu-box:8001"
    assert widget.form.model_box.currentText() == "sam2.1_hiera_small"


@pytest.mark.parametrize("preset", list(PRESETS))
def test_our_keys_do_not_collide_with_napari_defaults(viewer, preset):
    """No preset takes a key of napari's viewer or menus; micro-sam's C, S and T are keys of napari's
    layer types (an image's auto-contrast, a points or shapes layer's select mode, a shapes layer's
    path mode), which the panel also binds on the session's own layers: those three alone."""
    from napari.layers import Image, Labels, Points, Shapes, Surface, Tracks, Vectors
    from napari.utils.key_bindings import coerce_keybinding

    def keys_of(*providers) -> set:
        return {coerce_keybinding(key) for cls in providers for c in cls.__mro__ for key in vars(c).get("class_keymap", {})}

    ours = {coerce_keybinding(key) for key in PRESETS[preset].values()}
    viewer_s = keys_of(type(viewer)) | {coerce_keybinding(key) for key in viewer.keymap}  # (no panel open)
    from napari._app_model import get_app_model  # napari's own menu/action shortcuts

    for binding in get_app_model().keybindings:
        viewer_s.add(coerce_keybinding(binding.keybinding))
    assert not ours & viewer_s
    layers_ = keys_of(Image, Labels, Points, Shapes, Surface, Tracks, Vectors)
    assert {str(key) for key in ours & layers_} == ({"C", "S", "T"} if preset == "micro-sam" else set())


def test_the_model_box_lists_what_the_backend_offers(qtbot, viewer, synthetic_repository, synthetic_server):
    """The repository's models (backend Local), the server's (Triton: its repository index), listed
    again when the backend or the server's address changes."""
    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    widget.form.backend_box.setCurrentText("Local")
    widget.form.repository_field.setText(str(synthetic_repository))
    widget.form.find_models_button.click()
    qtbot.waitUntil(lambda: widget.form.status.label.text().startswith("Local repository"), timeout=10000)
    assert [widget.form.model_box.itemText(i) for i in range(widget.form.model_box.count())] == ["sam2.1_hiera_tiny"]
    widget.form.backend_box.setCurrentText("Triton")
    widget.form.url_field.setText(synthetic_server.grpc_url)
    QTest.keyClick(widget.form.url_field, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: widget.form.status.label.text().startswith("Triton at"), timeout=10000)
    assert widget.form.model_box.currentText() == "sam2.1_hiera_tiny"


def test_a_sam1_family_model_served_next_to_sam2_previews_what_the_predictor_predicts(
    qtbot, viewer, models_server, exported_repository
):
    image = viewer.add_image(disk_image(H, W, DISKS))  # not square: SAM1 resizes the longest side
    viewer.reset_view()
    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    widget.form.backend_box.setCurrentText("Triton")
    widget.form.url_field.setText(models_server.grpc_url)
    widget.form.find_models_button.click()
    qtbot.waitUntil(lambda: widget.form.status.label.text().startswith("Triton at"), timeout=10000)
    assert sorted(widget.form.model_box.itemText(i) for i in range(widget.form.model_box.count())) == sorted(SERVED_MODELS)
    widget.form.model_box.setCurrentText("mobile_sam")
    widget.connect_engine()
    qtbot.waitUntil(lambda: widget.ready, timeout=60000)
    with qtbot.waitSignal(widget.preview_shown, timeout=30000) as shown:
        move(viewer, world(image, 300, 150))
    hovered = shown.args[0].point
    assert np.abs(np.subtract(hovered, [300, 150])).max() < 1
    with Predictor("mobile_sam", model_repository=exported_repository("mobile_sam")) as predictor:
        predictor.set_image(image.data)
        masks, scores, _ = predictor.predict(point_coords=[hovered], point_labels=[1])
        expected = masks[np.argmax(scores)]  # the candidate a click there chooses
    assert 0 < expected.mean() < 1  # random weights, yet a mask with content
    np.testing.assert_array_equal(viewer.layers[layers.PREVIEW_NAME].data > 0, expected)
    widget.close_session()


def test_neighbouring_planes_are_encoded_ahead(qtbot, viewer, synthetic_repository):
    stack = np.stack([disk_image(H, W, [(40 + 60 * i, 80, 30)]) for i in range(3)])
    viewer.add_image(stack)
    viewer.dims.set_current_step(0, 1)
    widget = start(qtbot, viewer, repository=synthetic_repository)
    qtbot.waitUntil(lambda: len(widget.session.cache) == 3, timeout=30000)  # planes 0 and 2 too
    viewer.dims.set_current_step(0, 2)
    qtbot.waitUntil(lambda: widget.ready and widget.encoding.index == (2,), timeout=10000)
    assert widget.session.cache.misses == 3  # no new encode for the plane that was guessed


def test_rgb_image_and_ctrl_drag_box(qtbot, viewer, synthetic_repository):
    gray = disk_image(H, W, DISKS)
    image = viewer.add_image(np.stack([gray, gray, gray], axis=-1), rgb=True)
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    drag_box(viewer, image, (250, 100), (350, 200))
    qtbot.waitUntil(lambda: widget.session.object.box is not None, timeout=5000)
    x0, y0, x1, y1 = widget.session.object.box
    assert abs(x0 - 250) < 3 and abs(y0 - 100) < 3 and abs(x1 - 350) < 3 and abs(y1 - 200) < 3
    assert bindings.camera(viewer).mouse_pan  # handed back after the drag
    obj = widget.session.object
    qtbot.waitUntil(lambda: obj.decoded_version == obj.version, timeout=10000)
    with Predictor(model_repository=synthetic_repository) as predictor:
        predictor.set_image(image.data)
        masks, scores, _ = predictor.predict(box=np.array(obj.box))
    preview = viewer.layers[layers.PREVIEW_NAME]
    qtbot.waitUntil(lambda: np.array_equal(preview.data.astype(bool), masks[int(np.argmax(scores))]), timeout=10000)
    widget.close_session()


def test_encode_all_planes_runs_in_the_background_and_can_be_stopped(qtbot, viewer, synthetic_repository):
    """Stopped by the button, or by new pixels (their planes are not the ones it was encoding)."""
    stack = np.stack([disk_image(H, W, [(40 + 10 * i, 80, 30)]) for i in range(40)])
    image = viewer.add_image(stack)
    widget = start(qtbot, viewer, repository=synthetic_repository)
    widget.toggle_encode_all()
    qtbot.waitUntil(lambda: len(widget.session.cache) >= 5, timeout=30000)
    widget.toggle_encode_all()  # stop
    qtbot.waitUntil(lambda: not widget.encoding.encoding_all, timeout=30000)
    stopped_at = len(widget.session.cache)
    assert stopped_at < 40 and widget.form.encode_all_button.text() == "Encode all planes"
    widget.toggle_encode_all()  # run to the end this time
    qtbot.waitUntil(lambda: not widget.encoding.encoding_all, timeout=60000)
    assert len(widget.session.cache) == 40

    moved = np.stack([disk_image(H, W, [(40 + 10 * i, 120, 30)]) for i in range(40)])
    image.data = moved
    session = widget.session

    def shown_plane_encoded_anew() -> bool:  # (its neighbours may follow it into the cache at once)
        if not widget.ready:
            return False
        pixels = encoder_input(moved[widget.encoding.index], session.spec, layers.encoding_contrast(image))
        return session.cache.signature(pixels) in session.cache

    qtbot.waitUntil(shown_plane_encoded_anew, timeout=30000)
    widget.toggle_encode_all()
    done = []
    widget.encoding._all_worker.yielded.connect(done.append)
    qtbot.waitUntil(lambda: len(done) >= 3, timeout=30000)
    image.data = stack  # back to the planes encoded before: the run through the others stops
    qtbot.waitUntil(lambda: not widget.encoding.encoding_all, timeout=30000)
    assert done[-1] < 40 and widget.form.encode_all_button.text() == "Encode all planes"
    widget.close_session()


def _slow_decodes(monkeypatch, widget, seconds: float = 0.5) -> None:
    """A slow engine: each decode of the widget's engine waits `seconds` first."""
    decode = widget.session.engine.decode

    def slow_decode(*args, **kwargs):
        time.sleep(seconds)
        return decode(*args, **kwargs)

    monkeypatch.setattr(widget.session.engine, "decode", slow_decode)


def test_removing_the_image_layer_while_a_decode_runs_writes_nothing_and_raises_nothing(
    qtbot, viewer, synthetic_repository, monkeypatch
):
    image = viewer.add_image(disk_image(H, W, DISKS))
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    _slow_decodes(monkeypatch, widget)  # to remove the layer mid-decode
    preview = viewer.layers[layers.PREVIEW_NAME]
    move(viewer, world(image, 300, 150))
    qtbot.waitUntil(lambda: widget.session.in_flight == 1, timeout=5000)
    viewer.layers.remove(image)
    assert "removed" in widget.form.status.label.text() and not widget.ready
    qtbot.waitUntil(lambda: widget.session.idle, timeout=5000)
    qtbot.wait(200)
    assert not preview.data.any()  # the late result was not shown
    move(viewer, world(image, 80, 80))
    click(viewer, world(image, 80, 80))
    qtbot.keyClick(_canvas(viewer).native, Qt.Key.Key_C, Qt.KeyboardModifier.ShiftModifier)
    qtbot.wait(300)
    assert widget.session.stats.events == 1 and widget.session.object.empty
    assert layers.objects_name(image) not in viewer.layers and not preview.data.any()
    widget.close_session()


def test_a_decode_that_fails_during_commit_leaves_the_output_layer_as_it_was(qtbot, viewer, synthetic_repository, monkeypatch):
    image = viewer.add_image(disk_image(H, W, DISKS))
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    canvas = _canvas(viewer).native
    click(viewer, world(image, 80, 80))
    qtbot.waitUntil(lambda: widget.session.object.decoded_version == 1, timeout=10000)
    qtbot.keyClick(canvas, Qt.Key.Key_C, Qt.KeyboardModifier.ShiftModifier)
    qtbot.waitUntil(
        lambda: layers.objects_name(image) in viewer.layers and viewer.layers[layers.objects_name(image)].data.any(),
        timeout=10000,
    )
    objects = viewer.layers[layers.objects_name(image)]
    before = objects.data.copy()

    def broken_decode(*args, **kwargs):
        raise RuntimeError("the accelerator fell over")

    monkeypatch.setattr(widget.session.engine, "decode", broken_decode)
    click(viewer, world(image, 300, 150))
    qtbot.keyClick(canvas, Qt.Key.Key_C, Qt.KeyboardModifier.ShiftModifier)
    said = widget.form.status.label.text
    qtbot.waitUntil(lambda: "accelerator fell over" in said() or "prompts are kept" in said(), timeout=10000)
    qtbot.wait(300)
    np.testing.assert_array_equal(objects.data, before)
    assert widget.session.next_object_id == 2
    widget.close_session()


def _colour(label) -> str:
    """The colour `label`'s text is drawn in (its style sheet's, once polished)."""
    label.ensurePolished()
    return label.palette().color(label.foregroundRole()).name()


def test_the_status_says_what_to_do_the_engine_label_where_it_runs_and_the_tooltip_the_figures(
    qtbot, viewer, synthetic_repository
):
    """Issue #40: the message says how to segment; latency, moves previewed and the encode's time
    are in its tooltip; the engine has a label of its own from Start on."""
    image = viewer.add_image(disk_image(H, W, DISKS))
    viewer.reset_view()
    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    status = widget.form.status
    assert status.engine_label.isHidden()  # nothing runs yet
    widget.form.backend_box.setCurrentText("Local")
    widget.form.repository_field.setText(str(synthetic_repository))
    widget.connect_engine()
    qtbot.waitUntil(lambda: widget.ready, timeout=30000)
    assert status.engine_label.isVisibleTo(widget)
    assert status.engine_label.text() == f"Engine: {widget.session.engine.describe()}"
    assert "local ONNX Runtime (CPU" in status.engine_label.text()
    with qtbot.waitSignal(widget.preview_shown, timeout=10000):
        move(viewer, world(image, 300, 150))
    text, tooltip = status.label.text(), status.label.toolTip()
    assert text == f"Ready: hover to preview, click to add a point, {KEYS['commit']} to commit."
    assert re.search(r"Plane \(2D\) encoded in \d+\.\d s\.", tooltip)
    assert re.search(r"Last preview in \d+ ms · \d+ of \d+ mouse moves previewed", tooltip)
    assert not status.error_shown and status.label.styleSheet() == ""
    widget.close_session()
    assert status.engine_label.isHidden()


def test_an_error_shows_whole_in_the_theme_s_warning_colour_until_the_server_answers_again(
    qtbot, viewer, synthetic_repository, monkeypatch
):
    """Issue #40: an error longer than the status line once was (160 characters) is shown whole,
    with its fix, in napari's warning colour; when the server stops answering the panel says the
    prompts are kept, and once previews come again the error goes."""
    from napari.utils.theme import get_theme
    from tritonclient.utils import InferenceServerException

    from triton_sam.engines import TritonConnection
    from triton_sam.engines.triton_client import TritonClient

    image = viewer.add_image(disk_image(H, W, DISKS))
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    status, engine = widget.form.status, widget.session.engine
    client = TritonClient(TritonConnection(url="localhost:8001"))  # (no call: its message only)
    refused = "failed to connect to all addresses; ipv4:127.0.0.1:8001: Connection refused"
    error = client.unreachable(InferenceServerException(refused, "StatusCode.UNAVAILABLE"))
    client.close()
    answering = engine.decode

    def not_answering(*args, **kwargs):
        raise error

    monkeypatch.setattr(engine, "decode", not_answering)
    click(viewer, world(image, 80, 80))
    qtbot.waitUntil(lambda: status.error_shown, timeout=10000)
    text, fix = status.label.text(), "Check that it runs (`triton-sam serve`, or the Docker deployment)"
    assert text.startswith("Server not answering: your prompts are kept.") and len(text) > 160 and "…" not in text
    assert text.endswith("and that the URL and port are right.") and fix in text
    assert "StatusCode.UNAVAILABLE" not in text and "StatusCode.UNAVAILABLE" in status.label.toolTip()
    warning = get_theme(viewer.theme).warning.as_hex()
    assert _colour(status.label) == warning != _colour(status.engine_label)
    np.testing.assert_allclose(widget.session.object.points, [(80, 80)], atol=1)  # the click is kept

    monkeypatch.setattr(engine, "decode", answering)  # the server answers again
    move(viewer, world(image, 82, 80))
    qtbot.waitUntil(lambda: not status.error_shown, timeout=10000)
    assert status.label.text().startswith("Ready") and _colour(status.label) != warning
    widget.close_session()


def test_auto_keeps_previewing_on_the_local_engine_when_the_server_dies_mid_hover(qtbot, viewer, synthetic_repository):
    server = start_server(synthetic_repository)
    try:
        image = viewer.add_image(disk_image(H, W, DISKS))
        viewer.reset_view()
        widget = start(qtbot, viewer, backend="Auto", url=server.grpc_url, repository=synthetic_repository)
        assert widget.session.engine.describe().startswith("Triton at")
        preview = viewer.layers[layers.PREVIEW_NAME]
        move(viewer, world(image, 300, 150))
        qtbot.waitUntil(lambda: preview.data[150, 300] == 1, timeout=10000)
        os.kill(server.pid, signal.SIGSTOP)
        move(viewer, world(image, 80, 80))  # this decode goes to the stalled server ...
        qtbot.waitUntil(lambda: widget.session.in_flight == 1, timeout=5000)
        os.killpg(server.pid, signal.SIGKILL)  # ... which dies while it holds it
    finally:
        server.stop()
    qtbot.waitUntil(lambda: preview.data[80, 80] == 1 and not preview.data[150, 300], timeout=30000)
    assert "Triton not used" in widget.session.engine.describe()
    qtbot.waitUntil(lambda: "Triton not used" in widget.form.status.engine_label.text(), timeout=5000)
    widget.close_session()


def test_a_stalled_server_times_out_with_a_clear_status_while_napari_stays_responsive(
    qtbot, viewer, synthetic_repository, monkeypatch
):
    """The server stalls: the click is kept, the status says so, the event loop runs; it answers again:
    the object is previewed and committed. Then it is killed (issue #40: a kept click and the commit key
    said "Nothing to commit"): the commit is refused with the reason, the click and the next id kept."""
    monkeypatch.setenv("TRITON_SAM_TIMEOUT_S", "2")
    server = start_server(synthetic_repository)
    try:
        image = viewer.add_image(disk_image(H, W, DISKS))
        viewer.reset_view()
        widget = start(qtbot, viewer, backend="Triton", url=server.grpc_url)
        preview = viewer.layers[layers.PREVIEW_NAME]
        move(viewer, world(image, 80, 80))
        qtbot.waitUntil(lambda: preview.data[80, 80] == 1, timeout=10000)

        os.kill(server.pid, signal.SIGSTOP)  # the server stalls: connections stay open, nothing answers
        ticks = []
        timer = QTimer()
        timer.timeout.connect(lambda: ticks.append(time.perf_counter()))
        timer.start(20)
        move(viewer, world(image, 300, 150))
        click(viewer, world(image, 300, 150))
        qtbot.waitUntil(lambda: "not answering" in widget.form.status.label.text(), timeout=30000)
        timer.stop()
        assert (
            "StatusCode" not in widget.form.status.label.text() and "StatusCode" in widget.form.status.label.toolTip()
        )  # details on hover
        assert "your prompts are kept" in widget.form.status.label.text()
        assert len(ticks) > 50 and np.diff(ticks).max() < 0.5  # the event loop kept running throughout
        np.testing.assert_allclose(widget.session.object.points, [(300, 150)], atol=1)  # the click is kept

        os.kill(server.pid, signal.SIGCONT)
        move(viewer, world(image, 310, 150))
        qtbot.waitUntil(lambda: preview.data[150, 300] == 1 and not preview.data[80, 80], timeout=30000)
        qtbot.waitUntil(lambda: widget.form.status.label.text().startswith("Ready"), timeout=5000)  # the error went
        assert widget.form.status.engine_label.text().startswith("Engine: Triton at")
        canvas, said = _canvas(viewer).native, widget.form.status.label.text
        qtbot.keyClick(canvas, Qt.Key.Key_C, Qt.KeyboardModifier.ShiftModifier)
        qtbot.waitUntil(lambda: layers.objects_name(image) in viewer.layers, timeout=10000)
        objects = viewer.layers[layers.objects_name(image)]
        qtbot.waitUntil(lambda: objects.data[150, 300] == 1, timeout=10000)

        os.killpg(server.pid, signal.SIGKILL)  # the server dies, with its model processes
        click(viewer, world(image, 80, 80))
        qtbot.waitUntil(lambda: "not answering" in said(), timeout=30000)
        widget.form.set_status("(the commit's answer comes here)")
        qtbot.keyClick(canvas, Qt.Key.Key_C, Qt.KeyboardModifier.ShiftModifier)
        qtbot.waitUntil(lambda: not said().startswith("(the commit's answer"), timeout=30000)
        assert "server answering" in said() and "prompts are kept" in said() and "Nothing to commit" not in said()
        np.testing.assert_allclose(widget.session.object.points, [(80, 80)], atol=1)
        assert widget.session.next_object_id == 2 and not objects.data[80, 80]
        widget.close_session()
    finally:
        if server.is_running():
            os.kill(server.pid, signal.SIGCONT)
        server.stop()


def test_auto_goes_on_locally_when_the_server_is_killed_mid_encode(qtbot, viewer, synthetic_repository):
    server = start_server(synthetic_repository)
    try:
        planes = [disk_image(H, W, DISKS), disk_image(H, W, [(100, 100, 30)]), disk_image(H, W, [(200, 120, 60)])]
        image = viewer.add_image(np.stack(planes))
        viewer.dims.set_current_step(0, 0)
        viewer.reset_view()
        widget = start(qtbot, viewer, backend="Auto", url=server.grpc_url, repository=synthetic_repository)
        assert widget.session.engine.describe().startswith("Triton at")
        qtbot.waitUntil(lambda: len(widget.session.cache) == 2, timeout=10000)  # plane 1 was encoded ahead

        os.kill(server.pid, signal.SIGSTOP)
        viewer.dims.set_current_step(0, 2)  # plane 2 goes to the stalled server ...
        qtbot.wait(500)
        assert "Encoding plane (2,)" in widget.form.status.label.text() and not widget.ready
        os.killpg(server.pid, signal.SIGKILL)  # ... which dies mid-encode, with its model processes
        qtbot.waitUntil(lambda: widget.ready, timeout=30000)
        qtbot.waitUntil(lambda: "Ready" in widget.form.status.label.text(), timeout=5000)
        engine = widget.form.status.engine_label.text()
        assert "Triton not used" in engine and "not answering" in engine
        move(viewer, world(image, 200, 120)[-2:])
        preview = viewer.layers[layers.PREVIEW_NAME]
        qtbot.waitUntil(lambda: preview.data[120, 200] == 1, timeout=10000)
        assert not preview.data[80, 80]  # plane 2's object, not plane 0's
        widget.close_session()
    finally:
        server.stop()


def test_closing_the_panel_mid_decode_stops_its_work_and_lets_go_of_the_viewer(qtbot, viewer, synthetic_repository, monkeypatch):
    image = viewer.add_image(disk_image(H, W, DISKS))
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    _slow_decodes(monkeypatch, widget)  # to close the panel mid-decode
    preview = viewer.layers[layers.PREVIEW_NAME]
    move(viewer, world(image, 300, 150))
    qtbot.waitUntil(lambda: widget.session.in_flight == 1, timeout=5000)
    viewer.window.remove_dock_widget(widget)  # what the panel's close button does
    assert widget.session is None
    qtbot.waitUntil(lambda: not [t for t in threading.enumerate() if t.name.startswith("triton-sam-decode")], timeout=5000)
    qtbot.wait(300)
    assert not preview.data.any()  # the result in flight was dropped
    move(viewer, world(image, 80, 80))
    click(viewer, world(image, 80, 80))
    qtbot.keyClick(_canvas(viewer).native, Qt.Key.Key_C, Qt.KeyboardModifier.ShiftModifier)
    qtbot.wait(300)
    assert not preview.data.any() and layers.objects_name(image) not in viewer.layers

    again = start(qtbot, viewer, repository=synthetic_repository)  # a new panel takes over the keys
    click(viewer, world(image, 80, 80))
    qtbot.waitUntil(lambda: again.session.object.decoded_version == 1, timeout=10000)
    qtbot.keyClick(_canvas(viewer).native, Qt.Key.Key_C, Qt.KeyboardModifier.ShiftModifier)
    qtbot.waitUntil(lambda: layers.objects_name(image) in viewer.layers, timeout=10000)
    assert viewer.layers[layers.objects_name(image)].data[80, 80] == 1
    again.close_session()


def _used_engine(qtbot, viewer, synthetic_repository):
    """A panel on a 3-plane stack that encoded, prefetched, hovered and committed: (widget, a weak
    reference to its engine). napari keeps every worker (its function and arguments) as long as
    its window: a closed panel's engine, gigabytes of ONNX Runtime sessions, lived on."""
    image = viewer.add_image(np.stack([disk_image(H, W, DISKS)] * 3))
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    engine = weakref.ref(widget.session.engine)
    viewer.dims.set_current_step(0, 1)  # another plane: its encode and its neighbours' prefetch
    qtbot.waitUntil(lambda: widget.ready and widget.encoding.index == (1,), timeout=10000)
    move(viewer, world(image, 80, 80)[-2:])
    key(viewer, "commit")  # at once: the object moved onto
    qtbot.waitUntil(lambda: layers.objects_name(image) in viewer.layers, timeout=10000)
    qtbot.wait(500)  # the prefetch of the neighbours ends
    return widget, engine


def _gone(qtbot, reference: weakref.ref) -> None:
    qtbot.waitUntil(lambda: gc.collect() is not None and reference() is None, timeout=10000)


def test_closing_the_panel_lets_go_of_its_engine(qtbot, viewer, synthetic_repository):
    widget, engine = _used_engine(qtbot, viewer, synthetic_repository)
    viewer.window.remove_dock_widget(widget)  # what the panel's close button does
    _gone(qtbot, engine)


def test_closing_the_viewer_stops_the_session_and_lets_go_of_the_engine(qtbot, viewer, synthetic_repository):
    before = _decode_threads()
    widget, engine = _used_engine(qtbot, viewer, synthetic_repository)
    assert len(_decode_threads()) > len(before)
    viewer.close()  # napari deletes its docked widgets without closing them
    qtbot.waitUntil(lambda: _decode_threads() == before, timeout=5000)
    _gone(qtbot, engine)


def _as(dtype, data: np.ndarray) -> np.ndarray:
    """The disks image in another dtype/range, bright where the disks are."""
    if dtype == "bool":
        return data > 0
    if dtype == "uint16-full":
        return (data.astype(np.uint32) * 257).astype(np.uint16)  # 0-65535
    return data.astype(dtype)


@pytest.mark.parametrize(
    "dtype, leading, rgba",
    [
        ("bool", (), False),
        ("int32", (), False),
        ("uint16-full", (), False),
        ("float64", (), False),
        ("uint8", (2, 3), False),
        ("uint16-full", (2, 1, 2), False),
        ("uint8", (), True),
    ],
    ids=["bool", "int32", "uint16-0-65535", "float64", "4D", "5D", "RGBA"],
)
def test_odd_images_get_a_preview_of_the_right_object(qtbot, viewer, synthetic_repository, dtype, leading, rgba):
    plane = _as(dtype, disk_image(H, W, DISKS))
    if rgba:
        plane = np.dstack([plane, plane, plane, np.full((H, W), 255, np.uint8)])
    data = np.broadcast_to(plane, (*leading, *plane.shape)).copy()
    image = viewer.add_image(data, rgb=rgba)
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    move(viewer, np.asarray(image.data_to_world([*([0] * len(leading)), 150, 300]))[-2:])
    preview = viewer.layers[layers.PREVIEW_NAME]
    qtbot.waitUntil(lambda: preview.data[150, 300] == 1, timeout=10000)
    assert not preview.data[80, 80]  # the other disk is another object
    widget.close_session()


def test_an_image_with_nan_says_so_and_nothing_is_encoded(qtbot, viewer, synthetic_repository):
    data = disk_image(H, W, DISKS).astype(np.float32)
    data[0, 0] = np.nan
    viewer.add_image(data)
    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    widget.form.repository_field.setText(str(synthetic_repository))
    widget.form.backend_box.setCurrentText("Local")
    widget.connect_engine()
    qtbot.waitUntil(lambda: "NaN" in widget.form.status.label.text(), timeout=20000)
    assert not widget.ready and len(widget.session.cache) == 0
    widget.close_session()


def test_in_3d_view_the_panel_says_that_sam_works_in_2d_and_the_keys_rest(qtbot, viewer, synthetic_repository):
    image = viewer.add_image(disk_image(H, W, DISKS))
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    qtbot.waitUntil(lambda: "encoded in" in widget.form.status.label.toolTip(), timeout=10000)  # the plane's news has come
    viewer.dims.ndisplay = 3
    assert widget.form.status.label.text().startswith("3D view") and not widget.interaction.interactive()
    widget.encoding.plane_ready(widget.encoding.index, 0.4)  # news of an encode that ends after the switch (as once in CI)
    assert widget.form.status.label.text().startswith("3D view")
    qtbot.keyClick(_canvas(viewer).native, Qt.Key.Key_C, Qt.KeyboardModifier.ShiftModifier)
    qtbot.wait(200)
    assert widget.form.status.label.text().startswith("3D view") and layers.objects_name(image) not in viewer.layers
    viewer.dims.ndisplay = 2
    assert widget.form.status.label.text().startswith("Ready") and widget.interaction.interactive()
    widget.close_session()


def test_plugin_layers_sit_above_the_image_started_on_and_each_image_has_its_own_objects(qtbot, viewer, synthetic_repository):
    first = viewer.add_image(disk_image(H, W, DISKS), name="first")
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    click(viewer, world(first, 80, 80))
    qtbot.waitUntil(lambda: widget.session.object.decoded_version == 1, timeout=10000)
    qtbot.keyClick(_canvas(viewer).native, Qt.Key.Key_C, Qt.KeyboardModifier.ShiftModifier)
    qtbot.waitUntil(lambda: layers.objects_name(first) in viewer.layers, timeout=10000)
    second = viewer.add_image(disk_image(H, W, DISKS[::-1]), name="second")  # added later, same shape
    widget.form.image_box.setCurrentText("second")
    widget.connect_engine()
    qtbot.waitUntil(lambda: widget.ready and widget.image.name == "second", timeout=30000)
    click(viewer, world(second, 300, 150))
    qtbot.waitUntil(lambda: widget.session.object.decoded_version == 1, timeout=10000)
    qtbot.keyClick(_canvas(viewer).native, Qt.Key.Key_C, Qt.KeyboardModifier.ShiftModifier)
    qtbot.waitUntil(lambda: layers.objects_name(second) in viewer.layers, timeout=10000)
    names = [layer.name for layer in viewer.layers]
    assert names == [
        "first",
        "first [triton-sam objects]",
        "second",
        "second [triton-sam objects]",
        layers.PREVIEW_NAME,
        layers.PROMPTS_NAME,
        layers.BOX_NAME,  # above the points (test_helper_layers.py)
    ]
    assert (
        viewer.layers["second [triton-sam objects]"].data[150, 300]
        and not viewer.layers["first [triton-sam objects]"].data[150, 300]
    )
    widget.close_session()


def test_another_image_or_model_chosen_without_start_refuses_prompts_and_says_so(qtbot, viewer, tmp_path):
    """Choosing another image or model in the panel without Start: a click or Shift-C never acts
    on the session's image (it went to the old image, hidden under the new one); choosing the
    session's own again, or Start, brings mouse and keys back."""
    coins = viewer.add_image(disk_image(H, W, DISKS), name="coins")
    viewer.reset_view()
    two = write_repository(get_model("sam2.1_hiera_small"), write_repository(get_model("sam2.1_hiera_tiny"), tmp_path))
    widget = start(qtbot, viewer, repository=two)
    widget.form.find_models_button.click()  # the model box: both models
    model = widget.form.model_box.currentText()
    cell = viewer.add_image(disk_image(H, W, DISKS[::-1]), name="cell")
    for box, other in ((widget.form.image_box, "cell"), (widget.form.model_box, "sam2.1_hiera_small")):
        shown = box.currentText()
        box.setCurrentText(other)
        click(viewer, world(cell, 300, 150))
        key(viewer, "commit")
        qtbot.wait(300)  # a commit runs on a worker
        assert widget.session.object.labels == [] and layers.objects_name(coins) not in viewer.layers
        assert "press Start" in widget.form.status.label.text() and other in widget.form.status.label.text()
        box.setCurrentText(shown)
    assert widget.form.model_box.currentText() == model
    click(viewer, world(coins, 80, 80))
    qtbot.waitUntil(lambda: widget.session.object.decoded_version == 1, timeout=10000)
    key(viewer, "commit")
    qtbot.waitUntil(lambda: layers.objects_name(coins) in viewer.layers, timeout=10000)
    assert viewer.layers[layers.objects_name(coins)].data[80, 80] == 1
    widget.close_session()


def test_a_commit_on_an_object_labelled_already_is_refused_and_changes_nothing(qtbot, viewer, synthetic_repository):
    """It said "Object 2: 0 pixels" and used up an id; now it says why and keeps the prompts and the id."""
    image = viewer.add_image(disk_image(H, W, DISKS))
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    for version in (1, 2):
        click(viewer, world(image, 80, 80))
        qtbot.waitUntil(lambda v=version: widget.session.object.decoded_version >= 1, timeout=10000)
        key(viewer, "commit")
        if version == 1:
            qtbot.waitUntil(lambda: layers.objects_name(image) in viewer.layers, timeout=10000)
    qtbot.waitUntil(lambda: "labelled already" in widget.form.status.label.text(), timeout=10000)
    objects = viewer.layers[layers.objects_name(image)]
    assert widget.session.next_object_id == 2 and set(np.unique(objects.data)) == {0, 1}
    assert widget.session.object.labels == [1]  # the prompts stay
    widget.close_session()


def _drawn_points(viewer) -> list[tuple[int, int, bool]]:
    """(x, y, positive) of the points the prompts layer draws."""
    points = viewer.layers[layers.PROMPTS_NAME]
    positive = np.asarray(napari.utils.colormaps.standardize_color.transform_color(layers.POSITIVE_COLOR)[0])
    return [
        (round(x), round(y), bool(np.allclose(colour, positive)))
        for (y, x), colour in zip(points.data, points.face_color, strict=True)
    ]


def _drawn_box(viewer) -> tuple[int, ...] | None:
    """(x0, y0, x1, y1) of the rectangle the box layer draws."""
    box = viewer.layers[layers.BOX_NAME]
    if not box.data:
        return None
    (y0, x0), (y1, x1) = box.data[0].min(axis=0), box.data[0].max(axis=0)
    return round(x0), round(y0), round(x1), round(y1)


def test_prompts_are_drawn_where_they_were_given_and_go_with_undo_commit_and_discard(qtbot, viewer, synthetic_repository):
    image = viewer.add_image(disk_image(H, W, DISKS), scale=(0.5, 2.0))
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=synthetic_repository)
    click(viewer, world(image, 80, 80))
    click(viewer, world(image, 300, 150), Qt.KeyboardModifier.AltModifier)
    qtbot.waitUntil(lambda: len(_drawn_points(viewer)) == 2, timeout=5000)
    drawn = _drawn_points(viewer)
    assert all(abs(x - ex) <= 1 and abs(y - ey) <= 1 for (x, y, _), (ex, ey) in zip(drawn, [(80, 80), (300, 150)]))
    assert [positive for *_, positive in drawn] == [True, False]

    during = []
    drag_box(viewer, image, (250, 100), (350, 200), before_release=lambda: during.append(_drawn_box(viewer)))
    assert during[0] is not None  # the box is drawn while it is dragged
    qtbot.waitUntil(lambda: widget.session.object.box is not None, timeout=5000)
    assert np.allclose(_drawn_box(viewer), widget.session.object.box, atol=1)
    assert np.allclose(_drawn_box(viewer), (250, 100, 350, 200), atol=3)

    key(viewer, "undo")  # the box was the last prompt
    assert _drawn_box(viewer) is None and len(_drawn_points(viewer)) == 2
    key(viewer, "undo")
    assert [p[2] for p in _drawn_points(viewer)] == [True]
    obj = widget.session.object
    qtbot.waitUntil(lambda: obj.decoded_version == obj.version, timeout=10000)
    key(viewer, "commit")
    qtbot.waitUntil(lambda: layers.objects_name(image) in viewer.layers, timeout=10000)
    assert _drawn_points(viewer) == [] and _drawn_box(viewer) is None

    click(viewer, world(image, 300, 150))
    drag_box(viewer, image, (250, 100), (350, 200))
    qtbot.waitUntil(lambda: _drawn_box(viewer) is not None and len(_drawn_points(viewer)) == 1, timeout=5000)
    key(viewer, "discard")
    assert _drawn_points(viewer) == [] and _drawn_box(viewer) is None and widget.session.object.empty
    widget.close_session()


def _started_on_disks(qtbot, viewer, repository):
    """The panel started on the two disks, fitted to the canvas: the image, the panel, the preview layer."""
    image = viewer.add_image(disk_image(H, W, DISKS))
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=repository)
    return image, widget, viewer.layers[layers.PREVIEW_NAME]


def test_the_commit_key_stores_what_the_preview_shows_as_the_object_not_the_hint(qtbot, viewer, synthetic_repository):
    image, widget, preview = _started_on_disks(qtbot, viewer, synthetic_repository)
    click(viewer, world(image, 80, 80))
    qtbot.waitUntil(lambda: preview.data[80, 80] == 1, timeout=10000)
    move(viewer, world(image, 300, 150))  # over the other disk: shown apart, as what a click would add
    qtbot.waitUntil(lambda: preview.data[150, 300] == 2 and preview.data[80, 80] == 1, timeout=10000)
    assert preview.colormap.map(previews.HINT)[3] == 0 and preview.colormap.map(previews.DASH)[3] == 1  # dashed outline
    shown = _object(preview)
    key(viewer, "commit")
    qtbot.waitUntil(lambda: layers.objects_name(image) in viewer.layers, timeout=10000)
    objects = viewer.layers[layers.objects_name(image)]
    qtbot.waitUntil(lambda: objects.data.any(), timeout=10000)
    np.testing.assert_array_equal(objects.data == 1, shown)  # what was outlined in green, nothing else
    assert not objects.data[150, 300]
    widget.close_session()


def _band(mask: np.ndarray, width: int) -> np.ndarray:
    """The pixels of `mask` within `width` (8-connected steps) of its edge."""
    return mask & ~ndimage.binary_erosion(mask, np.ones((3, 3), bool), iterations=width, border_value=0)


def _click_and_commit(qtbot, viewer, widget, image, x: int, y: int):
    """Click image pixel (x, y), commit the object once decoded (the first); its objects layer."""
    click(viewer, world(image, x, y))
    qtbot.waitUntil(lambda: widget.session.object.decoded_version == widget.session.object.version, timeout=10000)
    key(viewer, "commit")
    qtbot.waitUntil(lambda: layers.objects_name(image) in viewer.layers, timeout=10000)
    objects = viewer.layers[layers.objects_name(image)]
    qtbot.waitUntil(lambda: objects.data[y, x] == 1, timeout=10000)
    return objects


def test_the_preview_and_its_hint_are_outlines_that_no_label_colour_can_be_mistaken_for(qtbot, viewer, synthetic_repository):
    """napari colours labels at random over the hue circle, near-black to near-white: no fill colour
    can stand apart from all of them. Labels are filled; the preview is lines over a see-through
    inside: the object a solid line in a colour far from the first 50 labels' (0.45 in RGB: 0.51
    is the most any colour is, the old yellow fill was 0.16 from one), the hint a dashed one."""
    image, widget, preview = _started_on_disks(qtbot, viewer, synthetic_repository)
    objects = _click_and_commit(qtbot, viewer, widget, image, 80, 80)
    click(viewer, world(image, 300, 150))
    move(viewer, world(image, 80, 80))  # over the committed disk: the hint, what a click there would add
    qtbot.waitUntil(lambda: preview.data[150, 300] == previews.OBJECT and preview.data[80, 80] == previews.HINT, timeout=10000)

    labels = np.array([objects.get_color(i) for i in range(1, 51)])
    assert objects.contour == 0 and (labels[:, 3] > 0).all()  # labels: filled, each in its colour
    colours = preview.colormap.map(preview.data)  # what the preview layer draws, pixel by pixel
    opaque, obj, hint = colours[..., 3] > 0, _object(preview), _hint(preview)
    line, _ = previews.line_widths(bindings.camera(viewer).zoom, preview)
    assert np.array_equal(opaque & obj, _band(obj, line)) and not opaque[150, 300]  # a line along its edge, inside clear
    outline = preview.colormap.map(previews.OUTLINE)[:3]
    assert np.linalg.norm(labels[:, :3] - outline, axis=1).min() >= 0.45
    edge = _band(obj | hint, line) & hint  # where the object would end after a click at the cursor
    assert np.array_equal(opaque & hint, edge) and edge.any() and not opaque[80, 80]
    dashes = {tuple(map(float, c)): int(n) for c, n in zip(*np.unique(colours[edge], axis=0, return_counts=True))}
    assert set(dashes) == {(1, 1, 1, 1), (0, 0, 0, 1)} and min(dashes.values()) > 0.3 * edge.sum()  # white, black in turn

    bindings.camera(viewer).zoom *= 8  # zoomed in: lines as wide on screen (at least a layer pixel)
    thinner, _ = previews.line_widths(bindings.camera(viewer).zoom, preview)
    assert thinner < line or thinner == 1
    qtbot.waitUntil(lambda: np.array_equal((preview.data != previews.OBJECT) & obj, _band(obj, thinner)), timeout=5000)
    widget.close_session()


def test_shift_n_shows_the_next_candidate_by_score_and_says_which(qtbot, viewer, synthetic_repository):
    image, widget, preview = _started_on_disks(qtbot, viewer, synthetic_repository)
    key(viewer, "cycle")
    assert "No candidates to cycle: click on an object first" in widget.form.status.label.text()
    click(viewer, world(image, 80, 80))
    obj = widget.session.object
    qtbot.waitUntil(lambda: obj.decoded_version == obj.version, timeout=10000)
    with Predictor(model_repository=synthetic_repository) as predictor:
        predictor.set_image(image.data)
        masks, scores, _ = predictor.predict(point_coords=[list(obj.points[0])], point_labels=[1])
    ranked = [int(i) for i in np.argsort(-scores, kind="stable")]
    assert len({m.tobytes() for m in masks}) == 3  # three masks to tell apart
    qtbot.waitUntil(lambda: np.array_equal(_object(preview), masks[ranked[0]]), timeout=10000)
    for place in (2, 3, 1, 2):  # after the last, the first again
        key(viewer, "cycle")
        said = widget.form.status.label.text()
        assert f"candidate {place} of 3 by predicted IoU ({scores[ranked[place - 1]]:.2f})" in said, said
        qtbot.waitUntil(lambda: np.array_equal(_object(preview), masks[ranked[place - 1]]), timeout=5000)  # noqa: B023
        move(viewer, world(image, 300 + place, 150))  # hover previews on their way show the candidate chosen too
        qtbot.waitUntil(lambda: preview.data[150, 300] in previews.HINT_LABELS, timeout=5000)
        assert np.array_equal(_object(preview), masks[ranked[place - 1]])
        move(viewer, world(image, 80, 80))
    key(viewer, "commit")
    qtbot.waitUntil(lambda: layers.objects_name(image) in viewer.layers, timeout=10000)
    objects = viewer.layers[layers.objects_name(image)]
    qtbot.waitUntil(lambda: objects.data.any(), timeout=10000)
    np.testing.assert_array_equal(objects.data == 1, masks[ranked[1]])  # the candidate shown is the one stored
    assert objects.metadata[layers.PROVENANCE_KEY][1]["candidate"] == ranked[1]

    click(viewer, world(image, 300, 150))  # the next object: its candidates, until a click changes it
    new = widget.session.object
    qtbot.waitUntil(lambda: new.points and new.decoded_version == new.version, timeout=10000)
    key(viewer, "cycle")
    assert "Showing candidate 2 of" in widget.form.status.label.text()
    click(viewer, world(image, 310, 160))
    assert widget.form.status.label.text() == f"Ready: hover to preview, click to add a point, {KEYS['commit']} to commit."
    widget.close_session()


BIG_H, BIG_W = 2600, 6000  # tiled: 4 x 8 tiles of 1024 px
BIG_DISKS = [(300, 300, 60), (1400, 896, 70), (5700, 2400, 40)]


def test_prompts_no_tile_of_a_large_plane_holds_are_refused_in_the_panel_and_change_nothing(qtbot, viewer, synthetic_repository):
    """Two points too far apart for one tile: InvalidInputError escaped napari's mouse callback
    (napari's traceback pop-up; without napari's hook Qt aborts). Called as the mouse binding calls it."""
    viewer.add_image(disk_image(BIG_H, BIG_W, BIG_DISKS))
    camera = bindings.camera(viewer)
    camera.center, camera.zoom = (300, 300), 1.0
    widget = start(qtbot, viewer, repository=synthetic_repository)
    widget.interaction.add_point(300, 300, positive=True)
    qtbot.waitUntil(lambda: widget.session.object.decoded_version == 1, timeout=30000)
    widget.interaction.add_point(5700, 2400, positive=True)  # raised here
    assert "no 1024x1024 tile holds them all" in widget.form.status.label.text()
    assert widget.session.object.labels == [1] and widget.session.object.points == [(300.0, 300.0)]
    assert _drawn_points(viewer) == [(300, 300, True)]
    widget.close_session()


def _object(preview) -> np.ndarray:
    """Where the preview layer shows the object (its inside and its outline)."""
    return np.isin(preview.data, previews.OBJECT_LABELS)


def _hint(preview) -> np.ndarray:
    """Where the preview layer shows the hint (what a click at the cursor adds)."""
    return np.isin(preview.data, previews.HINT_LABELS)


def _shown(preview, image, x: int, y: int) -> int:
    """The preview layer's label at image pixel (x, y) (a large plane's preview covers only a box of it)."""
    row, col = np.round(preview.world_to_data(image.data_to_world([y, x]))).astype(int)
    inside = 0 <= row < preview.data.shape[0] and 0 <= col < preview.data.shape[1]
    return int(preview.data[row, col]) if inside else 0


def _disk_pixels(r: int) -> int:
    yy, xx = np.mgrid[-r : r + 1, -r : r + 1]
    return int((xx**2 + yy**2 <= r**2).sum())


def _pyramid_level(data: np.ndarray, stored: str):
    """`data` as a lazily read pyramid level: a dask array, or a zarr array whose chunk reads are counted."""
    if stored == "dask":
        return pytest.importorskip("dask.array").from_array(data, chunks=512)
    zarr = pytest.importorskip("zarr")
    store = zarr.storage.LoggingStore(zarr.storage.MemoryStore(), log_level="DEBUG")
    array = zarr.create_array(store=store, shape=data.shape, chunks=(512, 512), dtype=data.dtype)
    array[:] = data
    store.counter.clear()
    return array


@pytest.mark.parametrize("stored", ["dask", "zarr"])
def test_a_large_multiscale_plane_is_encoded_where_the_view_is_and_segmented_at_native_resolution(
    qtbot, viewer, synthetic_repository, stored
):
    """A multiscale layer (dask, or zarr arrays as napari takes them) is read where it is used: the
    view's tiles, not the whole plane."""
    from triton_sam.tiles import Tile, view_order

    full = disk_image(BIG_H, BIG_W, BIG_DISKS).astype(np.uint16) * 250
    image = viewer.add_image([_pyramid_level(full, stored), _pyramid_level(full[::4, ::4], stored)], multiscale=True)
    camera = bindings.camera(viewer)
    camera.center, camera.zoom = (896, 1400), 1.0  # a view of a few tiles around the second disk
    widget = start(qtbot, viewer, repository=synthetic_repository)
    session = widget.session
    qtbot.waitUntil(lambda: "Tiles in view ready" in widget.form.status.label.text(), timeout=60000)
    view = Tile(*layers.visible_region(image))
    assert view.y0 > 0 and view.x0 > 0 and view.y1 < BIG_H and view.x1 < BIG_W  # zoomed in: a part of the plane
    inside, near = view_order(session.tiles, view, around=512)
    assert all(session.encoded(t) for t in inside)  # the tiles in view, encoded first
    assert all(t in inside + near for t in session.tiles if session.encoded(t))  # and nothing far from it
    if stored == "zarr":  # of level 0's 72 chunks, those napari draws and those under the tiles encoded
        chunks_read = image.data[0].store.counter["get"]
        assert 0 < chunks_read < 72, chunks_read

    preview = viewer.layers[layers.PREVIEW_NAME]
    move(viewer, world(image, 1400, 896))
    qtbot.waitUntil(lambda: _shown(preview, image, 1400, 896) == 1, timeout=10000)
    assert preview.data.shape == (previews.PREVIEW_WINDOW,) * 2  # a window of the plane, not the plane
    assert not _shown(preview, image, 300, 300) and abs(int(_object(preview).sum()) - _disk_pixels(70)) < 0.05 * _disk_pixels(70)
    objects = _click_and_commit(qtbot, viewer, widget, image, 1400, 896)
    assert objects.data.shape == (BIG_H, BIG_W) and abs(int(objects.data.sum()) - _disk_pixels(70)) < 0.05 * _disk_pixels(70)
    assert objects.metadata[layers.PROVENANCE_KEY][1]["tile"] == [768, 768, 1792, 1792]

    far = next(t for t in session.tiles if t.x0 <= 5700 < t.x1 and t.y0 <= 2400 < t.y1 and t.x1 == BIG_W and t.y1 == BIG_H)
    assert not session.encoded(far), (view, [t for t in session.tiles if session.encoded(t)])
    camera.center = (2400, 5700)  # pan to the far corner: its tiles are encoded once the view rests
    qtbot.waitUntil(lambda: session.encoded(far), timeout=60000)
    move(viewer, world(image, 5700, 2400))
    qtbot.waitUntil(lambda: _shown(preview, image, 5700, 2400) == 1, timeout=10000)
    assert not _shown(preview, image, 1400, 896)
    widget.close_session()


def test_zoomed_out_a_large_plane_is_tiled_from_its_pyramid_level_and_large_objects_commit_at_full_resolution(
    qtbot, viewer, synthetic_repository
):
    """An object wider than a native tile (1100 px): zoomed out, the panel tiles the plane from the
    pyramid level that matches the screen, previews it at that level and commits it at full resolution."""
    da = pytest.importorskip("dask.array")
    large = (2500, 1300, 550)
    full = disk_image(BIG_H, BIG_W, [*BIG_DISKS, large]).astype(np.uint16) * 250
    pyramid = [da.from_array(full[::f, ::f], chunks=512) for f in (1, 2, 4)]
    image = viewer.add_image(pyramid, multiscale=True)
    camera = bindings.camera(viewer)
    camera.center, camera.zoom = (1300, 2500), 0.4  # 2.5 plane pixels a screen pixel: the level reduced twice
    widget = start(qtbot, viewer, repository=synthetic_repository)
    session = widget.session
    qtbot.waitUntil(lambda: "Tiles in view ready" in widget.form.status.label.text(), timeout=60000)
    assert session.tile_step == 2 and all(t.step == 2 for t in session.tiles)

    preview = viewer.layers[layers.PREVIEW_NAME]
    move(viewer, world(image, 2500, 1300))
    qtbot.waitUntil(lambda: _shown(preview, image, 2500, 1300) == 1, timeout=10000)
    np.testing.assert_allclose(preview.scale, np.asarray(image.scale) * 2)  # a preview pixel: 2 plane pixels
    shown = int(_object(preview).sum())
    assert abs(shown * 4 - _disk_pixels(550)) < 0.05 * _disk_pixels(550)  # whole, not cut by a tile
    key(viewer, "commit")
    qtbot.waitUntil(lambda: layers.objects_name(image) in viewer.layers, timeout=10000)
    objects = viewer.layers[layers.objects_name(image)]
    qtbot.waitUntil(lambda: objects.data[1300, 2500] == 1, timeout=10000)
    assert abs(int((objects.data == 1).sum()) - _disk_pixels(550)) < 0.02 * _disk_pixels(550)  # full resolution
    made = objects.metadata[layers.PROVENANCE_KEY][1]
    assert made["tile_step"] == 2 and made["tile"][3] - made["tile"][1] == 2048

    camera.center, camera.zoom = (896, 1400), 1.0  # zoomed in again: native tiles, full-resolution previews
    qtbot.waitUntil(lambda: session.tile_step == 1 and "Tiles in view ready" in widget.form.status.label.text(), timeout=60000)
    move(viewer, world(image, 1400, 896))
    qtbot.waitUntil(lambda: _shown(preview, image, 1400, 896) == 1, timeout=10000)
    np.testing.assert_allclose(preview.scale, image.scale)
    assert abs(int(_object(preview).sum()) - _disk_pixels(70)) < 0.05 * _disk_pixels(70)
    widget.close_session()


def test_on_a_stack_of_large_planes_neighbours_and_encode_all_planes_encode_the_view_of_other_planes(
    qtbot, viewer, synthetic_repository
):
    from triton_sam.tiles import Tile, view_order

    stack = np.stack([disk_image(BIG_H, BIG_W, [(1400 + 40 * i, 896, 70)]) for i in range(3)])
    image = viewer.add_image(stack)
    viewer.dims.set_current_step(0, 0)
    camera = bindings.camera(viewer)
    camera.center, camera.zoom = (896, 1400), 1.0
    widget = start(qtbot, viewer, repository=synthetic_repository)
    session = widget.session
    qtbot.waitUntil(lambda: "Tiles in view ready" in widget.form.status.label.text(), timeout=60000)
    inside, _ = view_order(session.tiles, Tile(*layers.visible_region(image)), around=0)
    contrast = layers.encoding_contrast(image)

    def cached(plane: int) -> bool:
        inputs = [encoder_input(stack[plane][t.window], session.spec, contrast) for t in inside]
        return all(session.cache.signature(x) in session.cache for x in inputs)

    qtbot.waitUntil(lambda: cached(1), timeout=60000)  # the neighbour's view, once the cursor rested
    assert not cached(2)
    widget.form.encode_all_button.click()
    qtbot.waitUntil(lambda: widget.form.encode_all_button.text() == "Encode all planes", timeout=60000)
    assert cached(2) and "Encoded 3 of 3 planes" in widget.form.status.label.text()

    hits, misses = session.cache.hits, session.cache.misses
    viewer.dims.set_current_step(0, 2)
    qtbot.waitUntil(lambda: widget.ready and all(session.encoded(t) for t in inside), timeout=30000)
    assert session.cache.hits - hits >= len(inside)  # found in the cache, not encoded again
    move(viewer, world(image, 1480, 896))
    preview = viewer.layers[layers.PREVIEW_NAME]
    qtbot.waitUntil(lambda: _shown(preview, image, 1480, 896) == 1, timeout=10000)
    assert session.cache.misses - misses <= 9  # at most the tiles around the view (not asked for by Encode all)
    widget.close_session()
