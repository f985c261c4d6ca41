"""The interactive segmentation session: one object built from prompts, previewed under the cursor.

Qt-free. The caller (the napari widget, a benchmark, a test) says which image plane is shown,
reports cursor moves and clicks in image pixels (x, y), and receives `Preview`s through a callback
on a worker thread. Decoding goes through a `SpeculativeDecoder`, so cursor moves never queue up.

- Hover: with no prompts yet, the preview is the object under the cursor (one mask, chosen the way
  SAM2 chooses). With prompts, the preview is the object as the prompts make it, and the cursor is
  an extra positive point whose mask comes apart as a `hint`: what a click there would give.
  A preview's `mask` is always what `commit` stores.
- Click / box: the prompt is recorded at once (never lost), then decoded with the previous round's
  low-res logits; 3 candidates, best score first, `cycle_candidate` goes through them.
- `undo`, `discard`, `commit` (full-resolution mask plus a new object id). Each plane of a stack
  has its own embedding (cached by content) and its own object in progress.
- Large planes (see `tiles`) are covered by tiles at native resolution, encoded on request
  (`encode_tiles`, the tiles in view first) rather than by `set_plane`; each decode uses the tile
  that holds its prompts best, and masks come as that tile's crop with its `offset` on the plane.
  The cursor over a tile not encoded yet gets no preview; a click there encodes its tile. While a
  tile (or, encoding a stack ahead, a plane) is encoded, the next one is read (slow storage need
  not wait for the encoder).
  Zoomed out, the caller asks for coarser tiles (`set_tile_step`): previews then come at the
  tiles' reduced resolution and `commit` stores the object at full resolution.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice

import numpy as np

from .engines import CancelToken, Engine, ImageFeatures
from .errors import InvalidInputError
from .features import FeatureCache
from .image import ContrastLimits, ReadAhead, encoder_input, read_window
from .prompts import model_request
from .speculative import Delivery, SchedulerStats, SpeculativeDecoder
from .tiled_predictor import plane_limits
from .tiles import Tile, needs_tiling, prompt_corners, prompts_in_tile, tile_for_prompts, tile_grid

Offset = tuple[int, int]  # (row, column) of a mask crop's first pixel on its plane


@dataclass(frozen=True)
class Preview:
    """Masks to show on the plane they belong to: `mask` is what `commit` would store.

    Masks are crops placed at their offsets: the whole plane at (0, 0) unless the plane is tiled.
    """

    plane: Hashable
    mask: np.ndarray  # bool [h, w] at `offset`
    score: float
    hint: np.ndarray | None = None  # bool, at `hint_offset`; with prompts: the object with a point at `point` too
    point: tuple[float, float] | None = None  # the hover point, None for a prompt result
    candidate: int | None = None  # which multimask candidate (prompt results)
    seq: int = 0  # the scheduler's sequence number, for a last `is_current` check
    t_event: float = 0.0  # when the event it answers happened (time.perf_counter)
    offset: Offset = (0, 0)
    hint_offset: Offset = (0, 0)
    tile: Tile | None = None  # the tile `mask` was decoded with
    # float32 [h, w]: the logits `mask` comes from (commit upsamples them); they may hold only the
    # part around the object, the rest below the threshold (`DecodeRequest.logits_above`)
    low_res: np.ndarray | None = None

    @property
    def step(self) -> int:
        """Plane pixels a side of one pixel of `mask` and `hint` (1 unless its tile is coarse)."""
        return 1 if self.tile is None else self.tile.step


@dataclass(frozen=True)
class Committed:
    """A finished object: its mask on its plane, the id it was given, and how it was made."""

    plane: Hashable
    mask: np.ndarray  # bool [h, w] at `offset`, full resolution (the whole plane unless it is tiled)
    object_id: int
    provenance: dict = field(default_factory=dict)  # see `InteractiveSession.provenance`
    offset: Offset = (0, 0)


@dataclass
class ObjectPrompts:
    """Prompts of the object being built on one plane, and its last decoded candidates."""

    points: list[tuple[float, float]] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    box: tuple[float, float, float, float] | None = None
    order: list[str] = field(default_factory=list)  # "point" / "box", for undo
    version: int = 0  # bumped on every change; a decode stores results only for its version
    low_res: np.ndarray | None = None  # float32 [C, 256, 256] candidates of the last decode (`logits_above`)
    scores: np.ndarray | None = None  # [C]
    mask: np.ndarray | None = None  # bool, the chosen candidate at full size (its tile's): what commit stores
    tile: Tile | None = None  # the tile `low_res` and `mask` belong to
    chosen: int = 0
    decoded_version: int = -1
    content: Hashable = None  # the plane's `content` when it was last decoded
    pending: int = 0  # prompt decodes submitted and not finished

    @property
    def empty(self) -> bool:
        return not self.points and self.box is None

    def request_kwargs(self, extra_point: tuple[float, float] | None = None) -> dict:
        points = self.points + ([extra_point] if extra_point else [])
        labels = self.labels + ([1] if extra_point else [])
        kwargs: dict = {"box": self.box}
        if points:
            kwargs.update(point_coords=np.array(points, np.float32), point_labels=np.array(labels))
        return kwargs


@dataclass
class _Plane:
    key: Hashable
    size: tuple[int, int]  # (H, W)
    tiles: list[Tile]  # one, the whole plane, unless it is tiled (then the grid of the tile step asked for)
    features: dict[Tile, ImageFeatures] = field(default_factory=dict)  # the whole plane's, held while shown
    image: object = None  # a tiled plane (any array that slices), to encode its tiles from
    levels: Mapping[int, object] = field(default_factory=dict)  # the tiled plane reduced by factors > 1 (a pyramid)
    contrast: ContrastLimits | None = None
    signatures: dict[Tile, str] = field(default_factory=dict)  # tiles encoded: the cache holds them, bounded
    content: Hashable = None  # what the encoder sees: a whole plane's signature, a tiled plane's contrast limits

    def read(self, tile: Tile, max_side: int) -> np.ndarray:
        """A tiled plane's pixels under `tile`, from the coarsest pyramid level whose factor divides
        the tile's step (full resolution when none does); the encoder's own resize reduces the rest,
        as it reduces a plane encoded whole, after windows over `max_side` are reduced while read."""
        factor = max((f for f in self.levels if tile.step % f == 0), default=1)
        level = self.image if factor == 1 else self.levels[factor]
        y0, y1, x0, x1 = tile.y0 // factor, -(-tile.y1 // factor), tile.x0 // factor, -(-tile.x1 // factor)
        return read_window(level, y0, y1, x0, x1, max_side)

    @property
    def tiled(self) -> bool:
        return self.image is not None


class InteractiveSession:
    """Builds objects from prompts on the plane being shown; see the module docstring.

    The one object callers talk to: it owns its decoder's scheduling and, unless `owns_engine` is
    False, its engine (`close` closes both).
    """

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
        self.cache = cache or FeatureCache(engine)
        self.min_move_px = min_move_px
        self.mask_threshold = mask_threshold
        self.next_object_id = 1
        self._on_preview = on_preview
        self._lock = threading.Condition()
        self._plane: _Plane | None = None
        self._planes_asked = 0  # `set_plane` calls begun: the last one begun shows its plane
        self._objects: dict[Hashable, ObjectPrompts] = {}
        self._last_hover: tuple[float, float] | None = None
        self._waiting_hover: tuple[float, float] | None = None  # the cursor rests on a tile not encoded yet
        self._moved_at = -math.inf  # when `hover` was last called (time.perf_counter)
        self._closed = False
        self._tile_step = 1
        self._hover_preview: Preview | None = None
        self._decoder = SpeculativeDecoder(
            self._deliver,
            max_in_flight,
            on_error,
            cancel_running=engine.cancel_running,
            settle=engine.settle_hovers,
        )

    # --- planes -------------------------------------------------------------------------------

    def prefetch(
        self,
        image,
        contrast_limits: ContrastLimits | None = None,
        tiles: Sequence[Tile] = (),
        levels: Mapping[int, object] | None = None,
        should_stop: Callable[[], bool] | None = None,
        yield_to_cursor_s: float = 0.0,
    ) -> None:
        """Encode a plane into the cache without showing it (neighbouring planes): the whole plane,
        or, of a tiled one, `tiles` (e.g. those in view on the plane shown), each after the cursor
        has rested `yield_to_cursor_s`, stopping when `should_stop()` says so. Showing the plane
        later finds them in the cache (keyed by content)."""
        if not self.is_tiled(image.shape[:2]):
            self.cache.features(encoder_input(np.asarray(image), self.spec, contrast_limits))
            return
        contrast = plane_limits(image, contrast_limits)
        plane = _Plane(None, tuple(image.shape[:2]), list(tiles), image=image, levels=dict(levels or {}), contrast=contrast)

        def stopped() -> bool:
            return self._closed or (should_stop is not None and should_stop())

        with ReadAhead(lambda tile: self._tile_input(plane, tile)) as ahead:
            for batch, model_inputs in ahead.in_batches(tiles, self.engine.encode_batch):
                if not self._cursor_rested(yield_to_cursor_s, stopped):
                    return
                self._tiles_features(plane, list(batch), model_inputs)

    def prefetch_planes(
        self,
        planes: Sequence[tuple[object, Mapping[int, object] | None]],
        contrast_limits: ContrastLimits | None = None,
        tiles: Sequence[Tile] = (),
        should_stop: Callable[[], bool] | None = None,
    ) -> Iterator[int]:
        """`prefetch` each of `planes` (image, pyramid levels; e.g. every plane of a stack), yielding
        how many are done after each plane, until `should_stop()` says so. Planes encoded whole go
        to the engine `Engine.encode_batch` at a time (a GPU server encodes them together), each
        batch read while the one before it is encoded (`image.ReadAhead`), as tiles are."""

        def read(number: int):
            image = planes[number][0]
            return image if self.is_tiled(image.shape[:2]) else np.asarray(image)  # tiles: read as encoded

        whole = not any(self.is_tiled(image.shape[:2]) for image, _ in planes)
        with ReadAhead(read) as ahead:
            for numbers, images in ahead.in_batches(range(len(planes)), self.engine.encode_batch if whole else 1):
                if self._closed or (should_stop is not None and should_stop()):
                    return
                if whole:
                    self.cache.features_many([encoder_input(image, self.spec, contrast_limits) for image in images])
                else:
                    self.prefetch(images[0], contrast_limits, tiles, planes[numbers[0]][1], should_stop)
                yield from (number + 1 for number in numbers)  # one per plane: napari's progress counts yields

    def _cursor_rested(self, seconds: float, stopped: Callable[[], bool]) -> bool:
        """Wait until the cursor has rested `seconds` (work ahead of need must not slow the previews
        on a shared CPU); False, at once, when `stopped()` says so."""
        while not stopped() and time.perf_counter() - self._moved_at < seconds:
            time.sleep(0.05)
        return not stopped()

    def is_tiled(self, shape: tuple[int, int]) -> bool:
        """Whether a plane of `shape` (H, W) is covered by tiles rather than encoded whole."""
        return needs_tiling(tuple(shape[:2]), self.spec.input_size)

    def set_plane(
        self, key: Hashable, image, contrast_limits: ContrastLimits | None = None, levels: Mapping[int, object] | None = None
    ) -> None:
        """Show plane `key`. A plane that is not tiled is encoded now (blocks: call it off the GUI
        thread); a tiled one (any array that slices: numpy, dask, zarr) is only read tile by tile,
        coarse tiles from `levels` (the plane reduced by each integer factor: a pyramid) where given.
        Of calls that overlap (a slow encode, then a plane found in the cache), the one begun last
        shows its plane: the others only leave their features in the cache. An object in progress
        on `key` that was decoded from the plane as it was (other contrast limits, other pixels) is
        decoded again from its prompts, afresh."""
        with self._lock:
            self._planes_asked += 1
            asked = self._planes_asked
        size = tuple(image.shape[:2])
        if not self.is_tiled(size):
            whole = Tile(0, 0, *size)
            model_input = encoder_input(np.asarray(image), self.spec, contrast_limits)
            signature = self.cache.signature(model_input)
            plane = _Plane(key, size, [whole], {whole: self.cache.features(model_input, signature)}, content=signature)
        else:
            contrast = plane_limits(image, contrast_limits)  # the same for every tile
            grid = tile_grid(size, self.spec.input_size, step=self._tile_step)
            plane = _Plane(key, size, grid, image=image, levels=dict(levels or {}), contrast=contrast, content=contrast)
        with self._lock:
            if asked != self._planes_asked:
                return
            self._plane = plane
            self._last_hover = None
            self._hover_preview = None
            self._decoder.clear()
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
            plane = self._plane
            if plane is not None and plane.tiled and plane.tiles[0].step != step:
                plane.tiles = tile_grid(plane.size, self.spec.input_size, step=self._tile_step)
                self._last_hover = None

    def encoded(self, tile: Tile) -> bool:
        """Whether `tile` of the plane shown is encoded (and its features still cached)."""
        with self._lock:
            return self._plane is not None and self._encoded(self._plane, tile)

    def _encoded(self, plane: _Plane, tile: Tile) -> bool:
        return tile in plane.features or (tile in plane.signatures and plane.signatures[tile] in self.cache)

    def encode_tiles(
        self,
        tiles: Sequence[Tile],
        on_progress: Callable[[int, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        yield_to_cursor_s: float = 0.0,
    ) -> int:
        """Encode `tiles` of the plane shown, in order (blocks: off the GUI thread), skipping those
        done; a tile under a cursor waiting for its preview goes first, alone. Where the engine
        encodes several at once faster (`Engine.encode_batch`), tiles go that many together.
        Stops early when the plane changes or `should_stop()` says so (the view moved).
        With `yield_to_cursor_s`, each batch waits until the cursor has rested that long (work
        ahead of need must not slow the previews on a shared CPU). `on_progress(done, total)`
        after each. Returns how many were encoded now."""
        with self._lock:
            plane = self._plane

        def stopped() -> bool:
            return self._closed or self._plane is not plane or (should_stop is not None and should_stop())

        encoded, done, remaining = 0, 0, list(tiles)
        with ReadAhead(lambda tile: self._tile_input(plane, tile)) as ahead:
            while remaining:
                if not self._cursor_rested(yield_to_cursor_s, stopped):
                    break
                batch = self._next_tiles(plane, remaining)
                for tile in batch:
                    remaining.remove(tile)
                new = [tile for tile in batch if not self._encoded(plane, tile)]
                if new:
                    for tile in islice(self._not_encoded(plane, remaining), self.engine.encode_batch):
                        ahead.start(tile)  # the next batch
                    self._tiles_features(plane, new, [ahead.take(tile) for tile in new])
                    encoded += len(new)
                    for tile in new:
                        self._hover_again_if_waiting(plane, tile)
                done += len(batch)
                if on_progress is not None and not stopped():
                    on_progress(done, len(tiles))
        return encoded

    def _next_tiles(self, plane: _Plane, remaining: list[Tile]) -> list[Tile]:
        """The tile a cursor waits for its preview on, alone; else the first of `remaining`, alone
        if it is encoded (skipped), else with the next ones not encoded yet, up to `Engine.encode_batch`."""
        with self._lock:
            waiting = None if self._waiting_hover is None else np.array([self._waiting_hover])
        if waiting is not None:
            holding = [t for t in remaining if t.margin(waiting) >= 0]
            if holding:
                return [max(holding, key=lambda t: t.margin(waiting))]
        if self._encoded(plane, remaining[0]):
            return remaining[:1]
        return [remaining[0], *islice(self._not_encoded(plane, remaining[1:]), self.engine.encode_batch - 1)]

    def _not_encoded(self, plane: _Plane, tiles: list[Tile]) -> Iterator[Tile]:
        return (tile for tile in tiles if not self._encoded(plane, tile))

    def _tile_input(self, plane: _Plane, tile: Tile) -> np.ndarray:
        """A tiled plane's encoder input for `tile`, read from the plane."""
        return encoder_input(plane.read(tile, self.spec.max_read_side), self.spec, plane.contrast)

    def _tiles_features(self, plane: _Plane, tiles: list[Tile], model_inputs: list[np.ndarray]) -> None:
        """Encode `tiles` (read as `model_inputs`) into the cache, together where the engine can."""
        keys = [self.cache.signature(model_input) for model_input in model_inputs]
        self.cache.features_many(model_inputs, keys)
        with self._lock:
            plane.signatures.update(zip(tiles, keys))

    def _tile_features(self, plane: _Plane, tile: Tile, model_input: np.ndarray | None = None) -> ImageFeatures:
        """A tile's features: the whole plane's, or a tile's from the cache, encoded now (from
        `model_input` where it was read already) if evicted or new."""
        features = plane.features.get(tile)
        if features is None and tile in plane.signatures:
            features = self.cache.get(plane.signatures[tile])
        if features is None:
            model_input = self._tile_input(plane, tile) if model_input is None else model_input
            key = self.cache.signature(model_input)
            features = self.cache.features(model_input, key)
            with self._lock:
                plane.signatures[tile] = key
        return features

    @property
    def plane(self) -> Hashable | None:
        with self._lock:
            return self._plane.key if self._plane else None

    @property
    def prompts(self) -> ObjectPrompts:
        """A copy of the prompts of the object in progress on the current plane (for drawing them)."""
        with self._lock:
            obj = self.object
            return ObjectPrompts(points=list(obj.points), labels=list(obj.labels), box=obj.box)

    @property
    def object(self) -> ObjectPrompts:
        """Prompts of the object in progress on the current plane."""
        with self._lock:
            return self._objects.setdefault(self._plane.key if self._plane else None, ObjectPrompts())

    # --- hover --------------------------------------------------------------------------------

    def hover(self, x: float, y: float, t_event: float | None = None) -> int | None:
        """The cursor moved to (x, y): ask for its preview. None when skipped or outside."""
        self._moved_at = time.perf_counter()
        with self._lock:
            plane = self._plane
            if plane is None:
                return None
            height, width = plane.size
            inside = 0 <= x < width and 0 <= y < height
            just_left = not inside and self._last_hover is not None
        if not inside:
            if just_left:
                self.leave()
            return None
        with self._lock:
            if self._plane is not plane:  # the plane changed meanwhile
                return None
            if self._last_hover is not None and math.dist(self._last_hover, (x, y)) < self.min_move_px:
                self._decoder.count_skipped_event()
                return None
            self._last_hover = (x, y)
            obj = self.object
            stale = obj.decoded_version != obj.version  # the last prompt's decode failed (a server away?)
            restepped = obj.tile is not None and obj.tile.step != plane.tiles[0].step  # zoomed since
            if not obj.empty and obj.pending == 0 and (stale or restepped):
                self._submit_prompt(None)  # again, with the tiles of now
            kwargs = obj.request_kwargs(extra_point=(x, y))
            with_prompts = not obj.empty
            tile = self._tile_for(plane, kwargs, encoded_only=True)
            unavailable = tile is None  # no tile holds it, or none that does is encoded yet
            if with_prompts and not unavailable:  # decoded as a click here would be
                kwargs["mask_input"] = self._previous_logits(obj, tile)
            self._waiting_hover = (x, y) if unavailable else None
            if unavailable:
                self._last_hover = None  # the next move decodes, if its tile is ready by then
                self._decoder.count_skipped_event()
        if unavailable:
            if not with_prompts:
                self._clear_hover()  # no object under the cursor to show here yet
            return None

        def run(token: CancelToken) -> Preview | None:
            # As a click at the cursor would be: the candidate it will choose, refining the object's mask.
            low_res, scores = self._decode_low_res(plane, tile, kwargs, token, preview=True)
            mask = self._image_masks(low_res, tile)[0]
            if not with_prompts:
                return Preview(plane.key, mask, float(scores[0]), point=(x, y), offset=tile.offset, tile=tile, low_res=low_res[0])
            with self._lock:
                if self._objects.get(plane.key) is not obj:
                    return None  # committed or discarded meanwhile
                shown = self._object_preview(plane, obj)
                if shown.step != tile.step:  # the object is being decoded again with the tiles of now
                    return shown
                return replace(shown, hint=mask, point=(x, y), hint_offset=tile.offset)

        return self._decoder.hover(run, t_event)

    def leave(self) -> None:
        """The cursor left the image: stop hover work and show what is left without it, the object
        in progress (its prompts' mask, no hint) or nothing."""
        with self._lock:
            self._waiting_hover = None
            plane, obj = self._plane, self.object
            left = self._object_preview(plane, obj) if plane is not None and not obj.empty else None
        self._clear_hover(left)

    def _clear_hover(self, shown: Preview | None = None) -> None:
        """Forget the hover (its decodes too) and show `shown` instead."""
        with self._lock:
            self._last_hover = None
            self._hover_preview = None
            self._decoder.clear()
        self._on_preview(shown)

    # --- prompts ------------------------------------------------------------------------------

    def add_point(self, x: float, y: float, positive: bool = True, t_event: float | None = None) -> int | None:
        """Add a point to the object and decode it (the point is kept even if decoding fails)."""
        with self._lock:
            if self._plane is None:
                return None
            obj = self.object
            self._check_fits(obj.points + [(x, y)], obj.box)
            obj.points.append((float(x), float(y)))
            obj.labels.append(1 if positive else 0)
            obj.order.append("point")
            return self._submit_prompt(t_event)

    def set_box(self, x0: float, y0: float, x1: float, y1: float, t_event: float | None = None) -> int | None:
        """Give the object a box (replacing an earlier one) and decode it."""
        with self._lock:
            if self._plane is None:
                return None
            obj = self.object
            box = (min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1))
            self._check_fits(obj.points, box)
            if obj.box is not None:
                obj.order.remove("box")
            obj.box = box
            obj.order.append("box")
            return self._submit_prompt(t_event)

    def undo(self) -> bool:
        """Remove the last prompt; False if there was none."""
        with self._lock:
            obj = self.object
            if not obj.order:
                return False
            if obj.order.pop() == "box":
                obj.box = None
            else:
                obj.points.pop()
                obj.labels.pop()
            obj.low_res = obj.scores = obj.mask = None  # the refinement chain no longer applies
            if obj.empty:
                obj.version += 1
                self._hover_preview = None
                self._decoder.clear(prompts=True)
                self._on_preview(None)
            else:
                self._submit_prompt(None)
            return True

    def cycle_candidate(self) -> Preview | None:
        """Show the next multimask candidate of the last prompt decode."""
        with self._lock:
            obj, plane = self.object, self._plane
            if obj.low_res is None or plane is None:
                return None
            self._choose(obj, (obj.chosen + 1) % len(obj.low_res))
            preview = self._object_preview(plane, obj)
        self._on_preview(preview)
        return preview

    def discard(self) -> None:
        """Drop the object in progress on this plane."""
        with self._lock:
            self._objects.pop(self._plane.key if self._plane else None, None)
            self._hover_preview = None
            self._decoder.clear(prompts=True)
        self._on_preview(None)

    def commit(self, wait_s: float = 30.0) -> Committed | None:
        """Finish the object: its full-size mask and a new id. Waits for its prompt decodes first.

        What is stored is a preview's `mask`: the object its prompts make (the hover `hint` is
        not part of it) or, with no prompts, the object under the cursor (once its preview, if
        on its way, is in: a key pressed just after a move means the object moved onto).
        """
        with self._lock:
            hover_only = self.object.empty
        if hover_only:  # (not holding the lock: the preview is delivered under it)
            self._decoder.wait_for_hover(wait_s)
        with self._lock:
            obj, plane = self.object, self._plane
            if plane is None:
                return None
            self._lock.wait_for(lambda: obj.pending == 0, timeout=wait_s)
            if not obj.empty and obj.mask is not None and obj.decoded_version == obj.version:
                shown = self._object_preview(plane, obj)
                made_by = self.provenance(obj, candidate=obj.chosen)
            elif obj.empty and self._hover_preview is not None and self._hover_preview.plane == plane.key:
                shown = self._hover_preview
                made_by = self.provenance(ObjectPrompts(points=[shown.point], labels=[1]), candidate=None)
            else:
                return None
            mask, offset = self._full_resolution(shown)
            if not mask.any():
                return None
            if plane.tiled:
                tile = shown.tile
                made_by["tile"] = [tile.y0, tile.x0, tile.y1, tile.x1]
                made_by["tile_step"] = tile.step
            committed = Committed(plane.key, mask, self.next_object_id, made_by, offset)
            self.next_object_id += 1
            self._objects.pop(plane.key, None)
            self._hover_preview = None
            self._last_hover = None
            self._decoder.clear(prompts=True)
        self._on_preview(None)
        return committed

    # --- scheduling state ---------------------------------------------------------------------

    @property
    def stats(self) -> SchedulerStats:
        """What the scheduler did: events, decodes sent, cancelled, delivered, latencies."""
        return self._decoder.stats

    @property
    def idle(self) -> bool:
        """No decode pending or running."""
        return self._decoder.idle

    @property
    def in_flight(self) -> int:
        """Decodes running now."""
        return self._decoder.in_flight

    def is_current(self, preview: Preview) -> bool:
        """Whether `preview` is still the newest result (a last check before showing it)."""
        return self._decoder.is_current(preview.seq)

    def is_superseded(self, preview: Preview) -> bool:
        """Whether a newer hover was asked for after the one `preview` answers."""
        return preview.seq < self._decoder.latest_hover_seq

    def provenance(self, obj: ObjectPrompts, candidate: int | None) -> dict:
        """What reproduces an object: its prompts in image pixels (x, y), the candidate chosen
        (None: the single mask SAM picks), the model and its weights, the mask threshold; on a
        tiled plane `commit` adds the tile decoded (rows y0, columns x0, y1, x1) and its step."""
        return {
            "points": [list(p) for p in obj.points],
            "labels": list(obj.labels),
            "box": list(obj.box) if obj.box is not None else None,
            "candidate": candidate,
            "model_id": self.spec.model_id,
            "weights_id": self.engine.weights_id,
            "mask_threshold": self.mask_threshold,
        }

    # --- internals ----------------------------------------------------------------------------

    def _submit_prompt(self, t_event: float | None) -> int:
        """Queue a decode of the object's prompts as they are now (call with the lock held)."""
        plane, obj = self._plane, self.object
        prompts = obj.request_kwargs()
        tile = self._tile_for(plane, prompts)
        kwargs = {**prompts, "mask_input": self._previous_logits(obj, tile)}
        obj.version += 1
        version = obj.version
        obj.pending += 1

        def run(token: CancelToken) -> Preview:
            try:
                low_res, scores = self._decode_low_res(plane, tile, kwargs, token)
                with self._lock:
                    if obj.version != version:  # a newer prompt will store its own result
                        return self._object_preview(plane, obj) if obj.mask is not None else None
                    obj.low_res, obj.scores, obj.tile = low_res, scores, tile
                    self._choose(obj, int(np.argmax(scores)))
                    obj.decoded_version, obj.content = version, plane.content
                    return self._object_preview(plane, obj)
            finally:
                with self._lock:
                    obj.pending -= 1
                    self._lock.notify_all()

        return self._decoder.prompt(run, t_event)

    def _previous_logits(self, obj: ObjectPrompts, tile: Tile | None) -> np.ndarray | None:
        """The object's chosen logits as a next round's mask input, as the official predictor hands
        them back for refinement; None unless its last decode is current and of `tile` (lock held)."""
        if obj.low_res is None or obj.decoded_version != obj.version or obj.tile != tile:
            return None
        return self.spec.as_mask_input(obj.low_res[obj.chosen][None])

    def _choose(self, obj: ObjectPrompts, candidate: int) -> None:
        """Make `candidate` the object's mask (call with the lock held)."""
        obj.chosen = candidate
        obj.mask = self._image_masks(obj.low_res[candidate][None], obj.tile)[0]

    def _object_preview(self, plane: _Plane, obj: ObjectPrompts) -> Preview:
        """The object as its prompts make it (empty while its first decode runs; lock held)."""
        if obj.mask is None:
            tile = plane.tiles[0]
            return Preview(plane.key, np.zeros(tile.reduced_shape, bool), 0.0, offset=tile.offset, tile=tile)
        score, tile = float(obj.scores[obj.chosen]), obj.tile
        return Preview(
            plane.key, obj.mask, score, candidate=obj.chosen, offset=tile.offset, tile=tile, low_res=obj.low_res[obj.chosen]
        )

    def _full_resolution(self, shown: Preview) -> tuple[np.ndarray, Offset]:
        """A preview's mask at full resolution and its offset: as shown, unless its tile is coarse;
        then upsampled from its logits around the object only (see `MaskResizer.object_mask`)."""
        if shown.step == 1:
            return shown.mask, shown.offset
        mask, (y, x) = self.engine.resizer.object_mask(shown.low_res, shown.tile.shape, self.mask_threshold)
        return mask, (shown.offset[0] + y, shown.offset[1] + x)

    def _tile_for(self, plane: _Plane, kwargs: dict, encoded_only: bool = False) -> Tile | None:
        """The tile that decodes these prompts (`encoded_only`: the best of those encoded, for a
        preview that need not wait); None when no such tile holds them all."""
        if not plane.tiled:
            return plane.tiles[0]
        corners = prompt_corners(kwargs.get("point_coords"), kwargs.get("box"))
        try:
            best = tile_for_prompts(plane.tiles, corners)
            if not encoded_only or self._encoded(plane, best):
                return best
            encoded = [t for t in plane.tiles if t in plane.signatures and self._encoded(plane, t)]
            return tile_for_prompts(encoded, corners) if encoded else None
        except InvalidInputError:
            return None

    def _hover_again_if_waiting(self, plane: _Plane, tile: Tile) -> None:
        """A tile was encoded: if the cursor rests on it waiting for a preview, ask again."""
        with self._lock:
            waiting = self._waiting_hover
            if waiting is None or self._closed or self._plane is not plane or tile.margin(np.array([waiting])) < 0:
                return
        self.hover(*waiting)

    def _check_fits(self, points: list[tuple[float, float]], box: tuple[float, float, float, float] | None) -> None:
        """Refuse (InvalidInputError, nothing changed) prompts that no tile of a tiled plane holds."""
        if self._plane is not None and self._plane.tiled:
            tile_for_prompts(self._plane.tiles, prompt_corners(np.array(points, np.float64).reshape(-1, 2), box))

    def _decode_low_res(self, plane: _Plane, tile: Tile, kwargs: dict, token: CancelToken, preview: bool = False):
        """Low-res logits and scores of the first prompt set: a click's three candidates, or a hover
        `preview`'s one mask, the candidate that click would choose (`best_of_multimask`). Both are
        only thresholded or refined, so a server may send just the part around the object (`logits_above`)."""
        features = self._tile_features(plane, tile)
        options = {"logits_above": self.mask_threshold, "best_of_multimask": preview}
        request = model_request(self.spec, tile.shape, **_in_tile(kwargs, tile), **options)
        result = self.engine.decode(features, request, not preview, token)
        return result.low_res_logits[0], result.scores[0]

    def _image_masks(self, low_res: np.ndarray, tile: Tile) -> np.ndarray:
        """Binary masks at the tile's reduced size (the plane's, unless tiled) from low-res logits [..., h, w]."""
        return self.engine.resizer.masks(low_res, tile.reduced_shape, self.mask_threshold)

    def _deliver(self, delivery: Delivery) -> None:
        preview = delivery.value
        if preview is None:
            return
        preview = replace(preview, seq=delivery.seq, t_event=delivery.t_event)
        with self._lock:
            if self._plane is None or preview.plane != self._plane.key:
                return  # never show a mask on another plane
            if preview.point is not None and preview.hint is None:
                self._hover_preview = preview
        self._on_preview(preview)

    def close(self) -> None:
        """Stop decoding (no worker thread outlives this call) and close the engine if owned;
        tile encoding in another thread stops after its current tile."""
        self._closed = True
        self._decoder.close()
        if self.owns_engine:
            self.engine.close()


def _in_tile(kwargs: dict, tile: Tile) -> dict:
    """Request prompts in plane pixels moved to `tile`'s pixels."""
    points, box = prompts_in_tile(tile, kwargs.get("point_coords"), kwargs.get("box"))
    return {**kwargs, "point_coords": points, "box": box}
