"""The preview layer's drawing: outlines (no label's filled look), widths that follow the zoom,
and writes of only what changes, in a whole plane or a large plane's window."""

import numpy as np
import pytest
from scipy import ndimage

napari = pytest.importorskip("napari")
from napari.components import ViewerModel  # noqa: E402

from triton_sam.plugin import layers  # noqa: E402
from triton_sam.plugin import preview as previews  # noqa: E402


def _object(layer) -> np.ndarray:
    return np.isin(layer.data, previews.OBJECT_LABELS)


def _hint(layer) -> np.ndarray:
    return np.isin(layer.data, previews.HINT_LABELS)


def _band(mask: np.ndarray, width: int) -> np.ndarray:
    """The pixels of `mask` within `width` (8-connected steps) of its edge."""
    return mask & ~ndimage.binary_erosion(mask, np.ones((3, 3), bool), iterations=width, border_value=0)


def _disk(shape, y, x, r) -> np.ndarray:
    yy, xx = np.ogrid[: shape[0], : shape[1]]
    return (yy - y) ** 2 + (xx - x) ** 2 < r * r


def test_the_object_is_a_solid_outline_and_the_hint_a_dashed_one_over_a_see_through_inside():
    viewer = ViewerModel()
    image = viewer.add_image(np.zeros((300, 400)))
    live = previews.LivePreview(layers.preview_layer(viewer, image))
    mask, hint = _disk((300, 400), 100, 100, 50), _disk((300, 400), 100, 100, 50) | _disk((300, 400), 100, 190, 60)
    live.show(mask, hint)
    data, line = live.layer.data, previews.LINE_PX  # zoom 1: a layer pixel is a screen pixel
    opaque = live.layer.colormap.map(data)[..., 3] > 0
    assert np.array_equal(_object(live.layer), mask) and np.array_equal(_hint(live.layer), hint & ~mask)
    assert np.array_equal(opaque & mask, _band(mask, line))  # the object's inside shows the image
    assert np.array_equal(data == previews.EDGE, _band(mask, line) & ~_band(mask, line - 1))  # the last pixel inward dark
    edge = _band(hint, line) & ~mask  # the hint's line: where the object would end after a click there
    assert np.array_equal(opaque & ~mask, edge)
    dashes, gaps = (data == previews.DASH) & edge, (data == previews.GAP) & edge
    assert np.array_equal(dashes | gaps, edge) and dashes.sum() > 0.3 * edge.sum() and gaps.sum() > 0.3 * edge.sum()
    row = data[100, 240:260]  # along the hint's right edge, across: white or black, then see-through
    assert set(row[row > 0]) <= {previews.DASH, previews.GAP, previews.HINT}


def test_lines_keep_their_width_on_screen_at_any_zoom_and_are_drawn_again_only_when_it_changes():
    viewer = ViewerModel()
    image = viewer.add_image(np.zeros((300, 400)), scale=(2.0, 2.0))
    live = previews.LivePreview(layers.preview_layer(viewer, image), zoom=0.5)  # a layer pixel: a screen pixel
    updates = []  # napari's, of a few pixels or of the whole layer
    live.layer.events.labels_update.connect(updates.append)
    live.layer.events.set_data.connect(updates.append)
    mask = _disk((300, 400), 150, 200, 80)
    live.show(mask)
    for zoom, width in [(0.5, 4), (4.0, 1), (1.0, 2), (0.125, 16), (0.6, 4)]:
        live.set_zoom(zoom)
        assert previews.line_widths(zoom, live.layer)[0] == width
        assert np.array_equal((live.layer.data != previews.OBJECT) & mask, _band(mask, width)), zoom
        assert np.array_equal(_object(live.layer), mask)
    count = len(updates)
    live.set_zoom(0.55)  # the same width: nothing drawn
    assert len(updates) == count
    live.show(None)
    assert not live.layer.data.any() and len(updates) > count
    count = len(updates)
    live.set_zoom(4.0)  # nothing shown: nothing drawn
    assert len(updates) == count


