"""Propagate from the dock widget: labels' masks on the plane on screen, tracked through the stack.

Tracking runs in a napari thread worker (`video.propagate_masks`); each plane's result is written
into the objects layer on the GUI thread as it comes, whole (a cancelled run stops between
planes), never over a label not tracked. One run is one undo step on the objects layer. Each set
of labels tracked together keeps its own tracking state, so earlier prompts (corrections
included) guide the next run. `LabelPropagation.toggle` is the Propagate button: it reads the
panel's choices and says why a run cannot start.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import napari
import numpy as np
from napari.layers import Image, Labels

from ..features import FeatureCache
from ..image import lazy_index
from ..registry import ModelSpec
from ..video import VolumePredictor, VolumeState
from ..video.propagation import BACKWARDS, FORWARDS, propagate_masks
from . import layers
from .encoding import NOT_READY, PlaneEncoding
from .form import SettingsForm
from .workers import make_worker


def stack_axis(image: Image, last_used: int, viewer_ndim: int) -> int | None:
    """The layer axis planes are stacked along: the slider used last if it moves this layer's
    planes, else the first slider's; None for a single plane."""
    stacked = image.ndim - 2
    if stacked < 1:
        return None
    axis = last_used - (viewer_ndim - image.ndim)
    return axis if 0 <= axis < stacked else 0


def stack_data(image: Image, index: tuple[int, ...], axis: int):
    """The planes through `index` along `axis` (level 0 of a multiscale layer), lazily for dask/zarr."""
    data = image.data[0] if image.multiscale else image.data
    return lazy_index(data, index[:axis] + (slice(None),) + index[axis + 1 :])


