"""`python -m benchmarks memory`: resident memory of client and server as image features pile up, and a soak.

Client: this process with the local engine, after 1, 10 and 100 images went through the
embedding cache (bounded at `FeatureCache.max_bytes`). To keep 100 entries affordable on a
CPU, the engine encodes the first image for real and hands out a fresh copy of those arrays for
every other image: same sizes, same cache path, no 100 encoder runs. Server: the Triton process
and its model processes after encoding 1, 10 and `cache_size + 4` different images for real
(the session model keeps `cache_size`). Soak: one annotator hovers through the server for
`soak_s`, memory of both sampled as it goes; growth is the slope of a least-squares line.
Segment all: the peak resident memory of ours (local engine) and of the official
`SAM2AutomaticMaskGenerator` on the same image and weights, each in a process of its own.
"""

from __future__ import annotations

import itertools
import resource
import time
from pathlib import Path

import numpy as np
import psutil

from triton_sam.engines import Engine, ImageFeatures, create_engine
from triton_sam.export.triton_config import SESSION_CACHE_SIZE
from triton_sam.features import FeatureCache
from triton_sam.image import encoder_input
from triton_sam.registry import DEFAULT_MODEL, get_model
from triton_sam.server.local import LocalTritonServer
from triton_sam.session import InteractiveSession

from .fixtures import BENCH_SHAPE, bench_image, bench_images, exported_repository, mouse_trace, official_predictor, replay
from .wire import loopback_server

MIB = 2**20


