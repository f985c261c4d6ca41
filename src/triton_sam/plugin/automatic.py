"""Segment all from the dock widget: every object on the plane on screen (or in the view) into a
new Labels layer, from the panel's engine and its cache of encoded planes.

The generator runs in a napari thread worker with a napari progress bar over its decoder
batches; stopping cancels between batches (and the running call). The layer is made only when
the run has finished, so a stopped run leaves nothing behind, and the objects layer is never
touched. The new layer covers just the region segmented, placed on its plane. A large plane is
segmented where the view is, tile by tile at native resolution. `AutomaticSegmentation.toggle` is
the Segment all button: it reads the panel's choices and says why a run cannot start.
"""

from __future__ import annotations

import napari
import numpy as np
from napari.layers import Image, Labels
from napari.utils import progress
from superqt.utils import ensure_main_thread

from ..automatic import AutomaticMaskGenerator, label_image
from ..engines import CancelToken, Engine
from ..errors import DecodeCancelled
from ..features import FeatureCache
from ..tiles import Tile, tile_grid, view_order
from . import layers
from .encoding import MAX_VIEW_TILES, PlaneEncoding
from .form import SettingsForm
from .workers import make_worker

AUTOMATIC_SUFFIX = " [triton-sam automatic]"
AUTOMATIC_KEY = "triton_sam_automatic"  # in the layer's metadata: image, plane, region, model, parameters
PLANE, VIEW = "plane", "view"
Region = tuple[int, int, int, int]  # rows y0:y1, columns x0:x1 of the plane


def region_of(image: Image, where: str) -> Region:
    """The part of the plane to segment: all of it, or what the canvas shows of it."""
    height, width = layers.plane_shape(image)
    if where == PLANE:
        return 0, 0, height, width
    y0, x0, y1, x1 = layers.visible_region(image)
    return max(y0, 0), max(x0, 0), min(y1, height), min(x1, width)


def nothing_found(options: dict) -> str:
    """What to change when Segment all kept no mask (no layer is added for none)."""
    return (
        "Segment all found no object, so no layer was added: lower 'Predicted IoU >' (now "
        f"{options['pred_iou_thresh']}) or 'Stability >=' (now {options['stability_score_thresh']}), "
        "or raise 'Points per side' to prompt smaller objects, and run it again."
    )


def add_automatic_layer(viewer, image: Image, index: tuple[int, ...], region: Region, labels: np.ndarray, record: dict) -> Labels:
    """A Labels layer holding `labels` (the region's objects) where the region lies on plane `index`."""
    y0, x0 = region[:2]
    data = labels.reshape((1,) * len(index) + labels.shape)
    translate = np.asarray(image.translate) + np.asarray((*index, y0, x0)) * np.asarray(image.scale)
    layer = viewer.add_labels(
        data,
        name=f"{image.name}{AUTOMATIC_SUFFIX}",
        scale=image.scale,
        translate=translate,
        metadata={AUTOMATIC_KEY: record},
    )
    objects = layers.existing_objects_layer(viewer, image)
    layers.place_above(viewer, objects if objects is not None else image, layer)
    return layer


