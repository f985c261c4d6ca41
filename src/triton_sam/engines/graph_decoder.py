"""One-prompt-set decodes replayed as CUDA graphs on a GPU (#38).

A decode of one prompt set launches hundreds of small kernels. ONNX Runtime can capture them once
and replay them as one CUDA graph: on an H200, SAM2.1 tiny's decoder took 1.3 ms replayed against
3.7 ms run as usual, logits within 3e-4 (`python -m benchmarks.gpu_decoder_probe`). A graph replays
fixed addresses, so everything it reads and writes lives in buffers of its own: the current image's
features (copied in on the device when another image is decoded), the prompts (copied in each
call) and the outputs (copied out). Each point count gets a decoder session with batch and point
count fixed (its shape arithmetic folds away), captured on its first runs.

Without `capture` the same buffers and sessions run as usual: on a CPU, where tests check them.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from .. import contract
from .base import ImageFeatures
from .providers import CPU, CUDA

OUTPUTS = contract.decoder_output_names(True)  # the candidates: hover and `predict` both ask for them
MAX_POINTS = 4  # point counts with a graph of their own: the hover's one, and a few clicks


class GraphDecoder:
    """Decodes of one prompt set with at most `MAX_POINTS` points, multimask outputs, through
    fixed buffers on `device` ("cuda", or "cpu" without `capture`)."""

    def __init__(self, decoder: Path, spec, *, capture: bool = True, device_id: int = 0) -> None:
        self.device = "cuda" if capture else "cpu"
        self.device_id = device_id
        self._path = Path(decoder)
        cuda = {"device_id": str(device_id)}
        self._providers = [(CUDA, {**cuda, "enable_cuda_graph": "1"}), CPU] if capture else [CPU]
        self._features = {name: self._buffer([1, *shape]) for name, shape in spec.feature_shapes.items()}
        low = spec.low_res_size
        self._outputs = dict(zip(OUTPUTS, map(self._buffer, ([1, 3, low, low], [1, 3], [1, 1]))))
        self._copy = _copy_session(spec.feature_shapes, [(CUDA, cuda), CPU] if capture else [CPU])
        self._runs: dict[int, tuple[ort.InferenceSession, dict, object]] = {}
        self._current: ImageFeatures | None = None  # whose features the buffers hold
        self._lock = threading.Lock()  # one decode at a time through the shared buffers

    def decode(self, features: ImageFeatures, prompts: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The decoder's multimask outputs (masks, scores, object score) for one prompt set."""
        points = prompts[contract.POINT_COORDS].shape[1]
        with self._lock:
            session, inputs, binding = self._runs.get(points) or self._prepare(prompts)
            if self._current is not features:
                self._load(features)
            for name, array in prompts.items():
                inputs[name].update_inplace(np.ascontiguousarray(array))
            session.run_with_iobinding(binding)
            # copies: a CPU buffer's numpy() is a view, which the next decode would overwrite
            return [np.array(self._outputs[name].numpy()) for name in OUTPUTS]

    @property
    def point_counts(self) -> set[int]:
        """The point counts that have a session (and on a GPU a graph) here."""
        return set(self._runs)

    @staticmethod
    def handles(batch_size: int, points: int, outputs: list[str]) -> bool:
        """Whether a decode of `batch_size` prompt sets of `points` points, asking for `outputs`, runs here."""
        return batch_size == 1 and points <= MAX_POINTS and outputs == OUTPUTS

    def _buffer(self, shape: list[int]) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32, self.device, self.device_id)

    def _prepare(self, prompts: dict[str, np.ndarray]) -> tuple:
        """The session for the point count of `prompts`, its prompt buffers (made from them) and its
        binding of every buffer."""
        points = prompts[contract.POINT_COORDS].shape[1]
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        for dimension, size in zip(_point_dimensions(self._path), (1, points)):
            if dimension:  # free in the file (named), not fixed
                options.add_free_dimension_override_by_name(dimension, size)
        session = ort.InferenceSession(str(self._path), options, providers=self._providers)
        inputs = {
            name: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), self.device, self.device_id)
            for name, array in prompts.items()
        }
        binding = session.io_binding()
        for name, value in {**self._features, **inputs}.items():
            binding.bind_ortvalue_input(name, value)
        for name, value in self._outputs.items():
            binding.bind_ortvalue_output(name, value)
        self._runs[points] = (session, inputs, binding)
        return session, inputs, binding

    def _load(self, features: ImageFeatures) -> None:
        """Put `features` into the graphs' feature buffers: a copy on the device where they live there."""
        if features.device:
            binding = self._copy.io_binding()
            for name, value in self._features.items():
                binding.bind_ortvalue_input(name, features.device[name])
                binding.bind_ortvalue_output(f"{name}_copy", value)
            self._copy.run_with_iobinding(binding)
        else:
            for name, value in self._features.items():
                value.update_inplace(np.ascontiguousarray(features.arrays[name], np.float32))
        self._current = features


def _point_dimensions(decoder: Path) -> list[str]:
    """The names of the decoder's batch and point-count dimensions ("" where the file fixes one)."""
    graph = onnx.load(str(decoder), load_external_data=False).graph
    coords = next(i for i in graph.input if i.name == contract.POINT_COORDS)
    return [d.dim_param for d in coords.type.tensor_type.shape.dim[:2]]


def _copy_session(feature_shapes: dict, providers: list) -> ort.InferenceSession:
    """A graph copying each feature map into a bound buffer (Identity, kept: optimisations off)."""
    nodes = [helper.make_node("Identity", [name], [f"{name}_copy"]) for name in feature_shapes]
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, *shape]) for name, shape in feature_shapes.items()]
    outputs = [helper.make_tensor_value_info(f"{n}_copy", TensorProto.FLOAT, [1, *s]) for n, s in feature_shapes.items()]
    graph = helper.make_graph(nodes, "triton_sam_copy_features", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=providers)
