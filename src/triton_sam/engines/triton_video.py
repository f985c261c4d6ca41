"""A Triton engine's volumes: planes and mask memories kept by the server's session model, where
tracking runs (`TritonEngine.video`)."""

from __future__ import annotations

import json

import numpy as np

from .. import contract
from ..errors import ServerModelError, ServerUnavailableError
from ..features import FeatureCache
from ..prompts import DecodeRequest
from ..server.models import triton_sam_video
from ..video.backend import TrackingOutput, VideoBackend
from ..video.memory import MemoryInputs, VideoSettings
from .base import ImageFeatures
from .triton import TritonEngine
from .triton_requests import prompt_arrays


class TritonVideo(VideoBackend):
    """Planes and mask memories kept by a Triton server's session model; tracking runs there.

    A plane is the engine's features (a handle, re-encoded if the server lost it; `cache` holds
    features from the server, so a plane cached there is not sent again); a memory is the handle
    of a mask memory kept on the server (1 MiB each for SAM2.1), so a plane sends only prompts,
    handles and object pointers, and gets back low-res masks.
    """

    def __init__(self, cache: FeatureCache, engine: TritonEngine) -> None:
        self.cache, self.engine = cache, engine
        config = engine.client.session_config(engine.spec)
        settings = config.get("parameters", {}).get(contract.VIDEO_SETTINGS_PARAMETER, {}).get("string_value")
        if not settings:
            raise ServerModelError(
                f"{engine.spec.session_name} on {engine.client.url} has no video graphs: export the model again "
                "with this triton-sam and restart the server."
            )
        self.settings = VideoSettings.from_dict(json.loads(settings))

    def _plane(self, features: ImageFeatures) -> ImageFeatures:
        if not features.on_server:  # `backend="auto"`: the server stopped answering since tracking began there
            raise ServerUnavailableError(
                f"Triton at {self.engine.client.url} stopped answering while tracking: propagate again "
                "(the local engine takes over)."
            )
        return features

    def track(self, plane, inputs: MemoryInputs | None, request: DecodeRequest) -> TrackingOutput:
        size = self.engine.spec.feature_shapes["image_embed"][0]
        arrays = {
            contract.MEMORY_HANDLES: np.array([[h.encode() for h in inputs.memories]] if inputs else [[]], dtype=np.object_),
            contract.MEMORY_TPOS: (inputs.memory_tpos if inputs else np.zeros(0, np.int64))[None],
            contract.OBJ_PTRS: (inputs.obj_ptrs if inputs else np.zeros((0, size), np.float32))[None],
            contract.OBJ_PTR_TPOS: (inputs.obj_ptr_tpos if inputs else np.zeros(0, np.float32))[None],
            **prompt_arrays(request),
        }
        return TrackingOutput(*self._call(plane, arrays, list(triton_sam_video.TRACK_OUTPUTS)).values())

    def remember(self, plane, low_res: np.ndarray, score: np.ndarray, binarize: bool) -> str:
        arrays = {
            contract.MASK_LOGITS: np.ascontiguousarray(low_res, np.float32).reshape(1, 1, *low_res.shape[-2:]),
            contract.MASK_SCORE: np.ascontiguousarray(score, np.float32).reshape(1, 1),
            contract.BINARIZE: np.array([[float(binarize)]], np.float32),
        }
        return self._call(plane, arrays, [contract.MEMORY_HANDLE])[contract.MEMORY_HANDLE].reshape(-1)[0].decode()

    def mask_as_output(self, plane, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        outputs = [contract.LOW_RES_LOGITS, contract.OBJECT_SCORE, contract.MASK_OBJ_PTR]
        low_res, score, obj_ptr = self._call(plane, {contract.MASK: np.asarray(mask, np.uint8)[None]}, outputs).values()
        return low_res, score, obj_ptr[0]

    def _call(self, plane, arrays: dict, outputs: list[str]) -> dict[str, np.ndarray]:
        try:
            return self.engine.call(plane, arrays, outputs)
        except ServerModelError as error:
            if contract.UNKNOWN_MEMORY in str(error):
                raise ServerModelError(
                    f"The server on {self.engine.client.url} no longer holds this object's memories: its memory cache "
                    f"(`memory_cache_size` in {self.engine.spec.session_name}'s config.pbtxt) is too small for its "
                    "clients' volumes. Propagate again from a prompted plane."
                ) from error
            raise
