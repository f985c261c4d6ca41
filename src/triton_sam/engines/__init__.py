"""Engines run a model's encoder and decoder behind one interface (`Engine`)."""

from __future__ import annotations

from pathlib import Path

from ..errors import InvalidInputError
from ..registry import ModelSpec
from .base import CancelToken, DecodeResult, Engine, ImageFeatures

BACKENDS = ("local", "triton", "auto")
TRITON_OPTIONS = frozenset(
    {"url", "ssl", "root_certificates", "headers", "api_key", "timeout_s", "encode_timeout_s", "reconnect_s"}
)


def _local(spec: ModelSpec, model_repository: Path | None, options: dict) -> Engine:
    from ..repository import locate
    from .local import LocalEngine

    return LocalEngine(locate(spec, model_repository), **options)


def _triton(spec: ModelSpec, options: dict) -> Engine:
    from .triton import TritonEngine

    return TritonEngine(spec, **options)


def create_engine(spec: ModelSpec, backend: str = "local", model_repository: Path | None = None, **options) -> Engine:
    """An engine for `spec` on `backend`: "local" (ONNX Runtime here), "triton" (a Triton server at
    `url`), or "auto" (Triton when it answers, else local; see `FallbackEngine`).
    """
    retry = {"retry_s": options.pop("retry_s")} if "retry_s" in options else {}  # auto only
    triton_options = {k: v for k, v in options.items() if k in TRITON_OPTIONS}
    local_options = {k: v for k, v in options.items() if k not in TRITON_OPTIONS}
    if backend == "local":
        return _local(spec, model_repository, local_options)
    if backend == "triton":
        return _triton(spec, triton_options)
    if backend == "auto":
        from .fallback import FallbackEngine

        return FallbackEngine(
            lambda: _triton(spec, triton_options), lambda: _local(spec, model_repository, local_options), **retry
        )
    raise InvalidInputError(f"Unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}.")


__all__ = ["BACKENDS", "CancelToken", "DecodeResult", "Engine", "ImageFeatures", "create_engine"]
