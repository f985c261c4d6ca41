"""One-prompt-set decodes replayed as CUDA graphs on a GPU (#38; the local engine's default on CUDA).

A decode of one prompt set launches hundreds of small kernels. ONNX Runtime can capture them once
and replay them as one CUDA graph, several times faster on an H200 with the same logits
(`python -m benchmarks.gpu_decoder_probe`; BENCHMARKS.md, GPU). A graph replays
fixed addresses, so everything it reads and writes lives in buffers of its own: the current image's
features and the prompts (copied in by a small ONNX Runtime graph, on its stream, so a copy is done
before the replay reads it) and every output (copied out). Each point count up to `MAX_POINTS` gets
a decoder session with batch and point count fixed (its shape arithmetic folds away).

ONNX Runtime captures a graph per calling thread, and a capture fails while another thread
allocates on the device; so all of this runs on one thread of its own, and every graph is captured
when the decoder is made, before the engine encodes anything. It captures in CUDA's global mode:
while a capture is open, device work on any other thread of the process fails and breaks it. So
captures hold `DEVICE_WORK`, as do the local engines' runs on CUDA (another engine may be in use
while one is made: napari's panel makes the next model's engine while the last one still previews).

Without `capture` the same buffers, sessions and copies run as usual: on a CPU, where tests check them.
"""

from __future__ import annotations

import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
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
WARM_RUNS = 3  # runs of each graph when made: ONNX Runtime allocates on the first and captures after it
DEVICE_WORK = threading.RLock()  # held by each capture and by every CUDA run of a local engine (see above)


class GraphDecoder:
    """Decodes of one prompt set with at most `MAX_POINTS` points, multimask outputs, through
    fixed buffers on "cuda" (or "cpu" without `capture`)."""

    def __init__(self, decoder: Path, spec, *, capture: bool = True, device_id: int = 0) -> None:
        self.device, self.device_id = ("cuda" if capture else "cpu"), device_id
        cuda = {"device_id": str(device_id)}
        providers = [(CUDA, {**cuda, "enable_cuda_graph": "1"}), CPU] if capture else [CPU]
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="triton-sam-graphs")
        low = spec.low_res_size
        features = {name: ([1, *shape], np.float32) for name, shape in spec.feature_shapes.items()}
        self._prompts = {
            contract.POINT_COORDS: ([1, "points", 2], np.float32),
            contract.POINT_LABELS: ([1, "points"], np.int32),
            contract.MASK_INPUT: ([1, 1, low, low], np.float32),
            contract.HAS_MASK_INPUT: ([1, 1], np.float32),
        }
        outputs = {contract.MULTI_MASKS: [1, 3, low, low], contract.MULTI_SCORES: [1, 3], contract.SINGLE_MASK: [1, 1, low, low]}
        outputs |= {contract.SINGLE_SCORE: [1, 1], contract.OBJECT_SCORE: [1, 1]}
        self._outputs = {name: self._buffer(shape, np.float32) for name, shape in outputs.items()}
        self._features = {name: self._buffer(shape, dtype) for name, (shape, dtype) in features.items()}
        copy_on = [(CUDA, cuda), CPU] if capture else [CPU]
        self._copy_features, self._copy_prompts = _copy_session(features, copy_on), _copy_session(self._prompts, copy_on)
        self._current = None  # a weak reference to the features the buffers hold
        try:
            with DEVICE_WORK:
                self._runs = self._thread.submit(self._prepare_all, Path(decoder), providers).result()
        except BaseException:
            self._thread.shutdown(wait=False)
            raise

    @property
    def point_counts(self) -> set[int]:
        """The point counts that have a session (and on a GPU a graph) here."""
        return set(self._runs)

    @staticmethod
    def handles(batch_size: int, points: int, outputs: list[str]) -> bool:
        """Whether a decode of `batch_size` prompt sets of `points` points, asking for `outputs`, runs here."""
        return batch_size == 1 and points <= MAX_POINTS and outputs == OUTPUTS

    def decode(self, features: ImageFeatures, prompts: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The decoder's multimask outputs (masks, scores, object score) for one prompt set."""
        return self._thread.submit(self._decode, features, prompts).result()

    def close(self) -> None:
        self._thread.shutdown(wait=False)

    def _decode(self, features: ImageFeatures, prompts: dict[str, np.ndarray]) -> list[np.ndarray]:
        session, buffers, binding = self._runs[prompts[contract.POINT_COORDS].shape[1]]
        if self._current is None or self._current() is not features:
            sources = {name: features.device.get(name, features.arrays.get(name)) for name in self._features}
            _copy_in(self._copy_features, {name: (sources[name], self._features[name], np.float32) for name in sources})
            self._current = weakref.ref(features)
        _copy_in(self._copy_prompts, {name: (prompts[name], buffers[name], self._prompts[name][1]) for name in self._prompts})
        session.run_with_iobinding(binding)
        # copies: a CPU buffer's numpy() is a view, which the next decode would overwrite
        return [np.array(self._outputs[name].numpy()) for name in OUTPUTS]

    def _buffer(self, shape: list[int], dtype) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, self.device, self.device_id)

    def _prepare_all(self, decoder: Path, providers: list) -> dict:
        """Point count -> (its session, its prompt buffers, its binding of every buffer), each run
        `WARM_RUNS` times on zeros (on a GPU: captured)."""
        runs = {}
        names = _point_dimensions(decoder)
        for points in range(1, MAX_POINTS + 1):
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            for dimension, size in zip(names, (1, points)):
                if dimension:  # free in the file (named), not fixed
                    options.add_free_dimension_override_by_name(dimension, size)
            session = ort.InferenceSession(str(decoder), options, providers=providers)
            buffers = {
                name: self._buffer([points if size == "points" else size for size in shape], dtype)
                for name, (shape, dtype) in self._prompts.items()
            }
            binding = session.io_binding()
            for name, value in {**self._features, **buffers}.items():
                binding.bind_ortvalue_input(name, value)
            for output in session.get_outputs():  # every one: a replay writes them all
                binding.bind_ortvalue_output(output.name, self._outputs[output.name])
            for _ in range(WARM_RUNS):
                session.run_with_iobinding(binding)
            runs[points] = (session, buffers, binding)
        return runs


