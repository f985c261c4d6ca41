"""The interactive segmentation session: one object built from prompts, previewed under the cursor.

Qt-free. The caller (the napari widget, a benchmark, a test) says which image plane is shown,
reports cursor moves and clicks in image pixels (x, y), and receives `Preview`s through a callback
on a worker thread. Decodes go through a `DecodeScheduler` (cursor moves never queue up) to an
`ObjectDecoder` (`object_decoding`); cursor moves through a `Cursor` (`cursor`).

- Hover: with no prompts yet, the preview is the object under the cursor (one mask, chosen the way
  SAM2 chooses). With prompts, the preview is the object as the prompts make it, and the cursor is
  an extra positive point whose mask comes apart as a `hint`: what a click there would give.
  A preview's `mask` is always what `commit` stores.
- Click / box: the prompt is recorded at once (never lost), then decoded with the previous round's
  low-res logits; 3 candidates, the best scored shown, `cycle_candidate` goes through them by score.
- `undo`, `discard`, `commit` (full-resolution mask plus a new object id). Each plane of a stack
  has its own embedding (cached by content) and its own object in progress.
- Large planes (`planes`, `tiles`) are covered by tiles encoded on request (`encode_tiles`), not by
  `set_plane`; the cursor over a tile not encoded yet gets no preview, a click there encodes it.
  Zoomed out (`set_tile_step`), previews come coarser and `commit` stores full resolution.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import replace
from functools import partial

from .cursor import Cursor
from .engines import CancelToken, Engine
from .errors import InvalidInputError, TritonSamError
from .features import FeatureCache
from .image import ContrastLimits
from .object_decoding import ObjectDecoder, decoding_tile
from .objects import Committed, ObjectInProgress, Offset, Preview
from .planes import Plane
from .prompts import Prompts
from .speculative import DecodeScheduler, Delivery, SchedulerStats
from .tiles import Tile, needs_tiling

UNDECODED = (
    "The object's prompts are not decoded (the engine failed: is the server answering?). Your prompts are kept: "
    "commit again once their preview shows."
)

__all__ = ["Committed", "InteractiveSession", "ObjectInProgress", "Offset", "Preview"]  # the values live in `objects`


class InteractiveSession:
    """Builds objects from prompts on the plane shown (see the module docstring). It owns its decodes'
    scheduling and, unless `owns_engine` is False, its engine (`close` closes both)."""

    def __init__(
        self,
        engine: Engine,
        on_preview: Callable[[Preview | None], None],
        *,
        cache: FeatureCache | None = None,
        max_in_flight: int = 1,
        min_move_px: float = 2.0,
        mask_threshold: float = 0.0,
        on_error: Callable[[Exception], None] | None = None,
        owns_engine: bool = True,
    ) -> None:
        self.engine = engine
        self.owns_engine = owns_engine
        self.spec = engine.spec
        self.cache = cache if cache is not None else FeatureCache(engine)  # an empty one given too
        self.decoder = ObjectDecoder(engine, mask_threshold)
        self.next_object_id = 1
        self._on_preview = on_preview
        self._lock = threading.Condition()
        self._plane: Plane | None = None
        self._planes_asked = 0  # `set_plane` calls begun: the last one begun shows its plane
        self._objects: dict[Hashable, ObjectInProgress] = {}
        self._closed = False
        self._tile_step = 1
        self._scheduler = DecodeScheduler(
            self._deliver,
            max_in_flight,
            on_error,
            cancel_running=engine.cancel_running,
            settle=engine.settle_hovers,
        )
        self.cursor = Cursor(min_move_px, self._scheduler.count_skipped_event)

    # --- planes -------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether `close` was called: work ahead of need (encoding planes not shown) stops."""
        return self._closed

    def is_tiled(self, shape: tuple[int, int]) -> bool:
        """Whether a plane of `shape` (H, W) is covered by tiles rather than encoded whole."""
        return needs_tiling(tuple(shape[:2]), self.spec.input_size)

    def set_plane(
        self, key: Hashable, image, contrast_limits: ContrastLimits | None = None, levels: Mapping[int, object] | None = None
    ) -> None:
        """Show plane `key` (`levels`: its pyramid; see `planes.Plane`); one not tiled is encoded now
        (blocks: off the GUI thread). Of overlapping calls the one begun last shows its plane, the others
        only fill the cache. An object in progress on `key` decoded from the plane as it was (other
        contrast limits or pixels) is decoded again from its prompts, afresh."""
        with self._lock:
            self._planes_asked += 1
            asked = self._planes_asked
        plane = Plane(image, self.cache, contrast_limits=contrast_limits, levels=levels, step=self._tile_step, key=key)
        if not plane.tiled:
            plane.hold()  # encoded now, kept while shown
        with self._lock:
            if asked != self._planes_asked:
                return
            self._plane = plane
            self.cursor.forget()
            self._scheduler.clear()
            obj = self.object
            if not obj.empty and obj.content not in (None, plane.content):
                obj.decoded_version = -1  # its logits are of the plane as it was: no mask input
                self._submit_prompt(None)

    @property
    def tiles(self) -> list[Tile]:
        """The tiles of the plane shown (one, the whole plane, unless it is tiled)."""
        with self._lock:
            return list(self._plane.tiles) if self._plane else []

    @property
    def tile_step(self) -> int:
        """The step of the tiles large planes are covered by now (1: native resolution)."""
        return self._tile_step

    def set_tile_step(self, step: int) -> None:
        """Cover large planes with tiles encoded from the plane reduced `step` times (zoomed out:
        objects as large as the view fit one tile). Tiles of other steps stay cached; an object in
        progress is decoded again with the new tiles at its next hover."""
        if step < 1:
            raise ValueError(f"The tile step must be at least 1, got {step}.")
        with self._lock:
            self._tile_step = int(step)
            if self._plane is not None and self._plane.retile(self._tile_step):
                self.cursor.decoded = None

    def encoded(self, tile: Tile) -> bool:
        """Whether `tile` of the plane shown is encoded (and its features still cached)."""
        with self._lock:
            return self._plane is not None and self._plane.encoded(tile)

    def encode_tiles(
        self,
        tiles: Sequence[Tile],
        on_progress: Callable[[int, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        yield_to_cursor_s: float = 0.0,
    ) -> int:
        """Encode `tiles` of the plane shown as `Plane.encode_tiles` does (blocks: off the GUI thread)
        until the plane changes or `should_stop()` says so (the view moved); with `yield_to_cursor_s`,
        each batch once the cursor has rested that long. `on_progress(done, total)` after each batch.
        Returns how many were encoded now."""
        with self._lock:
            plane = self._plane

        def stopped() -> bool:
            return self._closed or self._plane is not plane or (should_stop is not None and should_stop())

        encoded = 0
        ready = lambda: self.cursor.rested(yield_to_cursor_s, stopped)  # noqa: E731
        for done, new in plane.encode_tiles(tiles, ready, waiting=lambda: self.cursor.waiting):
            encoded += len(new)
            for tile in new:
                self._hover_again_if_waiting(plane, tile)
            if on_progress is not None and not stopped():
                on_progress(done, len(tiles))
        return encoded

    @property
    def plane(self) -> Hashable | None:
        with self._lock:
            return self._plane.key if self._plane else None

    @property
    def prompts(self) -> ObjectInProgress:
        """A copy of the prompts of the object in progress on the current plane (for drawing them)."""
        with self._lock:
            return ObjectInProgress(self.object.prompts)

    @property
    def object(self) -> ObjectInProgress:
        """Prompts of the object in progress on the current plane."""
        with self._lock:
            return self._objects.setdefault(self._plane.key if self._plane else None, ObjectInProgress())

    def objects_in_progress(self, where: Callable[[Hashable], bool] = lambda key: True) -> int:
        """How many planes (of those whose key `where` takes) have an object in progress: prompts
        neither committed nor discarded."""
        with self._lock:
            return sum(not obj.empty and where(key) for key, obj in self._objects.items())

    # --- hover --------------------------------------------------------------------------------

    def hover(self, x: float, y: float, t_event: float | None = None) -> int | None:
        """The cursor moved to (x, y): ask for its preview. None when skipped or outside."""
        self.cursor.moved()
        with self._lock:
            plane = self._plane
            inside = plane is not None and plane.holds((x, y))
            just_left = plane is not None and not inside and self.cursor.decoded is not None
        if just_left:
            self.leave()
        if not inside:
            return None
        with self._lock:
            if self._plane is not plane or not self.cursor.moved_enough((x, y)):
                return None
            obj = self.object
            with_prompts = not obj.empty
            self._decode_again_if_outdated(plane, obj)
            prompts = obj.prompts.with_point((x, y))  # decoded as a click here would be
            tile = self.cursor.hover_tile(plane, prompts, (x, y))
            mask_input = obj.mask_input(tile, self.spec) if with_prompts and tile is not None else None
        if tile is None:
            if not with_prompts:
                self._clear_hover()  # no object under the cursor to show here yet
            return None
        hinted = obj if with_prompts else None
        return self._scheduler.hover(partial(self._decode_hover, plane, hinted, tile, prompts, mask_input), t_event)

    def _decode_again_if_outdated(self, plane: Plane, obj: ObjectInProgress) -> None:
        """Decode the object's prompts again, with the tiles of now, if its last decode failed (a
        server away?) or was of tiles of another step (zoomed since). Lock held."""
        stale = obj.decoded_version != obj.version
        restepped = obj.tile is not None and obj.tile.step != plane.tiles[0].step
        if not obj.empty and obj.pending == 0 and (stale or restepped):
            self._submit_prompt(None)

    def _decode_hover(
        self, plane: Plane, obj: ObjectInProgress | None, tile: Tile, prompts: Prompts, mask_input, token: CancelToken
    ) -> Preview | None:
        """Decode a hover (on a worker thread, `ObjectDecoder.hover`); with an object in progress
        (`obj`), the preview is the object's, the cursor's mask its hint."""
        hovered = self.decoder.hover(plane, tile, prompts, token, mask_input)
        if obj is None:
            return hovered
        with self._lock:
            if self._objects.get(plane.key) is not obj:
                return None  # committed or discarded meanwhile
            return obj.preview(plane).hinted(hovered.mask, hovered.point, tile.offset, tile.step)

    def leave(self) -> None:
        """The cursor left the image: stop hover work and show what is left without it, the object
        in progress (its prompts' mask, no hint) or nothing."""
        with self._lock:
            self.cursor.waiting = None
            plane, obj = self._plane, self.object
            left = obj.preview(plane) if plane is not None and not obj.empty else None
        self._clear_hover(left)

    def _clear_hover(self, shown: Preview | None = None) -> None:
        """Forget the hover (its decodes too) and show `shown` instead."""
        with self._lock:
            self.cursor.forget()
            self._scheduler.clear()
        self._on_preview(shown)

    # --- prompts ------------------------------------------------------------------------------

    def add_point(self, x: float, y: float, positive: bool = True, t_event: float | None = None) -> int | None:
        """Add a point to the object and decode it (the point is kept even if decoding fails)."""
        return self._give(lambda prompts: prompts.with_point((x, y), 1 if positive else 0), "point", t_event)

    def set_box(self, x0: float, y0: float, x1: float, y1: float, t_event: float | None = None) -> int | None:
        """Give the object a box (replacing an earlier one) and decode it."""
        box = (min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1))
        return self._give(lambda prompts: replace(prompts, box=box), "box", t_event)

    def _give(self, change: Callable[[Prompts], Prompts], kind: str, t_event: float | None) -> int | None:
        """Give the object `change(its prompts)`, one more prompt of `kind`, and decode them; refused
        (InvalidInputError, nothing changed) on a tiled plane that they are off or no tile of holds."""
        with self._lock:
            if self._plane is None:
                return None
            obj = self.object
            prompts = change(obj.prompts)
            if self._plane.tiled:
                self._plane.tile_for(prompts)  # raises where no tile fits them
            obj.give(prompts, kind)
            return self._submit_prompt(t_event)

    def undo(self) -> bool:
        """Remove the last prompt; False if there was none."""
        with self._lock:
            obj = self.object
            if not obj.order:
                return False
            obj.take_back()
            if obj.empty:
                obj.version += 1
                self.cursor.preview = None
                self._scheduler.clear(prompts=True)
                self._on_preview(None)
            else:
                self._submit_prompt(None)
            return True

    def cycle_candidate(self) -> Preview | None:
        """Show the next multimask candidate of the last prompt decode, by score (after the worst,
        the best again); its `place` says which. None when there is none."""
        with self._lock:
            obj, plane = self.object, self._plane
            if obj.low_res is None or plane is None:
                return None
            obj.choose_next(self.decoder.masks)
            preview = obj.preview(plane)
        self._on_preview(preview)
        return preview

    def discard(self) -> None:
        """Drop the object in progress on this plane."""
        with self._lock:
            self._objects.pop(self._plane.key if self._plane else None, None)
            self.cursor.preview = None
            self._scheduler.clear(prompts=True)
        self._on_preview(None)

    def commit(self, wait_s: float = 30.0, refuse: Callable[[Committed], str | None] | None = None) -> Committed | None:
        """Finish the object once its prompt decodes are in: its full-size mask and a new id, or, where
        `refuse` names a reason not to (e.g. nothing of it unlabelled), an `InvalidInputError` and no change.
        It stores a preview's `mask`: the object its prompts make (not the `hint`) or, with none, the
        object under the cursor (once its preview on its way is in: a key just after a move means its object)."""
        with self._lock:
            hover_only = self.object.empty
        if hover_only:  # (not holding the lock: the preview is delivered under it)
            self._scheduler.wait_for_hover(wait_s)
        with self._lock:
            obj, plane = self.object, self._plane
            if plane is None:
                return None
            self._lock.wait_for(lambda: obj.pending == 0, timeout=wait_s)
            if not obj.empty and obj.mask is not None and obj.decoded_version == obj.version:
                shown, prompts, candidate = obj.preview(plane), obj.prompts, obj.chosen
            elif obj.empty and self.cursor.preview is not None and self.cursor.preview.plane == plane.key:
                shown = self.cursor.preview
                prompts, candidate = Prompts().with_point(shown.point), None
            elif not obj.empty and obj.pending == 0:  # its last decode failed (the engine said why)
                raise TritonSamError(UNDECODED)
            else:
                return None
            committed = self.decoder.committed(plane, shown, prompts, candidate, self.next_object_id)
            if not committed.mask.any():
                return None
            reason = refuse(committed) if refuse is not None else None
            if reason:
                raise InvalidInputError(reason)
            self.next_object_id += 1
            self._objects.pop(plane.key, None)
            self.cursor.forget()
            self._scheduler.clear(prompts=True)
        self._on_preview(None)
        return committed

    # --- scheduling state ---------------------------------------------------------------------

    @property
    def stats(self) -> SchedulerStats:
        """What the scheduler did: events, decodes sent, cancelled, delivered, latencies."""
        return self._scheduler.stats

    @property
    def idle(self) -> bool:
        """No decode pending or running."""
        return self._scheduler.idle

    @property
    def in_flight(self) -> int:
        """Decodes running now."""
        return self._scheduler.in_flight

    def is_current(self, preview: Preview) -> bool:
        """Whether `preview` is still the newest result (a last check before showing it)."""
        return self._scheduler.is_current(preview.seq)

    def as_now(self, preview: Preview) -> Preview:
        """`preview` as its object is now (a last step before showing it): one of the object in
        progress made before another of its candidates was chosen (Shift-N while it was on its way)
        shows the one chosen, with its hint where both are of one step."""
        with self._lock:
            plane, obj = self._plane, self._objects.get(preview.plane)
            of_shown_object = plane is not None and plane.key == preview.plane and obj is not None and obj.mask is not None
            if preview.candidate is None or not of_shown_object or obj.mask is preview.mask:
                return preview
            now = replace(obj.preview(plane), seq=preview.seq, t_event=preview.t_event)
        return now.hinted(preview.hint, preview.point, preview.hint_offset, preview.step)

    def is_superseded(self, preview: Preview) -> bool:
        """Whether a newer hover was asked for after the one `preview` answers."""
        return preview.seq < self._scheduler.latest_hover_seq

    # --- internals ----------------------------------------------------------------------------

    def _submit_prompt(self, t_event: float | None) -> int:
        """Queue a decode of the object's prompts as they are now (call with the lock held)."""
        plane, obj = self._plane, self.object
        prompts = obj.prompts
        tile = decoding_tile(plane, prompts)
        mask_input = obj.mask_input(tile, self.spec)
        obj.version += 1
        version = obj.version
        obj.pending += 1

        def run(token: CancelToken) -> Preview:
            try:
                low_res, scores = self.decoder.low_res(plane, tile, prompts, token, mask_input)
                with self._lock:
                    if obj.version != version:  # a newer prompt will store its own result
                        return obj.preview(plane) if obj.mask is not None else None
                    obj.store(version, low_res, scores, tile, plane.content, self.decoder.masks)
                    return obj.preview(plane)
            finally:
                with self._lock:
                    obj.pending -= 1
                    self._lock.notify_all()

        return self._scheduler.prompt(run, t_event)

    def _hover_again_if_waiting(self, plane: Plane, tile: Tile) -> None:
        """A tile was encoded: if the cursor rests on it waiting for a preview, ask again."""
        with self._lock:
            waiting = self.cursor.waiting
            if self._closed or self._plane is not plane or not self.cursor.waits_on(tile):
                return
        self.hover(*waiting)

    def _deliver(self, delivery: Delivery) -> None:
        preview = delivery.value
        if preview is None:
            return
        preview = replace(preview, seq=delivery.seq, t_event=delivery.t_event)
        with self._lock:
            if self._plane is None or preview.plane != self._plane.key:
                return  # never show a mask on another plane
            if preview.point is not None and preview.hint is None:
                self.cursor.preview = preview
        self._on_preview(preview)

    def close(self) -> None:
        """Stop decoding (no worker thread outlives this call) and close the engine if owned;
        tile encoding in another thread stops after its current tile."""
        self._closed = True
        self._scheduler.close()
        if self.owns_engine:
            self.engine.close()
