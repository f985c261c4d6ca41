"""`python -m benchmarks memory`: resident memory of client and server as image features pile up, and a soak.

Client: this process with the local engine, after 1, 10 and 100 images went through the
embedding cache (bounded at `FeatureCache.max_bytes`). To keep 100 entries affordable on a
CPU, the engine encodes the first image for real and hands out a fresh copy of those arrays for
every other image: same sizes, same cache path, no 100 encoder runs. Server: the Triton process
and its model processes after encoding 1, 10 and `cache_size + 4` different images for real
(the session model keeps `cache_size`). Soak: one annotator hovers through the server for
`soak_s`, memory of both sampled as it goes; growth is the slope of a least-squares line.
"""

from __future__ import annotations

import itertools
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

from .fixtures import BENCH_SHAPE, bench_images, exported_repository, mouse_trace, replay
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
    images, rows, done = bench_images(shape, max(counts)), [], 0
    for count in counts:
        for image in itertools.islice(images, count - done):
            cache.features(encoder_input(image, spec))
        done = count
        rows.append({"images": count, "cached": len(cache), "cache_mib": cache.nbytes / MIB, "rss_mib": _rss_mib(me)})
    engine.engine.close()
    return {"cache_bound_mib": cache.max_bytes / MIB, "rows": rows}


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


def run(
    model_id: str = DEFAULT_MODEL,
    client_counts: tuple[int, ...] = (1, 10, 100),
    server_counts: tuple[int, ...] = (1, 10, SESSION_CACHE_SIZE + 4),
    soak_s: float = 600.0,
    sample_s: float = 10.0,
    shape: tuple[int, int] = BENCH_SHAPE,
    seed: int = 0,
    workdir: Path = Path(".bench"),
) -> dict:
    spec = get_model(model_id)
    repository = exported_repository(model_id, seed, workdir)
    result = {"benchmark": "memory", "model": model_id, "image_shape": list(shape)}
    result["client"] = _client(repository, spec, shape, client_counts)
    with loopback_server(repository, model_id) as server:
        result["server"] = {"session_cache_size": SESSION_CACHE_SIZE, "rows": _server(server, spec, shape, server_counts)}
        if soak_s > 0:
            result["soak"] = _soak(server, spec, next(bench_images(shape, 1)), soak_s, sample_s)
    return result
