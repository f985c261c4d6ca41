"""`TritonConnection`: how to reach a Triton server, and the environment's defaults for it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

from ..errors import InvalidInputError

ENV_URL = "TRITON_SAM_URL"
ENV_API_KEY = "TRITON_SAM_API_KEY"
ENV_TIMEOUT = "TRITON_SAM_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_URL = "127.0.0.1:8001"


def default_url() -> str:
    """`$TRITON_SAM_URL`, else the gRPC port of a server on this machine."""
    return os.environ.get(ENV_URL) or DEFAULT_URL


def default_timeout_s() -> float:
    """`$TRITON_SAM_TIMEOUT_S`, else 10 s: how long a decode or a server check may take."""
    text = os.environ.get(ENV_TIMEOUT)
    try:
        seconds = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise InvalidInputError(f"${ENV_TIMEOUT} must be a positive number of seconds, not {text!r}.")
    return seconds


@dataclass(frozen=True)
class TritonConnection:
    """How to reach a Triton server: one value for the client, the engine and `create_engine`.

    `url` may name several servers, comma-separated ("gpu1:8001,gpu2:8001"): the engine then
    spreads images over them (`server_pool`). Unset values come from the environment
    ($TRITON_SAM_URL, $TRITON_SAM_API_KEY, $TRITON_SAM_TIMEOUT_S) when a client is made.
    """

    url: str | None = None  # "host:port", or several, comma-separated
    ssl: bool = False
    root_certificates: str | None = None  # PEM file of the server's certificate authority
    headers: Mapping[str, str] = field(default_factory=dict)  # sent with every call (a TLS proxy's token)
    api_key: str | None = None  # what `triton-sam serve` with $TRITON_SAM_API_KEY asks for
    timeout_s: float | None = None  # each call but an encode

    def server_urls(self) -> list[str]:
        """The servers `url` (else $TRITON_SAM_URL, else the local default) names, in its order."""
        urls = [url.strip() for url in (self.url or default_url()).split(",") if url.strip()]
        if not urls:
            raise InvalidInputError(f"No Triton server URL in {self.url!r}.")
        return urls

    def to(self, url: str) -> TritonConnection:
        """This connection to the one server at `url`."""
        return replace(self, url=url)


CONNECTION_OPTIONS = frozenset(f.name for f in fields(TritonConnection))
