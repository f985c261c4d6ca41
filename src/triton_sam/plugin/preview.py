"""How the preview layer draws the object in progress and the hint, and writes them cheaply.

Committed objects are filled with napari's random label colours, which span the hue circle from
near-black to near-white: any fill colour of ours looks like some label. So the preview is drawn as
outlines over a see-through inside, which no label is: the object (what the commit key stores) as a
solid line, `OUTLINE_COLOR` with a dark inner edge (seen on bright and dark images alike), and the
hint (what a click at the cursor would add) as a dashed line of alternating white and black, where
the object would then end. Lines keep `LINE_PX` screen pixels at any zoom (`set_zoom`).

The layer's data keeps what is shown: `OBJECT_LABELS` are the object's pixels (`OBJECT` inside,
the outline's), `HINT_LABELS` those only the hint adds; anything else is 0.
"""

from __future__ import annotations

import math

import numpy as np
from napari.layers import Labels
from napari.utils.colormaps import DirectLabelColormap

from ..session import Offset

OBJECT, HINT, OUTLINE, EDGE, DASH, GAP = 1, 2, 3, 4, 5, 6  # the preview layer's labels
OBJECT_LABELS = (OBJECT, OUTLINE, EDGE)  # what the commit key stores
HINT_LABELS = (HINT, DASH, GAP)  # what only a click at the cursor adds
CLEAR = (0.0, 0.0, 0.0, 0.0)
# Bright green: 0.47 (RGB distance) from the nearest of napari's first 50 label colours, where
# 0.51 is the most any colour is (the old yellow fill was 0.16 from one).
OUTLINE_COLOR = (0.0, 1.0, 0.25, 1.0)
EDGE_COLOR = (0.0, 0.0, 0.0, 1.0)  # the outline's inner edge: the line shows on bright images too
DASH_COLOR, GAP_COLOR = (1.0, 1.0, 1.0, 1.0), (0.0, 0.0, 0.0, 1.0)  # the hint's dashes, one of each in turn
COLORS = {None: CLEAR, OBJECT: CLEAR, HINT: CLEAR, OUTLINE: OUTLINE_COLOR, EDGE: EDGE_COLOR, DASH: DASH_COLOR, GAP: GAP_COLOR}
LINE_PX = 4  # screen pixels across the lines, at least (and at least one layer pixel: wider zoomed far in)
DASH_PX = 8  # screen pixels along a dash of the hint
PREVIEW_HISTORY_BYTES = 32 * 2**20  # napari's undo history of the preview is let go beyond this
FULL_WRITE_FRACTION = 1 / 64  # a preview changing more of the layer than this is written whole (cheaper than napari per pixel)
PREVIEW_WINDOW = 3072  # pixels a side of a large plane's preview layer: two tiles' masks fit in it


def colormap() -> DirectLabelColormap:
    return DirectLabelColormap(color_dict=COLORS)


def line_widths(zoom: float, layer: Labels) -> tuple[int, int]:
    """Layer pixels across a line (`LINE_PX` on screen or more) and along a dash at the camera's `zoom`."""
    screen_per_pixel = zoom * abs(float(layer.scale[-1]))
    return max(1, math.ceil(LINE_PX / screen_per_pixel - 1e-6)), max(1, round(DASH_PX / screen_per_pixel))


