"""The local engine's decodes replayed as CUDA graphs (#38; its default on CUDA): the graph
decoder it shares with the session model (`server/models/triton_sam_graphs.py`), made for a model,
and the copy graphs that decoder needs (built here with onnx; the export writes them beside the
session model, whose server may lack onnx).

`DEVICE_WORK` is held by each capture and by every CUDA run of a local engine: a capture runs in
CUDA's global mode, and another engine may be in use while one is made (napari's panel makes the
next model's engine while the last one still previews).
"""

from __future__ import annotations

import threading
from pathlib import Path

import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from .. import contract
from ..registry import ModelSpec
from ..server.models.triton_sam_graphs import GraphDecoder, free_dimensions

OUTPUTS = contract.decoder_output_names(True)  # the candidates: hover and `predict` both ask for them
DEVICE_WORK = threading.RLock()  # held by each capture and by every CUDA run of a local engine (see above)


def graph_decoder(
    decoder: ort.InferenceSession, path: Path, spec: ModelSpec, *, capture: bool = True, device_id: int = 0
) -> GraphDecoder:
    """The graph decoder of `spec`'s decoder file `path` (`decoder`: a session of it, for its
    dimensions), captured on CUDA device `device_id` unless not `capture` (then on the CPU)."""
    low = spec.low_res_size
    features = {name: [1, *shape] for name, shape in spec.feature_shapes.items()}
    copies = tuple(graph.SerializeToString() for graph in copy_graphs(spec))
    dimensions = free_dimensions(decoder, contract.POINT_COORDS)
    return GraphDecoder(
        path,
        dimensions,
        features,
        contract.graph_prompts(low),
        contract.graph_outputs(low),
        copies,
        capture=capture,
        device_id=device_id,
        device_work=DEVICE_WORK,
    )


def copy_graphs(spec: ModelSpec) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The graphs copying an image's features, and a decode's prompts, into a graph decoder's
    buffers (`contract.GRAPH_COPY_FILES`)."""
    features = {name: ([1, *shape], "float32") for name, shape in spec.feature_shapes.items()}
    return _copy_graph(features), _copy_graph(contract.graph_prompts(spec.low_res_size))


def _copy_graph(tensors: dict) -> onnx.ModelProto:
    """A graph copying each of `tensors` (name -> (shape, dtype)) to `<name>_copy` (Identity nodes:
    kept where the session's optimisations are off)."""
    kinds = {"float32": TensorProto.FLOAT, "int32": TensorProto.INT32}
    values = [(name, kinds[dtype], shape) for name, (shape, dtype) in tensors.items()]
    nodes = [helper.make_node("Identity", [name], [f"{name}_copy"]) for name, _, _ in values]
    inputs = [helper.make_tensor_value_info(name, kind, shape) for name, kind, shape in values]
    outputs = [helper.make_tensor_value_info(f"{name}_copy", kind, shape) for name, kind, shape in values]
    graph = helper.make_graph(nodes, "triton_sam_copy_in", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
