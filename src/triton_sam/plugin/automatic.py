"""Segment all from the dock widget: every object on the plane on screen (or in the view), or on
every plane of a stack, into a new Labels layer, from the panel's engine and its cache of encoded
planes.

How the objects of a region are found is the run's `Method` (`automatic_methods`): prompts on
a grid of points, or a micro-sam model's instance decoder. It runs in a napari thread worker with
a napari progress bar over its steps (decoder batches; tiles); stopping cancels between steps
(and the running call). One plane's layer is made only when the run has finished, so a stopped
run leaves nothing behind, and the objects layer is never touched. The new layer covers just the
region segmented, placed on its plane. A large plane is segmented where the view is, tile by tile
at native resolution. On a stack, "All planes" segments every plane (the same region of each)
into one layer of the stack's shape, made with the first objects found: planes are written as
they finish, ids go on from plane to plane, and a stopped run keeps the planes done (one undo
step while napari's history of them stays small; see `StackLabels`). `AutomaticSegmentation.toggle`
is the Segment all button: it reads the panel's choices and says why a run cannot start.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from functools import partial

import napari
import numpy as np
from napari.layers import Image, Labels
from napari.utils import progress
from qtpy.QtWidgets import QPushButton
from superqt.utils import ensure_main_thread

from ..engines import CancelToken, Engine
from ..errors import DecodeCancelled, InvalidInputError
from ..features import FeatureCache
from ..tiles import Tile, tile_grid, view_order
from . import layers
from .automatic_decoder import InstanceDecoder
from .automatic_methods import Crop, Method, PointGrid, Region
from .encoding import MAX_VIEW_TILES, NOT_READY, PlaneEncoding
from .form import SettingsForm
from .segment_all_modes import DECODER
from .workers import make_worker

AUTOMATIC_SUFFIX = " [triton-sam automatic]"
AUTOMATIC_KEY = "triton_sam_automatic"  # in the layer's metadata: image, plane(s), region, model, parameters
PLANE, VIEW = "plane", "view"
MAX_STACK_LAYER_BYTES = 2 * 2**30  # the labels layer of a stack's Segment all (uint32) at most
UNDO_HISTORY_BYTES = 256 * 2**20  # napari's undo history of a stack run's writes at most: beyond, it is let go


def region_of(image: Image, where: str) -> Region:
    """The part of the plane to segment: all of it, or what the canvas shows of it."""
    height, width = layers.plane_shape(image)
    if where == PLANE:
        return 0, 0, height, width
    y0, x0, y1, x1 = layers.visible_region(image)
    return max(y0, 0), max(x0, 0), min(y1, height), min(x1, width)


def stack_shape(image: Image) -> tuple[int, ...]:
    """The sizes of the image's stacked axes (all but the plane's two and colour)."""
    return tuple(image.data.shape[: image.ndim - 2])


def add_automatic_layer(viewer, image: Image, data: np.ndarray, origin: tuple[int, ...], record: dict) -> Labels:
    """A Labels layer holding `data`, whose first pixel lies at `origin` (data indices of `image`)."""
    translate = np.asarray(image.translate) + np.asarray(origin) * np.asarray(image.scale)
    layer = viewer.add_labels(
        data, name=f"{image.name}{AUTOMATIC_SUFFIX}", scale=image.scale, translate=translate, metadata={AUTOMATIC_KEY: record}
    )
    objects = layers.existing_objects_layer(viewer, image)
    layers.place_above(viewer, objects if objects is not None else image, layer)
    return layer


class StackLabels:
    """The layer of a stack's Segment all, written a plane at a time on the GUI thread: made (zeros,
    `shape`: the stack's axes, then the region's rows and columns) with the first plane that has
    objects; each plane's ids follow on from those of the planes before. The writes are one undo
    step on the layer (napari's `block_history`, closed by `close`) until napari's history of them
    would pass `UNDO_HISTORY_BYTES`; then that history is let go and planes are written plainly."""

    def __init__(self, viewer, image: Image, shape: tuple[int, ...], region: Region, record: dict) -> None:
        self._viewer, self._image, self._shape, self._record = viewer, image, shape, record
        self._origin = (0,) * (len(shape) - 2) + tuple(region[:2])
        self.layer: Labels | None = None
        self.objects = 0  # ids used so far
        self.planes_done = record["planes"]  # indices of the planes written (in the layer's metadata)
        self.undoable = True
        self._history, self._history_bytes = ExitStack(), 0

    def write(self, index: tuple[int, ...], labels: np.ndarray) -> None:
        """Plane `index`'s objects (ids 1..n; 0: none) into the layer, as ids after those written."""
        self.planes_done.append(list(index))
        count = int(labels.max())
        if count == 0:
            return
        if self.layer is None:
            data = np.zeros(self._shape, np.uint32)
            self.layer = add_automatic_layer(self._viewer, self._image, data, self._origin, self._record)
            self._history.enter_context(self.layer.block_history())
        ys, xs = np.nonzero(labels)
        values = labels[ys, xs].astype(np.uint32) + np.uint32(self.objects)
        self.objects += count
        self._history_bytes += ys.size * (len(self._shape) * ys.itemsize + 2 * values.itemsize)  # indices, old and new
        if self.undoable and self._history_bytes > UNDO_HISTORY_BYTES:
            self._history.close()
            self.layer.editable = False  # (napari lets go of a layer's history when it stops being editable)
            self.layer.editable, self.undoable = True, False
        if self.undoable:
            self.layer.data_setitem(tuple(np.full(ys.size, i) for i in index) + (ys, xs), values)
        else:
            self.layer.data[index][ys, xs] = values
            self.layer.refresh()

    def close(self) -> None:
        """The run is over: its writes become one undo step (if still undoable)."""
        self._history.close()


class AutomaticSegmentation:
    """Runs Segment all for the widget, one run at a time; `stop` cancels the running one.

    `toggle` (the Segment all button) starts one from the panel's session, plane on screen and
    choices in `form`.
    """

    def __init__(
        self,
        viewer: napari.Viewer,
        encoding: PlaneEncoding,
        form: SettingsForm,
        objects_of: Callable[[Image], Labels | None] = lambda image: None,
    ) -> None:
        """`objects_of(image)`: the objects layer a run on `image` adds its objects to (a series image's:
        saved as it changes, as micro-sam commits an automatic segmentation); None: a new layer."""
        self._viewer, self._encoding, self._form, self._objects_of = viewer, encoding, form, objects_of
        self._set_status, self._warn = form.set_status, form.status.warn
        self._cancel: CancelToken | None = None
        self._stopped_because: str | None = None
        self._button = (form.segment_all_button, "Segment all")  # the running run's button, and its text when idle

    @property
    def running(self) -> bool:
        return self._cancel is not None

    def shown_on(self, button: QPushButton, busy: str, idle: str) -> None:
        """The run just started is stopped by `button`, which says `busy` until it ends, then `idle`."""
        if self.running:
            button.setText(busy)
            self._button = (button, idle)

    def started_by(self, button: QPushButton) -> bool:
        """Whether a run is going that `button` started (and stops)."""
        return self.running and self._button[0] is button

    def toggle(self) -> None:
        """Segment everything on the plane on screen (or in the view), or on every plane of a
        stack with "All planes", into a new labels layer; pressed again, stop."""
        if self.running:
            self.stop()
            return
        encoding, form = self._encoding, self._form
        if not encoding.ready:
            self._set_status(NOT_READY)
            return
        where, tiles = form.chosen_region(), None
        if encoding.tiled:  # the tiles in view, each at native resolution
            tiles = self.view_tiles()
            if where != VIEW or len(tiles) > MAX_VIEW_TILES:
                self._set_status(too_many_tiles(len(tiles), "choose 'Visible region' and "))
                return
        session, image = encoding.session, encoding.image
        method = self._method(session.engine, session.cache)
        if image.ndim > 2 and form.segments_all_planes():
            self.start_stack(image, where, method, tiles)
        else:
            self.start(image, encoding.index, where, method, tiles)
        self.shown_on(form.segment_all_button, "Stop segmenting", "Segment all")

    def view_tiles(self) -> list[Tile]:
        """The tiles of the large plane on screen that the view shows (segmented each at native resolution)."""
        image = self._encoding.image
        native = tile_grid(layers.plane_shape(image), self._encoding.session.spec.input_size)
        return view_order(native, Tile(*layers.visible_region(image)), around=0)[0]

    def _method(self, engine: Engine, cache: FeatureCache) -> Method:
        """The method the form chooses, with its parameters."""
        if self._form.segment_all_mode() == DECODER:
            return InstanceDecoder(engine, cache, self._form.decoder_settings())
        return PointGrid(engine, cache, self._form.automatic_options())

    def _prepare(self, image: Image, where: str, tiles: list[Tile] | None) -> tuple[Region, list[Crop]] | None:
        """The region to segment and its crops (each encoded on its own: the region, or the
        tiles); None when the region is empty (the status says so)."""
        if tiles:
            region = min(t.y0 for t in tiles), min(t.x0 for t in tiles), max(t.y1 for t in tiles), max(t.x1 for t in tiles)
        else:
            region = region_of(image, where)
        y0, x0, y1, x1 = region
        if y1 <= y0 or x1 <= x0:
            self._set_status("The view does not show the image: pan to it, or segment the whole plane.")
            return None
        crops = [(t.x0, t.y0, t.x1, t.y1) for t in tiles] if tiles else [(x0, y0, x1, y1)]
        return region, crops

    def start(
        self,
        image: Image,
        index: tuple[int, ...],
        where: str,
        method: Method,
        tiles: list[Tile] | None = None,
    ) -> None:
        """Segment everything in `where` (PLANE or VIEW) of plane `index` of `image` by `method`; a
        large plane's `tiles` (those in view) are each encoded at native resolution (cached features)."""
        prepared = self._prepare(image, where, tiles)
        if prepared is None:
            return
        region, crops = prepared
        y0, x0, y1, x1 = region
        plane = layers.plane_data(image, index)  # read only where the method's crops are
        contrast = layers.encoding_contrast(image)
        bar = progress(total=method.steps(plane.shape[:2], crops), desc="triton-sam: segment all")
        cancel, over = CancelToken(), []

        @ensure_main_thread
        def advance(done: int, total: int) -> None:
            if over or cancel.cancelled:
                return  # news that arrives after the run's end (or stop) must not replace what it said
            self._set_status(method.progress(done, total))
            bar.update(done - bar.n)  # last: napari's progress bar may handle pending events (the run's end) here

        def run() -> np.ndarray:
            return method.labels(plane, contrast, advance, cancel, crops, region)

        def returned(labels: np.ndarray) -> None:
            over.append(True)
            count = int(labels.max())
            if count == 0:
                self._set_status(method.nothing_found())
                return
            record = _record(image, method, region, crops if tiles else [], plane=list(index))
            into = self._objects_of(image)
            if into is not None:
                count = self._add(into, index, labels, (y0, x0), record)
                self._set_status(f"{method.title}: {count} objects added to '{into.name}' (Ctrl+Z on it undoes them).")
                return
            data = labels.reshape((1,) * len(index) + labels.shape)
            layer = add_automatic_layer(self._viewer, image, data, (*index, y0, x0), record)
            self._set_status(f"{method.title}: {count} object{'s' if count > 1 else ''} in the new layer '{layer.name}'.")

        def failed(error: Exception) -> None:
            over.append(True)
            if isinstance(error, DecodeCancelled):
                why = f" ({self._stopped_because})" if self._stopped_because else ""
                self._set_status(f"{method.title} stopped{why}: nothing was written.")
            else:
                self._warn(f"Error in {method.title}: {error}{_hint(method, error)}")

        worker = make_worker(run)
        worker.returned.connect(returned)
        worker.errored.connect(failed)
        worker.finished.connect(partial(self._finished, over, bar))
        self._cancel = cancel
        self._set_status(f"{method.title}: {where} of {y1 - y0} x {x1 - x0} px ...")
        worker.start()

    def start_stack(self, image: Image, where: str, method: Method, tiles: list[Tile] | None = None) -> None:
        """Segment everything in `where` (PLANE or VIEW; of large planes the `tiles` in view) on
        every plane of `image` by `method`, in the stack's order, into one layer (`StackLabels`) of
        the stack's shape over that region; each plane is written as it is done."""
        prepared = self._prepare(image, where, tiles)
        if prepared is None:
            return
        region, crops = prepared
        y0, x0, y1, x1 = region
        shape = (*stack_shape(image), y1 - y0, x1 - x0)
        if 4 * int(np.prod(shape)) > MAX_STACK_LAYER_BYTES:
            self._set_status(
                f"{method.title} on every plane would make a labels layer of {4 * np.prod(shape) / 2**30:.1f} GiB "
                f"(more than {MAX_STACK_LAYER_BYTES / 2**30:g} GiB): choose 'Visible region' and zoom in, or untick "
                "'All planes' to segment the plane on screen."
            )
            return
        planes = list(np.ndindex(*shape[:-2]))
        contrast = layers.encoding_contrast(image)
        per_plane = method.steps(layers.plane_shape(image), crops)
        bar = progress(total=per_plane * len(planes), desc="triton-sam: segment all planes")
        cancel, over, failures = CancelToken(), [], []
        record = _record(image, method, region, crops if tiles else [], planes=[])
        written = StackLabels(self._viewer, image, shape, region, record)

        def say_progress(number: int) -> None:
            self._set_status(f"{method.title}: plane {number} of {len(planes)}, {written.objects} objects so far.")

        @ensure_main_thread
        def advance(number: int, done: int, total: int) -> None:
            if over or cancel.cancelled:
                return  # news that arrives after the run's end (or stop) must not replace what it said
            say_progress(number)
            bar.update((number - 1) * per_plane + done - bar.n)  # last (see `start`)

        def run():
            for number, index in enumerate(planes, 1):
                if cancel.cancelled:
                    return
                plane = layers.plane_data(image, index)  # read only where the method's crops are
                try:
                    labels = method.labels(plane, contrast, partial(advance, number), cancel, crops, region)
                except DecodeCancelled:
                    return
                yield index, labels

        into = self._objects_of(image)

        def write(result: tuple[tuple[int, ...], np.ndarray]) -> None:
            if cancel.cancelled:  # stopped: what was written stays (a plane done as the run stopped is let go)
                return
            if into is None:
                written.write(*result)
            else:  # a plane at a time, each its own undo step
                written.planes_done.append(list(result[0]))
                written.objects += self._add(into, *result, (y0, x0), record)
                written.layer = into if written.objects else None
            if len(written.planes_done) < len(planes):
                say_progress(len(written.planes_done) + 1)

        def failed(error: Exception) -> None:
            failures.append(error)
            on_plane = f"on plane {len(written.planes_done) + 1} of {len(planes)}"
            self._warn(f"Error in {method.title} {on_plane}: {error}{_hint(method, error)}")

        def finished() -> None:
            written.close()
            if not failures:
                self._set_status(self._stack_outcome(written, len(planes), method, cancel.cancelled, into is not None))

        worker = make_worker(run)
        worker.yielded.connect(write)
        worker.errored.connect(failed)
        worker.finished.connect(finished)
        worker.finished.connect(partial(self._finished, over, bar))
        self._cancel = cancel
        say_progress(1)
        worker.start()

    def _add(self, into: Labels, index: tuple[int, ...], labels: np.ndarray, origin: tuple[int, int], record: dict) -> int:
        """`labels`' objects added to the objects layer `into`; commits go on after their ids."""
        count = layers.write_labels(into, index, labels, origin, record)
        session = self._encoding.session
        if session is not None:  # (it segments the image `into` belongs to: see `objects_of`)
            session.next_object_id = max(session.next_object_id, int(np.max(into.data)) + 1)
        return count

    def _stack_outcome(self, written: StackLabels, planes: int, method: Method, stopped: bool, added: bool = False) -> str:
        """What a stack's run ended with, for the status (`added`: to the objects layer)."""
        done = len(written.planes_done)
        why = f" ({self._stopped_because})" if self._stopped_because else ""
        if written.layer is None and not stopped:
            return method.nothing_found()
        if written.layer is None:
            return f"{method.title} stopped{why} after {done} of {planes} planes: no object found in them, so no layer was added."
        if added:
            ended = " stopped" + why if stopped else ""
            into = written.layer.name
            return f"{method.title}{ended}: {written.objects} objects on {done} of {planes} planes added to '{into}'."
        undo = "Ctrl+Z on it undoes the run" if written.undoable else "too large to undo: delete the layer to undo"
        return (
            f"{method.title}{' stopped' + why if stopped else ''}: {written.objects} objects on {done} of {planes} planes "
            f"in the new layer '{written.layer.name}' ({undo})."
        )

    def _finished(self, over: list, bar: progress) -> None:
        """The run ended: its bar and button let go, and the engine label follows the engine (with
        Auto, a run that the server's death moved to the local engine said otherwise)."""
        over.append(True)
        bar.close()
        self._cancel = self._stopped_because = None
        button, idle = self._button
        button.setText(idle)
        if self._encoding.session is not None:
            self._form.status.show_engine(self._encoding.session.engine.describe())

    def stop(self, reason: str | None = None) -> None:
        """Cancel the running Segment all; `reason` goes in its last status."""
        if self._cancel is not None:
            self._stopped_because = reason
            self._cancel.cancel()


def too_many_tiles(count: int, choose: str = "") -> str:
    """What to do when a large plane's run would cover `count` tiles (more than MAX_VIEW_TILES, or
    the whole plane where `choose` says to choose the visible region)."""
    return (
        f"This plane is large: {choose}zoom in until at most {MAX_VIEW_TILES} tiles show (now {count}); "
        "each is segmented at native resolution."
    )


def _record(image: Image, method: Method, region: Region, crops: list, **where) -> dict:
    """How a Segment all layer was made (its metadata): image, plane (or planes done), region, model, method, parameters."""
    return {
        "image": image.name,
        **where,
        "region": list(region),
        "tiles": len(crops),
        "model": method.model,
        "method": method.name,
        "parameters": method.parameters,
    }


def _hint(method: Method, error: Exception) -> str:
    """The way out `method` gives after `error` (an InvalidInputError: e.g. no decoder where it runs)."""
    return method.failure_hint if isinstance(error, InvalidInputError) else ""