class LivePreview:
    """Writes previews into the preview layer (see the module docstring for what it draws).

    Only the box around what was shown and what is shown now is looked at, and when few of its
    pixels change only those are written (`Labels.data_setitem`), so napari recolours and uploads
    just their bounding box instead of the whole plane (what matters on large planes). When many
    change, one plain write and refresh is cheaper than napari's per-pixel path. napari keeps an
    undo history of per-pixel writes; a preview is not an annotation, so that history is let go (a
    layer made read-only forgets it) once it holds about `PREVIEW_HISTORY_BYTES`.
    """

    def __init__(self, layer: Labels, zoom: float = 1.0) -> None:
        self.layer = layer
        self.layer.editable = False  # nobody paints on the preview
        self._shown_box: tuple[int, int, int, int] | None = None  # rows r0:r1, columns c0:c1 with labels
        self._history_bytes = 0
        self._zoom = zoom
        self._shown: tuple | None = None  # `show`'s masks and offsets, drawn again at another zoom
        self._widths: tuple[int, int] | None = None  # the lines' widths they were drawn with

    def set_zoom(self, zoom: float) -> None:
        """The camera's zoom changed: lines as wide on screen as before (drawn again where they change)."""
        self._zoom = zoom
        if self._shown is not None and line_widths(zoom, self.layer) != self._widths:
            self.show(*self._shown)

    def show(
        self,
        mask: np.ndarray | None,
        hint: np.ndarray | None = None,
        offset: Offset = (0, 0),
        hint_offset: Offset = (0, 0),
        step: int = 1,
    ) -> None:
        """Show `mask` (the object) and `hint` (where it adds pixels), crops at their offsets on the
        plane (row, column); None: nothing. A whole plane is never tiled coarser: `step` (as
        `WindowPreview` takes it) is 1."""
        if step != 1:
            raise ValueError(f"A whole-plane preview shows masks at full resolution, not reduced {step} times.")
        box = _union(_bounding_box(mask, offset), _bounding_box(hint, hint_offset))
        self._shown = None if box is None else (mask, hint, offset, hint_offset)
        self._widths = line_widths(self._zoom, self.layer)
        region = _union(self._shown_box, box)
        self._shown_box = box
        if region is None:
            return
        r0, r1, c0, c1 = region
        labels = _preview_labels(mask, hint, offset, hint_offset, region, self._widths)
        differs = labels != self.layer.data[r0:r1, c0:c1]
        count = np.count_nonzero(differs)
        if count > FULL_WRITE_FRACTION * self.layer.data.size:
            self.layer.data[r0:r1, c0:c1] = labels
            self.layer.refresh()
            self._forget_history()  # its per-pixel steps no longer lead to what is shown
        elif count:
            rows, cols = np.nonzero(differs)
            self.layer.data_setitem((rows + r0, cols + c0), labels[rows, cols])
            self._history_bytes += count * (2 * rows.itemsize + 2)  # indices, old and new values
            if self._history_bytes > PREVIEW_HISTORY_BYTES:
                self._forget_history()

    def _forget_history(self) -> None:
        self.layer.editable = True
        self.layer.editable = False
        self._history_bytes = 0


