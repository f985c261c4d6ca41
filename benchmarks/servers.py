"""`python -m benchmarks servers`: simulated annotators hovering through HAProxy in front of three
local Triton servers, the balancer keeping each image on one server (the shipped header hash) or
spreading requests round-robin; then one server killed mid-run.

Each annotator has an image of its own, an `InteractiveSession` on a `TritonEngine` whose one URL is
the balancer's, an object in progress (one click) and its own mouse trace. Every round uses images
no server has seen. The model is the tests' synthetic one (`tests/synthetic.py`) under the model's
names: its encodes and decodes take milliseconds, so the figures are of routing, re-encodes and the
balancer, not of a network's compute. Each server keeps the shipped number of images
(`SESSION_CACHE_SIZE`). Reported per round: re-encodes per 1000 decodes (the engines' count of
images encoded again because the server reached lacked their features), decodes/s the servers
ran, event-to-preview latency, errors; in the kill round also objects in progress lost and which
images were encoded again against which lived on the killed server.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from triton_sam.engines.triton import TritonConnection, TritonEngine
from triton_sam.registry import DEFAULT_MODEL, ModelSpec, get_model
from triton_sam.server.local import LocalTritonServer, free_ports
from triton_sam.session import InteractiveSession
from triton_sam.speculative import latency_percentiles

from .balancer import AFFINITY, ROUND_ROBIN, Balancer
from .fixtures import bench_images, mouse_trace, replay

SERVERS = ("triton-0", "triton-1", "triton-2")
KILLED = "triton-1"
CONFIGS = {"affinity": AFFINITY, "round_robin": ROUND_ROBIN}


class Annotator:
    """One simulated user: an image encoded through the balancer, the object in progress on it, and
    the engine's re-encode count."""

    def __init__(self, url: str, spec: ModelSpec, image: np.ndarray, errors: list[Exception]) -> None:
        self.engine = TritonEngine(spec, TritonConnection(url))
        self.session = InteractiveSession(self.engine, lambda preview: None, on_error=errors.append)
        self.session.set_plane("plane", image)
        self.shape = image.shape[:2]

    def click(self, fraction: float) -> None:
        """A click on the diagonal, `fraction` of the way down (the object in progress gets a point), decoded."""
        self.session.add_point(self.shape[1] * fraction, self.shape[0] * fraction)
        self.wait_idle()

    def wait_idle(self) -> None:
        while not self.session.idle:
            time.sleep(0.01)

    def object_kept(self) -> bool:
        """Whether the object in progress is there with all its prompts, decoded from the last of them."""
        obj = self.session.object
        decoded = obj.mask is not None and obj.decoded_version == obj.version
        return self.session.objects_in_progress() == 1 and len(obj.points) == 2 and decoded


def _decoded(servers: dict[str, LocalTritonServer], spec: ModelSpec) -> dict[str, int]:
    """Decodes each running server's session model ran so far."""
    return {name: s.session_requests(spec.session_name).get("decoded", 0) for name, s in servers.items() if s.is_running()}


def _encoded(servers: dict[str, LocalTritonServer], spec: ModelSpec) -> Counter:
    return Counter({name: s.session_requests(spec.session_name).get("encoded", 0) for name, s in servers.items()})


def _arrive(servers, spec: ModelSpec, url: str, images, errors) -> tuple[list[Annotator], list[str]]:
    """The annotators, one an image, arriving one after another and clicking on its centre; and the
    server that encoded each image (on arrival, before the click)."""
    annotators, placement = [], []
    for image in images:
        encoded = _encoded(servers, spec)
        annotators.append(Annotator(url, spec, image, errors))
        (where,) = (_encoded(servers, spec) - encoded).keys()
        placement.append(where)
        annotators[-1].click(0.5)
    return annotators, placement


def _hover(
    servers, spec: ModelSpec, annotators: list[Annotator], traces, during: Callable[[], dict[str, int]] | None = None
) -> tuple[float, int, int]:
    """All annotators replay their traces at once (`during` called halfway, returning the decodes of
    servers it stops); (seconds, decodes the servers ran, re-encodes)."""
    before, reencodes = _decoded(servers, spec), sum(a.engine.reencodes for a in annotators)
    threads = [
        threading.Thread(target=replay, args=(trace, lambda i, x, y, t, s=a.session: s.hover(x, y, t_event=t)))
        for a, trace in zip(annotators, traces)
    ]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    stopped: dict[str, int] = {}
    if during is not None:
        time.sleep(traces[0][-1][0] / 2)
        stopped = during()
    for thread in threads:
        thread.join()
    for annotator in annotators:
        annotator.wait_idle()
    seconds = time.perf_counter() - started
    after = {**_decoded(servers, spec), **stopped}
    decoded = sum(after[name] - before[name] for name in before)
    return seconds, decoded, sum(a.engine.reencodes for a in annotators) - reencodes


