"""The panel's Find section (SAM 3 concepts) in a real napari viewer, driven by real Qt keys and
mouse, on the synthetic sam3_tracker with synthetic concept graphs (tests/synthetic_concepts.py)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

from synthetic import write_repository
from synthetic_concepts import BRIGHT, DIM, MEDIUM, blob_image

napari = pytest.importorskip("napari")
from process_scenarios import open_section  # noqa: E402
from qtpy.QtCore import Qt  # noqa: E402
from qtpy.QtTest import QTest  # noqa: E402
from test_widget import click, drag_box, key, start, world  # noqa: E402

from conftest import start_server  # noqa: E402
from triton_sam.concepts import ConceptProcessor  # noqa: E402
from triton_sam.concepts.instances import label_image  # noqa: E402
from triton_sam.plugin import find, layers  # noqa: E402
from triton_sam.plugin.automatic import AUTOMATIC_KEY  # noqa: E402
from triton_sam.registry import get_model  # noqa: E402
from triton_sam.repository import concepts_path  # noqa: E402
from triton_sam.tiles import tile_grid  # noqa: E402

SIZE = 240  # a grid cell is 40 pixels
BLOBS = {(0, 0): BRIGHT, (0, 2): BRIGHT, (2, 0): BRIGHT, (2, 2): MEDIUM, (4, 0): MEDIUM, (4, 4): DIM, (0, 4): DIM}


def cell_centre(row: int, column: int) -> tuple[float, float]:
    return (column + 0.5) * SIZE / 6, (row + 0.5) * SIZE / 6


def instances(layer) -> int:
    return len(np.unique(layer.data[layer.data > 0]))


def start_sam3(qtbot, viewer, repository=None, data: np.ndarray | None = None, url: str | None = None):
    """The panel started with sam3_tracker of `repository` (Local), of the Triton server at `url`
    (Triton) or both (Auto) on `data` (a blob image by default); its Find section open."""
    image = viewer.add_image(blob_image(SIZE, BLOBS) if data is None else data)
    viewer.reset_view()
    _, widget = viewer.window.add_plugin_dock_widget("triton-sam", "Segment Anything")
    fields = {name: value for name, value in (("repository", repository), ("url", url)) if value is not None}
    backend = "Auto" if len(fields) == 2 else "Local" if url is None else "Triton"
    widget.form.backend_box.setCurrentText(backend)
    for name, value in fields.items():
        getattr(widget.form, f"{name}_field").setText(str(value))
    widget.form.find_models_button.click()
    qtbot.waitUntil(lambda: widget.form.model_box.findText("sam3_tracker") >= 0, timeout=10000)
    widget.form.model_box.setCurrentText("sam3_tracker")
    widget = start(qtbot, viewer, backend, **fields)
    open_section(widget, "find")
    return image, widget


def type_phrase(widget, phrase: str) -> None:
    field = widget.finder.phrase_field
    QTest.mouseClick(field, Qt.MouseButton.LeftButton)
    field.clear()
    QTest.keyClicks(field, phrase)
    QTest.keyClick(field, Qt.Key.Key_Return)


def slide(widget, key_name: str, presses: int) -> None:
    """Move the score slider with the keyboard (PageUp / PageDown: 0.05 a press)."""
    for _ in range(presses):
        QTest.keyClick(widget.finder.score_slider, getattr(Qt.Key, f"Key_{key_name}"))


def test_find_a_phrase_refilter_add_an_exemplar_commit_all_and_undo(qtbot, viewer, concepts_repository):
    image, widget = start_sam3(qtbot, viewer, concepts_repository)
    click(viewer, world(image, *cell_centre(0, 0)))  # an object of the tracker's first: Find never paints over it
    key(viewer, "commit")
    qtbot.waitUntil(lambda: layers.objects_name(image) in viewer.layers, timeout=10000)
    objects = viewer.layers[layers.objects_name(image)]
    qtbot.waitUntil(lambda: objects.data.any(), timeout=10000)
    tracked = objects.data.copy()
    assert tracked[20, 20] and not tracked[100, 100]

    type_phrase(widget, "blob")
    qtbot.waitUntil(lambda: layers.FOUND_NAME in viewer.layers, timeout=10000)
    found = viewer.layers[layers.FOUND_NAME]
    qtbot.waitUntil(lambda: instances(found) == 5, timeout=10000)
    assert found.data[tuple(int(v) for v in cell_centre(4, 4)[::-1])] == 0  # dim: below 0.5
    assert "(1 labelled already: a commit leaves them out)" in widget.form.status.label.text()  # the tracker's
    encodes, runs = widget.session.cache.misses, widget.finder.detector_runs
    assert runs == 1 and encodes == 1  # one encode served the click and Find

    slide(widget, "PageUp", 9)  # 0.95: the medium blobs go, without a detector run
    qtbot.waitUntil(lambda: instances(found) == 3, timeout=10000)
    slide(widget, "PageDown", 9)
    qtbot.waitUntil(lambda: instances(found) == 5, timeout=10000)
    assert widget.finder.detector_runs == runs and widget.finder.threshold == 0.5

    x, y = cell_centre(4, 4)
    drag_box(viewer, image, (x - 15, y - 15), (x + 15, y + 15))  # Ctrl-drag on a dim blob: more like this
    qtbot.waitUntil(lambda: instances(found) == 7, timeout=10000)
    assert widget.finder.detector_runs == runs + 1 and widget.session.object.box is None  # an exemplar, no tracker box
    x, y = cell_centre(2, 2)
    not_this = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.AltModifier
    drag_box(viewer, image, (x - 15, y - 15), (x + 15, y + 15), ctrl=not_this)  # Ctrl-Alt-drag on a medium blob
    qtbot.waitUntil(lambda: instances(found) == 5, timeout=10000)
    shown = found.data > 0

    key(viewer, "commit")  # Shift-C: every instance shown, as new objects
    qtbot.waitUntil(lambda: len(np.unique(objects.data)) > 2, timeout=10000)
    assert np.array_equal(objects.data[tracked > 0], tracked[tracked > 0])  # the tracker's object untouched
    new = (objects.data > 0) & (tracked == 0)
    assert len(np.unique(objects.data[new])) == 4 and not (new & ~shown).any()  # the 4 instances not labelled yet
    made = objects.metadata[layers.PROVENANCE_KEY][int(objects.data[new].max())]
    assert made["phrase"] == "blob" and made["model_id"] == "sam3_tracker"
    assert [positive for *_, positive in made["exemplars"]] == [True, False]
    assert layers.FOUND_NAME not in viewer.layers and widget.session.next_object_id == int(objects.data.max()) + 1

    objects.undo()  # napari's undo (Ctrl+Z on the objects layer): the whole Find commit, one step
    assert np.array_equal(objects.data, tracked)
    widget.close_session()


def test_find_through_a_triton_server_finds_previews_refilters_and_commits_as_locally(qtbot, viewer, concepts_repository):
    """The server keeps the plane's features and runs the detector; the panel has no export (the
    server's merges file tokenizes the phrase); the slider re-filters without a request."""
    server = start_server(concepts_repository)
    try:
        image, widget = start_sam3(qtbot, viewer, url=server.grpc_url)
        type_phrase(widget, "blob")
        qtbot.waitUntil(lambda: layers.FOUND_NAME in viewer.layers, timeout=20000)
        found = viewer.layers[layers.FOUND_NAME]
        qtbot.waitUntil(lambda: instances(found) == 5, timeout=20000)  # as on the local backend
        asked = server.session_requests(get_model("sam3_tracker").session_name)["concepts"]
        slide(widget, "PageUp", 9)  # 0.95
        qtbot.waitUntil(lambda: instances(found) == 3, timeout=20000)
        assert server.session_requests(get_model("sam3_tracker").session_name)["concepts"] == asked
        key(viewer, "commit")
        objects_name = layers.objects_name(image)
        qtbot.waitUntil(lambda: objects_name in viewer.layers and viewer.layers[objects_name].data.any(), timeout=20000)
        assert len(np.unique(viewer.layers[objects_name].data)) == 4  # the 3 shown, and 0
        widget.close_session()
    finally:
        server.stop()


