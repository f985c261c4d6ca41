"""Saving a series image's objects layer as it changes, off the GUI thread.

A commit is saved at once (`AnnotationSeries.save_object`, from the committed object); every other
change of the layer (napari's paint, fill and erase, undo and redo, Propagate) is saved once the
layer rests for `SETTLE_MS` (`AnnotationSeries.save_changes`: what differs from the saved labels, in
the region napari says changed, or the whole layer where it does not say). Saves run one at a time,
in order, in napari thread workers: the GUI thread only queues them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import partial

from napari.layers import Labels
from qtpy.QtCore import QObject, QTimer

from ..series import AnnotationSeries
from . import layers
from .workers import make_worker

SETTLE_MS = 300  # a paint stroke sends a change for each mouse move: saved once the layer rests this long
Region = tuple[slice, ...]


class SeriesSaving:
    """Saves the objects layer `watch` is given into its series image; `pending` saves are queued or
    running. `failed(error)` is told of a save that failed (its edits stay in the layer and are saved
    with the next change); `on_saved()` once all saves are done."""

    def __init__(self, parent: QObject, failed: Callable[[Exception], None], on_saved: Callable[[], None]) -> None:
        self._failed, self._on_saved = failed, on_saved
        self._jobs: deque[tuple] = deque()  # (job, returned, failed)
        self._running = None
        self._watched: tuple[AnnotationSeries, int, Labels] | None = None
        self._dirty: list[Region | None] = []  # regions changed since the last save of them (None: anywhere)
        self._timer = QTimer(parent, singleShot=True, interval=SETTLE_MS)
        self._timer.timeout.connect(self.flush)

    @property
    def pending(self) -> int:
        return len(self._jobs) + (self._running is not None) + bool(self._dirty)

    def watch(self, series: AnnotationSeries | None, index: int = 0, layer: Labels | None = None) -> None:
        """Save `layer`'s changes into image `index` of `series` from now on (None: stop); the changes
        of the layer watched before are queued first."""
        self.flush()
        if self._watched is not None:
            for event, slot in self._slots(self._watched[2]):
                event.disconnect(slot)
        self._watched = (series, index, layer) if series is not None and layer is not None else None
        if layer is not None:
            for event, slot in self._slots(layer):
                event.connect(slot)

    def watches(self, layer: Labels) -> bool:
        """Whether `layer` is the layer watched."""
        return self._watched is not None and self._watched[2] is layer

    def committed(self, committed, plane: tuple[int, ...]) -> None:
        """An object was committed into the watched layer, on `plane`: saved at once."""
        if self._watched is not None:
            series, index, _ = self._watched
            self._queue(partial(series.save_object, index, committed, plane))

    def flush(self) -> None:
        """Queue the save of what changed in the watched layer (without waiting for it to rest)."""
        self._timer.stop()
        if self._watched is None or not self._dirty:
            return
        series, index, layer = self._watched
        region, self._dirty = _union(self._dirty), []
        provenance = dict(layer.metadata.get(layers.PROVENANCE_KEY, {}))
        self._queue(partial(series.save_changes, index, layer.data, provenance, region))

    def _slots(self, layer: Labels) -> list[tuple]:
        """The layer's events that say its labels changed, and what each calls: `paint` (napari's tools,
        `data_setitem`: commits, Propagate) with the region changed, `set_data` (undo, redo; also a
        slider move: nothing differs then) and `data` (replaced) anywhere."""
        return [(layer.events.paint, self._painted), (layer.events.set_data, self._changed), (layer.events.data, self._changed)]

    def _painted(self, event) -> None:
        self._changed(region=_region(event.value))

    def _changed(self, event=None, region: Region | None = None) -> None:
        self._dirty.append(region)
        self._timer.start()

    def run(self, job: Callable[[], object], returned: Callable[[object], None], failed: Callable[[Exception], None]) -> None:
        """Run `job` (an export) after the saves queued before it; `returned` its result or `failed` its error."""
        self._queue(job, returned, failed)

    def _queue(self, job: Callable[[], object], returned: Callable | None = None, failed: Callable | None = None) -> None:
        self._jobs.append((job, returned, failed or self._failed))
        self._next()

    def _next(self) -> None:
        if self._running is not None:
            return
        if not self._jobs:
            if not self._dirty:
                self._on_saved()
            return
        job, returned, failed = self._jobs.popleft()
        worker = make_worker(job)
        if returned is not None:
            worker.returned.connect(returned)
        worker.errored.connect(failed)
        worker.finished.connect(self._done)
        self._running = worker
        worker.start()

    def _done(self) -> None:
        self._running = None
        self._next()


def _region(history_item) -> Region | None:
    """The region a `paint` event's history item changed (slices, one per axis), None if unknown."""
    try:
        boxes = []
        for atom in history_item:
            key = getattr(atom, "slice_key", None)  # napari's paint and fill
            if key is None:  # data_setitem: (indices, old values, new values)
                key = tuple(slice(int(i.min()), int(i.max()) + 1) for i in atom[0])
            boxes.append(key)
        return _union(boxes)
    except (AttributeError, TypeError, IndexError, ValueError):
        return None


def _union(regions: list[Region | None]) -> Region | None:
    """The box around all `regions` (None, anywhere, if one is None)."""
    if not regions or any(region is None for region in regions):
        return None
    return tuple(slice(min(r[a].start for r in regions), max(r[a].stop for r in regions)) for a in range(len(regions[0])))
