"""Several Triton servers without a balancer: each image's requests go to one server, chosen by
rendezvous (highest-random-weight) hashing of its content signature over the servers' URLs, so
adding a server moves only about 1/N of the images. A server that stops answering is skipped for
`RETRY_DOWN_S`: its images go to the next server in their order and are encoded again there."""

from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter
from collections.abc import Sequence

from .triton_client import TritonClient

RETRY_DOWN_S = 30.0  # how long a server that stopped answering is skipped before it is tried again


def rendezvous_order(signature: str, urls: Sequence[str]) -> list[str]:
    """`urls` from the one the image of `signature` prefers most to the one it prefers least."""
    return sorted(urls, key=lambda url: _weight(url, signature), reverse=True)


def _weight(url: str, signature: str) -> int:
    """The random but fixed weight of `url` for one image."""
    return int.from_bytes(hashlib.blake2b(f"{url}\n{signature}".encode(), digest_size=8).digest(), "big")


class ServerPool:
    """The clients of one engine's servers, which one each image uses, and which are down."""

    def __init__(self, clients: Sequence[TritonClient]) -> None:
        self.clients = {client.url: client for client in clients}
        self.encodes: Counter[str] = Counter()  # images encoded, by server URL
        self._down_until: dict[str, float] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.clients)

    def client_for(self, signature: str) -> TritonClient:
        """The first server in the image's rendezvous order not known to be down (its first if all are)."""
        if len(self.clients) == 1:
            return next(iter(self.clients.values()))
        order = rendezvous_order(signature, list(self.clients))
        now = time.monotonic()
        with self._lock:
            up = [url for url in order if self._down_until.get(url, 0.0) <= now]
        return self.clients[(up or order)[0]]

    def fail_over(self, client: TritonClient) -> bool:
        """Skip `client`'s server for a while (it stopped answering); True if another one is left."""
        if len(self.clients) == 1:
            return False
        now = time.monotonic()
        with self._lock:
            self._down_until[client.url] = now + RETRY_DOWN_S
            return any(self._down_until.get(url, 0.0) <= now for url in self.clients)

    def encoded(self, client: TritonClient, images: int) -> None:
        with self._lock:
            self.encodes[client.url] += images

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
