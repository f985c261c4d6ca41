"""Encoding from the dock widget: the plane on screen first, then what the user may want next.

A plane shown is encoded in a napari thread worker (cached planes are instant); once it is, a
large plane's tiles are encoded where the view is (those in view, centre first, then those around
it once the cursor rests), chosen anew when the view rests after a pan or zoom; then the planes
one step away on each slider, in the background. "Encode all planes" encodes every plane of the
stack (of large planes the region in view). Work for a view or a plane the user has left stops.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import napari
import numpy as np
from napari.layers import Image
from qtpy.QtCore import QObject, QTimer
from superqt.utils import ensure_main_thread

from ..planes import cache_plane, cache_planes
from ..session import InteractiveSession
from ..tiles import Tile, view_order
from . import bindings, layers
from .workers import make_worker

MAX_VIEW_TILES = 36  # tiles of a large plane encoded for one view at most (in view, then around it)
AROUND_VIEW_WAIT_S = 1.0  # tiles around the view are encoded once the cursor has rested this long
VIEW_SETTLE_MS = 150  # the view rests this long before its tiles are chosen (pan and zoom come in bursts)
NOT_READY = "Press Start and wait for the plane to be encoded first."  # what needs an encoded plane says, before it is
CHANGE_SETTLE_MS = 400  # the layer's contrast limits (a slider drag) or pixels rest this long before the plane is encoded anew


class PlaneEncoding:
    """The panel's session, its image and the plane on screen, and the encoding of planes for it.

    `begin` gives it a session, `end` takes it back; `step_moved` encodes the plane the sliders
    point to and makes it the one on screen; `follow` watches the image's contrast limits and pixels
    (the plane is encoded anew once they rest) and its name (its objects layer goes with it). It
    tells the panel through `set_status` (what it does), `say_ready` (news of encoding), `failed`
    (an error), `on_leaving` (the plane on screen changes: its preview and prompts go), `on_shown`
    (a plane asked for is encoded: its prompts and the preview at the cursor), `on_all_finished`
    (Encode all planes ended), `on_new_pixels(same_layout)` (the image's data was replaced) and
    `on_renamed` (the image layer has a new name).
    """

    def __init__(
        self,
        viewer: napari.Viewer,
        parent: QObject,
        *,
        set_status: Callable[[str], None],
        say_ready: Callable[..., None],
        failed: Callable[[Exception], None],
        on_leaving: Callable[[], None],
        on_shown: Callable[[], None],
        on_all_finished: Callable[[], None],
        on_new_pixels: Callable[[bool], None],
        on_renamed: Callable[[], None],
    ) -> None:
        self.viewer = viewer
        self.session: InteractiveSession | None = None
        self.image: Image | None = None
        self.index: tuple[int, ...] | None = None  # the plane on screen (None: none yet, or not ready)
        self._set_status, self._say_ready, self._failed = set_status, say_ready, failed
        self._on_leaving, self._on_shown = on_leaving, on_shown
        self._on_all_finished, self._on_new_pixels, self._on_renamed = on_all_finished, on_new_pixels, on_renamed
        self._encoding = None  # the worker encoding the plane on screen
        self._all_worker = None
        self._view_generation = 0  # bumped when the view moves: tile encoding for the old view stops
        self._view_timer = QTimer(parent, singleShot=True, interval=VIEW_SETTLE_MS)
        self._view_timer.timeout.connect(self._encode_view)
        self._change_timer = QTimer(parent, singleShot=True, interval=CHANGE_SETTLE_MS)
        self._change_timer.timeout.connect(self._image_rested)
        self._followed: Image | None = None  # the layer whose pixels and contrast limits are followed
        self._layout: tuple | None = None  # its dimensions, shape and colour when followed
        self._image_name = ""  # and its name (its objects layer is found by it)

    def begin(self, session: InteractiveSession, image: Image) -> None:
        """Encode planes of `image` for `session` from now on (none is on screen yet)."""
        self.session, self.image, self.index = session, image, None

    def end(self) -> InteractiveSession | None:
        """Stop encoding for the session (work under way sees it and stops); returns it."""
        session, self.session = self.session, None
        return session

    @property
    def ready(self) -> bool:
        """A plane is encoded and it is the one on screen."""
        return (
            self.session is not None
            and self.index is not None
            and self.image in self.viewer.layers
            and self.session.plane == layers.plane_key(self.image, self.index)
        )

    @property
    def tiled(self) -> bool:
        """The plane on screen is large: covered by tiles, encoded as they come into view."""
        return self.ready and self.large

    @property
    def large(self) -> bool:
        """The image's planes are large (tiled)."""
        return self.session.is_tiled(layers.plane_shape(self.image))

    def step_moved(self, event=None) -> None:
        """The sliders moved: encode the plane now on screen (cached planes are instant)."""
        if self.session is None or self.image is None or self.image not in self.viewer.layers:
            return
        index = layers.plane_index(self.image, self.viewer.dims.point)
        if index != self.index:
            self._show(index, f"Encoding plane {index or '(2D)'} ...")

    def follow(self, image: Image | None) -> None:
        """Encode the plane on screen again when `image`'s contrast limits or pixels change, and keep
        its objects layer when it is renamed (None: stop following)."""
        if self._followed is not None:
            self._followed.events.contrast_limits.disconnect(self._on_contrast)
            self._followed.events.data.disconnect(self._on_data)
            self._followed.events.name.disconnect(self._on_rename)
        self._change_timer.stop()
        self._followed, self._layout = image, None
        if image is not None:
            self._layout, self._image_name = _layout(image), image.name
            image.events.contrast_limits.connect(self._on_contrast)
            image.events.data.connect(self._on_data)
            image.events.name.connect(self._on_rename)

    def _on_rename(self, event=None) -> None:
        """The image layer was renamed: its objects layer goes with it (commits, Propagate)."""
        layers.rename_objects_layer(self.viewer, self._image_name, self._followed)
        self._image_name = self._followed.name
        self._on_renamed()

    def _on_contrast(self, event=None) -> None:
        if not self._followed.rgb:  # (SAM sees RGB as it is)
            self._change_timer.start()  # (again): a slider drag sends many changes

    def _on_data(self, event=None) -> None:
        """The layer's data was replaced: the plane on screen is encoded anew (if of the same
        shape); Encode all planes, which reads the old planes, stops."""
        same = _layout(self._followed) == self._layout
        self._on_new_pixels(same)
        self.stop_all()
        if same:
            self._change_timer.start()

    def _image_rested(self) -> None:
        """Contrast limits or pixels rest: the model sees the plane as the user does (cached limits are instant)."""
        index = self.index
        if index is not None and self.session is not None and self.image in self.viewer.layers:
            self._show(index, f"The image changed: encoding plane {index or '(2D)'} as now shown ...")

    def _show(self, index: tuple[int, ...], status: str) -> None:
        """Encode plane `index` of the image (with its contrast limits of now) and show it to the session."""
        self._on_leaving()
        self.index = index
        key = layers.plane_key(self.image, index)
        data = layers.plane_data(self.image, index)
        contrast = layers.encoding_contrast(self.image)
        self._set_status(status)
        started = time.perf_counter()
        worker = make_worker(
            self.session.set_plane,
            key,
            data,
            contrast,
            layers.plane_levels(self.image, index),
            progress={"desc": "triton-sam: encoding"},
        )
        worker.returned.connect(lambda _: self.plane_ready(index, time.perf_counter() - started))
        worker.errored.connect(self._failed)
        self._encoding = worker
        worker.start()

    def plane_ready(self, index: tuple[int, ...], seconds: float) -> None:
        """Plane `index` is encoded: the panel shows it, then its view or its neighbours are encoded."""
        if self.session is None or self.image is None or index != self.index:
            return  # closed, or the user moved on while this plane was encoded
        self._on_shown()
        if self.tiled:
            self._encode_view()
            return
        self._say_ready("", f"Plane {index or '(2D)'} encoded in {seconds:.1f} s.")
        self._prefetch_neighbours(index)

    def view_moved(self) -> None:
        """Pan or zoom: stop encoding the tiles of the old view; choose anew once the view rests."""
        self._view_generation += 1
        if self.tiled:
            self._view_timer.start()

    def _encode_view(self) -> None:
        """Encode the tiles in view (centre first), then those around it, in the background; the
        tiles are as coarse as the screen's pixels (zoomed out: the plane reduced, a pyramid level)."""
        if not self.tiled:
            return
        self._view_generation += 1
        generation, session = self._view_generation, self.session
        session.set_tile_step(layers.screen_step(self.image, bindings.camera(self.viewer).zoom))
        view = Tile(*layers.visible_region(self.image))
        inside, near = view_order(session.tiles, view, around=session.spec.input_size * session.tile_step // 2)
        if len(inside) > MAX_VIEW_TILES:
            self._set_status(
                f"Zoom in to segment: the view shows {len(inside)} tiles and up to {MAX_VIEW_TILES} are encoded at a time."
            )
            return
        ahead = (inside + near)[:MAX_VIEW_TILES]
        todo = [t for t in ahead if t in inside and not session.encoded(t)]
        around = [t for t in ahead if t not in inside and not session.encoded(t)]
        visible, index = len(todo), self.index

        def moved_on() -> bool:
            return generation != self._view_generation or session is not self.session

        def encode() -> None:
            session.encode_tiles(todo, partial(self._tiles_progress, visible=visible), moved_on)
            # The tiles around the view are work ahead of need: they wait while the cursor moves.
            session.encode_tiles(
                around, partial(self._tiles_progress, visible=visible, before=visible), moved_on, AROUND_VIEW_WAIT_S
            )

        worker = make_worker(encode)
        worker.errored.connect(self._failed)
        worker.returned.connect(lambda _: moved_on() or self._prefetch_neighbours(index, inside, moved_on))
        worker.start()

    def view_tiles(self) -> list[Tile]:
        """The tiles of the plane shown that meet the view, nearest its centre first."""
        return view_order(self.session.tiles, Tile(*layers.visible_region(self.image)), around=0)[0]

    @ensure_main_thread
    def _tiles_progress(self, done: int, total: int, visible: int, before: int = 0) -> None:
        """`done` of `total` tiles encoded, after `before` others; the first `visible` are in view."""
        if self.session is None:
            return
        done, total = done + before, total + before
        if done < visible:
            progress = f"encoding the tiles in view: {done} of {visible}"
        else:
            progress = f"tiles in view ready; around it {done - visible} of {total - visible}"
        self._say_ready(f"{progress.capitalize()}.")

    def _prefetch_neighbours(self, index: tuple[int, ...], tiles: list[Tile] = (), view_moved=lambda: False) -> None:
        """Encode the planes one step away on each slider in the background (cached by content):
        whole, or of large planes the `tiles` in view, these once the cursor rests and until
        `view_moved()`."""
        shape = self.image.data.shape[: self.image.ndim - 2]
        neighbours = [
            index[:axis] + (index[axis] + step,) + index[axis + 1 :]
            for axis in range(len(index))
            for step in (1, -1)
            if 0 <= index[axis] + step < shape[axis]
        ]
        if not neighbours:
            return
        contrast = layers.encoding_contrast(self.image)
        session, image = self.session, self.image

        def moved_on() -> bool:
            return session is not self.session or self.index != index or view_moved()  # stop guessing

        def stopped() -> bool:
            return session.closed or moved_on()

        def ready() -> bool:  # work ahead of need: tiles wait while the cursor moves
            return session.cursor.rested(AROUND_VIEW_WAIT_S if tiles else 0.0, stopped)

        def prefetch():
            for neighbour in neighbours:
                if moved_on():
                    return
                data, levels = layers.plane_data(image, neighbour), layers.plane_levels(image, neighbour)
                cache_plane(data, session.cache, tiles, contrast_limits=contrast, levels=levels, ready=ready)

        make_worker(prefetch).start()

    @property
    def encoding_all(self) -> bool:
        """Encode all planes is running."""
        return self._all_worker is not None

    def encode_all(self) -> None:
        """Encode every plane of the layer in the background (with progress); of large planes, the
        tiles in view now (the same region of every plane)."""
        shape = self.image.data.shape[: self.image.ndim - 2]
        indices = list(np.ndindex(*shape))
        contrast = layers.encoding_contrast(self.image)
        session, image = self.session, self.image
        tiles = self.view_tiles() if self.large else []

        def stopped() -> bool:
            return session.closed or worker.abort_requested

        def encode_all():
            planes = [(layers.plane_data(image, index), layers.plane_levels(image, index)) for index in indices]
            yield from cache_planes(planes, session.cache, tiles, contrast_limits=contrast, stopped=stopped)

        worker = make_worker(encode_all, progress={"total": len(indices), "desc": "triton-sam: encoding all planes"})
        worker.yielded.connect(lambda done: self._set_status(f"Encoded {done} of {len(indices)} planes."))
        worker.finished.connect(self._all_finished)
        worker.errored.connect(self._failed)
        self._all_worker = worker
        worker.start()

    def stop_all(self) -> None:
        """Stop Encode all planes (after the plane under way)."""
        if self._all_worker is not None:
            self._all_worker.quit()

    def _all_finished(self) -> None:
        self._all_worker = None
        self._on_all_finished()


def _layout(image: Image) -> tuple:
    """What the panel's layers and planes depend on: the image's dimensions, shape and colour."""
    return image.ndim, tuple(image.data.shape), image.rgb