def test_with_auto_find_goes_on_locally_once_the_server_is_gone_and_the_panel_says_so(qtbot, viewer, concepts_repository):
    """Found through the server, committed; the server stopped, Find again finds on the local engine
    (the plane encoded from the kept input), the engine label says so, the commit keeps the first."""
    server = start_server(concepts_repository)
    try:
        image, widget = start_sam3(qtbot, viewer, concepts_repository, url=server.grpc_url)
        engine_label = widget.form.status.engine_label
        type_phrase(widget, "blob")
        qtbot.waitUntil(lambda: layers.FOUND_NAME in viewer.layers, timeout=20000)
        qtbot.waitUntil(lambda: instances(viewer.layers[layers.FOUND_NAME]) == 5, timeout=20000)
        assert engine_label.text().startswith("Engine: Triton at") and "labelled already" not in widget.form.status.label.text()
        key(viewer, "commit")
        objects = viewer.layers[layers.objects_name(image)]
        qtbot.waitUntil(lambda: len(np.unique(objects.data)) == 6, timeout=20000)
        committed = objects.data.copy()
    finally:
        server.stop()
    slide(widget, "PageDown", 9)  # 0.05: the dim blobs too, found anew
    type_phrase(widget, "blob")
    qtbot.waitUntil(lambda: layers.FOUND_NAME in viewer.layers, timeout=30000)
    qtbot.waitUntil(lambda: instances(viewer.layers[layers.FOUND_NAME]) == 7, timeout=30000)
    assert "Triton not used" in engine_label.text() and widget.session.engine.fallback_reason is not None
    assert "scoring above 0.05 (5 labelled already: a commit leaves them out)" in widget.form.status.label.text()
    key(viewer, "commit")  # the two dim blobs: the five committed before are never painted over
    qtbot.waitUntil(lambda: len(np.unique(objects.data)) == 8, timeout=20000)
    assert np.array_equal(objects.data[committed > 0], committed[committed > 0])
    widget.close_session()


