"""Segment all with a micro-sam model's instance-segmentation decoder ("Decoder (AIS)") in a real
napari viewer, clicked with real Qt events, on vit_t_lm with random weights (`triton-sam export
vit_t_lm --random-init`, its decoder included: micro-sam's cheapest model with one; vit_b_lm cost
CI ~2.5 min more for the same panel code): the layer holds what `InstanceSegmenter` gives for the same
plane and settings, on the plane on screen and on every plane of a stack, from the planes the
panel encoded (none encoded twice); a stopped run writes nothing on one plane and keeps the planes
done on a stack; an engine without the decoder says so and changes nothing. Through a real Triton
server, the server's session model computes the maps next to the features it keeps. (SAM2.1's
panel shows no decoder mode: tests/plugin/test_segment_all.py.) On a large plane, the synthetic
vit_t_lm (`synthetic.write_instance_decoder`: maps in a blink) segments the tiles in view.

Random weights give nearly flat maps (values 0.3 to 0.77, medians near 0.54, 0.52 and 0.52 for the
center distances, boundary distances and foreground of these blob planes): thresholds at about
those medians (`MANY_OBJECTS`, as tests/instance/test_instance_parity.py takes its thresholds from
the maps' medians) cut each plane into dozens of objects (33 on each).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from scipy import ndimage

napari = pytest.importorskip("napari")
from process_scenarios import open_section  # noqa: E402
from qtpy.QtCore import QSettings, Qt  # noqa: E402
from test_widget import start, world  # noqa: E402

from conftest import start_server  # noqa: E402
from synthetic import disk_image, write_instance_decoder, write_repository  # noqa: E402
from triton_sam.engines import Engine  # noqa: E402
from triton_sam.instance import InstanceSegmenter  # noqa: E402
from triton_sam.plugin import bindings, layers  # noqa: E402
from triton_sam.plugin.automatic import AUTOMATIC_KEY  # noqa: E402
from triton_sam.plugin.form import SettingsForm  # noqa: E402
from triton_sam.plugin.segment_all_modes import DECODER, POINT_GRID  # noqa: E402
from triton_sam.predictor import Predictor  # noqa: E402
from triton_sam.registry import get_model  # noqa: E402

MODEL = "vit_t_lm"
H, W = 96, 128
MANY_OBJECTS = {
    "center_distance_threshold": 0.54,
    "boundary_distance_threshold": 0.52,
    "foreground_threshold": 0.52,
    "min_size": 5,
}


def blobs(seed: int) -> np.ndarray:
    """A uint8 plane of blurred blobs."""
    smooth = ndimage.gaussian_filter(np.random.default_rng(seed).random((H, W)), 4)
    return (255 * (smooth - smooth.min()) / np.ptp(smooth)).astype(np.uint8)


def _automatic_layers(viewer) -> list:
    return [layer for layer in viewer.layers if AUTOMATIC_KEY in layer.metadata]


def start_micro_sam(qtbot, viewer, model: str, backend: str, monkeypatch, **fields):
    """The panel started on `model` (`fields`: its repository or server), its features kept in
    memory only (hermetic: none read from an earlier run's disk cache), Segment all unfolded."""
    monkeypatch.setenv("TRITON_SAM_MODEL", model)
    QSettings("triton-sam", "triton-sam").setValue("disk_cache", "false")
    widget = start(qtbot, viewer, backend, ready_ms=120000, **fields)  # a first encode: seconds, more beside a CI run
    assert widget.session.spec.model_id == model
    open_section(widget, "segment_all")
    return widget


def choose_many_objects(widget) -> None:
    """Type `MANY_OBJECTS` into the decoder's fields."""
    for name, value in MANY_OBJECTS.items():
        widget.form.segment_all_modes.decoder_spins[name].setValue(value)


def segment_all(qtbot, widget) -> None:
    """Click Segment all and wait for the run's end."""
    qtbot.mouseClick(widget.form.segment_all_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: widget.form.segment_all_button.text() == "Segment all", timeout=120000)


def instance_segmenter_labels(widget, image, index: int) -> np.ndarray:
    """What `InstanceSegmenter` gives for plane `index` with `MANY_OBJECTS`, on the panel's engine and cache."""
    segmenter = InstanceSegmenter(Predictor(MODEL, engine=widget.session.engine), widget.session.cache)
    segmenter.initialize(image.data[index], layers.encoding_contrast(image))
    return segmenter.generate(**MANY_OBJECTS)


def slow_maps(engine, seconds: float, monkeypatch) -> None:
    """Make the decoder's maps take `seconds` longer (time to stop a run mid-plane)."""
    maps = engine.instance_maps

    def slow(features, image_hw):
        time.sleep(seconds)
        return maps(features, image_hw)

    monkeypatch.setattr(engine, "instance_maps", slow)


def test_decoder_mode_segments_the_plane_shown_and_every_plane_as_instance_segmenter_does(
    qtbot, viewer, vit_t_lm_export, monkeypatch
):
    """One session throughout: the encodes and decoder maps (seconds a plane on 2 cores) are the
    cost, so each plane is encoded once and the planes are few."""
    stack = np.stack([blobs(seed) for seed in range(2)])
    image = viewer.add_image(stack, scale=(3.0, 0.5, 2.0))
    viewer.dims.set_current_step(0, 1)
    viewer.reset_view()
    widget = start_micro_sam(qtbot, viewer, MODEL, "Local", monkeypatch, repository=vit_t_lm_export)
    modes, form = widget.form.segment_all_modes, widget.form
    assert modes.mode_box.isVisibleTo(widget) and modes.decoder_fields.isVisibleTo(widget)
    assert [modes.mode_box.itemText(i) for i in range(modes.mode_box.count())] == ["Decoder (AIS)", "Point grid"]
    assert form.segment_all_mode() == DECODER and not form.points_per_side_spin.isVisibleTo(widget)  # the default
    assert form.decoder_settings().min_size == 100  # micro-sam's annotator's default
    choose_many_objects(widget)
    form.all_planes_check.setChecked(False)  # the plane on screen
    segment_all(qtbot, widget)

    (found,) = _automatic_layers(viewer)
    expected = instance_segmenter_labels(widget, image, 1)
    assert expected.max() > 20  # many objects
    assert found.data.shape == (1, H, W) and np.array_equal(found.data[0], expected)
    assert found.data_to_world((0, 0, 0)) == pytest.approx(image.data_to_world((1, 0, 0)))
    assert found.metadata[AUTOMATIC_KEY]["method"] == "decoder" and found.metadata[AUTOMATIC_KEY]["plane"] == [1]
    assert f"{expected.max()} objects in the new layer" in form.status.label.text()

    qtbot.mouseClick(form.segment_all_button, Qt.MouseButton.LeftButton)
    qtbot.mouseClick(form.segment_all_button, Qt.MouseButton.LeftButton)  # stopped at once
    qtbot.waitUntil(lambda: form.segment_all_button.text() == "Segment all", timeout=30000)
    assert form.status.label.text() == "Segment all stopped: nothing was written." and len(_automatic_layers(viewer)) == 1

    form.all_planes_check.setChecked(True)
    segment_all(qtbot, widget)
    (stacked,) = (layer for layer in _automatic_layers(viewer) if layer is not found)
    assert stacked.data.shape == stack.shape and stacked.metadata[AUTOMATIC_KEY]["planes"] == [[0], [1]]
    first = instance_segmenter_labels(widget, image, 0)
    assert np.array_equal(stacked.data[0], first)
    assert np.array_equal(stacked.data[1], np.where(expected > 0, expected + first.max(), 0))  # ids go on
    assert widget.session.cache.misses == 2  # each plane encoded once, by the panel or the run

    slow_maps(widget.session.engine, 0.5, monkeypatch)
    qtbot.mouseClick(form.segment_all_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: form.status.label.text().startswith("Segment all: plane 2 of 2"), timeout=60000)
    qtbot.mouseClick(form.segment_all_button, Qt.MouseButton.LeftButton)  # while plane 1 is under way
    qtbot.waitUntil(lambda: form.segment_all_button.text() == "Segment all", timeout=60000)
    (stopped,) = (layer for layer in _automatic_layers(viewer) if layer not in (found, stacked))
    assert [bool(plane.any()) for plane in stopped.data] == [True, False] and np.array_equal(stopped.data[0], first)
    assert stopped.metadata[AUTOMATIC_KEY]["planes"] == [[0]]
    assert form.status.label.text().startswith("Segment all stopped: ") and "on 1 of 2 planes" in form.status.label.text()

    engine = widget.session.engine  # without the decoder (a model that has none): InvalidInputError, with the way out
    monkeypatch.setattr(engine, "instance_maps", Engine.instance_maps.__get__(engine))
    for all_planes in (False, True):
        form.all_planes_check.setChecked(all_planes)
        segment_all(qtbot, widget)
        status = form.status.label.text()
        where = " on plane 1 of 2" if all_planes else ""
        assert f"Error in Segment all{where}: " in status and f"has no instance-segmentation decoder for {MODEL}" in status
        assert "'Point grid'" in status and form.status.error_shown
        assert len(_automatic_layers(viewer)) == 3  # no new layer

    modes.mode_box.setCurrentText("Point grid")
    assert form.segment_all_mode() == POINT_GRID and form.points_per_side_spin.isVisibleTo(widget)
    assert not modes.decoder_fields.isVisibleTo(widget)
    remembered = SettingsForm()  # the next session's panel
    assert remembered.segment_all_modes.decoder_settings() == form.decoder_settings()
    assert remembered.segment_all_modes.mode_box.currentText() == "Point grid"
    remembered.deleteLater()
    widget.close_session()


@pytest.fixture(scope="module")
def vit_t_lm_export(exported_repository):
    """vit_t_lm with random weights and its decoder (exported once, tests/instance/test_decoder_export.py's)."""
    return exported_repository(MODEL)


@pytest.fixture  # one test's: stopped before the next test starts
def vit_t_lm_server(vit_t_lm_export):
    server = start_server(vit_t_lm_export, sessions_only=True)  # its plain encoder not loaded (nor warmed up) beside it
    yield server
    server.stop()


def test_through_triton_every_plane_is_segmented_by_the_server_s_decoder(qtbot, viewer, vit_t_lm_server, monkeypatch):
    """Segment all (decoder) on a stack through a real Triton server: each plane encoded once there
    and its maps computed there, the layer as `InstanceSegmenter` on the same engine gives it."""
    stack = np.stack([blobs(seed) for seed in range(2)])
    image = viewer.add_image(stack)
    viewer.dims.set_current_step(0, 0)
    viewer.reset_view()
    widget = start_micro_sam(qtbot, viewer, MODEL, "Triton", monkeypatch, url=vit_t_lm_server.grpc_url)
    choose_many_objects(widget)
    widget.form.all_planes_check.setChecked(True)
    segment_all(qtbot, widget)
    requests = vit_t_lm_server.session_requests(widget.session.spec.session_name)
    assert requests.get("encoded") == 2 and requests.get("instance_maps") == 2, requests

    (stacked,) = _automatic_layers(viewer)
    first, second = (instance_segmenter_labels(widget, image, index) for index in range(2))
    assert second.max() > 20  # many objects
    assert np.array_equal(stacked.data[0], first)
    assert np.array_equal(stacked.data[1], np.where(second > 0, second + first.max(), 0))
    widget.close_session()


@pytest.fixture(scope="module")
def vit_t_lm_repository(tmp_path_factory):
    """The synthetic model under vit_t_lm's names, with the synthetic instance decoder: the decoder mode in a blink."""
    repository = write_repository(get_model("vit_t_lm"), tmp_path_factory.mktemp("vit_t_lm_repo"))
    write_instance_decoder(get_model("vit_t_lm"), repository)
    return repository


def test_on_a_large_plane_the_decoder_segments_the_tiles_in_view_and_writes_nowhere_else(
    qtbot, viewer, vit_t_lm_repository, monkeypatch
):
    """A 2600 x 3200 plane (tiled) zoomed in: the labels cover the visible region, from the tiles in
    view, placed where they lie; a disk across two tiles' overlap is one object; a disk far from
    the view is in no layer."""
    in_view, across, far = (1300, 800, 50), (1660, 900, 60), (200, 2400, 80)  # (x, y, r); `across`: tiles at x 768 and 1536
    plane = disk_image(2600, 3200, [in_view, across, far])
    image = viewer.add_image(plane)
    camera = bindings.camera(viewer)
    camera.center, camera.zoom = (900, 1500), 1.0
    widget = start_micro_sam(qtbot, viewer, "vit_t_lm", "Local", monkeypatch, repository=vit_t_lm_repository)
    assert widget.tiled and widget.form.segment_all_mode() == DECODER
    widget.form.segment_all_modes.decoder_spins["boundary_distance_threshold"].setValue(0.99)  # the synthetic maps' seeds
    widget.form.segment_all_modes.decoder_spins["min_size"].setValue(5)
    widget.form.region_box.setCurrentText("Visible region")
    segment_all(qtbot, widget)

    (found,) = _automatic_layers(viewer)
    y0, x0, y1, x1 = region = found.metadata[AUTOMATIC_KEY]["region"]
    vy0, vx0, vy1, vx1 = layers.visible_region(image)
    assert found.metadata[AUTOMATIC_KEY]["tiles"] > 1 and y0 <= vy0 and x0 <= vx0 and vy1 <= y1 and vx1 <= x1
    assert found.data.shape == (y1 - y0, x1 - x0) and (y1 - y0) * (x1 - x0) < plane.size  # the tiles in view only
    assert found.data_to_world((0, 0)) == pytest.approx(image.data_to_world((y0, x0)))
    yy, xx = np.mgrid[y0:y1, x0:x1]
    for x, y, r in (in_view, across):
        disk = (xx - x) ** 2 + (yy - y) ** 2 <= r**2
        (label,) = np.unique(found.data[disk & (found.data > 0)])  # one object, across the tiles' overlap too
        assert np.count_nonzero(found.data[disk] == label) >= 0.9 * np.count_nonzero(disk)
        at = np.round(found.world_to_data(world(image, x, y))).astype(int)
        assert found.data[tuple(at)] == label
    assert found.data.max() == 2 and far[1] - far[2] >= y1, region  # the far disk: below the region, in no layer
    widget.close_session()
