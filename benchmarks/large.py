"""`python -m benchmarks large`: a 20000 x 20000 uint16 plane in napari, as a numpy array and as a
multiscale dask pyramid generated on demand (nothing of it is held but what is read).

For each plane and backend, in a real napari window zoomed to native resolution at the plane's
centre: Start, with the cursor resting on a cell, until the first preview is on screen and until
the tiles in view are encoded; a hover trace over the view (move to preview on screen); a pan by
one view, until the new view's tiles are encoded; zooming out to the whole plane (coarse tiles from
the pyramid, or reduced crops), until a preview of a coarse tile is on screen and its view is
encoded. The worst event-loop stall of each phase and the
memory peak of the run's process (each plane and backend runs in a process of its own) and of
the server are reported. The reference is what tools that tile do
(micro-sam's tiled embeddings): encode every tile of the plane before the first prompt; its time
is the plane's tile count times the tile encode time measured here, not run (hours on a CPU).
Needs a display (use `xvfb-run -a` on a headless machine).
"""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import psutil
from qtpy.QtCore import QEvent, QTimer

from triton_sam.plugin import bindings, layers
from triton_sam.registry import DEFAULT_MODEL
from triton_sam.tiles import Tile, view_order

from . import timed_call
from .gui import ScreenClock, StallMonitor, _canvas, _hover, _run_until, open_widget, send_mouse

LARGE_SHAPE = (20000, 20000)
CELL_SPACING = 48  # pixels between cell centres (a jittered lattice)
CELL_RADIUS = 14
PYRAMID_FACTOR = 4  # each level of the multiscale pyramid is this much smaller
CHUNK = 256  # rows and columns of a chunk of the dask levels (napari draws whole chunks in view)