def _point_dimensions(decoder: Path) -> list[str]:
    """The names of the decoder's batch and point-count dimensions ("" where the file fixes one)."""
    graph = onnx.load(str(decoder), load_external_data=False).graph
    coords = next(i for i in graph.input if i.name == contract.POINT_COORDS)
    return [d.dim_param for d in coords.type.tensor_type.shape.dim[:2]]


def _copy_in(session: ort.InferenceSession, copies: dict) -> None:
    """Run copy `session` on `copies` (name -> (source, buffer, dtype)): an OrtValue where it lies,
    a numpy array from the host in `dtype`; ONNX Runtime orders the copies before its run ends."""
    binding = session.io_binding()
    for name, (source, buffer, dtype) in copies.items():
        if isinstance(source, ort.OrtValue):
            binding.bind_ortvalue_input(name, source)
        else:
            binding.bind_cpu_input(name, np.ascontiguousarray(source, dtype))
        binding.bind_ortvalue_output(f"{name}_copy", buffer)
    session.run_with_iobinding(binding)


def _copy_session(tensors: dict, providers: list) -> ort.InferenceSession:
    """A graph copying each of `tensors` (name -> (shape, dtype)) into a bound buffer (Identity,
    kept: optimisations off)."""
    kinds = {np.float32: TensorProto.FLOAT, np.int32: TensorProto.INT32}
    values = [(name, kinds[dtype], shape) for name, (shape, dtype) in tensors.items()]
    nodes = [helper.make_node("Identity", [name], [f"{name}_copy"]) for name, _, _ in values]
    inputs = [helper.make_tensor_value_info(name, kind, shape) for name, kind, shape in values]
    outputs = [helper.make_tensor_value_info(f"{name}_copy", kind, shape) for name, kind, shape in values]
    graph = helper.make_graph(nodes, "triton_sam_copy_in", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=providers)