class AutomaticSegmentation:
    """Runs Segment all for the widget, one run at a time; `stop` cancels the running one.

    `toggle` (the Segment all button) starts one from the panel's session, plane on screen and
    choices in `form`.
    """

    def __init__(self, viewer: napari.Viewer, encoding: PlaneEncoding, form: SettingsForm) -> None:
        self._viewer, self._encoding, self._form = viewer, encoding, form
        self._set_status, self._warn = form.set_status, form.status.warn
        self._cancel: CancelToken | None = None
        self._stopped_because: str | None = None

    @property
    def running(self) -> bool:
        return self._cancel is not None

    def toggle(self) -> None:
        """Segment everything on the plane on screen (or in the view) into a new labels layer;
        pressed again, stop."""
        if self.running:
            self.stop()
            return
        encoding, form = self._encoding, self._form
        if not encoding.ready:
            self._set_status("Press Start and wait for the plane to be encoded first.")
            return
        where, tiles = form.chosen_region(), None
        if encoding.tiled:  # the tiles in view, each at native resolution
            native = tile_grid(layers.plane_shape(encoding.image), encoding.session.spec.input_size)
            tiles, _ = view_order(native, Tile(*layers.visible_region(encoding.image)), around=0)
            if where != VIEW or len(tiles) > MAX_VIEW_TILES:
                self._set_status(
                    f"This plane is large: choose 'Visible region' and zoom in until at most {MAX_VIEW_TILES} tiles "
                    f"show (now {len(tiles)}); each is segmented at native resolution."
                )
                return
        session = encoding.session
        self.start(encoding.image, encoding.index, where, session.engine, session.cache, form.automatic_options(), tiles)
        if self.running:
            form.segment_all_button.setText("Stop segmenting")

    def start(
        self,
        image: Image,
        index: tuple[int, ...],
        where: str,
        engine: Engine,
        cache: FeatureCache,
        options: dict,
        tiles: list[Tile] | None = None,
    ) -> None:
        """Segment everything in `where` (PLANE or VIEW) of plane `index` of `image`; a large plane's
        `tiles` (those in view) are prompted each at native resolution, with their cached features."""
        if tiles:
            region = min(t.y0 for t in tiles), min(t.x0 for t in tiles), max(t.y1 for t in tiles), max(t.x1 for t in tiles)
        else:
            region = region_of(image, where)
        y0, x0, y1, x1 = region
        if y1 <= y0 or x1 <= x0:
            self._set_status("The view does not show the image: pan to it, or segment the whole plane.")
            return
        plane = layers.plane_data(image, index)  # read only where the generator crops it
        crops = [(t.x0, t.y0, t.x1, t.y1) for t in tiles] if tiles else [(x0, y0, x1, y1)]
        contrast = layers.encoding_contrast(image)
        generator = AutomaticMaskGenerator(engine.spec.model_id, engine=engine, cache=cache, **options)
        bar = progress(total=generator.batches(plane.shape[:2], crops), desc="triton-sam: segment all")
        cancel, over = CancelToken(), []

        @ensure_main_thread
        def advance(done: int, total: int) -> None:
            if over or cancel.cancelled:
                return  # news that arrives after the run's end (or stop) must not replace what it said
            self._set_status(f"Segment all: {done} of {total} batches of points decoded.")
            bar.update(done - bar.n)  # last: napari's progress bar may handle pending events (the run's end) here

        def run() -> np.ndarray:
            found = generator.find(plane, contrast, advance, cancel, crops)
            return label_image(found, (y1 - y0, x1 - x0), origin=(x0, y0))

        def returned(labels: np.ndarray) -> None:
            over.append(True)
            count = int(labels.max())
            if count == 0:
                self._set_status(nothing_found(options))
                return
            record = {
                "image": image.name,
                "plane": list(index),
                "region": list(region),
                "tiles": len(crops) if tiles else 0,
                "model": engine.spec.model_id,
                "parameters": options,
            }
            layer = add_automatic_layer(self._viewer, image, index, region, labels, record)
            self._set_status(f"Segment all: {count} object{'s' if count > 1 else ''} in the new layer '{layer.name}'.")

        def failed(error: Exception) -> None:
            over.append(True)
            if isinstance(error, DecodeCancelled):
                why = f" ({self._stopped_because})" if self._stopped_because else ""
                self._set_status(f"Segment all stopped{why}: nothing was written.")
            else:
                self._warn(f"Error in Segment all: {error}")

        def finished() -> None:
            over.append(True)
            bar.close()
            self._cancel = self._stopped_because = None
            self._form.segment_all_button.setText("Segment all")

        worker = make_worker(run)
        worker.returned.connect(returned)
        worker.errored.connect(failed)
        worker.finished.connect(finished)
        self._cancel = cancel
        self._set_status(f"Segment all: {where} of {y1 - y0} x {x1 - x0} px ...")
        worker.start()

    def stop(self, reason: str | None = None) -> None:
        """Cancel the running Segment all; `reason` goes in its last status."""
        if self._cancel is not None:
            self._stopped_because = reason
            self._cancel.cancel()