class WindowPreview:
    """The preview of a large plane: a `PREVIEW_WINDOW`-pixel square of it, written as
    `LivePreview` writes a whole plane, moved (its translate) only when a preview falls outside it.
    A plane-sized layer would take hundreds of megabytes, and napari draws layers over 16384 px
    downsampled; moving the window costs ~20 ms of napari's bookkeeping, a write within it ~2 ms.
    Masks of coarse tiles (zoomed out) come with their `step`: the window's pixels then cover
    `step` plane pixels a side (its scale), so the window still holds objects as large as the view."""

    def __init__(self, layer: Labels, zoom: float = 1.0) -> None:
        """`layer`: a square Labels layer placed on the plane, its origin at the plane's (0, 0)."""
        self.size = layer.data.shape[0]
        self._scale = np.asarray(layer.scale)[-2:]
        self._translate = np.asarray(layer.translate)[-2:]
        self._origin = (0, 0)  # the window's first row and column, in plane pixels reduced `_step` times
        self._step = 1
        self._live = LivePreview(layer, zoom)

    @property
    def layer(self) -> Labels:
        return self._live.layer

    def set_zoom(self, zoom: float) -> None:
        """As `LivePreview.set_zoom` (a window pixel covers `step` plane pixels)."""
        self._live.set_zoom(zoom)

    def show(
        self,
        mask: np.ndarray | None,
        hint: np.ndarray | None = None,
        offset: Offset = (0, 0),
        hint_offset: Offset = (0, 0),
        step: int = 1,
    ) -> None:
        """As `LivePreview.show`; a pixel of `mask` and `hint` covers `step` plane pixels a side
        (their offsets, in plane pixels, are multiples of it)."""
        offset, hint_offset = (offset[0] // step, offset[1] // step), (hint_offset[0] // step, hint_offset[1] // step)
        box = _union(_bounding_box(mask, offset), _bounding_box(hint, hint_offset))
        if step != self._step:
            self._live.show(None)
            self._step = step
            self.layer.scale = self._scale * step
            self._origin = None
        if box is not None and not self._holds(box):
            self._live.show(None)
            centre = np.array([box[0] + box[1], box[2] + box[3]]) // 2
            self._origin = tuple(int(c) for c in np.maximum(centre - self.size // 2, 0))
            # A window pixel's centre is its `step` x `step` plane pixels' centre.
            self.layer.translate = self._translate + (np.array(self._origin) * step + (step - 1) / 2) * self._scale
        if self._origin is None:  # rescaled, and nothing to show yet
            return
        y, x = self._origin
        self._live.show(mask, hint, (offset[0] - y, offset[1] - x), (hint_offset[0] - y, hint_offset[1] - x))

    def _holds(self, box: tuple[int, int, int, int]) -> bool:
        if self._origin is None:
            return False
        (y, x), n = self._origin, self.size
        return y <= box[0] and box[1] <= y + n and x <= box[2] and box[3] <= x + n


def _preview_labels(
    mask: np.ndarray | None,
    hint: np.ndarray | None,
    offset: Offset,
    hint_offset: Offset,
    region: tuple[int, int, int, int],
    widths: tuple[int, int],
) -> np.ndarray:
    """The preview's labels inside `region` (which holds all of `mask` and `hint`), `widths` the
    lines' (across) and the dashes' (along): the object's outline inside its edge, the last pixel
    inward dark; the hint's pixels that the object lacks, dashed along where the two together end.
    Each is drawn in the box around it only (`region` may hold the last preview too)."""
    line, dash = widths
    r0, _, c0, _ = region
    labels = np.zeros((region[1] - r0, region[3] - c0), np.uint8)
    box = _bounding_box(mask, offset)
    if box is not None:
        obj = _crop(mask, offset, box)
        outer = _eroded(obj, line - 1)  # inside the outline but for its last pixel inward
        inside = _eroded(outer, 1)
        drawn = np.where(inside, np.uint8(OBJECT), np.uint8(EDGE if line > 1 else OUTLINE))
        drawn[~outer] = OUTLINE
        drawn[~obj] = 0
        labels[box[0] - r0 : box[1] - r0, box[2] - c0 : box[3] - c0] = drawn
    both = _union(box, _bounding_box(hint, hint_offset))
    if hint is not None and both is not None:
        obj = _crop(mask, offset, both)
        grown = obj | _crop(hint, hint_offset, both)
        added = grown & ~obj
        edge = added & ~_eroded(grown, line)
        rows, cols = np.ogrid[both[0] : both[1], both[2] : both[3]]
        dashes = ((rows // dash + cols // dash) % 2).astype(bool)
        drawn = labels[both[0] - r0 : both[1] - r0, both[2] - c0 : both[3] - c0]  # a view
        drawn[added] = HINT
        drawn[edge & dashes] = DASH
        drawn[edge & ~dashes] = GAP
    return labels


def _eroded(mask: np.ndarray, radius: int) -> np.ndarray:
    """The pixels of `mask` whose (2 `radius` + 1)-pixel square lies in `mask` (outside it is not)."""
    for axis in (0, 1) if radius > 0 else ():
        mask = _all_within(mask, radius, axis)
    return mask


def _all_within(mask: np.ndarray, radius: int, axis: int) -> np.ndarray:
    """Whether all of `mask` within `radius` along `axis` is set, outside counting as unset: runs of
    1, 2, 4, ... pixels, then the two runs of the longest that together cover 2 `radius` + 1."""

    def part(array: np.ndarray, start: int, stop: int) -> np.ndarray:
        return array[(slice(None),) * axis + (slice(start, stop),)]

    pad = [(0, 0), (0, 0)]
    pad[axis] = (radius, radius)
    runs, length, span, n = np.pad(mask, pad), 2 * radius + 1, 1, mask.shape[axis]
    while 2 * span <= length:
        runs = part(runs, 0, -span) & part(runs, span, None)
        span *= 2
    return part(runs, 0, n) & part(runs, length - span, length - span + n)


def _crop(mask: np.ndarray | None, offset: Offset, region: tuple[int, int, int, int]) -> np.ndarray:
    """`mask` (bool, placed at `offset` on the plane) inside `region`, False where it is not."""
    r0, r1, c0, c1 = region
    crop = np.zeros((r1 - r0, c1 - c0), bool)
    if mask is not None:
        (y, x), (h, w) = offset, mask.shape
        top, bottom, left, right = max(r0, y), min(r1, y + h), max(c0, x), min(c1, x + w)
        if top < bottom and left < right:
            crop[top - r0 : bottom - r0, left - c0 : right - c0] = mask[top - y : bottom - y, left - x : right - x]
    return crop


def _bounding_box(mask: np.ndarray | None, offset: Offset = (0, 0)) -> tuple[int, int, int, int] | None:
    """(r0, r1, c0, c1) on the plane around the set pixels of `mask` (placed at `offset`), or None."""
    if mask is None:
        return None
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    if not rows.size:
        return None
    y, x = offset
    return int(rows[0]) + y, int(rows[-1]) + 1 + y, int(cols[0]) + x, int(cols[-1]) + 1 + x


def _union(a: tuple[int, int, int, int] | None, b: tuple[int, int, int, int] | None) -> tuple[int, int, int, int] | None:
    if a is None or b is None:
        return a or b
    return min(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), max(a[3], b[3])
