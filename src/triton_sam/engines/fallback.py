"""`backend="auto"`: Triton when it answers, otherwise the local engine, with the reason kept."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from ..errors import ServerModelError, ServerUnavailableError
from ..prompts import DecodeRequest
from .base import CancelToken, DecodeResult, Engine, ImageFeatures

if TYPE_CHECKING:
    from ..features import FeatureCache
    from ..video.backend import VideoBackend

logger = logging.getLogger(__name__)
T = TypeVar("T")

RETRY_S = 10.0  # while on the local engine, try the server again this often


class FallbackEngine(Engine):
    """Uses `connect()` (a Triton engine) while it answers and `local()` while it does not.

    The switch to local happens at start (server unreachable or without the model) or mid-session
    (server died): features from the server are then encoded again locally from the kept encoder input.
    While local because the server was unreachable, a background thread tries `connect()` every
    `retry_s` seconds and new encodes go to the server again once it answers; features already
    encoded locally stay with the local engine. `fallback_reason` says why the local engine is in use
    (None while on Triton). A refinement right after the switch refines the server's logits as
    they came (`DecodeRequest.logits_above`: around the object only), so its mask may differ a
    little from what the server would have given.
    """

    def __init__(self, connect: Callable[[], Engine], local: Callable[[], Engine], *, retry_s: float = RETRY_S) -> None:
        self._connect = connect
        self._local_factory = local
        self.retry_s = retry_s
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._retrying: threading.Thread | None = None
        self._server: Engine | None = None
        self._local: Engine | None = None
        self._local_features: tuple[str, ImageFeatures] | None = None  # (handle, local features)
        self.fallback_reason: str | None = None
        try:
            self._server = connect()
        except (ServerUnavailableError, ServerModelError) as error:
            self._use_local(error, None)
        self.spec = self.active.spec

    @property
    def active(self) -> Engine:
        """The engine new work goes to: the server while it answers, else the local engine."""
        server = self._server
        return server if server is not None else self._local

    def _use_local(self, error: Exception, failed: Engine | None) -> None:
        """Send new work to the local engine (unless `failed` was already replaced), and say why."""
        with self._lock:
            if failed is not self._server:
                return  # another thread switched already, or the server came back since
            self.fallback_reason = str(error)
            if self._server is not None:
                self._server.close()
                self._server = None
            if self._local is None:
                self._local = self._local_factory()
            if isinstance(error, ServerUnavailableError) and self._retrying is None and not self._closed.is_set():
                self._retrying = threading.Thread(target=self._retry, name="triton-sam-reconnect", daemon=True)
                self._retrying.start()
        logger.warning("Using the local engine: %s", error)

    def _retry(self) -> None:
        """Try the server every `retry_s` seconds until it answers or the engine is closed."""
        while not self._closed.wait(self.retry_s):
            try:
                server = self._connect()
            except (ServerUnavailableError, ServerModelError) as error:
                logger.debug("Triton still not usable: %s", error)
                continue
            with self._lock:
                self._retrying = None
                if self._closed.is_set():
                    server.close()
                    return
                self._server, self.fallback_reason = server, None
            logger.warning("Triton answers again: %s", server.describe())
            return
        self._retrying = None

    @property
    def cancel_running(self) -> str:
        return self.active.cancel_running

    @property
    def settle_hovers(self) -> bool:
        return self.active.settle_hovers

    @property
    def weights_id(self) -> str | None:
        """The weights of the engine in use: the local engine's exported files name theirs (so a
        session that starts local keeps features on disk; features loaded from there are decoded
        locally); a server's are unknown."""
        return self.active.weights_id

    def describe(self) -> str:
        reason = self.fallback_reason
        if reason is None:
            return self.active.describe()
        return f"{self.active.describe()} (Triton not used: {reason.splitlines()[0].split('. ')[0]})"

    def video(self, cache: FeatureCache) -> VideoBackend:
        """The video backend of the engine in use: volumes are tracked on the server while it
        answers, else locally. A switch during a run stops it with a message to propagate again."""
        return self.active.video(cache)

    @property
    def encode_batch(self) -> int:
        return self.active.encode_batch

    def encode(self, image: np.ndarray) -> ImageFeatures:
        return self.encode_many([image])[0]

    def encode_many(self, images: Sequence[np.ndarray]) -> list[ImageFeatures]:
        server = self._server
        if server is not None:
            try:
                return server.encode_many(images)
            except ServerUnavailableError as error:
                self._use_local(error, server)
        return self._local.encode_many(images)

    def decode(
        self,
        features: ImageFeatures,
        request: DecodeRequest,
        multimask_output: bool = True,
        cancel: CancelToken | None = None,
    ) -> DecodeResult:
        return self._where_features_are(features, lambda engine, kept: engine.decode(kept, request, multimask_output, cancel))

    def instance_maps(self, features: ImageFeatures, image_hw: tuple[int, int]) -> np.ndarray:
        return self._where_features_are(features, lambda engine, kept: engine.instance_maps(kept, image_hw))

    @property
    def answers_concepts(self) -> bool:
        return self.active.answers_concepts

    def concepts(self, features: ImageFeatures, *request) -> dict[str, np.ndarray]:
        return self._where_features_are(features, lambda engine, kept: engine.concepts(kept, *request))

    def concepts_vocabulary(self, features: ImageFeatures) -> bytes:
        return self._where_features_are(features, lambda engine, kept: engine.concepts_vocabulary(kept))

    def _where_features_are(self, features: ImageFeatures, run: Callable[[Engine, ImageFeatures], T]) -> T:
        """`run(engine, features)` on the server for its features while it answers; else on the local
        engine, server features encoded here first."""
        if features.on_server:
            server = self._server
            if server is not None:
                try:
                    return run(server, features)
                except ServerUnavailableError as error:
                    self._use_local(error, server)
            features = self._as_local(features)
        return run(self._local, features)

    def _as_local(self, features: ImageFeatures) -> ImageFeatures:
        """Features the local engine can use: server-side ones are encoded here once."""
        cached = self._local_features
        if cached is None or cached[0] != features.handle:
            cached = (features.handle, self._local.encode(features.encoder_input))
            self._local_features = cached
        return cached[1]

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            engines = [e for e in (self._server, self._local) if e is not None]
            retrying = self._retrying
        for engine in engines:
            engine.close()
        if retrying is not None:
            retrying.join(timeout=5.0)