def _round(
    servers, spec: ModelSpec, url: str, images, traces, errors: list[Exception], during=None
) -> tuple[dict, list[Annotator], list[str]]:
    """One round: the annotators arrive, hover together, and the figures (`errors`: those shown to
    them, collected); also the annotators (open) and where each image was encoded."""
    annotators, placement = _arrive(servers, spec, url, images, errors)
    seconds, decoded, reencodes = _hover(servers, spec, annotators, traces, during)
    latencies = np.concatenate([np.asarray(a.session.stats.latencies_s) * 1000.0 for a in annotators] + [np.zeros(0)])
    failed = sum(a.session.stats.failed for a in annotators)
    figures = {
        "annotators": len(annotators),
        "images_per_server": dict(sorted(Counter(placement).items())),
        "decodes": decoded,
        "decodes_per_s": decoded / seconds,
        "reencodes": reencodes,
        "reencodes_per_1000_decodes": 1000.0 * reencodes / max(decoded, 1),
        "previews": int(latencies.size),
        "latency_ms": latency_percentiles(latencies),
        "errors": len(errors) + failed,
        "first_error": str(errors[0]) if errors else None,
    }
    return figures, annotators, placement


def _close(annotators: list[Annotator]) -> None:
    for annotator in annotators:
        annotator.session.close()


def _kill_round(servers, spec: ModelSpec, balancer: Balancer, images, traces) -> dict:
    """The affinity round with `KILLED` killed halfway (SIGKILL, as a machine lost); then each
    annotator clicks once more on its object in progress."""

    def kill() -> dict[str, int]:
        last = _decoded({KILLED: servers[KILLED]}, spec)
        os.killpg(servers[KILLED].pid, signal.SIGKILL)  # Triton and its backends' stubs (its own session)
        servers[KILLED].wait()
        return last

    errors: list[Exception] = []
    figures, annotators, placement = _round(servers, spec, balancer.url, images, traces, errors, during=kill)
    try:
        reencodes_before = sum(a.engine.reencodes for a in annotators)
        for annotator in annotators:
            annotator.click(1 / 3)
        lost = sum(not a.object_kept() for a in annotators)
        reencoded = {i for i, a in enumerate(annotators) if a.engine.reencodes > 0}
        clicks_reencodes = sum(a.engine.reencodes for a in annotators) - reencodes_before
        shown = len(errors) + sum(a.session.stats.failed for a in annotators)
    finally:
        _close(annotators)
    on_killed = {i for i, where in enumerate(placement) if where == KILLED}
    return {
        **figures,
        "errors": shown,
        "first_error": str(errors[0]) if errors else None,
        "killed": KILLED,
        "objects_lost": lost,
        "images_on_killed_server": sorted(on_killed),
        "images_reencoded": sorted(reencoded),
        "reencoded_only_killed_servers_images": reencoded <= on_killed,
        "reencodes_of_last_clicks": clicks_reencodes,
    }


@contextmanager
def _three_servers(repository: Path) -> Iterator[dict[str, LocalTritonServer]]:
    """`SERVERS` serving `repository` on loopback, started side by side (their ports asked at once: all different)."""
    ports = free_ports(3 * len(SERVERS))
    kinds = ("http_port", "grpc_port", "metrics_port")
    servers = {
        name: LocalTritonServer(repository, **dict(zip(kinds, ports[3 * i : 3 * i + 3]))) for i, name in enumerate(SERVERS)
    }
    try:
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(LocalTritonServer.start, servers.values()))
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def run(
    model_id: str = DEFAULT_MODEL,
    counts: tuple[int, ...] = (16, 32),
    duration_s: float = 6.0,
    rate_hz: float = 120.0,
    shape: tuple[int, int] = (256, 256),
    seed: int = 0,
    workdir: Path = Path(".bench"),
) -> dict:
    """Each count of annotators with affinity, then round-robin; then the kill round with the fewest."""
    from tests.synthetic import write_repository  # a checkout's tests: the synthetic model

    spec = get_model(model_id)
    rounds = [(config, n) for config in CONFIGS for n in counts] + [("kill", min(counts))]
    images = iter(bench_images(shape, sum(n for _, n in rounds)))
    traces = [mouse_trace(shape, rate_hz, duration_s, seed + i) for i in range(max(counts))]
    result = {"benchmark": "servers", "model": f"synthetic ({model_id}'s names)", "servers": len(SERVERS)}
    result |= {"image_shape": list(shape), "duration_s": duration_s, "load_average": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(dir=workdir if Path(workdir).is_dir() else None) as directory:
        repository = write_repository(spec, Path(directory) / "repository")
        with _three_servers(repository) as servers:
            for config, balance in CONFIGS.items():
                with Balancer(Path(directory), servers, balance) as balancer:
                    balancer.wait_for(dict.fromkeys(servers, "UP L7OK"))
                    result[config] = []
                    for n in counts:
                        picked = [next(images) for _ in range(n)]
                        figures, annotators, _ = _round(servers, spec, balancer.url, picked, traces[:n], [])
                        _close(annotators)
                        result[config].append(figures)
            with Balancer(Path(directory), servers) as balancer:
                balancer.wait_for(dict.fromkeys(servers, "UP L7OK"))
                n = min(counts)
                result["kill"] = _kill_round(servers, spec, balancer, [next(images) for _ in range(n)], traces[:n])
    return result