def cells(y0: int, x0: int, height: int, width: int, step: int = 1) -> np.ndarray:
    """The synthetic plane's pixels rows y0, y0 + step, ... and columns likewise (uint16): bright
    round cells on a dim textured background, the same wherever and at whatever step it is read."""
    yy = (y0 + step * np.arange(height))[:, None]
    xx = (x0 + step * np.arange(width))[None, :]
    row, col = yy // CELL_SPACING, xx // CELL_SPACING
    jitter_y = (row * 73856093 ^ col * 19349663) % 17 - 8
    jitter_x = (row * 83492791 ^ col * 2654435761) % 17 - 8
    dy = yy - (row * CELL_SPACING + CELL_SPACING // 2 + jitter_y)
    dx = xx - (col * CELL_SPACING + CELL_SPACING // 2 + jitter_x)
    inside = dy * dy + dx * dx <= CELL_RADIUS**2
    return (800 + 30000 * inside + ((yy * 31 + xx * 17) % 97) * 20).astype(np.uint16)


def numpy_plane(shape: tuple[int, int] = LARGE_SHAPE) -> np.ndarray:
    plane = np.empty(shape, np.uint16)
    for y0 in range(0, shape[0], CHUNK):
        plane[y0 : y0 + CHUNK] = cells(y0, 0, min(CHUNK, shape[0] - y0), shape[1])
    return plane


def dask_pyramid(shape: tuple[int, int] = LARGE_SHAPE) -> list:
    """Levels of the plane, each `PYRAMID_FACTOR` x smaller, down to about a screen; computed per chunk when read."""
    import dask.array as da

    levels, factor = [], 1
    while not levels or max(levels[-1].shape) > 2048:
        level_shape = (-(-shape[0] // factor), -(-shape[1] // factor))

        def block(block_info=None, factor=factor):
            (r0, r1), (c0, c1) = block_info[None]["array-location"]
            return cells(r0 * factor, c0 * factor, r1 - r0, c1 - c0, factor)

        chunks = da.core.normalize_chunks(CHUNK, level_shape)
        levels.append(da.map_blocks(block, chunks=chunks, dtype=np.uint16, meta=np.array((), np.uint16)))
        factor *= PYRAMID_FACTOR
    return levels


class MemoryPeak:
    """Peak resident memory of this process (its own children but the server) and of the server
    (with its model processes), sampled every 0.1 s."""

    def __init__(self, server_pid: int | None = None) -> None:
        self.server = psutil.Process(server_pid) if server_pid else None
        self.peaks_mib = {"client_peak_mib": 0.0, **({"server_peak_mib": 0.0} if server_pid else {})}
        self._running = True
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        me = psutil.Process()
        while self._running:
            server = [self.server, *self.server.children(recursive=True)] if self.server else []
            client = [p for p in [me, *me.children(recursive=True)] if p not in server]
            for key, tree in (("client_peak_mib", client), ("server_peak_mib", server)):
                if tree:
                    self.peaks_mib[key] = max(self.peaks_mib[key], sum(_rss(p) for p in tree) / 2**20)
            time.sleep(0.1)

    def stop(self) -> dict:
        self._running = False
        self._thread.join()
        return dict(self.peaks_mib)


def _rss(process: psutil.Process) -> int:
    try:
        return process.memory_info().rss
    except psutil.NoSuchProcess:
        return 0


def _view_tiles(widget, image) -> list[Tile]:
    inside, _ = view_order(widget.session.tiles, Tile(*layers.visible_region(image)), around=0)
    return inside


def _start(viewer, widget, image, canvas, action=None, counts=lambda preview: True) -> dict:
    """Start (or another `action`) with the cursor resting on the cell nearest the view's centre
    (the same position sent every 100 ms: napari's plugin sees none before Start is done), until
    the first preview that `counts` is on screen and the tiles in view are encoded."""
    monitor, screen = StallMonitor(canvas), ScreenClock(widget, canvas, counts)
    cy, cx = (int(c) // CELL_SPACING * CELL_SPACING + CELL_SPACING // 2 for c in bindings.camera(viewer).center[-2:])
    rest = QTimer()
    rest.setInterval(100)
    rest.timeout.connect(lambda: send_mouse(viewer, canvas, QEvent.Type.MouseMove, (cy, cx)))
    marks: dict[str, float] = {}

    def check() -> bool:
        now = time.perf_counter() - started
        if "ready_s" not in marks and widget.ready:
            marks["ready_s"] = now
        if "first_preview_s" not in marks and screen.shown:
            marks["first_preview_s"] = screen.shown[0][1] - started
        if "view_encoded_s" not in marks and widget.ready and all(widget.session.encoded(t) for t in _view_tiles(widget, image)):
            marks["view_encoded_s"] = now
        return len(marks) == 3

    monitor.start()
    started = time.perf_counter()
    (action or widget.connect_engine)()
    rest.start()
    _run_until(check, 900)
    rest.stop()
    return {
        **marks,
        **monitor.stop(),
        "tiles_in_view": len(_view_tiles(widget, image)),
        "tile_step": widget.session.tile_step,
        "engine": widget.session.engine.describe(),
    }


def _zoom_out(viewer, widget, image, canvas) -> dict:
    """Zoom out to the whole plane, the cursor resting at its centre: until a coarse tile's preview
    is on screen and the (coarse) tiles in view are encoded."""

    def zoom_out() -> None:
        viewer.reset_view()
        _run_until(lambda: False, 0.3)  # the canvas draws the new view (corner pixels follow)

    result = _start(viewer, widget, image, canvas, zoom_out, counts=lambda preview: preview.step > 1)
    result.pop("ready_s")
    return result


def _pan(viewer, widget, image, canvas) -> dict:
    """Pan by one view width; until the new view's tiles are encoded."""
    monitor = StallMonitor(canvas)
    y0, x0, y1, x1 = layers.visible_region(image)
    camera = bindings.camera(viewer)
    monitor.start()
    started = time.perf_counter()
    camera.center = (camera.center[-2], camera.center[-1] + (x1 - x0))
    _run_until(lambda: False, 0.3)  # the canvas draws the new view (corner pixels follow)
    _run_until(lambda: all(widget.session.encoded(t) for t in _view_tiles(widget, image)), 900)
    return {"view_encoded_s": time.perf_counter() - started, **monitor.stop()}


def _tile_encode_s(model_id: str, backend: str, repository: Path, url: str | None, data, tiles: int = 2) -> float:
    """Median seconds to encode one tile through `backend` with nothing else running: tiles of the
    plane's far corner, which the napari run never sees (no cache, here or on the server, helps it)."""
    from triton_sam.tiled_predictor import TiledPredictor

    options = {"url": url} if backend == "triton" else {}
    with TiledPredictor(model_id, backend, repository, **options) as predictor:
        predictor.set_image(data[0] if isinstance(data, list) else data)
        return float(np.median([timed_call(predictor.tile_features, tile)[0] for tile in predictor.tiles[-tiles:]]))


def _backend_run(backend: str, url: str | None, model_id: str, repository: Path, data, trace_s: float, seed: int, window) -> dict:
    shape = (data[0] if isinstance(data, list) else data).shape
    import napari

    from .fixtures import mouse_trace

    viewer = napari.Viewer(show=True)
    try:
        viewer.window._qt_window.resize(*window)
        image = viewer.add_image(data, name="large", multiscale=isinstance(data, list), contrast_limits=(0, 40000))
        widget = open_widget(viewer, backend, url, model_id, repository)
        camera = bindings.camera(viewer)
        camera.center, camera.zoom = (shape[0] / 2, shape[1] / 2), 1.0  # native resolution
        _run_until(lambda: False, 0.5)
        canvas = _canvas(widget)
        result = {"start": _start(viewer, widget, image, canvas)}
        y0, x0, y1, x1 = layers.visible_region(image)
        trace = [(t, x0 + x, y0 + y) for t, x, y in mouse_trace((y1 - y0, x1 - x0), 120.0, trace_s, seed)]
        result["hover"] = _hover(viewer, widget, image, trace, StallMonitor(canvas))
        result["pan"] = _pan(viewer, widget, image, canvas)
        encoded = [t for t in widget.session.tiles if widget.session.encoded(t)]
        result["tiles"] = {"plane": len(widget.session.tiles), "encoded": len(encoded)}
        result["zoom_out"] = _zoom_out(viewer, widget, image, canvas)
        widget.close_session()
        return result
    finally:
        viewer.close()


def run(
    model_id: str = DEFAULT_MODEL,
    planes: tuple[str, ...] = ("multiscale", "numpy"),
    shape: tuple[int, int] = LARGE_SHAPE,
    backends: tuple[str, ...] = ("local", "triton"),
    hover_s: float = 10.0,
    seed: int = 0,
    workdir: Path = Path(".bench"),
    timed_tiles: int = 2,
    window: tuple[int, int] = (1600, 1000),
) -> dict:
    """Each plane with each backend; more than one such run goes one per child process, so that each
    memory peak is that run's own, not what an earlier one left behind. `timed_tiles`: tiles encoded
    alone to time one (the estimate of encoding every tile first); `window`: napari's window size
    (width, height), which sets how many tiles are in view."""
    result = {"benchmark": "large", "model": model_id, "plane_shape": list(shape), "dtype": "uint16", "hover_s": hover_s}
    how = {"shape": list(shape), "hover_s": hover_s, "timed_tiles": timed_tiles, "window": list(window)}
    runs = [(plane, backend) for plane in planes for backend in backends]
    if len(runs) == 1:
        result[f"{planes[0]}_{backends[0]}"] = _plane_run(planes[0], backends[0], model_id, seed, workdir, **how)
        return result
    from .suite import run_in_child

    for plane, backend in runs:
        child = run_in_child("large", {"planes": [plane], "backends": [backend], **how}, model_id, seed, workdir)
        key = f"{plane}_{backend}"
        if key not in child:
            raise RuntimeError(f"bench large, {plane} plane, {backend}: {child}")
        result[key] = child[key]
    return result


def _plane_run(
    plane: str, backend: str, model_id: str, seed: int, workdir: Path, shape, hover_s: float, timed_tiles: int, window
) -> dict:
    """One plane ("multiscale" or "numpy") in napari with one backend, its memory peak included."""
    from .fixtures import exported_repository
    from .wire import loopback_server

    repository = exported_repository(model_id, seed, workdir)
    data = dask_pyramid(shape) if plane == "multiscale" else numpy_plane(shape)
    with ExitStack() as servers:
        url, server_pid = None, None
        if backend == "triton":
            server = servers.enter_context(loopback_server(repository, model_id))
            url, server_pid = server.grpc_url, server.pid
        encode_s = _tile_encode_s(model_id, backend, repository, url, data, timed_tiles)
        memory = MemoryPeak(server_pid)
        label = "Triton" if backend == "triton" else "Local"
        result = _backend_run(label, url, model_id, repository, data, hover_s, seed, window)
        result["memory"] = memory.stop()
        result["tiles"]["encode_s"] = encode_s
    result["reference_encode_all_s"] = result["tiles"]["plane"] * encode_s  # estimated, see the docstring
    return result
