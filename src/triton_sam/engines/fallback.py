"""`backend="auto"`: Triton when it answers, otherwise the local engine, with the reason kept."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from ..errors import ServerModelError, ServerUnavailableError
from ..prompts import DecodeRequest
from .base import CancelToken, DecodeResult, Engine, ImageFeatures

logger = logging.getLogger(__name__)


class FallbackEngine(Engine):
    """Uses `connect()` (a Triton engine) and switches to `local()` for good when it fails.

    The switch happens at start (server unreachable or without the model) or mid-session (server
    died): features from the server are then encoded again locally from the kept model input.
    `fallback_reason` says why the local engine is in use (None while on Triton).
    """

    def __init__(self, connect: Callable[[], Engine], local: Callable[[], Engine]) -> None:
        self._local_factory = local
        self._local_features: tuple[str, ImageFeatures] | None = None  # (handle, local features)
        self.fallback_reason: str | None = None
        self.active: Engine | None = None
        try:
            self.active = connect()
        except (ServerUnavailableError, ServerModelError) as error:
            self._switch(error)
        self.spec = self.active.spec

    def _switch(self, error: Exception) -> None:
        """Use the local engine from now on, and say why."""
        self.fallback_reason = str(error)
        logger.warning("Using the local engine: %s", error)
        if self.active is not None:
            self.active.close()
        self.active = self._local_factory()

    @property
    def cancel_running(self) -> str:
        return self.active.cancel_running

    @property
    def settle_hovers(self) -> bool:
        return self.active.settle_hovers

    def describe(self) -> str:
        if self.fallback_reason is None:
            return self.active.describe()
        return f"{self.active.describe()} (Triton not used: {self.fallback_reason.splitlines()[0]})"

    def encode(self, image: np.ndarray) -> ImageFeatures:
        if self.fallback_reason is None:
            try:
                return self.active.encode(image)
            except ServerUnavailableError as error:
                self._switch(error)
        return self.active.encode(image)

    def decode(
        self,
        features: ImageFeatures,
        request: DecodeRequest,
        multimask_output: bool = True,
        cancel: CancelToken | None = None,
    ) -> DecodeResult:
        if self.fallback_reason is None:
            try:
                return self.active.decode(features, request, multimask_output, cancel)
            except ServerUnavailableError as error:
                self._switch(error)
        return self.active.decode(self._as_local(features), request, multimask_output, cancel)

    def _as_local(self, features: ImageFeatures) -> ImageFeatures:
        """Features the local engine can use; server-side ones are encoded here once."""
        if features.arrays:
            return features
        if self._local_features is None or self._local_features[0] != features.handle:
            self._local_features = (features.handle, self.active.encode(features.model_input))
        return self._local_features[1]

    def close(self) -> None:
        self.active.close()
