"""Measure the wire: a counting TCP proxy (bytes per call each way), servers on free loopback ports."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

from triton_sam.server.local import LocalTritonServer, free_ports, loopback_ports


class CountingProxy:
    """Forwards connections to `target` ("host:port") and counts bytes sent up and down."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._lock = threading.Lock()
        self.up = 0
        self.down = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            threading.Thread(target=self._pump, args=(client, upstream, "up"), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, "down"), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, direction: str) -> None:
        try:
            while data := source.recv(65536):
                with self._lock:
                    setattr(self, direction, getattr(self, direction) + len(data))
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def counts(self) -> tuple[int, int]:
        with self._lock:
            return self.up, self.down

    def close(self) -> None:
        self._closed = True
        self._listener.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    return free_ports(1)[0]


SHARED_SERVERS = "TRITON_SAM_BENCH_SHARED_SERVERS"  # JSON of `shared_servers`'s, set by the suite for its children


class _SharedServer(LocalTritonServer):
    """A server that the suite started and stops, as one benchmark sees it: used as its own
    (`with`, `grpc_url`, `pid`, `session_requests`), neither started nor stopped here."""

    def __init__(self, repository: str, model_id: str, pid: int, ports: dict[str, int], **batching: bool) -> None:
        super().__init__(Path(repository), models=(model_id,), **batching, **ports)
        self._pid = pid

    @property
    def pid(self) -> int:
        return self._pid

    def __enter__(self) -> LocalTritonServer:
        return self

    def __exit__(self, *exc) -> None:
        pass


def shared_servers(model_id: str, *servers: LocalTritonServer) -> dict[str, str]:
    """The environment that makes `loopback_server` in a child process hand out one of `servers`
    (running; the first on the default settings, another with the session model's batching
    switched the other way) instead of starting one of its own with the same settings."""
    about = [
        {
            "repository": str(Path(server.model_repository).resolve()),
            "model_id": model_id,
            "pid": server.pid,
            "ports": {f"{kind}_port": port for kind, port in server.ports.items()},
            "session_batching": server.session_batching,
            "batched_encodes": server.batched_encodes,
        }
        for server in servers
    ]
    return {SHARED_SERVERS: json.dumps(about)}


def loopback_server(repository: Path, model_id: str, **options) -> LocalTritonServer:
    """A local Triton server (not started yet) on free loopback ports, serving `model_id` only
    (the benchmark's work directory may hold other, larger models); or, where the suite shares
    servers (`shared_servers`) and one has all that `options` ask for, that server (without
    options, the one on the default settings)."""
    for shared in json.loads(os.environ.get(SHARED_SERVERS) or "[]"):
        same = (shared["repository"], shared["model_id"]) == (str(Path(repository).resolve()), model_id)
        settings = {name: shared[name] for name in ("session_batching", "batched_encodes")}
        if same and options.items() <= settings.items():
            return _SharedServer(**shared)
    return LocalTritonServer(repository, models=(model_id,), **loopback_ports(), **options)
