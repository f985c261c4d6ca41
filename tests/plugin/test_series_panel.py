"""The panel's Series section: a series annotated through the panel, killed and resumed
(`series_scenarios.py`, in processes of their own), bad folders, and saves off the GUI thread."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile

pytest.importorskip("napari")
from qtpy.QtCore import QTimer  # noqa: E402
from qtpy.QtTest import QTest  # noqa: E402

from triton_sam.objects import Committed  # noqa: E402
from triton_sam.plugin import automatic, layers  # noqa: E402
from triton_sam.plugin.widget import TritonSamWidget  # noqa: E402
from triton_sam.series import IN_PROGRESS, AnnotationSeries  # noqa: E402

SCENARIOS = Path(__file__).with_name("series_scenarios.py")
ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(SCENARIOS.parent))
from process_scenarios import open_section  # noqa: E402
from series_scenarios import LEFT, OBJECTS, STACK, click, make_images, press, saved, showing, wait  # noqa: E402


def _run(scenario: str, repository: Path, settings: Path, folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCENARIOS), scenario, str(repository), str(settings), str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
    )


def test_a_series_annotated_in_the_panel_killed_between_two_commits_resumes_with_every_commit(synthetic_repository, tmp_path):
    """Five images (planes, a plane over 2048 x 2048 px, a stack): objects committed with real mouse and
    key events, Done and Next between images, the process killed with an object in progress; reopened,
    the series is at the stack with every committed object on disk and shown, and its export (label
    TIFFs, COCO JSON) reads back equal to the layers."""
    folder = tmp_path / "images"
    folder.mkdir()
    make_images(folder)
    killed = _run("annotate", synthetic_repository, tmp_path, folder)
    assert killed.returncode == -9, f"{killed.stdout[-2000:]}\n{killed.stderr[-3000:]}"
    commits = [line.split()[1:] for line in killed.stdout.splitlines() if line.startswith("saved ")]
    assert len(commits) == 5, killed.stdout
    series = AnnotationSeries.open(folder)
    assert series.index == STACK and str(series.progress) == "2 of 5 done, 2 in progress"
    for index, object_id, pixels in (map(int, commit) for commit in commits):
        assert pixels > 100 and np.count_nonzero(series.labels(index) == object_id) == pixels

    resumed = _run("resume", synthetic_repository, tmp_path, folder)
    assert resumed.returncode == 0 and resumed.stdout.rstrip().endswith("survived"), resumed.stdout + resumed.stderr[-3000:]
    assert "Image 4 of 5 (4.tif) · 2 done · all saved" in resumed.stdout


def test_a_folder_without_images_or_with_an_unreadable_image_says_why_and_changes_nothing(viewer, tmp_path):
    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    (tmp_path / "notes.txt").write_text("not an image")
    widget.series.open(tmp_path)
    assert "holds no images" in widget.form.status.label.text() and "Series not opened" in widget.form.status.label.text()
    (tmp_path / "broken.png").write_bytes(b"not a png")
    widget.series.open(tmp_path)
    assert "broken.png cannot be read" in widget.form.status.label.text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.png", "notes.txt"] and not viewer.layers
    widget.series.next()
    assert "Open a folder" in widget.form.status.label.text()
    widget.close_session()


def test_saving_a_commit_on_a_4096_plane_happens_off_the_gui_thread(viewer, qtbot, tmp_path):
    """A commit on a 4096 x 4096 plane (labels in zarr, fsync'd), with the layer's changes after it, is
    saved on worker threads while the GUI thread's event loop runs. The loop's longest wait is printed, not
    asserted (timings are not); `python -m benchmarks series_gui` measures it against the issue's 50 ms."""
    tifffile.imwrite(tmp_path / "large.tif", np.zeros((4096, 4096), np.uint8))
    series = AnnotationSeries.open(tmp_path)
    saved_on = []
    for name in ("save_object", "save_changes"):  # record the thread each save runs on, then save
        save = getattr(series, name)
        setattr(series, name, lambda *a, save=save, **k: saved_on.append(threading.current_thread()) or save(*a, **k))
    image = viewer.add_image(np.zeros((4096, 4096), np.uint8))
    objects = layers.objects_layer(viewer, image, np.uint16)
    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    saving = widget.series.saving
    saving.watch(series, 0, objects)
    yy, xx = np.mgrid[-150:151, -150:151]
    gaps, last = [], [0.0]

    def tick() -> None:
        now = time.perf_counter()
        gaps.append(now - last[0])
        last[0] = now

    timer = QTimer(interval=2)
    timer.timeout.connect(tick)
    for object_id, (y, x) in enumerate([(500, 500), (2000, 3000), (3700, 1200)], 1):
        committed = Committed(None, yy**2 + xx**2 <= 150**2, object_id, {"model_id": "m"}, (y, x))
        layers.write_object(objects, (), committed.mask, object_id, committed.provenance, committed.offset)
        qtbot.wait(30)  # napari draws the commit
        last[0] = time.perf_counter()
        timer.start()
        saving.committed(committed, ())
        qtbot.waitUntil(lambda: not saving.pending, timeout=20000)
        timer.stop()
    assert np.array_equal(series.labels(0), objects.data) and series.status(0) == IN_PROGRESS
    print(f"longest GUI-thread wait while 3 commits on a 4096 x 4096 plane were saved: {max(gaps) * 1000:.1f} ms")
    assert saved_on and threading.main_thread() not in saved_on
    widget.close_session()


def _open_series(viewer, folder: Path, backend: str, **fields):
    """The panel (`backend`, its `fields` set: url, repository) with the series of `folder` opened."""
    folder.mkdir(exist_ok=True)
    if not any(folder.iterdir()):
        make_images(folder)
    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    widget.form.backend_box.setCurrentText(backend)
    for name, value in fields.items():
        getattr(widget.form, f"{name}_field").setText(str(value))
    open_section(widget, "series")
    widget.series.open(folder)
    return widget


def _commit(viewer, widget, x: float, y: float) -> int:
    """Click at (x, y) of the series image shown and commit, with real events; once it is saved, its id."""
    panel, object_id = widget.series, widget.session.next_object_id
    click(viewer, panel.image, x, y)
    press(viewer, widget.form.keys["commit"])
    index = panel.series.index
    wait(widget, lambda: saved(panel) and np.count_nonzero(panel.series.labels(index) == object_id) > 100)
    return object_id


def test_a_series_annotated_through_triton_is_saved_and_resumes_at_the_image_left(qtbot, viewer, synthetic_server, tmp_path):
    """Two images annotated through a real Triton server, Done between them: each commit is on disk;
    a new panel reopening the series (the server's address remembered) is at the second image,
    its saved labels shown, and new objects take ids after them."""
    widget = _open_series(viewer, tmp_path / "images", "Triton", url=synthetic_server.grpc_url)
    panel = widget.series
    wait(widget, lambda: showing(widget, 0))
    assert widget.session.engine.describe().startswith("Triton at")
    assert [_commit(viewer, widget, x, y) for x, y in OBJECTS[0]] == [1, 2]
    QTest.mouseClick(panel.buttons["done"], LEFT)
    wait(widget, lambda: showing(widget, 1))
    assert _commit(viewer, widget, *OBJECTS[1][0]) == 1
    on_disk = panel.series.labels(1)
    widget.close_session()
    viewer.layers.clear()

    again = TritonSamWidget(viewer)
    again.series.open(tmp_path / "images")
    wait(again, lambda: showing(again, 1))
    assert again.session.engine.describe().startswith("Triton at")
    assert str(again.series.series.progress) == "1 of 5 done, 1 in progress"
    objects = layers.existing_objects_layer(viewer, again.series.image)
    assert np.array_equal(objects.data, on_disk) and again.session.next_object_id == 2
    again.close_session()


def test_paint_on_an_objects_layer_made_again_after_the_user_deleted_it_is_saved(qtbot, viewer, synthetic_repository, tmp_path):
    """The user deletes the series image's objects layer; the next commit makes it again: it shows the
    labels saved before, and painting on it is saved like any change."""
    widget = _open_series(viewer, tmp_path / "images", "Local", repository=synthetic_repository)
    panel = widget.series
    wait(widget, lambda: showing(widget, 0))
    first, second = OBJECTS[0]
    assert _commit(viewer, widget, *first) == 1
    viewer.layers.remove(layers.existing_objects_layer(viewer, panel.image))
    assert _commit(viewer, widget, *second) == 2  # the layer is made again
    objects = layers.existing_objects_layer(viewer, panel.image)
    wait(widget, lambda: saved(panel) and 1 in objects.data and 2 in objects.data)

    objects.paint((5, 5), 9)  # napari's paint tool's call (brush of its size)
    wait(widget, lambda: saved(panel) and panel.series.labels(0)[5, 5] == 9)
    assert np.array_equal(panel.series.labels(0), objects.data)
    widget.close_session()


def test_segment_all_on_a_series_image_adds_its_objects_to_the_saved_labels(qtbot, viewer, synthetic_repository, tmp_path):
    """Segment all on a series image adds what it finds to the image's objects layer (on the pixels no
    object has, after the ids committed), as micro-sam commits an automatic segmentation: saved at once,
    there when the series is opened again; no separate layer is added."""
    widget = _open_series(viewer, tmp_path / "images", "Local", repository=synthetic_repository)
    panel = widget.series
    wait(widget, lambda: showing(widget, 0))
    assert _commit(viewer, widget, *OBJECTS[0][0]) == 1
    committed = panel.series.labels(0) == 1
    open_section(widget, "segment_all")
    widget.form.points_per_side_spin.setValue(8)
    QTest.mouseClick(widget.form.segment_all_button, LEFT)
    wait(widget, lambda: "objects added to" in widget.form.status.label.text() and saved(panel))
    objects = layers.existing_objects_layer(viewer, panel.image)
    assert [layer.name for layer in viewer.layers if layer.name.endswith(automatic.AUTOMATIC_SUFFIX)] == []
    on_disk = AnnotationSeries.open(tmp_path / "images").labels(0)
    assert np.array_equal(on_disk, objects.data) and on_disk.max() > 1
    assert np.array_equal(on_disk == 1, committed)  # the object committed before is untouched
    assert widget.session.next_object_id == on_disk.max() + 1
    widget.close_session()


def test_segment_all_on_every_plane_of_a_series_stack_adds_its_objects_to_the_saved_labels(
    qtbot, viewer, synthetic_repository, tmp_path
):
    """Segment all with "All planes" on a series' stack, as on a plane: every plane's objects go into the
    stack's objects layer (no layer of their own), saved at once, read back from disk and shown in a new
    panel that reopens the series at the stack."""
    widget = _open_series(viewer, tmp_path / "images", "Local", repository=synthetic_repository)
    panel = widget.series
    for index in range(1, STACK + 1):
        wait(widget, lambda index=index: showing(widget, index - 1))
        QTest.mouseClick(panel.buttons["next"], LEFT)
    wait(widget, lambda: showing(widget, STACK))
    open_section(widget, "segment_all")
    assert widget.form.all_planes_check.isChecked() and widget.form.all_planes_check.isEnabled()
    widget.form.points_per_side_spin.setValue(8)
    QTest.mouseClick(widget.form.segment_all_button, LEFT)
    wait(widget, lambda: "on 3 of 3 planes added to" in widget.form.status.label.text() and saved(panel))
    objects = layers.existing_objects_layer(viewer, panel.image)
    assert [layer.name for layer in viewer.layers if layer.name.endswith(automatic.AUTOMATIC_SUFFIX)] == []
    on_disk = AnnotationSeries.open(tmp_path / "images").labels(STACK)
    assert on_disk.shape == (3, 120, 160) and np.array_equal(on_disk, objects.data)
    assert all(np.count_nonzero(plane) > 100 for plane in on_disk)  # each plane's objects, not one plane's
    assert widget.session.next_object_id == on_disk.max() + 1
    widget.close_session()
    viewer.layers.clear()

    again = TritonSamWidget(viewer)
    again.form.repository_field.setText(str(synthetic_repository))  # (the tests' environment names another)
    again.series.open(tmp_path / "images")
    wait(again, lambda: showing(again, STACK))
    assert np.array_equal(layers.existing_objects_layer(viewer, again.series.image).data, on_disk)
    again.close_session()
