"""The panel's "Series" section: a folder of images annotated one after another, each commit saved
at once (`series_saving`), resumed where it was left, exported for training (docs/series.md).

It opens one image at a time as an image layer with its saved labels as its objects layer, and
starts the panel on it (`start_on`: the engine running is kept, so the next image, encoded in the
background meanwhile, is ready at once). Switching images with an object in progress is refused:
the status says to commit or discard it first, so nothing the user made is lost or stored unasked.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import napari
import numpy as np
from napari.layers import Image
from napari.layers.utils.layer_utils import calc_data_range
from qtpy.QtWidgets import QFileDialog, QGridLayout, QLabel, QLineEdit, QPushButton, QWidget

from ..errors import InvalidInputError
from ..planes import cache_plane
from ..series import DONE, OUTPUT, AnnotationSeries
from . import layers
from .encoding import PlaneEncoding
from .form import SettingsForm
from .series_saving import SeriesSaving
from .workers import make_worker

NO_SERIES = "Open a folder of images first (Series: Open folder)."
IN_PROGRESS = "An object is in progress on this image: commit it ({commit}) or discard it ({discard}) first, then move on."


class SeriesPanel:
    """The Series section's fields (`group`, which the form folds in a section) and what its buttons
    and keys do; `start_on(layer)` starts the panel on an image layer, `encoding` holds the session
    running and the image it segments."""

    def __init__(
        self, viewer: napari.Viewer, form: SettingsForm, encoding: PlaneEncoding, start_on: Callable[[Image], None]
    ) -> None:
        self.viewer, self.form, self.encoding, self._start_on = viewer, form, encoding, start_on
        self.series: AnnotationSeries | None = None
        self.image: Image | None = None  # the series image shown
        self._opening: int | None = None  # the index being read
        self._prefetched: int | None = None  # the index whose plane was encoded ahead
        self._shown: tuple | None = None  # (series, index) of the image shown
        self.saving = SeriesSaving(form, self._save_failed, self._show_progress)
        self.group = QWidget()
        self.output_field = QLineEdit(placeholderText=f"{OUTPUT} beside the images")
        self.output_field.setToolTip(f"Where the labels are saved; empty: a folder {OUTPUT} beside the images.")
        self.progress_label = QLabel(NO_SERIES)
        self.progress_label.setWordWrap(True)
        buttons = {
            "open": ("Open folder...", self.choose_folder),
            "output": ("Labels folder...", self.choose_output),
            "previous": ("Previous", self.previous),
            "next": ("Next", self.next),
            "done": ("Done, next", self.done),
            "export": ("Export for training...", self.choose_export),
        }
        self.buttons = {name: QPushButton(text) for name, (text, _) in buttons.items()}
        for name, (_, slot) in buttons.items():
            self.buttons[name].clicked.connect(lambda _=False, slot=slot: slot())
        grid = QGridLayout(self.group)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.addWidget(self.buttons["open"], 0, 0)
        grid.addWidget(self.buttons["output"], 0, 1)
        grid.addWidget(self.output_field, 1, 0, 1, 3)
        for column, name in enumerate(("previous", "next", "done")):
            grid.addWidget(self.buttons[name], 2, column)
        grid.addWidget(self.buttons["export"], 0, 2)
        grid.addWidget(self.progress_label, 3, 0, 1, 3)
        self._enable()
        viewer.layers.events.inserted.connect(self._layer_added)

    # --- opening --------------------------------------------------------------------------------

    def choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self.group, "Folder of images to annotate")
        if folder:
            self.open(folder)

    def choose_output(self) -> None:
        folder = QFileDialog.getExistingDirectory(self.group, "Folder to save the labels in")
        if folder:
            self.output_field.setText(folder)

    def open(self, images: str | Path | list, output: str | Path | None = None) -> None:
        """Open `images` (a folder, or a list of files) as a series, labels in `output` (the panel's
        field; empty: beside the images), and show its current image. Bad input changes nothing."""
        if not self._may_leave():
            return
        output = output or self.output_field.text().strip() or None
        try:
            series = AnnotationSeries.open(images, output)
        except (InvalidInputError, OSError) as error:
            self.form.status.warn(f"Series not opened: {error}")
            return
        self.saving.watch(None)
        self.series = series
        self.form.set_status(f"Series of {len(series)} images, labels in {series.output}: {series.progress}.")
        self.show(series.index)

    # --- moving ---------------------------------------------------------------------------------

    def next(self) -> None:
        if self._ready_to_move():
            self.show(min(self.series.index + 1, len(self.series) - 1))

    def previous(self) -> None:
        if self._ready_to_move():
            self.show(max(self.series.index - 1, 0))

    def done(self) -> None:
        """Mark the image shown done and show the next one (the last stays)."""
        if not self._ready_to_move():
            return
        self.series.mark_done()
        self._show_progress()
        self.show(min(self.series.index + 1, len(self.series) - 1))

    def show(self, index: int) -> None:
        """Read image `index` and its labels (off the GUI thread), then open it and start on it."""
        if self._shown == (self.series, index) and self.image in self.viewer.layers:
            self._show_progress()
            return
        self._opening = index
        self.form.set_status(f"Opening {self.series.images[index].name} ...")
        series = self.series
        worker = make_worker(lambda: (series.image(index), series.labels(index)))
        worker.returned.connect(lambda read: self._opened(series, index, *read))
        worker.errored.connect(lambda error: self._open_failed(series, index, error))
        worker.start()

    def _opened(self, series: AnnotationSeries, index: int, pixels: np.ndarray, labels: np.ndarray) -> None:
        """Image `index` was read: it replaces the image shown (whose changes are saved first)."""
        if series is not self.series or index != self._opening:
            return  # another image (or series) was asked for meanwhile
        self._opening = None
        series.go_to(index)
        old, old_objects = self.image, self._objects_layer()
        name = series.images[index].name
        image = self.viewer.add_image(pixels, name=name, rgb=pixels.ndim == len(labels.shape) + 1)
        objects = layers.objects_layer(self.viewer, image, _label_type(labels, self.encoding.session, image))
        objects.data = labels.astype(objects.data.dtype)
        self.image, self._shown = image, (series, index)
        self.saving.watch(series, index, objects)
        self._start_on(image)
        for axis, size in enumerate(image.data.shape[: image.ndim - 2]):  # a stack opens at its middle plane
            self.viewer.dims.set_current_step(axis, size // 2)
        for layer in (old_objects, old):
            if layer is not None and layer in self.viewer.layers:
                self.viewer.layers.remove(layer)
        self.viewer.reset_view()
        self._show_progress()

    def _open_failed(self, series: AnnotationSeries, index: int, error: Exception) -> None:
        if series is self.series and index == self._opening:
            self._opening = None
        self.form.status.warn(f"{series.images[index].name} could not be opened: {error}")

    def plane_shown(self) -> None:
        """A plane of the image segmented is encoded: if it is the series image, the next image's
        plane (whole planes only; of a stack, the one napari shows first) is encoded into the session's
        features cache in the background, once, so that Next is ready at once."""
        session, series = self.encoding.session, self.series
        if session is None or series is None or not self._segmented() or series.index + 1 >= len(series):
            return
        index = series.index + 1
        if self._prefetched == index or session.is_tiled(series.shape(index)[-2:]):
            return
        self._prefetched = index

        def encode() -> None:
            pixels = series.image(index)
            rgb = pixels.ndim == len(series.shape(index)) + 1
            plane = pixels[tuple(n // 2 for n in pixels.shape[: pixels.ndim - 2 - rgb])]
            if session.closed:
                return
            contrast = None if rgb else tuple(float(c) for c in calc_data_range(pixels, rgb))  # as napari's first
            cache_plane(plane, session.cache, contrast_limits=contrast)

        make_worker(encode).start()  # (a failure here only means the encode is done when the image is shown)

    # --- saving and export ----------------------------------------------------------------------

    def _layer_added(self, event) -> None:
        """The series image's objects layer made again (the user deleted it; a commit makes it anew):
        it is watched for saving from now on, and takes the labels saved (deleting a layer deletes no
        label), read after the saves queued, where it has none of its own."""
        layer = event.value
        if self._shown is None or self._shown[0] is not self.series or self.saving.watches(layer):
            return
        if self.image not in self.viewer.layers or layer is not self._objects_layer():
            return
        series, index = self._shown
        self.saving.watch(series, index, layer)
        self.saving.run(partial(series.labels, index), partial(self._take_saved, layer), self._save_failed)

    def objects_of(self, image: Image):
        """The objects layer Segment all on `image` adds its objects to, so that they are saved with the
        series (made if need be): the series image's; None for another image."""
        return layers.objects_layer(self.viewer, image, np.uint32) if self._segmented() and image == self.image else None

    def _take_saved(self, layer, saved: np.ndarray) -> None:
        """`saved` (the image's labels on disk) into `layer` where it has no label."""
        if layer not in self.viewer.layers:
            return
        data = np.asarray(layer.data)
        dtype = data.dtype if saved.max(initial=0) <= np.iinfo(data.dtype).max else np.uint32
        layer.data = np.where(data == 0, saved, data).astype(dtype)
        if self._segmented():  # new objects take ids after the saved ones
            session = self.encoding.session
            session.next_object_id = max(session.next_object_id, int(layer.data.max()) + 1)

    def committed(self, committed, plane: tuple[int, ...]) -> None:
        """An object was committed on the image segmented: saved at once if it is the series image."""
        if self._segmented():
            self.saving.committed(committed, plane)
            self._show_progress()

    def choose_export(self) -> None:
        if self.series is None:
            self.form.set_status(NO_SERIES)
            return
        folder = QFileDialog.getExistingDirectory(self.group, "Folder to export the training data to")
        if folder:
            self.export(folder)

    def export(self, folder: str | Path) -> None:
        """Export the images annotated (instance label TIFFs and a COCO JSON) into `folder`, once the
        saves under way are done (they run in order)."""
        if self.series is None:
            self.form.set_status(NO_SERIES)
            return
        self.saving.flush()
        series = self.series
        self.form.set_status(f"Exporting to {folder} ...")
        self.saving.run(
            lambda: series.export_training(folder),
            lambda path: self.form.set_status(f"Exported the images annotated for training: {path} and its labels."),
            lambda error: self.form.status.warn(f"Export failed: {error}"),
        )

    # --- internals ------------------------------------------------------------------------------

    def _ready_to_move(self) -> bool:
        if self.series is None:
            self.form.set_status(NO_SERIES)
            return False
        return self._may_leave()

    def _may_leave(self) -> bool:
        """Whether the image shown may be left: no object is in progress on it."""
        session = self.encoding.session
        if self._segmented() and session.objects_in_progress(partial(layers.of_layer, self.encoding.image)):
            keys = self.form.keys
            self.form.status.warn(IN_PROGRESS.format(commit=keys["commit"], discard=keys.get("discard", "discard")))
            return False
        return True

    def _segmented(self) -> bool:
        """Whether the panel segments the series image shown (== : napari may hand out proxies of a layer)."""
        return self.image is not None and self.encoding.session is not None and self.encoding.image == self.image

    def _objects_layer(self):
        return layers.existing_objects_layer(self.viewer, self.image) if self.image in self.viewer.layers else None

    def _save_failed(self, error: Exception) -> None:
        self.form.status.warn(f"Saving failed: {error} Your labels are kept in the layer and saved with the next change.")

    def _show_progress(self) -> None:
        """ "Image 3 of 5 (name) · 2 done · saving" under the buttons."""
        self._enable()
        series = self.series
        if series is None:
            return
        progress = series.progress
        saved = "saving ..." if self.saving.pending else "all saved"
        text = f"Image {series.index + 1} of {len(series)} ({series.current.name}) · {progress.done} done · {saved}"
        self.progress_label.setText(text + (" · this image is done" if series.status() == DONE else ""))

    def _enable(self) -> None:
        opened = self.series is not None
        for name in ("previous", "next", "done", "export"):
            self.buttons[name].setEnabled(opened)


def _label_type(labels: np.ndarray, session, image: Image) -> type:
    """uint16 for a large plane's labels while its ids fit (napari colours them on the GPU), else uint32."""
    large = session is not None and session.is_tiled(layers.plane_shape(image))
    return np.uint16 if large and labels.max(initial=0) < 2**16 else np.uint32
