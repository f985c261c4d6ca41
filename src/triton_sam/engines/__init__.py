"""Engines run a model's encoder and decoder behind one interface (`Engine`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..errors import InvalidInputError, ServerUnavailableError
from ..registry import ModelSpec
from ..repository import exported_models
from .base import CancelToken, DecodeResult, Engine, ImageFeatures
from .connection import CONNECTION_OPTIONS, TritonConnection

BACKENDS = ("local", "triton", "auto")
TRITON_ENGINE_OPTIONS = frozenset({"encode_timeout_s", "reconnect_s"})  # besides `TritonConnection`'s


def _local(spec: ModelSpec, model_repository: Path | None, options: dict) -> Engine:
    from ..repository import locate
    from .local import LocalEngine

    return LocalEngine(locate(spec, model_repository), **options)


def _triton(spec: ModelSpec, connection: TritonConnection, options: dict) -> Engine:
    from .triton import TritonEngine

    return TritonEngine(spec, connection, **options)


def create_engine(
    spec: ModelSpec,
    backend: str = "local",
    model_repository: Path | None = None,
    *,
    connection: TritonConnection | None = None,
    **options,
) -> Engine:
    """An engine for `spec` on `backend`: "local" (ONNX Runtime here), "triton" (the Triton server
    of `connection`), or "auto" (Triton when it answers, else local; see `FallbackEngine`).

    `options`: `TritonConnection`'s fields (url, ssl, api_key, ...; they override `connection`'s),
    `TritonEngine`'s timeouts and, for "auto", `retry_s`; the rest goes to `LocalEngine`.
    """
    retry = {"retry_s": options.pop("retry_s")} if "retry_s" in options else {}  # auto only
    loose = {k: options.pop(k) for k in list(options) if k in CONNECTION_OPTIONS}
    connection = replace(connection or TritonConnection(), **loose)
    triton_options = {k: options.pop(k) for k in list(options) if k in TRITON_ENGINE_OPTIONS}
    if backend == "local":
        return _local(spec, model_repository, options)
    if backend == "triton":
        return _triton(spec, connection, triton_options)
    if backend == "auto":
        from .fallback import FallbackEngine

        return FallbackEngine(
            lambda: _triton(spec, connection, triton_options), lambda: _local(spec, model_repository, options), **retry
        )
    raise InvalidInputError(f"Unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}.")


def offered_models(backend: str, repository: Path, connection: TritonConnection | None = None) -> tuple[str, list[str]]:
    """(where, model ids) `backend` can serve: the Triton server's (the first that answers of those
    `connection` names; "triton", or "auto" while one answers), else the local repository's."""
    if backend != "local":
        from .triton_client import TritonClient, served_models

        connection = connection or TritonConnection()
        urls = connection.server_urls()
        for url in urls:
            client = TritonClient(connection.to(url))
            try:
                return f"Triton at {client.url}", served_models(client)
            except ServerUnavailableError:
                if backend == "triton" and url == urls[-1]:
                    raise
            finally:
                client.close()
    return f"Local repository {repository}", exported_models(repository)


__all__ = [
    "BACKENDS",
    "CancelToken",
    "DecodeResult",
    "Engine",
    "ImageFeatures",
    "TritonConnection",
    "create_engine",
    "offered_models",
]