def test_find_on_all_planes_fills_a_stack_layer_with_each_plane_s_instances_and_stops_when_pressed_again(
    qtbot, viewer, concepts_repository, monkeypatch
):
    """Find on all planes runs as Segment all on all planes: each plane's instances (as the processor
    finds them on that plane alone) in one layer of the stack's shape, ids going on; pressed again
    while a plane is under way, it stops and keeps the planes done."""
    planes = [{(0, 0): BRIGHT}, {(0, 0): BRIGHT, (2, 2): MEDIUM, (4, 4): DIM}, {}, {(2, 0): MEDIUM, (0, 4): BRIGHT}]
    stack = np.stack([blob_image(SIZE, blobs) for blobs in planes])
    image, widget = start_sam3(qtbot, viewer, concepts_repository, stack)
    button, form = widget.finder.all_planes_button, widget.form
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    assert form.status.label.text() == find.NO_PHRASE.format(button=find.ALL_PLANES)
    type_phrase(widget, "blob")  # Enter: the plane on screen's preview, which the run then takes away
    qtbot.waitUntil(lambda: layers.FOUND_NAME in viewer.layers, timeout=10000)
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    assert button.text() == find.STOP and layers.FOUND_NAME not in viewer.layers
    qtbot.waitUntil(lambda: button.text() == find.ALL_PLANES, timeout=20000)

    (found,) = [layer for layer in viewer.layers if AUTOMATIC_KEY in layer.metadata]
    record = found.metadata[AUTOMATIC_KEY]
    assert record["method"] == "concepts" and record["parameters"]["phrase"] == "blob"
    assert record["planes"] == [[0], [1], [2], [3]]
    processor = ConceptProcessor(widget.session.engine, widget.session.engine.exported.concepts_dir)
    first = 0
    for index, blobs in enumerate(planes):
        state = processor.set_text_prompt("blob", processor.set_image(stack[index]))
        expected = label_image(state["masks"], state["scores"])
        assert len(state["scores"]) == sum(value > DIM for value in blobs.values())  # bright and medium: above 0.5
        assert np.array_equal(found.data[index], np.where(expected > 0, expected.astype(np.uint32) + first, 0))
        first += int(expected.max())
    assert widget.session.cache.misses == len(planes)  # each plane encoded once (plane 0 at Start)
    assert form.status.label.text().startswith(f"Find 'blob': {first} objects on 4 of 4 planes in the new layer")

    slow = ConceptProcessor.set_text_prompt
    monkeypatch.setattr(ConceptProcessor, "set_text_prompt", lambda *args: (time.sleep(0.5), slow(*args))[1])
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: form.status.label.text().startswith("Find 'blob': plane 3 of 4"), timeout=20000)
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)  # while plane 3 is under way
    qtbot.waitUntil(lambda: button.text() == find.ALL_PLANES, timeout=20000)
    (stopped,) = [layer for layer in viewer.layers if AUTOMATIC_KEY in layer.metadata and layer is not found]
    assert stopped.metadata[AUTOMATIC_KEY]["planes"] == [[0], [1]]
    assert np.array_equal(stopped.data[:2], found.data[:2]) and not stopped.data[2:].any()
    assert form.status.label.text().startswith("Find 'blob' stopped: ") and "on 2 of 4 planes" in form.status.label.text()
    widget.close_session()


