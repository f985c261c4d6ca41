"""A Triton engine's volumes: planes and mask memories kept by the server's session model, where
tracking runs (`TritonEngine.video`). With several servers all of a volume's requests go to one
(a plane attends to other planes' memories); where that one stops answering, the next takes over:
its planes are encoded again there and the memories they attend to remembered again."""

from __future__ import annotations

import json
import uuid
from collections import OrderedDict
from typing import NamedTuple

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

# Memories this client can remember again on another server (the inputs of each, about 256 KB and
# its plane): the newest and those tracking used last, enough for the planes a few objects attend to.
KEPT_RECIPES = 128


class _Recipe(NamedTuple):
    """What made a memory: its plane, and the mask logits and score it was made of."""

    plane: ImageFeatures
    low_res: np.ndarray
    score: np.ndarray
    binarize: bool


class _MemoriesLost(Exception):
    """The server no longer holds memories a track request names."""


class TritonVideo(VideoBackend):
    """Planes and mask memories kept by a Triton server's session model; tracking runs there.

    A plane is the engine's features (a handle, re-encoded if the server lost it; `cache` holds
    features from the server, so a plane cached there is not sent again); a memory is the handle
    of a mask memory kept on the server (1 MiB each for SAM2.1), so a plane sends only prompts,
    handles and object pointers, and gets back low-res masks. Every request goes by `route`, one
    key of this backend's, so that planes and memories meet on one server.
    """

    def __init__(self, cache: FeatureCache, engine: TritonEngine) -> None:
        self.cache, self.engine = cache, engine
        self.route = uuid.uuid4().hex
        config = engine.session_config(self.route)
        settings = config.get("parameters", {}).get(contract.VIDEO_SETTINGS_PARAMETER, {}).get("string_value")
        if not settings:
            raise ServerModelError(
                f"{engine.spec.session_name} on {engine.describe()} has no video graphs: export the model again "
                "with this triton-sam and restart the server."
            )
        self.settings = VideoSettings.from_dict(json.loads(settings))
        self._recipes: OrderedDict[str, _Recipe] = OrderedDict()  # memory handle -> what made it
        self._renamed: dict[str, str] = {}  # memory handle -> the handle of its memory remembered again

    def planes(self, encoder_inputs: list[np.ndarray]) -> list:
        """Planes encoded on this backend's server (those cached are not sent again)."""
        with self.engine.routed(self.route):
            return super().planes(encoder_inputs)

    def _plane(self, features: ImageFeatures) -> ImageFeatures:
        if not features.on_server:  # `backend="auto"`: the server stopped answering since tracking began there
            raise ServerUnavailableError(
                f"{self.engine.describe()} stopped answering while tracking: propagate again (the local engine takes over)."
            )
        return features

    def track(self, plane, inputs: MemoryInputs | None, request: DecodeRequest) -> TrackingOutput:
        """Tracked on this backend's server; memories it lost (another server took over) are
        remembered there again, once, from their recipes."""
        memories = inputs.memories if inputs else []
        try:
            return self._track(plane, inputs, request, memories)
        except _MemoriesLost:
            pass
        try:
            return self._track(plane, inputs, request, [self._remember_again(memory) for memory in memories])
        except _MemoriesLost as error:  # evicted again at once
            raise ServerModelError(self._lost_memories()) from error

    def _track(self, plane, inputs: MemoryInputs | None, request: DecodeRequest, memories: list[str]) -> TrackingOutput:
        size = self.engine.spec.feature_shapes["image_embed"][0]
        memories = [self._renamed.get(memory, memory) for memory in memories]
        for memory in memories:
            if memory in self._recipes:
                self._recipes.move_to_end(memory)
        arrays = {
            contract.MEMORY_HANDLES: np.array([[h.encode() for h in memories]], dtype=np.object_),
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
        memory = self._call(plane, arrays, [contract.MEMORY_HANDLE])[contract.MEMORY_HANDLE].reshape(-1)[0].decode()
        self._recipes[memory] = _Recipe(plane, arrays[contract.MASK_LOGITS], arrays[contract.MASK_SCORE], binarize)
        self._recipes.move_to_end(memory)
        while len(self._recipes) > KEPT_RECIPES:
            self._recipes.popitem(last=False)
        return memory

    def _remember_again(self, memory: str) -> str:
        """`memory` remembered again on this backend's server (another server made it, or it evicted
        it); its handle there, which later requests naming `memory` use."""
        recipe = self._recipes.get(self._renamed.get(memory, memory))
        if recipe is None:
            raise ServerModelError(self._lost_memories())
        again = self.remember(recipe.plane, recipe.low_res, recipe.score, recipe.binarize)
        if again != memory:
            self._renamed[memory] = again
        return again

    def mask_as_output(self, plane, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        outputs = [contract.LOW_RES_LOGITS, contract.OBJECT_SCORE, contract.MASK_OBJ_PTR]
        low_res, score, obj_ptr = self._call(plane, {contract.MASK: np.asarray(mask, np.uint8)[None]}, outputs).values()
        return low_res, score, obj_ptr[0]

    def _call(self, plane, arrays: dict, outputs: list[str]) -> dict[str, np.ndarray]:
        try:
            return self.engine.call(plane, arrays, outputs, self.route)
        except ServerModelError as error:
            if contract.UNKNOWN_MEMORY in str(error):
                raise _MemoriesLost() from error
            raise

    def _lost_memories(self) -> str:
        """Why tracking cannot go on where the server lost memories this client cannot make again."""
        return (
            f"{self.engine.describe()} no longer holds this object's memories: its memory cache "
            f"(`memory_cache_size` in {self.engine.spec.session_name}'s config.pbtxt) is too small for its "
            "clients' volumes. Propagate again from a prompted plane."
        )
