"""Engines run a model's encoder and decoder behind one interface (`Engine`)."""

from __future__ import annotations

from pathlib import Path

from ..errors import InvalidInputError
from ..registry import ModelSpec
from .base import CancelToken, DecodeResult, Engine, ImageFeatures

BACKENDS = ("local",)


def create_engine(spec: ModelSpec, backend: str = "local", model_repository: Path | None = None, **options) -> Engine:
    """An engine for `spec` on `backend`."""
    if backend == "local":
        from ..repository import locate
        from .local import LocalEngine

        return LocalEngine(locate(spec, model_repository), **options)
    raise InvalidInputError(f"Unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}.")


__all__ = ["BACKENDS", "CancelToken", "DecodeResult", "Engine", "ImageFeatures", "create_engine"]
