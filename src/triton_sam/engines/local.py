"""Run exported models in this process with ONNX Runtime (TensorRT, CUDA or CPU).

On a GPU an image's features stay on the device: the encoder's outputs are bound to GPU memory
and handed to the decoder as they are (ONNX Runtime IO binding), so a decode moves only the
prompts in and the low-res masks out. On the CPU the features are plain numpy arrays.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import weakref
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from .. import contract
from ..errors import DecodeCancelled, InvalidInputError
from ..masks import MaskResizer
from ..prompts import DecodeRequest
from ..repository import ExportedModel
from .base import CancelToken, DecodeResult, Engine, ImageFeatures, best_candidates
from .graph_decoder import DEVICE_WORK, OUTPUTS, GraphDecoder, graph_decoder
from .local_concepts import LocalConcepts
from .ort_sessions import on_cpu, release_cpu_arena, shared_session
from .providers import CUDA, TENSORRT, device_of, usable_providers

if TYPE_CHECKING:
    from ..features import FeatureCache
    from ..video.backend import VideoBackend

# Prompt sets per decoder run on a CPU: larger runs are no faster per prompt set there, and their
# intermediates grow with the batch (about 45 MB a prompt set for SAM2.1 tiny).
CPU_DECODE_BATCH = 8
log = logging.getLogger(__name__)


class LocalEngine(Engine):
    """Encoder and decoder ONNX Runtime sessions for one exported model.

    `feature_device` says where features are kept as ONNX Runtime buffers ("cuda", "cpu"); by
    default on the GPU the sessions run on, and as numpy arrays on a CPU. With `detector_maps` the
    features also hold SAM3's concept detector maps (`contract.DETECTOR_MAPS`, 111 MB an image in
    float32, from the same encoder run): only for `concepts.ConceptProcessor`; the decoder ignores them.
    `graph_decodes` replays one-prompt-set decodes as CUDA graphs (`graph_decoder`; by default on
    CUDA unless `$TRITON_SAM_CUDA_GRAPHS` is 0; True on a CPU runs the same fixed-buffer path
    without capture, for tests).
    """

    def __init__(
        self,
        exported: ExportedModel,
        *,
        providers: list[str] | None = None,
        intra_op_threads: int = 0,
        trt_cache_dir: str | None = None,
        feature_device: str | None = None,
        detector_maps: bool = False,
        graph_decodes: bool | None = None,
    ) -> None:
        self.spec = exported.spec
        self.exported = exported
        providers = providers or usable_providers()
        self._encoder = shared_session(exported.encoder, providers, intra_op_threads, trt_cache_dir)
        self._decoder = shared_session(exported.decoder, providers, intra_op_threads, trt_cache_dir)
        self._intra_op_threads, self._trt_cache_dir = intra_op_threads, trt_cache_dir
        self._device = feature_device or device_of(self.providers[0])  # None: numpy arrays
        self._on_cpu = on_cpu(self.providers)
        on_cuda = self.providers[0] == CUDA and self._device == "cuda"
        # runs on CUDA wait for a capture of any engine's graphs (`graph_decoder.DEVICE_WORK`)
        self._device_work = DEVICE_WORK if self.providers[0] == CUDA else contextlib.nullcontext()
        self.graph_decoder = self._graph_decoder(on_cuda, graph_decodes)
        self.detector_maps = self._detector_maps() if detector_maps else ()
        self._outputs = [*self.spec.feature_shapes, *self.detector_maps]

    def _graph_decoder(self, on_cuda: bool, asked: bool | None) -> GraphDecoder | None:
        """The CUDA-graph decoder where `asked` (None: `graph_decodes_by_default`). One that cannot
        be made by default leaves the engine on its usual decodes, with a log line: the graphs only
        make decodes faster, so they must never keep the engine from starting."""
        if not (graph_decodes_by_default(on_cuda) if asked is None else asked):
            return None
        try:
            return graph_decoder(self._decoder, self.exported.decoder, self.spec, capture=on_cuda)
        except Exception as error:  # ONNX Runtime's errors have no common type (a failed capture, memory)
            if asked:
                raise
            log.warning("CUDA-graph decodes off for %s: they could not be made (%s)", self.spec.model_id, error)
            return None

    def _detector_maps(self) -> tuple[str, ...]:
        """The encoder's detector map outputs; raises where the export has none (not SAM3, or older)."""
        answered = {output.name for output in self._encoder.get_outputs()}
        if not set(contract.DETECTOR_MAPS) <= answered:
            raise InvalidInputError(
                f"{self.exported.encoder} does not answer SAM3's detector maps (concept prompts): "
                f"export {self.spec.model_id} again with this version of triton-sam."
            )
        return contract.DETECTOR_MAPS

    @property
    def answers_concepts(self) -> bool:
        """Where the features keep SAM3's detector maps and the export has its concept graphs."""
        return bool(self.detector_maps) and self.exported.concepts_dir is not None

    @functools.cached_property
    def _concepts(self) -> LocalConcepts:
        """The export's concept graphs, opened on first use (SAM3 with `detector_maps` only)."""
        if not self.detector_maps:
            raise InvalidInputError(f"{self.describe()} does not keep SAM3's detector maps: create it with detector_maps=True.")
        if self.exported.concepts_dir is None:
            raise InvalidInputError(
                f"{self.spec.model_id} in {self.exported.encoder.parents[2]} has no concept graphs (text encoder, detector): "
                f"export it again without --no-concepts."
            )
        return LocalConcepts(self.exported.concepts_dir, self.providers)

    def concepts(self, features: ImageFeatures, *request) -> dict[str, np.ndarray]:
        """The concept request (`Engine.concepts`) run here on the features' detector maps."""
        with self._device_work:
            return self._concepts.answer(features.host_arrays(), *request)

    def concepts_vocabulary(self, features: ImageFeatures) -> bytes:
        return self._concepts.vocabulary()

    @functools.cached_property
    def _instance_decoder(self) -> ort.InferenceSession:
        """The instance-segmentation decoder's session, opened on first use (micro-sam models only)."""
        path = self.exported.instance_decoder
        if path is None:
            raise InvalidInputError(
                f"{self.spec.model_id} has no instance-segmentation decoder in {self.exported.encoder.parents[2]}."
            )
        return shared_session(path, self.providers, self._intra_op_threads, self._trt_cache_dir)

    @property
    def providers(self) -> list[str]:
        """Providers the sessions actually run on (first = preferred)."""
        return self._encoder.get_providers()

    @property
    def weights_id(self) -> str | None:
        return self.exported.weights_id

    @functools.cached_property
    def resizer(self) -> MaskResizer:
        """Mask resizing on the decoder's device (TensorRT would build an engine for it: not worth it)."""
        return MaskResizer(self.spec, [p for p in self.providers if p != TENSORRT], self._device_work)

    def describe(self) -> str:
        device = self.providers[0].removesuffix("ExecutionProvider")
        random = ", random weights: masks are noise" if self.exported.random_weights else ""
        graphs = ", CUDA-graph decodes" if self.graph_decoder is not None and self.graph_decoder.device == "cuda" else ""
        return f"local ONNX Runtime ({device}{graphs}{random})"

    def video(self, cache: FeatureCache) -> VideoBackend:
        """The video graphs exported with this model, run in this process on the sessions' providers."""
        from .local_video import LocalVideo

        return LocalVideo(cache, self.exported, self.providers)

    def encode(self, image: np.ndarray) -> ImageFeatures:
        with self._device_work:
            return self._encode(image)

    def _encode(self, image: np.ndarray) -> ImageFeatures:
        names = self._outputs
        batch = np.ascontiguousarray(image[None])
        if self._device is None:
            run_options = release_cpu_arena(ort.RunOptions()) if self._on_cpu else None
            outputs = self._encoder.run(names, {contract.ENCODER_INPUT: batch}, run_options)
            return ImageFeatures(dict(zip(names, outputs)))
        binding = self._encoder.io_binding()
        binding.bind_cpu_input(contract.ENCODER_INPUT, batch)
        for name in names:
            binding.bind_output(name, self._device)
        self._encoder.run_with_iobinding(binding)
        return ImageFeatures(device=dict(zip(names, binding.get_outputs())))

    def instance_maps(self, features: ImageFeatures, image_hw: tuple[int, int]) -> np.ndarray:
        """The decoder fed the image embedding where it is (host or device); its 1024 x 1024 maps
        cropped and resized to the image by `resizer`, on the same device."""
        session = self._instance_decoder
        name = contract.INSTANCE_EMBED
        binding = session.io_binding()
        if name in features.device:
            binding.bind_ortvalue_input(name, features.device[name])
        else:
            binding.bind_cpu_input(name, np.ascontiguousarray(features.arrays[name]))
        binding.bind_output(contract.INSTANCE_MAPS, "cpu")
        with self._device_work:
            session.run_with_iobinding(binding)
        (maps,) = binding.copy_outputs_to_cpu()
        return self.resizer.logits(maps, image_hw)[0]

    def decode(
        self,
        features: ImageFeatures,
        request: DecodeRequest,
        multimask_output: bool = True,
        cancel: CancelToken | None = None,
    ) -> DecodeResult:
        best = request.best_of_multimask and not multimask_output
        outputs = contract.decoder_output_names(multimask_output or best)
        run_options = ort.RunOptions()
        if cancel is not None:
            cancel.on_cancel(lambda: setattr(run_options, "terminate", True))
        try:
            graphs = self.graph_decoder is not None
            with self._device_work:
                if graphs and outputs == OUTPUTS and GraphDecoder.handles(request.batch_size, request.point_coords.shape[1]):
                    masks, scores, object_scores = self._decode_replayed(features, request, outputs, run_options)
                else:
                    masks, scores, object_scores = self._decode_usual(features, request, outputs, run_options)
        except Exception as error:
            if cancel is not None and cancel.cancelled:
                raise DecodeCancelled("decode cancelled while running") from error
            raise
        if cancel is not None and cancel.cancelled:
            raise DecodeCancelled("decode cancelled")
        result = DecodeResult(masks, scores, object_scores)
        return best_candidates(result) if best else result

    def _decode_usual(self, features: ImageFeatures, request: DecodeRequest, outputs: list[str], run_options) -> list:
        if features.device and request.batch_size == 1:
            return self._decode_on_device(features, request, outputs, run_options)
        return self._decode_host(features, request, outputs, run_options)

    def _decode_replayed(self, features: ImageFeatures, request: DecodeRequest, outputs: list[str], run_options) -> list:
        """Through the graphs (`graph_decoder`). A point count's first replay is checked against the
        usual run; a mismatch or a failure turns the graphs off for this engine (logged), and the
        usual run answers."""
        prompts = prompt_feeds(request, self.spec.low_res_size)
        points = prompts[contract.POINT_COORDS].shape[1]
        graphs = self.graph_decoder
        sources = features.device or features.arrays
        try:
            answer = graphs.decode(weakref.ref(features), sources, prompts)
        except Exception as error:  # ONNX Runtime's CUDA graph capture refuses some graphs
            if self.graph_decoder is None:  # closed meanwhile (the engine too): nothing to turn off
                return self._decode_usual(features, request, outputs, run_options)
            return self._without_graphs(f"{type(error).__name__}: {error}", features, request, outputs, run_options)
        replayed = [answer[name] for name in outputs]
        if points in graphs.checked:
            return replayed
        why = graphs.mismatch(points, replayed, self._decode_usual(features, request, outputs, run_options))
        return replayed if why is None else self._without_graphs(why, features, request, outputs, run_options)

    def close(self) -> None:
        graphs, self.graph_decoder = self.graph_decoder, None
        if graphs is not None:
            graphs.close()

    def _without_graphs(self, why: str, features: ImageFeatures, request: DecodeRequest, outputs: list[str], run_options) -> list:
        log.warning("Decodes replayed as CUDA graphs are off for %s: %s", self.spec.model_id, why)
        graphs, self.graph_decoder = self.graph_decoder, None
        if graphs is not None:
            graphs.close()
        return self._decode_usual(features, request, outputs, run_options)

    def _decode_host(self, features: ImageFeatures, request: DecodeRequest, outputs: list[str], run_options) -> list:
        """The decoder fed numpy arrays, the features repeated for each prompt set of a run. On a CPU
        `CPU_DECODE_BATCH` prompt sets a run (larger runs are no faster there, and take more memory),
        and a batch's last run gives the arena's memory back: that peak is rare (`ort_sessions`)."""
        host = features.host_arrays()
        arrays = {name: host[name] for name in self.spec.feature_shapes}  # not the detector maps
        prompts = prompt_feeds(request, self.spec.low_res_size)
        batch = request.batch_size
        step = CPU_DECODE_BATCH if self._on_cpu else batch
        parts = []
        for start in range(0, batch, step):
            size = min(step, batch - start)
            if self._on_cpu and batch > 1 and start + size == batch:
                release_cpu_arena(run_options)
            feeds = {name: _repeat(array, size) for name, array in arrays.items()}
            feeds.update({name: array[start : start + size] for name, array in prompts.items()})
            parts.append(self._decoder.run(outputs, feeds, run_options))
        return parts[0] if len(parts) == 1 else [np.concatenate(column) for column in zip(*parts)]

    def _decode_on_device(self, features: ImageFeatures, request: DecodeRequest, outputs: list[str], run_options) -> list:
        """The decoder fed the features where they are; the prompts go in and the outputs come out."""
        binding = self._decoder.io_binding()
        for name in self.spec.feature_shapes:
            binding.bind_ortvalue_input(name, features.device[name])
        for name, array in prompt_feeds(request, self.spec.low_res_size).items():
            binding.bind_cpu_input(name, array)
        for name in outputs:
            binding.bind_output(name, "cpu")
        self._decoder.run_with_iobinding(binding, run_options)
        return binding.copy_outputs_to_cpu()


def graph_decodes_by_default(on_cuda: bool) -> bool:
    """Whether an engine whose features live on CUDA replays its decodes as CUDA graphs when not
    told: yes, unless `$TRITON_SAM_CUDA_GRAPHS` is 0 (#38; measured faster on an H200: BENCHMARKS.md, GPU)."""
    return on_cuda and contract.cuda_graphs_allowed(os.environ.get(contract.CUDA_GRAPHS_ENV))


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
