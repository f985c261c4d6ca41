"""`python -m benchmarks annotators`: many simulated annotators hovering on one local Triton server.

Each annotator has its own image, its own mouse trace (`hover.mouse_trace` with its own seed) and
its own `InteractiveSession` with a Triton engine, as a napari user would. They all replay their
traces at once against one server, run once with the session model's dynamic batcher and once
without. Reported per count: decodes the server ran per second, event-to-preview latency over all
annotators, and errors.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from triton_sam.engines.triton import TritonConnection, TritonEngine
from triton_sam.export import write_session_model
from triton_sam.export.triton_config import SESSION_CACHE_SIZE
from triton_sam.registry import DEFAULT_MODEL, ModelSpec, get_model
from triton_sam.server.local import LocalTritonServer
from triton_sam.session import InteractiveSession
from triton_sam.speculative import latency_percentiles

from .fixtures import BENCH_SHAPE, bench_images, exported_repository, mouse_trace, replay
from .wire import loopback_server


def _repository(spec: ModelSpec, exported: Path, target: Path, cache_size: int) -> Path:
    """The exported encoder and decoder with a session model that keeps `cache_size` images: the
    exported repository itself where its session model keeps as many (a server the suite shares
    serves it), else `target`, with a session model of its own."""
    if cache_size <= SESSION_CACHE_SIZE:
        return exported
    target.mkdir(parents=True, exist_ok=True)
    for name in (spec.encoder_name, spec.decoder_name):
        link = target / name
        if not link.exists():
            link.symlink_to(exported.resolve() / name, target_is_directory=True)
    write_session_model(spec, target, cache_size=cache_size)
    return target


def _round(server: LocalTritonServer, spec: ModelSpec, images, traces) -> dict:
    """All annotators replay their traces at once; server decodes/s, latency, errors."""
    errors: list[Exception] = []
    sessions = []
    for image in images:
        engine = TritonEngine(spec, TritonConnection(server.grpc_url))
        session = InteractiveSession(engine, lambda preview: None, on_error=errors.append)
        session.set_plane("plane", image)  # encoded once per server: handles are content hashes
        sessions.append(session)
    before = server.session_requests(spec.session_name).get("decoded", 0)
    started = time.perf_counter()
    threads = [
        threading.Thread(target=replay, args=(trace, lambda i, x, y, t, s=session: s.hover(x, y, t_event=t)))
        for session, trace in zip(sessions, traces)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for session in sessions:
        while not session.idle:
            time.sleep(0.01)
    seconds = time.perf_counter() - started
    decoded = server.session_requests(spec.session_name).get("decoded", 0) - before
    latencies = np.concatenate([np.asarray(s.stats.latencies_s) * 1000.0 for s in sessions] + [np.zeros(0)])
    failed = sum(s.stats.failed for s in sessions)
    for session in sessions:
        session.close()
    return {
        "annotators": len(images),
        "decodes_per_s": decoded / seconds,
        "previews": int(latencies.size),
        "latency_ms": latency_percentiles(latencies),
        "errors": len(errors) + failed,
        "first_error": str(errors[0]) if errors else None,
    }


def run(
    model_id: str = DEFAULT_MODEL,
    counts: tuple[int, ...] = (1, 4, 16, 32),
    duration_s: float = 10.0,
    rate_hz: float = 120.0,
    shape: tuple[int, int] = BENCH_SHAPE,
    seed: int = 0,
    workdir: Path = Path(".bench"),
) -> dict:
    spec = get_model(model_id)
    exported = exported_repository(model_id, seed, workdir)
    repository = _repository(spec, exported, Path(workdir) / "annotators_repository", cache_size=max(counts) + 4)
    images = list(bench_images(shape, max(counts)))
    traces = [mouse_trace(shape, rate_hz, duration_s, seed + i) for i in range(max(counts))]
    result = {"benchmark": "annotators", "model": model_id, "image_shape": list(shape), "duration_s": duration_s}
    for batching in (True, False):
        with loopback_server(repository, model_id, session_batching=batching) as server:
            rounds = [_round(server, spec, images[:n], traces[:n]) for n in counts]
        result["dynamic_batching" if batching else "no_batching"] = rounds
    return result