class CopyingEngine(Engine):
    """Encodes once for real, then returns copies of those features (memory as if each were new)."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.spec = engine, engine.spec
        self._first: ImageFeatures | None = None

    def encode(self, image: np.ndarray) -> ImageFeatures:
        if self._first is None:
            self._first = self.engine.encode(image)
        return ImageFeatures({k: v.copy() for k, v in self._first.arrays.items()})

    def decode(self, features, request, multimask_output=True, cancel=None):
        return self.engine.decode(features, request, multimask_output, cancel)


def _rss_mib(process: psutil.Process) -> float:
    """Resident memory of a process and all its children."""
    processes = [process, *process.children(recursive=True)]
    return sum(p.memory_info().rss for p in processes if p.is_running()) / MIB


def _client(repository: Path, spec, shape, counts) -> dict:
    engine = CopyingEngine(create_engine(spec, "local", repository))
    cache = FeatureCache(engine)
    me = psutil.Process()
    loaded_mib = _rss_mib(me)
    images, rows, done = bench_images(shape, max(counts)), [], 0
    for count in counts:
        for image in itertools.islice(images, count - done):
            cache.features(encoder_input(image, spec))
        done = count
        rows.append({"images": count, "cached": len(cache), "cache_mib": cache.nbytes / MIB, "rss_mib": _rss_mib(me)})
    engine.engine.close()
    return {"cache_bound_mib": cache.max_bytes / MIB, "engine_loaded_mib": loaded_mib, "rows": rows}


def _server(server: LocalTritonServer, spec, shape, counts) -> list[dict]:
    engine = create_engine(spec, "triton", url=server.grpc_url)
    process = psutil.Process(server.pid)
    images, rows, done = bench_images(shape, max(counts)), [], 0
    for count in counts:
        for image in itertools.islice(images, count - done):
            engine.encode(encoder_input(image, spec))
        done = count
        rows.append({"images": count, "rss_mib": _rss_mib(process)})
    engine.close()
    return rows


def _soak(server: LocalTritonServer, spec, image, soak_s: float, sample_s: float) -> dict:
    session = InteractiveSession(create_engine(spec, "triton", url=server.grpc_url), lambda preview: None)
    session.set_plane("soak", image)
    me, server_process = psutil.Process(), psutil.Process(server.pid)
    samples = []
    started = time.perf_counter()
    while (elapsed := time.perf_counter() - started) < soak_s:
        replay(
            mouse_trace(image.shape[:2], 120.0, sample_s, seed=len(samples)), lambda i, x, y, t: session.hover(x, y, t_event=t)
        )
        samples.append((elapsed / 60.0, _rss_mib(me), _rss_mib(server_process)))
    stats = session.stats.snapshot()
    session.close()
    minutes, client, served = (np.asarray(column) for column in zip(*samples))
    half = len(samples) // 2  # the first minutes include warm-up (allocator pools, caches filling)
    return {
        "seconds": soak_s,
        "hover_events": stats["events"],
        "previews": stats["delivered"],
        "client_rss_mib": {"first": float(client[0]), "last": float(client[-1]), "max": float(client.max())},
        "server_rss_mib": {"first": float(served[0]), "last": float(served[-1]), "max": float(served.max())},
        "client_growth_mib_per_min_second_half": float(np.polyfit(minutes[half:], client[half:], 1)[0]) if half > 1 else None,
        "server_growth_mib_per_min_second_half": float(np.polyfit(minutes[half:], served[half:], 1)[0]) if half > 1 else None,
        "samples": [[round(float(v), 2) for v in row] for row in samples],
    }


def _segment_all_here(side: str, model_id: str, repository: Path, shape, points_per_side: int, seed: int) -> dict:
    """Segment all on a `shape` bench image in this process: ours ("local") or "official"; its peak."""
    from triton_sam.automatic import AutomaticMaskGenerator

    from .automatic import OPTIONS

    options = dict(OPTIONS, points_per_side=points_per_side)
    if side == "official":
        import torch
        from sam2.automatic_mask_generator import SAM2AutomaticMaskGenerator

        torch.set_grad_enabled(False)
        generator = SAM2AutomaticMaskGenerator(official_predictor(model_id, seed).model, **options)
    else:
        generator = AutomaticMaskGenerator(model_id, model_repository=repository, **options)
    started = time.perf_counter()
    masks = len(generator.generate(bench_image(shape)))
    seconds = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"peak_mib": peak_mib, "after_mib": _rss_mib(psutil.Process()), "seconds": seconds, "masks": masks}


def _segment_all(sides, model_id: str, repository: Path, shape, points_per_side: int, seed: int, workdir: Path) -> dict:
    """`_segment_all_here` for each side, each in a child process (a peak is its process's own)."""
    how = {"shape": list(shape), "points_per_side": points_per_side}
    if len(sides) == 1:
        return {sides[0]: _segment_all_here(sides[0], model_id, repository, shape, points_per_side, seed), **how}
    from .suite import run_in_child

    result = dict(how)
    for side in sides:
        only = {"client_counts": [], "server_counts": [], "soak_s": 0.0, "segment_all": [side], "segment_all_shape": list(shape)}
        child = run_in_child("memory", {**only, "segment_all_points_per_side": points_per_side}, model_id, seed, workdir)
        result[side] = child.get("segment_all", {}).get(side, child)  # or why it failed
    return result


def run(
    model_id: str = DEFAULT_MODEL,
    client_counts: tuple[int, ...] = (1, 10, 100),
    server_counts: tuple[int, ...] = (1, 10, SESSION_CACHE_SIZE + 4),
    soak_s: float = 600.0,
    sample_s: float = 10.0,
    shape: tuple[int, int] = BENCH_SHAPE,
    seed: int = 0,
    workdir: Path = Path(".bench"),
    segment_all: tuple[str, ...] = ("local", "official"),
    segment_all_shape: tuple[int, int] = (350, 500),
    segment_all_points_per_side: int = 16,
) -> dict:
    """Each part runs only where asked: `client_counts`, `server_counts` or `soak_s`, `segment_all`."""
    spec = get_model(model_id)
    repository = exported_repository(model_id, seed, workdir)
    result = {"benchmark": "memory", "model": model_id, "image_shape": list(shape)}
    if client_counts:
        result["client"] = _client(repository, spec, shape, client_counts)
    if server_counts or soak_s > 0:
        with loopback_server(repository, model_id) as server:
            result["server"] = {"session_cache_size": SESSION_CACHE_SIZE, "rows": _server(server, spec, shape, server_counts)}
            if soak_s > 0:
                result["soak"] = _soak(server, spec, next(bench_images(shape, 1)), soak_s, sample_s)
    if segment_all:
        points = segment_all_points_per_side
        result["segment_all"] = _segment_all(segment_all, model_id, repository, segment_all_shape, points, seed, workdir)
    return result
