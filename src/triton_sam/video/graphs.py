"""Where a volume's planes and memories live: in this process (`LocalVideo`) or on a Triton server's
session model (`TritonVideo`). Both run the same code on a plane's features
(`server/models/triton_sam_video.py`); `VolumePredictor` talks to either alike.

A plane is what `plane()` returns for an encoder input (features here, a handle there), a memory
what `remember()` returns (an array here, a handle there).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from .. import contract
from ..engines import ImageFeatures
from ..engines.local import LocalEngine, prompt_feeds
from ..engines.providers import TENSORRT
from ..engines.triton import TritonEngine, prompt_arrays
from ..errors import ModelFileError, ServerModelError
from ..features import FeatureCache
from ..prompts import DecodeRequest
from ..server.models import triton_sam_video
from .memory import MemoryInputs, VideoSettings


@dataclass(frozen=True)
class TrackingOutput:
    """The tracking decoder's outputs for one prompt set (batch of one)."""

    multi_masks: np.ndarray  # [1, 3, S, S]
    multi_scores: np.ndarray  # [1, 3]
    single_mask: np.ndarray  # [1, 1, S, S]
    single_score: np.ndarray  # [1, 1]
    object_score_logits: np.ndarray  # [1, 1]
    obj_ptr: np.ndarray  # [1, 4, C]: single-mask token's pointer, then the multimask tokens'


class _CachedPlanes:
    """Planes encoded through a feature cache (each once while cached, keyed by content),
    `encode_batch` at a time where the engine encodes several together."""

    cache: FeatureCache

    @property
    def encode_batch(self) -> int:
        """How many planes `planes` should be given at once (see `Engine.encode_batch`)."""
        return self.cache.engine.encode_batch

    def plane(self, model_input: np.ndarray):
        return self.planes([model_input])[0]

    def planes(self, model_inputs: list[np.ndarray]) -> list:
        return [self._plane(features) for features in self.cache.features_many(model_inputs)]

    def _plane(self, features: ImageFeatures):
        """A plane as the video graphs take it."""
        return features


class LocalVideo(_CachedPlanes):
    """Planes encoded by a local engine (features cached by content), video graphs in this process."""

    def __init__(self, cache: FeatureCache, *, intra_op_threads: int = 0) -> None:
        engine = cache.engine
        if not isinstance(engine, LocalEngine):
            raise TypeError("LocalVideo needs a local engine's feature cache")
        directory = engine.exported.video_dir
        if not triton_sam_video.has_video_graphs(directory):
            raise ModelFileError(
                f"{engine.spec.model_id} has no video graphs in {directory}: it was exported before triton-sam "
                f"could propagate through volumes, or its family has none. Export it again "
                f"(`triton-sam setup {engine.spec.model_id}` or `triton-sam export ... --checkpoint PATH`)."
            )
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        providers = [p for p in engine.providers if p != TENSORRT]  # memory lengths vary

        def open_session(path) -> ort.InferenceSession:
            return ort.InferenceSession(str(path), sess_options=options, providers=providers)

        self.cache = cache
        self.graphs = triton_sam_video.VideoGraphs(directory, open_session)
        self.settings = VideoSettings.from_dict(self.graphs.settings)

    def _plane(self, features: ImageFeatures) -> dict[str, np.ndarray]:
        return features.host_arrays()

    def track(self, plane: dict, inputs: MemoryInputs | None, request: DecodeRequest) -> TrackingOutput:
        prompts = prompt_feeds(request, self.graphs.low_res)
        if inputs is None:  # an initial conditioning plane: no memories
            return TrackingOutput(*self.graphs.track(plane, [], None, None, None, prompts))
        memories = (inputs.memories, inputs.memory_tpos, inputs.obj_ptrs, inputs.obj_ptr_tpos)
        return TrackingOutput(*self.graphs.track(plane, *memories, prompts))

    def remember(self, plane: dict, low_res: np.ndarray, score: np.ndarray, binarize: bool) -> np.ndarray:
        return self.graphs.remember(plane, low_res, score, binarize)

    def mask_as_output(self, plane: dict, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.graphs.mask_as_output(plane, mask)


class TritonVideo(_CachedPlanes):
    """Planes and mask memories kept by a Triton server's session model; tracking runs there.

    A plane is the engine's features (a handle, re-encoded if the server lost it; `cache` is a
    Triton engine's, so a plane cached there is not sent again); a memory is the handle of a mask
    memory kept on the server (1 MiB each for SAM2.1), so a plane sends only prompts, handles and
    object pointers, and gets back low-res masks.
    """

    def __init__(self, cache: FeatureCache) -> None:
        engine = cache.engine
        if not isinstance(engine, TritonEngine):
            raise TypeError("TritonVideo needs a Triton engine's feature cache")
        self.cache, self.engine = cache, engine
        config = engine.client.session_config(engine.spec)
        settings = config.get("parameters", {}).get(contract.VIDEO_SETTINGS_PARAMETER, {}).get("string_value")
        if not settings:
            raise ServerModelError(
                f"{engine.spec.session_name} on {engine.client.url} has no video graphs: export the model again "
                "with this triton-sam and restart the server."
            )
        self.settings = VideoSettings.from_dict(json.loads(settings))

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