class LabelPropagation:
    """Runs propagations for the widget, one at a time; `stop` ends the running one between planes.

    `toggle` (the Propagate button) starts one from the panel's session, plane on screen and
    choices in `form`; `on_finished` is told when a run has ended (its button says so already).
    """

    def __init__(
        self, viewer: napari.Viewer, encoding: PlaneEncoding, form: SettingsForm, *, on_finished: Callable[[], None]
    ) -> None:
        self._viewer, self._encoding, self._form = viewer, encoding, form
        self._set_status, self._warn = form.set_status, form.status.warn
        self._on_finished = on_finished
        self._predictor: VolumePredictor | None = None
        self._predictor_for: tuple | None = None
        self._states: dict[tuple, VolumeState] = {}
        self._worker = None
        self._image: Image | None = None  # the running propagation's
        self._stopped_because: str | None = None
        self._closing: list[VolumePredictor] = []  # closed when the running propagation ends
        self._history = ExitStack()

    @property
    def running(self) -> bool:
        return self._worker is not None

    def toggle(self) -> None:
        """Track the objects layer's selected label (or every label on the plane on screen) from
        the plane on screen through the stack; pressed again, stop (between planes)."""
        if self.running:
            self.stop()
            return
        encoding, form = self._encoding, self._form
        objects = layers.existing_objects_layer(self._viewer, encoding.image) if encoding.ready else None
        labels = self._labels_to_propagate(objects) if objects is not None else []
        problem = self._problem(labels)
        if problem:
            self._set_status(problem)
            return
        self.start(
            encoding.image,
            objects,
            encoding.index,
            self._axis(),
            labels,
            form.chosen_direction(),
            form.chosen_max_planes(),
            (form.chosen_model(), form.chosen_repository()),
            encoding.session.cache,  # the planes the panel encoded, on its engine (local or Triton)
        )
        form.propagate_button.setText("Stop propagating")

    def _axis(self) -> int | None:
        """The axis of the panel's image that the sliders step along (None for a single plane)."""
        return stack_axis(self._encoding.image, self._viewer.dims.last_used, self._viewer.dims.ndim)

    def _problem(self, labels: list[int]) -> str | None:
        """Why Propagate cannot run now with `labels`, or None."""
        if not self._encoding.ready:
            return NOT_READY
        if self._axis() is None:
            return "Propagate needs a stack of planes (a 3D or higher image layer)."
        if not labels and self._form.propagates_all():
            return "Commit objects on this plane to propagate them."
        if not labels:
            return "Commit an object on this plane (or select a label present on it in the objects layer) to propagate it."
        if self._form.chosen_model().family != "sam2":
            return "Propagation through planes needs a SAM2.1 model."
        return None

    def _labels_to_propagate(self, objects: Labels) -> list[int]:
        """The labels Propagate tracks: every label on the plane on screen, or the selected one if it is there."""
        plane = np.asarray(objects.data[self._encoding.index])
        if self._form.propagates_all():
            return [int(label) for label in np.unique(plane) if label != 0]
        selected = int(objects.selected_label)
        return [selected] if selected != 0 and np.any(plane == selected) else []

    def start(
        self,
        image: Image,
        objects: Labels,
        index: tuple[int, ...],
        axis: int,
        labels: list[int],
        direction: str,
        max_planes: int | None,
        model: tuple[ModelSpec, Path],
        cache: FeatureCache | None,
    ) -> None:
        """Track `labels` (together: the masks of a plane never overlap) from plane `index` of
        `objects` along `axis` of `image`."""
        region = np.asarray(objects.data[index])
        masks = {label: region == label for label in labels}
        contrast = layers.encoding_contrast(image)
        rest = index[:axis] + index[axis + 1 :]
        state_key = (id(image), axis, rest, contrast, tuple(labels))
        frame = index[axis]
        what = f"label {labels[0]}" if len(labels) == 1 else f"{len(labels)} labels"

        def run():
            predictor = self._volume_predictor(model, cache)
            state = self._states.get(state_key)
            if state is None:
                state = predictor.init_state(stack_data(image, index, axis), contrast_limits=contrast)
                self._states[state_key] = state
            yield from propagate_masks(predictor, state, frame, masks, direction, max_planes)

        total = _planes_to_track(
            image.data.shape[axis] if not image.multiscale else image.data[0].shape[axis], frame, direction, max_planes
        )
        worker = make_worker(run, progress={"total": total, "desc": "triton-sam: propagating"})
        done, failed = [], []

        def write(result) -> None:
            plane, plane_masks = result
            target = index[:axis] + (plane,) + index[axis + 1 :]
            layers.write_tracked(objects, target, plane_masks)
            done.append(plane)
            self._set_status(f"Propagating {what}: plane {plane} ({len(done)} of {total}).")

        def finished() -> None:
            self._history.close()  # the run's writes become one undo step
            self._worker = None
            while self._closing:
                self._closing.pop().close()
            if done:
                records = objects.metadata.setdefault(layers.PROVENANCE_KEY, {})
                for label in labels:
                    records.setdefault(int(label), {})["propagated"] = {
                        "from_plane": list(index),
                        "axis": axis,
                        "direction": direction,
                        "model": model[0].model_id,
                        "with_labels": [int(other) for other in labels],
                    }
            if not failed:  # an error stays in the status line
                why = f"; stopped: {self._stopped_because}" if self._stopped_because else ""
                self._set_status(
                    f"{what.capitalize()} propagated to {len(done)} planes{why} (Ctrl+Z on the objects layer undoes it)."
                )
            self._image = self._stopped_because = None
            self._form.propagate_button.setText("Propagate label")
            self._on_finished()

        def error(exception: Exception) -> None:
            failed.append(exception)
            self._warn(f"Error while propagating {what} (planes done: {len(done)}): {exception}")

        worker.yielded.connect(write)
        worker.errored.connect(error)
        worker.finished.connect(finished)
        self._history = ExitStack()
        self._history.enter_context(objects.block_history())
        self._worker, self._image = worker, image
        self._set_status(f"Propagating {what} from plane {frame} ({direction}) ...")
        worker.start()

    def stop(self, reason: str | None = None) -> None:
        """End the running propagation after the plane being tracked; `reason` goes in its last status."""
        if self._worker is not None:
            self._stopped_because = reason
            self._worker.quit()

    def image_changed(self, image: Image) -> None:
        """`image`'s pixels were replaced: its tracking states hold the old planes, so they go, and a
        run through it stops (the planes it wrote stay, one undo step)."""
        self._states = {key: state for key, state in self._states.items() if key[0] != id(image)}
        if self._image is image:
            self.stop("the image's data changed")

    def close(self) -> None:
        """Stop, and let go of the tracking states and the predictor (once a running plane is done)."""
        predictor, self._predictor, self._predictor_for = self._predictor, None, None
        self._states.clear()
        if predictor is None:
            return
        if self._worker is None:
            predictor.close()
        else:  # (a slot connected to a started worker might not be called: see `make_worker`)
            self._closing.append(predictor)
            self.stop()

    def _volume_predictor(self, model: tuple[ModelSpec, Path], cache: FeatureCache | None) -> VolumePredictor:
        """One predictor per model and repository (made in the worker: it loads four graphs)."""
        key = (model[0].model_id, str(model[1]), id(cache))
        if self._predictor is None or self._predictor_for != key:
            if self._predictor is not None:
                self._predictor.close()
            self._states.clear()
            self._predictor = VolumePredictor(
                model[0].model_id, model_repository=model[1], cache=cache, add_all_frames_to_correct_as_cond=True
            )
            self._predictor_for = key
        return self._predictor


def _planes_to_track(planes: int, frame: int, direction: str, max_planes: int | None) -> int:
    reach = planes if max_planes is None else max_planes
    forwards = min(reach, planes - 1 - frame) if direction != BACKWARDS else 0
    backwards = min(reach, frame) if direction != FORWARDS else 0
    return forwards + backwards
