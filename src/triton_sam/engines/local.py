"""Run exported models in this process with ONNX Runtime (TensorRT, CUDA or CPU)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from .. import contract
from ..errors import DecodeCancelled, ModelFileError
from ..prompts import DecodeRequest
from ..repository import ExportedModel
from .base import CancelToken, DecodeResult, Engine, ImageFeatures
from .providers import provider_options, usable_providers


class LocalEngine(Engine):
    """Encoder and decoder ONNX Runtime sessions for one exported model."""

    def __init__(
        self,
        exported: ExportedModel,
        providers: list[str] | None = None,
        intra_op_threads: int = 0,
        trt_cache_dir: str | None = None,
    ) -> None:
        self.spec = exported.spec
        self._metadata = exported.metadata
        providers = providers or usable_providers()
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._encoder = _session(exported.encoder, options, providers, trt_cache_dir)
        self._decoder = _session(exported.decoder, options, providers, trt_cache_dir)

    @property
    def providers(self) -> list[str]:
        """Providers the sessions actually run on (first = preferred)."""
        return self._encoder.get_providers()

    @property
    def weights_id(self) -> str | None:
        weights = self._metadata.get("checkpoint_sha256") or (
            f"seed-{self._metadata['seed']}" if "seed" in self._metadata else None
        )
        return f"{self.spec.model_id}-{weights}" if weights else None

    def describe(self) -> str:
        device = self.providers[0].removesuffix("ExecutionProvider")
        return f"local ONNX Runtime ({device})"

    def encode(self, image: np.ndarray) -> ImageFeatures:
        names = list(self.spec.feature_shapes)
        outputs = self._encoder.run(names, {contract.ENCODER_INPUT: image[None]})
        return ImageFeatures(dict(zip(names, outputs)))

    def decode(
        self,
        features: ImageFeatures,
        request: DecodeRequest,
        multimask_output: bool = True,
        cancel: CancelToken | None = None,
    ) -> DecodeResult:
        feeds = {name: _repeat(array, request.batch_size) for name, array in features.arrays.items()}
        feeds.update(prompt_feeds(request, self.spec.low_res_size))
        outputs = contract.decoder_output_names(multimask_output)
        run_options = ort.RunOptions()
        if cancel is not None:
            cancel.on_cancel(lambda: setattr(run_options, "terminate", True))
        try:
            masks, scores, object_scores = self._decoder.run(outputs, feeds, run_options)
        except Exception as error:
            if cancel is not None and cancel.cancelled:
                raise DecodeCancelled("decode cancelled while running") from error
            raise
        if cancel is not None and cancel.cancelled:
            raise DecodeCancelled("decode cancelled")
        return DecodeResult(masks, scores, object_scores)


def prompt_feeds(request: DecodeRequest, low_res_size: int) -> dict[str, np.ndarray]:
    """The decoder's prompt tensors for `request` (an all-zero mask when there is none)."""
    batch = request.batch_size
    has_mask = request.mask_input is not None
    mask = request.mask_input if has_mask else np.zeros((batch, 1, low_res_size, low_res_size), np.float32)
    return {
        contract.POINT_COORDS: request.point_coords,
        contract.POINT_LABELS: request.point_labels,
        contract.MASK_INPUT: mask,
        contract.HAS_MASK_INPUT: np.full((batch, 1), float(has_mask), np.float32),
    }


def _repeat(array: np.ndarray, batch: int) -> np.ndarray:
    return array if batch == 1 else np.repeat(array, batch, axis=0)


def _session(path, options: ort.SessionOptions, providers: list[str], trt_cache_dir: str | None) -> ort.InferenceSession:
    provider_list = [(p, provider_options(p, trt_cache_dir)) for p in providers]
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=provider_list)
    except Exception as error:  # ORT raises several unrelated types for unreadable models
        raise ModelFileError(
            f"Cannot load {path}: {error}. The file may be corrupt or incomplete; export the model again "
            "(`triton-sam setup MODEL` or `triton-sam export MODEL --checkpoint PATH`)."
        ) from error

