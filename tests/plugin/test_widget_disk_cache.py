"""The panel's "Keep embeddings on disk" in a real napari viewer, driven by real Qt events: a plane
encoded once is read back from disk by the next Start, and a folder that cannot be written leaves
the panel working from memory. The disk cache is the test's own (`private_settings`)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import SYNTHETIC_MODEL
from synthetic import disk_image, write_repository
from triton_sam.features import default_disk_dir, disk_files
from triton_sam.registry import get_model

pytest.importorskip("napari")
from test_widget import DISKS, H, W, click, key, move, start, world  # noqa: E402

from triton_sam.plugin import layers  # noqa: E402


@pytest.fixture(scope="module")
def named_repository(tmp_path_factory):
    """The synthetic model with its weights named (as a seeded export's): the disk cache keeps its features."""
    return write_repository(get_model(SYNTHETIC_MODEL), tmp_path_factory.mktemp("named_repo"), seed=3)


def test_start_again_on_an_image_reads_its_plane_from_disk_and_previews_as_before(qtbot, viewer, named_repository, tmp_path):
    image = viewer.add_image(disk_image(H, W, DISKS))
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=named_repository)
    assert widget.form.disk_cache_check.isChecked()  # on unless the user unticks it
    first = widget.session.cache
    move(viewer, world(image, 300, 150))
    preview = viewer.layers[layers.PREVIEW_NAME]
    qtbot.waitUntil(lambda: preview.data[150, 300] == 1, timeout=10000)
    shown = preview.data > 0  # the object under the cursor (its outline drawn inside it)
    assert (first.misses, first.disk_hits) == (1, 0)  # encoded
    assert default_disk_dir().is_relative_to(tmp_path) and len(disk_files(default_disk_dir())) == 1

    widget.close_session()  # Stop: the engine and its cache in memory go
    widget.connect_engine()  # Start again, on the same image
    qtbot.waitUntil(lambda: widget.ready, timeout=30000)
    cache = widget.session.cache
    assert cache is not first and cache.misses == cache.disk_hits == 1  # read from disk: nothing encoded
    move(viewer, world(image, 300, 150))
    preview = viewer.layers[layers.PREVIEW_NAME]
    qtbot.waitUntil(lambda: preview.data[150, 300] == 1, timeout=10000)
    assert np.array_equal(preview.data > 0, shown), (np.unique(preview.data), (preview.data > 0).sum(), shown.sum())
    widget.close_session()


def test_a_disk_folder_that_cannot_be_written_is_said_and_annotation_goes_on_in_memory(qtbot, viewer, named_repository, tmp_path):
    (tmp_path / "cache").write_text("a file where the cache folder would be")  # unwritable, even for root
    image = viewer.add_image(disk_image(H, W, DISKS))
    viewer.reset_view()
    widget = start(qtbot, viewer, repository=named_repository)
    status = widget.form.status
    assert status.label.text().startswith("Ready: hover to preview") and not status.error_shown
    assert f"memory only: {default_disk_dir()} cannot be written (Not a directory)" in status.label.text()

    click(viewer, world(image, 80, 80))
    preview = viewer.layers[layers.PREVIEW_NAME]
    qtbot.waitUntil(lambda: preview.data[80, 80] == 1, timeout=10000)
    key(viewer, "commit")
    qtbot.waitUntil(lambda: layers.objects_name(image) in viewer.layers, timeout=10000)
    objects = viewer.layers[layers.objects_name(image)]
    qtbot.waitUntil(lambda: objects.data[80, 80] == 1, timeout=10000)
    assert widget.session.cache.misses == 1  # the plane's features, from memory
    widget.close_session()