def test_a_preview_writes_only_the_pixels_that_change_and_keeps_no_history_beyond_its_budget(monkeypatch):
    viewer = ViewerModel()
    image = viewer.add_image(np.zeros((300, 400)))
    live = previews.LivePreview(layers.preview_layer(viewer, image))
    updates = []
    live.layer.events.labels_update.connect(lambda event: updates.append((event.offset, event.data.shape)))
    mask, hint = np.zeros((300, 400), bool), np.zeros((300, 400), bool)
    mask[10:20, 30:50] = True
    hint[15:40, 30:60] = True
    live.show(mask, hint)
    assert np.array_equal(_object(live.layer), mask) and np.array_equal(_hint(live.layer), hint & ~mask)
    assert updates[-1] == ([10, 30], (30, 30))  # napari recoloured the changed box, not the plane
    moved = np.roll(mask, 5, axis=1)
    live.show(moved)
    assert np.array_equal(_object(live.layer), moved) and not _hint(live.layer).any()
    assert updates[-1] == ([10, 30], (30, 30))
    count = len(updates)
    live.show(moved)  # nothing changed: nothing written
    assert len(updates) == count and not live.layer.editable

    monkeypatch.setattr(previews, "PREVIEW_HISTORY_BYTES", 1000)
    live.show(None)  # more than 1000 bytes of history: napari lets it go
    assert not live.layer.data.any()
    live.layer.undo()
    assert not live.layer.data.any()  # nothing left to undo

    half = np.zeros((300, 400), bool)
    half[:, 200:] = True
    live.show(half, moved)  # most of the plane changes: written whole
    assert np.array_equal(_object(live.layer), half) and np.array_equal(_hint(live.layer), moved)
    live.show(mask)
    assert np.array_equal(_object(live.layer), mask) and not _hint(live.layer).any()


def test_a_large_plane_preview_is_a_window_that_moves_only_when_a_preview_falls_outside_it():
    viewer = ViewerModel()
    image = viewer.add_image(np.zeros((20000, 20000), np.uint16), scale=(0.5, 2.0), translate=(10.0, -4.0))
    assert layers.preview_layer(viewer, image, window=True).data.shape == (previews.PREVIEW_WINDOW,) * 2
    layer = viewer.add_labels(np.zeros((2048, 2048), np.uint8), scale=image.scale, translate=image.translate)
    preview = previews.WindowPreview(layer)

    def shown(y: int, x: int) -> int:
        """1 where the window shows the object at plane pixel (x, y), 2 the hint, else 0."""
        row, col = np.round(layer.world_to_data(image.data_to_world([y, x]))).astype(int)
        label = int(layer.data[row, col]) if 0 <= row < 2048 and 0 <= col < 2048 else 0
        return 1 if label in previews.OBJECT_LABELS else 2 if label in previews.HINT_LABELS else 0

    mask, hint = np.zeros((1024, 1024), bool), np.zeros((1024, 1024), bool)
    mask[100:110, 200:230] = True
    hint[0:5, 0:5] = True
    preview.show(mask, hint, offset=(3000, 4000), hint_offset=(3108, 4228))
    assert layer.data.shape == (2048, 2048) and int((layer.data > 0).sum()) == 300 + 25 - 4
    for y, x, label in [(3100, 4200, 1), (3109, 4229, 1), (3111, 4230, 2), (3112, 4200, 0)]:
        assert shown(y, x) == label, (y, x)
    translate = tuple(layer.translate)
    preview.show(mask, None, offset=(3500, 4500))  # still inside the window: written in place
    assert tuple(layer.translate) == translate and shown(3600, 4700) == 1 and not shown(3100, 4200)
    preview.show(mask, None, offset=(15000, 12000))  # far away: the window moves there
    assert tuple(layer.translate) != translate and shown(15100, 12200) == 1 and int((layer.data > 0).sum()) == 300
    preview.show(None)
    assert not layer.data.any()
    preview.show(mask, None, offset=(8000, 8000), step=4)  # zoomed out: a window pixel covers 4 x 4 plane pixels
    np.testing.assert_allclose(layer.scale, np.asarray(image.scale) * 4)
    assert shown(8400 + 1, 8800 + 2) == 1 and shown(8400 + 39, 8800 + 119) == 1 and not shown(8400 + 40, 8800)
    assert int((layer.data > 0).sum()) == 300  # its pixels as they came: the mask at the tiles' resolution
    preview.set_zoom(1 / 8)  # a window pixel (4 x 2 world units) is a screen pixel: lines 4 of them wide
    assert previews.line_widths(1 / 8, layer)[0] == 4 and np.array_equal(layer.data > previews.OBJECT, _band(layer.data > 0, 4))
    preview.show(mask, None, offset=(3000, 4000))  # zoomed in again: full resolution, nothing left from before
    np.testing.assert_allclose(layer.scale, image.scale)
    assert shown(3100, 4200) == 1 and int((layer.data > 0).sum()) == 300
