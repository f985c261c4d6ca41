"""The object in progress on the plane on screen, as mouse and keys make it.

`bindings` act on an `Interaction` alone, as napari's own bindings act on a layer: a move asks for
a preview, a click adds a point, a drag sets a box, keys commit, discard, undo and cycle. It draws
the prompts, shows the previews that are still for the plane on screen and the newest, and writes
a committed object into the image's objects layer (undoable).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import napari
import numpy as np
from superqt.utils import ensure_main_thread

from ..errors import TritonSamError
from ..session import Committed, ObjectInProgress, Preview
from . import bindings, layers
from . import preview as previews
from .bindings import KEYS
from .encoding import PlaneEncoding
from .find import ConceptFinder
from .workers import make_worker


def _labelled_already(objects, index: tuple[int, ...], committed) -> str | None:
    """Why `committed` would write nothing into `objects` on plane `index` (labels are never painted over)."""
    if objects is None or layers.unlabelled(objects, index, committed.mask, committed.offset)[0].size:
        return None
    return "Nothing to commit: every pixel of this object is labelled already (labels are never painted over)."


def _boxed_commit(session, refuse) -> Committed | None:
    """The session's commit (see `InteractiveSession.commit`), its mask cut to the object's box on the
    worker: `refuse`, writing it on the GUI thread and saving it then read that box, not the whole plane."""
    committed = session.commit(refuse=lambda whole: refuse(whole.cropped()))
    return None if committed is None else committed.cropped()


class Interaction:
    """Mouse and keys on the plane on screen, through the panel's session (`encoding.session`).

    `preview` is the preview layer's writer, `prompts` and `box` the layers the prompts are drawn
    in (set at Start); `cursor` the world position of the last mouse move over the canvas (None
    once it left). It acts only while `interactive()`; `switched_on()` is the panel's switch, and
    `out_of_step()` says why not when the panel shows another image or model than the session's.
    `keys` are the keys bound (`keys.KeyChoice` sets them); `news_over(text)` is told when a status
    it said ("Showing candidate 2 of 3") no longer holds: the object changed.
    `on_committed(committed, plane)` is told of each object written into the objects layer.
    """

    def __init__(
        self,
        viewer: napari.Viewer,
        encoding: PlaneEncoding,
        *,
        switched_on: Callable[[], bool],
        out_of_step: Callable[[], str | None],
        set_status: Callable[[str], None],
        failed: Callable[[Exception], None],
        on_preview_shown: Callable[[Preview], None],
        show_telemetry: Callable[[str], None],
        news_over: Callable[[str], None],
        on_committed: Callable[[Committed, tuple[int, ...]], None],
    ) -> None:
        self.viewer = viewer
        self.encoding = encoding
        self.preview: previews.LivePreview | previews.WindowPreview | None = None
        self.prompts = self.box = None
        self.cursor = None
        self.negative_points = False  # clicks add negative points (micro-sam's T)
        self.find: ConceptFinder | None = None  # the Find section: its boxes and commits while it shows a result
        self.keys: dict[str, str] = dict(KEYS)
        self._candidate_said: str | None = None  # the status Shift-N last gave, until the object changes
        self._news_over = news_over
        self._switched_on, self._out_of_step, self._set_status, self._failed = switched_on, out_of_step, set_status, failed
        self._on_preview_shown, self._show_telemetry, self._on_committed = on_preview_shown, show_telemetry, on_committed

    @property
    def session(self):
        return self.encoding.session

    @property
    def image(self):
        return self.encoding.image

    def interactive(self) -> bool:
        """Whether mouse and keys act now: the switch is on, the panel shows the session's image and
        model, and the plane on screen is encoded (2D)."""
        return self._switched_on() and self._out_of_step() is None and self.encoding.ready and self.viewer.dims.ndisplay == 2

    def acts(self) -> bool:
        """`interactive()` for a click or key: one refused because the panel shows another image or
        model than the session's says so (never a prompt on one image decoded on another)."""
        why = self._out_of_step()
        if why is not None:
            self._set_status(why)
        return self.interactive()

    def hover(self, x: float, y: float) -> None:
        self.session.hover(x, y)

    def add_point(self, x: float, y: float, positive: bool) -> None:
        self._prompt(self.session.add_point, x, y, positive=positive)

    def set_box(self, x0: float, y0: float, x1: float, y1: float, positive: bool = True) -> None:
        """The object's box; while Find shows a phrase's result, an exemplar for it instead ("not this"
        unless `positive`)."""
        if self.find is not None and self.find.active:
            self.find.add_exemplar(x0, y0, x1, y1, positive)
            self.draw_prompts()  # (the box dragged goes)
            return
        self._prompt(self.session.set_box, x0, y0, x1, y1)

    def _prompt(self, give: Callable, *args, **kwargs) -> None:
        """Give the session a prompt; one it refuses (off the plane, no tile of a large plane holds the
        object's prompts) leaves the object as it was and says why in the panel, never as a traceback
        out of napari's mouse callback."""
        try:
            give(*args, **kwargs)
        except TritonSamError as error:
            self._failed(error)
            return
        self.draw_prompts()
        self._object_changed()

    def _object_changed(self) -> None:
        """A prompt added or taken back, the object discarded or left: which candidate it showed no longer holds."""
        if self._candidate_said is not None:
            self._news_over(self._candidate_said)
            self._candidate_said = None

    def show_box(self, box: tuple[float, float, float, float]) -> None:
        """Draw a box being dragged (not yet a prompt)."""
        layers.show_box(self.box, box)

    def leave(self) -> None:
        """No preview under the cursor (it left the canvas, the view went 3D, the switch went off);
        the object in progress stays."""
        if self.session is not None:
            self.session.leave()

    def canvas_crossed(self, event=None) -> None:
        """The cursor left the canvas (for the panel, another window): its preview goes, the object
        in progress stays, and a plane shown later is not previewed where the cursor once was."""
        if self.viewer.mouse_over_canvas:
            return
        self.cursor = None
        if self.interactive():
            self.session.leave()

    def leave_plane(self) -> None:
        """The plane on screen changes: its preview and prompts go at once (never another plane's
        mask, nor its object)."""
        self.session.leave()
        self.preview.show(None)
        self.draw_prompts(clear=True)
        self._object_changed()

    def plane_shown(self) -> None:
        """The plane asked for is encoded: its object in progress, if any, and the preview at the cursor."""
        self.draw_prompts()
        self.preview_at_cursor()

    def preview_at_cursor(self) -> None:
        """Preview where the cursor rests: a plane just shown (slider keys, the wheel, the image
        changed) previews without a move, and no preview of the plane as it was stays. With the
        cursor off the canvas, the plane's object in progress shows."""
        if not self.interactive():
            return
        if self.cursor is None:
            self.session.leave()
        else:
            self.session.hover(*layers.image_xy(self.image, self.cursor))

    def commit(self) -> None:
        """Write the object to the output layer (undoable), from a worker: it may wait for a decode;
        while Find shows instances, those instead."""
        if not self.acts() or (self.find is not None and self.find.commit()):
            return
        index = self.encoding.index
        objects = layers.existing_objects_layer(self.viewer, self.image)
        worker = make_worker(_boxed_commit, self.session, partial(_labelled_already, objects, index))
        worker.returned.connect(lambda committed: self._write(committed, index))
        worker.errored.connect(self._failed)
        worker.start()

    def _write(self, committed, index) -> None:
        if committed is None:
            self._set_status("Nothing to commit: hover over an object or click on it first.")
            return
        self.draw_prompts()
        objects = layers.objects_layer(self.viewer, self.image, np.uint16 if self.encoding.large else np.uint32)
        written = layers.write_object(objects, index, committed.mask, committed.object_id, committed.provenance, committed.offset)
        objects.selected_label = committed.object_id  # what Propagate tracks
        if written:
            self._on_committed(committed, index)
        self._set_status(f"Object {committed.object_id}: {written} pixels (Ctrl+Z on the objects layer undoes it).")

    def discard(self) -> None:
        if self.acts():
            self.session.discard()
            self.draw_prompts()
            self._object_changed()

    def undo(self) -> None:
        if self.acts():
            self.session.undo()
            self.draw_prompts()
            self._object_changed()

    def cycle(self) -> None:
        """Show the object's next candidate mask by score, and say which ("candidate 2 of 3")."""
        if not self.acts():
            return
        shown = self.session.cycle_candidate()
        if shown is None:
            self._set_status(f"No candidates to cycle: click on an object first ({self.keys['cycle']} shows its other masks).")
            return
        place, count = shown.place
        self._candidate_said = (
            f"Showing candidate {place} of {count} by predicted IoU ({shown.score:.2f}): "
            f"{self.keys['cycle']} for the next, {self.keys['commit']} commits it."
        )
        self._set_status(self._candidate_said)

    def draw_prompts(self, clear: bool = False) -> None:
        """Draw the prompts of the object in progress on the plane on screen (`clear`: none)."""
        if self.session is None or self.prompts not in self.viewer.layers or self.box not in self.viewer.layers:
            return
        layers.show_prompts(self.prompts, self.box, ObjectInProgress() if clear else self.session.prompts)

    def zoomed(self, event=None) -> None:
        """The camera zoomed: the preview's lines keep their width on screen."""
        if self.preview is not None and self.preview.layer in self.viewer.layers:
            self.preview.set_zoom(bindings.camera(self.viewer).zoom)

    def clear_preview(self) -> None:
        """Take the preview off the preview layer, if it is still there."""
        if self.preview is not None and self.preview.layer in self.viewer.layers:
            self.preview.show(None)

    @ensure_main_thread
    def preview_ready(self, preview: Preview | None) -> None:
        """Show a preview if it is for the plane on screen and still the newest."""
        session = self.session
        if session is None or self.preview is None or self.preview.layer not in self.viewer.layers:
            return
        if preview is not None:
            if not self.encoding.ready or preview.plane != session.plane or self._out_of_step() is not None:
                return
            if preview.point is not None and not session.is_current(preview):
                return
        if preview is None:
            self.preview.show(None)
        else:
            preview = session.as_now(preview)  # another candidate chosen since it was made: that one
            self.preview.show(preview.mask, preview.hint, preview.offset, preview.hint_offset, preview.step)
        if preview is not None:
            self._on_preview_shown(preview)
        stats = session.stats
        if preview is not None and stats.latencies_s:
            self._show_telemetry(
                f"Last preview in {stats.latencies_s[-1] * 1000:.0f} ms · "
                f"{stats.hovers_delivered} of {stats.events} mouse moves previewed"
            )
