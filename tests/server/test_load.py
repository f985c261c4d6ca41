"""16 annotators hovering at once on one local Triton server for 24 s (synthetic model).

The server keeps fewer images than there are annotators, so embeddings are evicted all along and
must be recovered from; errors, memory, threads and connections are checked at the end.
"""

from __future__ import annotations

import threading
import time

import psutil
import pytest

from benchmarks.fixtures import mouse_trace, replay
from conftest import start_server
from synthetic import disk_image, write_repository
from triton_sam.engines.triton import TritonConnection, TritonEngine
from triton_sam.export import write_session_model
from triton_sam.registry import get_model
from triton_sam.session import InteractiveSession

TINY = get_model("sam2.1_hiera_tiny")
SESSIONS = 16
LOAD_S = 24.0  # long enough for evictions and a memory trend; a minute took 61 s of CI
H, W = 300, 400


@pytest.fixture(scope="module")
def evicting_server(tmp_path_factory):
    repository = write_repository(TINY, tmp_path_factory.mktemp("load_repo"))
    write_session_model(TINY, repository, cache_size=SESSIONS - 4)
    server = start_server(repository)
    yield server
    server.stop()


def _rss_mib(process: psutil.Process) -> float:
    return sum(p.memory_info().rss for p in [process, *process.children(recursive=True)]) / 2**20


def _threads() -> set[threading.Thread]:
    """Live threads, less the mask upsampling pool (module-level, it lives as long as the process)."""
    return {t for t in threading.enumerate() if not t.name.startswith("triton-sam-upsample")}


def test_sixteen_sessions_hover_without_errors_or_leaks(evicting_server):
    me, server_process = psutil.Process(), psutil.Process(evicting_server.pid)
    assert not any(evicting_server.session_requests(TINY.session_name).values())  # metrics answer before the load
    threads_before = _threads()
    connections_before = len(me.net_connections(kind="tcp"))
    errors: list[Exception] = []
    sessions = []
    for i in range(SESSIONS):
        engine = TritonEngine(TINY, TritonConnection(evicting_server.grpc_url))
        session = InteractiveSession(engine, lambda preview: None, on_error=errors.append)
        session.set_plane("plane", disk_image(H, W, [(50 + 15 * i, 80 + 7 * i, 30 + i)]))
        sessions.append(session)

    memory = []

    def sample() -> None:
        while replaying:
            memory.append((_rss_mib(me), _rss_mib(server_process)))
            time.sleep(2)

    replaying = True
    sampler = threading.Thread(target=sample)
    sampler.start()
    replayers = [
        threading.Thread(
            target=replay, args=(mouse_trace((H, W), 120.0, LOAD_S, seed=i), lambda n, x, y, t, s=s: s.hover(x, y, t))
        )
        for i, s in enumerate(sessions)
    ]
    for thread in replayers:
        thread.start()
    for thread in replayers:
        thread.join()
    replaying = False
    sampler.join()
    deadline = time.monotonic() + 30
    while not all(s.idle for s in sessions) and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = [s.stats for s in sessions]
    for session in sessions:
        session.close()
    counts = evicting_server.session_requests(TINY.session_name)

    assert errors == [] and sum(s.failed for s in stats) == 0
    assert all(s.delivered > 0 for s in stats)  # every annotator saw previews
    assert counts.get("unknown_handle", 0) > 0  # embeddings were evicted (their own outcome, not "failed") ...
    assert counts["encoded"] > SESSIONS  # ... and encoded again
    # Memory: after the first samples (warm-up) it stays within a margin.
    warm_client, warm_server = memory[2]
    assert max(c for c, _ in memory[2:]) < warm_client + 100
    assert max(s for _, s in memory[2:]) < warm_server + 100
    # No threads or connections left behind.
    deadline = time.monotonic() + 10
    while _threads() - threads_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _threads() - threads_before
    assert len(me.net_connections(kind="tcp")) <= connections_before
