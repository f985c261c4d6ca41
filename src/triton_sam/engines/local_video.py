"""The local engine's volumes: SAM2.1's video graphs in this process, on features from a feature
cache (`LocalEngine.video`)."""

from __future__ import annotations

import numpy as np

from ..errors import ModelFileError, ServerModelError
from ..features import FeatureCache
from ..prompts import DecodeRequest
from ..repository import ExportedModel
from ..server.models import triton_sam_video
from ..video.backend import TrackingOutput, VideoBackend
from ..video.memory import MemoryInputs, VideoSettings
from .base import ImageFeatures
from .local import prompt_feeds
from .ort_sessions import shared_session
from .providers import TENSORRT


class LocalVideo(VideoBackend):
    """Planes encoded by a local engine (features cached by content), video graphs in this process.

    `exported`: the model whose video graphs run; `providers`: ONNX Runtime's, as the engine's.
    """

    def __init__(self, cache: FeatureCache, exported: ExportedModel, providers: list[str], *, intra_op_threads: int = 0) -> None:
        directory = exported.video_dir
        if not triton_sam_video.has_video_graphs(directory):
            model_id = exported.spec.model_id
            raise ModelFileError(
                f"{model_id} has no video graphs in {directory}: it was exported before triton-sam "
                f"could propagate through volumes, or its family has none. Export it again "
                f"(`triton-sam setup {model_id}` or `triton-sam export ... --checkpoint PATH`)."
            )
        providers = [p for p in providers if p != TENSORRT]  # memory lengths vary
        self.cache = cache
        self.graphs = triton_sam_video.VideoGraphs(directory, lambda path: shared_session(path, providers, intra_op_threads))
        self.settings = VideoSettings.from_dict(self.graphs.settings)

    def _plane(self, features: ImageFeatures) -> dict[str, np.ndarray]:
        if features.on_server:  # `backend="auto"`: the server answers again since tracking began here
            raise ServerModelError("Triton answers again: propagate again, to track on the server.")
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