def held_whole_in_one_cell(centre: int, radius: int, starts: list[int], tile: int, margin: int = 12) -> bool:
    """Along one axis: whether a disk at `centre` lies inside one grid cell of the synthetic detector
    (with `margin` for the mask's resize) in every tile (starting at `starts`) that holds it whole,
    so that the synthetic model finds it as one instance there (it cuts instances at its cells)."""
    cell = tile / 6
    for first in starts:
        low, high = centre - radius - first, centre + radius - first
        if low >= 0 and high < tile and (low - margin) // cell != (high + margin) // cell:
            return False
    return True


def test_on_a_large_plane_find_joins_the_tiles_in_view_one_id_an_instance(qtbot, viewer, concepts_repository):
    """Each tile in view is searched at native resolution; an instance two overlapping tiles both
    hold whole is one object, one cut by a tile's edge is taken from the tile that holds it whole."""
    side, radius, tile = 2200, 25, get_model("sam3_tracker").input_size
    starts = sorted({t.x0 for t in tile_grid((side, side), tile)})
    places = [c for c in range(60, side - 60, 20) if held_whole_in_one_cell(c, radius, starts, tile)]
    chosen = [places[0]]
    for c in places:  # spaced apart, over the whole plane (overlaps included)
        if c - chosen[-1] >= 220:
            chosen.append(c)
    centres = [(x, y) for x in chosen for y in chosen[::2]]
    yy, xx = np.mgrid[:side, :side]
    plane = np.full((side, side), 20, np.uint8)
    for x, y in centres:
        plane[(xx - x) ** 2 + (yy - y) ** 2 <= radius**2] = BRIGHT
    whole_in = [sum(s <= x - radius and x + radius < s + tile for s in starts) for x, _ in centres]
    assert max(whole_in) >= 2 and len(centres) >= 12  # some are held whole by two tiles along x

    image, widget = start_sam3(qtbot, viewer, concepts_repository, plane)
    assert widget.tiled and len(widget._automatic.view_tiles()) == len(starts) ** 2  # the whole plane in view
    type_phrase(widget, "blob")
    qtbot.waitUntil(lambda: any(AUTOMATIC_KEY in layer.metadata for layer in viewer.layers), timeout=60000)
    qtbot.waitUntil(lambda: widget.finder.all_planes_button.text() == find.ALL_PLANES, timeout=60000)
    (found,) = [layer for layer in viewer.layers if AUTOMATIC_KEY in layer.metadata]
    assert found.metadata[AUTOMATIC_KEY]["tiles"] == len(starts) ** 2 and found.data.shape == (side, side)
    ids = set()
    for x, y in centres:
        disk = (xx - x) ** 2 + (yy - y) ** 2 <= radius**2
        values, counts = np.unique(found.data[disk], return_counts=True)
        assert values[0] != 0 and len(values) == 1 or counts[values == 0].sum() < 0.1 * disk.sum()
        (label,) = values[values != 0]  # one object a blob
        ids.add(int(label))
        near = (xx - x) ** 2 + (yy - y) ** 2 <= (radius + 6) ** 2  # (the masks come at a quarter of the tile's pixels)
        assert not ((found.data == label) & ~near).any()  # and nothing of it away from the blob
    assert len(ids) == len(centres) == len(np.unique(found.data)) - 1
    widget.close_session()


def test_find_says_what_it_needs_on_a_model_without_concepts(qtbot, viewer, synthetic_repository):
    viewer.add_image(blob_image(SIZE, BLOBS))
    widget = start(qtbot, viewer, repository=synthetic_repository)
    open_section(widget, "find")
    type_phrase(widget, "blob")
    assert widget.form.status.label.text() == find.NEEDS_SAM3
    widget.close_session()


def test_start_keeps_the_detector_maps_only_where_the_export_has_concept_graphs(concepts_repository, tmp_path):
    spec = get_model("sam3_tracker")
    engine = find.create_engine(spec, "local", concepts_repository, None)
    assert engine.detector_maps and find.unavailable(SimpleNamespace(engine=engine, spec=spec)) is None
    bare = write_repository(spec, tmp_path)  # a sam3_tracker export without concept graphs
    engine = find.create_engine(spec, "local", bare, None)
    why = find.unavailable(SimpleNamespace(engine=engine, spec=spec))
    assert not engine.detector_maps and why == find.NO_GRAPHS.format(path=concepts_path(bare, spec))
