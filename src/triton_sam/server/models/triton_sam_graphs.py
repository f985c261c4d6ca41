"""One-prompt-set decodes replayed as CUDA graphs on a GPU (#38): the local engine's on CUDA
(`engines/graph_decoder.py`) and the session model's (`triton_sam_devices.py`). Written next to
`model.py`; numpy and onnxruntime only: the graphs that copy into the buffers come as ONNX files
or bytes, built where onnx is (`engines.graph_decoder.copy_graphs`; the export writes them).

A decode of one prompt set launches hundreds of small kernels. ONNX Runtime can capture them once
and replay them as one CUDA graph, several times faster on an H200 with the same logits
(`python -m benchmarks.gpu_decoder_probe`; BENCHMARKS.md, GPU). A graph replays
fixed addresses, so everything it reads and writes lives in buffers of its own: the current image's
features and the prompts (copied in by a small ONNX Runtime graph, on its stream, so a copy is done
before the replay reads it) and every output (copied out). Each point count up to `MAX_POINTS` gets
a decoder session with batch and point count fixed (its shape arithmetic folds away).

ONNX Runtime captures a graph per calling thread, and a capture fails while another thread
allocates on the device; so all of this runs on one thread of its own, and every graph is captured
when the decoder is made, before anything is encoded. It captures in CUDA's global mode: while a
capture is open, device work on any other thread of the process fails and breaks it. So captures
hold `device_work` (the local engines' lock of their CUDA runs; a server's devices are made one
after the other, before any request).

Without `capture` the same buffers, sessions and copies run as usual: on a CPU, where tests check them.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnxruntime as ort

MAX_POINTS = 4  # point counts with a graph of their own: the hover's one, and a few clicks
WARM_RUNS = 3  # runs of each graph when made: ONNX Runtime allocates on the first and captures after it
# How far a replay's outputs may be from the usual run's before the graphs are turned off
# (measured: 3e-4 on an H200; fp32 kernels that differ only in launch order stay far below).
TOLERANCE = 1e-2
DTYPES = {"float32": np.float32, "int32": np.int32}


class DevicePointer(NamedTuple):
    """Features in device memory that are no OrtValue of their own (a slot of a feature buffer)."""

    device: str
    device_id: int
    pointer: int


class GraphDecoder:
    """Decodes of one prompt set with at most `MAX_POINTS` points through fixed buffers on "cuda"
    (or "cpu" without `capture`).

    `decoder`: the decoder file; `dimensions`: the names of its batch and point-count dimensions
    ("" where the file fixes one); `features`: name -> shape [1, ...] of the features it takes;
    `prompts`, `outputs`: `contract.graph_prompts`, `contract.graph_outputs`; `copies`: the copy
    graphs of the features and of the prompts (files or bytes)."""

    def __init__(
        self,
        decoder: Path,
        dimensions: list[str],
        features: dict[str, list[int]],
        prompts: dict[str, tuple[list, str]],
        outputs: dict[str, list[int]],
        copies: tuple,
        *,
        capture: bool = True,
        device_id: int = 0,
        device_work: AbstractContextManager | None = None,
    ) -> None:
        self.device, self.device_id = ("cuda" if capture else "cpu"), device_id
        cuda = {"device_id": str(device_id)}
        providers = [("CUDAExecutionProvider", {**cuda, "enable_cuda_graph": "1"}), "CPUExecutionProvider"]
        providers = providers if capture else ["CPUExecutionProvider"]
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="triton-sam-graphs")
        self._prompts = {name: (shape, DTYPES[dtype]) for name, (shape, dtype) in prompts.items()}
        self._counted = next(name for name, (shape, _) in prompts.items() if "points" in shape)  # gives the point count
        self._outputs = {name: self._buffer(shape, np.float32) for name, shape in outputs.items()}
        self._features = {name: self._buffer(shape, np.float32) for name, shape in features.items()}
        copy_on = [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"] if capture else ["CPUExecutionProvider"]
        self._copy_features, self._copy_prompts = (_copy_session(copy, copy_on) for copy in copies)
        self._current = None  # what identifies the features the buffers hold (`decode`'s key)
        self.checked: set[int] = set()  # point counts whose first replay matched the usual run (`mismatch`)
        try:
            with device_work or nullcontext():
                self._runs = self._thread.submit(self._prepare_all, Path(decoder), dimensions, providers).result()
        except BaseException:
            self._thread.shutdown(wait=False)
            raise

    @property
    def features(self) -> list[str]:
        """The names of the features a decode reads."""
        return list(self._features)

    @property
    def point_counts(self) -> set[int]:
        """The point counts that have a session (and on a GPU a graph) here."""
        return set(self._runs)

    def takes(self, prompts, outputs) -> bool:
        """Whether a decode with these prompt names asking for these outputs is one of its own."""
        return set(prompts) == set(self._prompts) and set(outputs) <= set(self._outputs)

    @staticmethod
    def handles(batch_size: int, points: int) -> bool:
        """Whether a decode of `batch_size` prompt sets of `points` points runs here."""
        return batch_size == 1 and points <= MAX_POINTS

    def decode(self, key, features: dict, prompts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every output (name -> array) of the decode of one prompt set. `features` (name -> an
        OrtValue, a numpy array or a `DevicePointer`) are copied in only where `key` (what
        identifies them, compared by ==) is not the last decode's."""
        return self._thread.submit(self._decode, key, features, prompts).result()

    def mismatch(self, points: int, replayed: list, usual: list) -> str | None:
        """Why `replayed` outputs are off the `usual` run's (beyond `TOLERANCE`, or NaN); None where
        they match, and `points` is then checked for good."""
        differences = [float(np.max(np.abs(ours - theirs))) for ours, theirs in zip(replayed, usual)]
        if not all(difference <= TOLERANCE for difference in differences):  # NaN too
            return f"outputs off the usual run by {', '.join(f'{d:.2g}' for d in differences)}"
        self.checked.add(points)
        return None

    def close(self) -> None:
        self._thread.shutdown(wait=False)

    def _decode(self, key, features: dict, prompts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        session, buffers, binding = self._runs[prompts[self._counted].shape[1]]
        if self._current is None or not self._current == key:
            self._current = None  # a copy that fails leaves nothing current
            copies = {name: (features[name], buffer, np.float32) for name, buffer in self._features.items()}
            self._copy_in(self._copy_features, copies)
            self._current = key
        copies = {name: (prompts[name], buffers[name], dtype) for name, (_, dtype) in self._prompts.items()}
        self._copy_in(self._copy_prompts, copies)
        session.run_with_iobinding(binding)
        # copies: a CPU buffer's numpy() is a view, which the next decode would overwrite
        return {name: np.array(value.numpy()) for name, value in self._outputs.items()}

    def _copy_in(self, session: ort.InferenceSession, copies: dict) -> None:
        """Run copy `session` on `copies` (name -> (source, buffer, dtype)); ONNX Runtime orders the
        copies before its run ends."""
        binding = session.io_binding()
        for name, (source, buffer, dtype) in copies.items():
            if isinstance(source, ort.OrtValue):
                binding.bind_ortvalue_input(name, source)
            elif isinstance(source, DevicePointer):
                binding.bind_input(name, source.device, source.device_id, dtype, buffer.shape(), source.pointer)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(source, dtype))
            binding.bind_ortvalue_output(f"{name}_copy", buffer)
        session.run_with_iobinding(binding)

    def _buffer(self, shape: list[int], dtype) -> ort.OrtValue:
        return ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, self.device, self.device_id)

    def _prepare_all(self, decoder: Path, dimensions: list[str], providers: list) -> dict:
        """Point count -> (its session, its prompt buffers, its binding of every buffer), each run
        `WARM_RUNS` times on zeros (on a GPU: captured)."""
        runs = {}
        for points in range(1, MAX_POINTS + 1):
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            for dimension, size in zip(dimensions, (1, points)):
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


def free_dimensions(session: ort.InferenceSession, name: str) -> list[str]:
    """The names of the first two dimensions (batch, point count) of input `name` of `session`, ""
    where the file fixes one: what `GraphDecoder` fixes in its sessions."""
    shape = next(i.shape for i in session.get_inputs() if i.name == name)
    return [size if isinstance(size, str) else "" for size in shape[:2]]


def _copy_session(graph, providers: list) -> ort.InferenceSession:
    """A session of a copy graph (a file or bytes); optimisations off, which would drop its Identity nodes."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(graph if isinstance(graph, bytes) else str(graph), options, providers=providers)
