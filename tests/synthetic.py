"""A tiny ONNX model with the SAM2 tensor contract, for fast tests (never offered to users).

Encoder: image brightness (any size, grey or RGB, resized to the input size as the real encoders
do), average-pooled to each feature map's size (SAM3's: also its concept detector maps; concept
graphs: `synthetic_concepts`). Decoder: for threshold t in
(0.3, 0.5, 0.7) the mask logits are `20 * (brightness - t)`, lowered by `0.5 * (d - 160)` where d
(in 1024-pixel model units) is the distance to the nearest positive point beyond 300, plus a
quarter of `mask_input` when given (a soft prior, as SAM's: a later click can still add a region
that the previous round's clamped logits put at -32). Scores are fixed at (0.5, 0.9, 0.7), so the best mask is the middle one.
So a click inside a bright disk returns that disk and not a distant one. Instance decoder
(micro-sam models, `write_instance_decoder`): three smooth maps of the image embedding's first
channels, each its own contrast, at the input size.
"""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from triton_sam import contract
from triton_sam.export import write_session_model
from triton_sam.export.triton_config import decoder_config, encoder_config
from triton_sam.registry import ModelSpec
from triton_sam.repository import instance_decoder_path

THRESHOLDS = (0.3, 0.5, 0.7)
SCORES = (0.5, 0.9, 0.7)
REACH = 300.0
OPSET = 17


def _const(name: str, value) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def _model(nodes, inputs, outputs) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "synthetic", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def encoder_model(spec: ModelSpec) -> onnx.ModelProto:
    size = spec.input_size
    nodes = [
        helper.make_node("Cast", ["image"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Transpose", ["f"], ["chw"], perm=[0, 3, 1, 2]),
        helper.make_node("ReduceMean", ["chw"], ["mean"], axes=[1], keepdims=1),
        _const("k255", np.float32(255.0)),
        helper.make_node("Div", ["mean", "k255"], ["gray_any"]),
        helper.make_node("Shape", ["gray_any"], ["gray_nc"], end=2),
        _const("input_hw", np.array([size, size], np.int64)),
        helper.make_node("Concat", ["gray_nc", "input_hw"], ["gray_sizes"], axis=0),
        helper.make_node("Resize", ["gray_any", "", "", "gray_sizes"], ["gray"], mode="linear"),
    ]
    outputs = []
    maps = contract.DETECTOR_MAP_SHAPES if spec.family == "sam3" else {}  # SAM3's encoder answers them too
    for name, (channels, height, _) in {**spec.feature_shapes, **maps}.items():
        nodes += [
            *_pooled(f"{name}_p", size, height),
            _const(f"{name}_shape", np.array([1, channels, 1, 1], np.int64)),
            helper.make_node("Expand", [f"{name}_p", f"{name}_shape"], [name]),
        ]
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["B", channels, height, height]))
    image = helper.make_tensor_value_info(contract.ENCODER_INPUT, TensorProto.UINT8, ["B", "H", "W", "C"])
    return _model(nodes, [image], outputs)


def _pooled(name: str, size: int, side: int) -> list[onnx.NodeProto]:
    """Nodes averaging "gray" [B, 1, size, size] to `name`, `side` a side; resized where `side` does not
    divide `size` (SAM3's 288 of 1008)."""
    if size % side:
        sizes = _const(f"{name}_sizes", np.array([1, 1, side, side], np.int64))
        return [sizes, helper.make_node("Resize", ["gray", "", "", f"{name}_sizes"], [name], mode="linear")]
    stride = size // side
    return [helper.make_node("AveragePool", ["gray"], [name], kernel_shape=[stride, stride], strides=[stride, stride])]


def _brightness(spec: ModelSpec) -> list:
    """Nodes giving "bright" [B, 1, low, low], the brightness the encoder pooled: SAM2's first
    high-resolution map, or SAM1's image embedding brought to the low-res size."""
    if "high_res_feats_0" in spec.feature_shapes:
        return [helper.make_node("Slice", ["high_res_feats_0", "c0", "c1", "c1"], ["bright"])]
    scale = spec.low_res_size / spec.feature_shapes["image_embed"][-1]
    return [
        helper.make_node("Slice", ["image_embed", "c0", "c1", "c1"], ["embed_bright"]),
        _const("bright_scales", np.array([1, 1, scale, scale], np.float32)),
        helper.make_node("Resize", ["embed_bright", "", "bright_scales"], ["bright"], mode="linear"),
    ]


def decoder_model(spec: ModelSpec, reach: float = REACH) -> onnx.ModelProto:
    """The decoder, its masks reaching `reach` model units from the nearest positive point before they fall off."""
    low = spec.low_res_size
    step = spec.input_size / low
    grid = ((np.arange(low) + 0.5) * step).astype(np.float32)
    nodes = [
        _const("c0", np.array([0], np.int64)),
        _const("c1", np.array([1], np.int64)),
        _const("c2", np.array([2], np.int64)),
        *_brightness(spec),
        helper.make_node("Slice", ["point_coords", "c0", "c1", "c2"], ["px"]),
        helper.make_node("Slice", ["point_coords", "c1", "c2", "c2"], ["py"]),
        helper.make_node("Unsqueeze", ["px", "c2"], ["px4"]),  # [B, P, 1, 1]
        helper.make_node("Unsqueeze", ["py", "c2"], ["py4"]),
        _const("gx", grid.reshape(1, 1, 1, low)),
        _const("gy", grid.reshape(1, 1, low, 1)),
        helper.make_node("Sub", ["px4", "gx"], ["dx"]),
        helper.make_node("Sub", ["py4", "gy"], ["dy"]),
        helper.make_node("Mul", ["dx", "dx"], ["dx2"]),
        helper.make_node("Mul", ["dy", "dy"], ["dy2"]),
        helper.make_node("Add", ["dx2", "dy2"], ["d2"]),
        helper.make_node("Sqrt", ["d2"], ["dist"]),
        _const("pos", np.int32(contract.LABEL_POSITIVE)),
        helper.make_node("Equal", ["point_labels", "pos"], ["is_pos"]),
        helper.make_node("Not", ["is_pos"], ["not_pos"]),
        helper.make_node("Cast", ["not_pos"], ["not_pos_f"], to=TensorProto.FLOAT),
        _const("far", np.float32(1e4)),
        helper.make_node("Mul", ["not_pos_f", "far"], ["pen"]),
        _const("c23", np.array([2, 3], np.int64)),
        helper.make_node("Unsqueeze", ["pen", "c23"], ["pen4"]),
        helper.make_node("Add", ["dist", "pen4"], ["dist_pos"]),
        helper.make_node("ReduceMin", ["dist_pos"], ["dmin"], axes=[1], keepdims=1),
        _const("reach", np.float32(reach)),
        helper.make_node("Sub", ["dmin", "reach"], ["beyond"]),
        helper.make_node("Relu", ["beyond"], ["beyond_r"]),
        _const("half", np.float32(0.5)),
        helper.make_node("Mul", ["beyond_r", "half"], ["falloff"]),
        _const("k20", np.float32(20.0)),
        helper.make_node("Mul", ["bright", "k20"], ["b20"]),
        helper.make_node("Sub", ["b20", "falloff"], ["base0"]),
        helper.make_node("Unsqueeze", ["has_mask_input", "c23"], ["has4"]),
        _const("quarter", np.float32(0.25)),
        helper.make_node("Mul", ["has4", "quarter"], ["weight"]),
        helper.make_node("Mul", ["mask_input", "weight"], ["prev"]),
        helper.make_node("Add", ["base0", "prev"], ["base"]),
    ]
    for i, threshold in enumerate(THRESHOLDS):
        nodes += [_const(f"t{i}", np.float32(20.0 * threshold)), helper.make_node("Sub", ["base", f"t{i}"], [f"m{i}"])]
    nodes += [
        helper.make_node("Concat", ["m0", "m1", "m2"], [contract.MULTI_MASKS], axis=1),
        _const("zero", np.float32(0.0)),
        helper.make_node("Mul", [contract.MULTI_MASKS, "zero"], ["zeros"]),
        helper.make_node("ReduceMean", ["zeros"], ["zero_b3"], axes=[2, 3], keepdims=0),
        _const("scores", np.array(SCORES, np.float32)),
        helper.make_node("Add", ["zero_b3", "scores"], [contract.MULTI_SCORES]),
        helper.make_node("Identity", ["m1"], [contract.SINGLE_MASK]),
        helper.make_node("Slice", [contract.MULTI_SCORES, "c1", "c2", "c1"], [contract.SINGLE_SCORE]),
        helper.make_node("Slice", ["zero_b3", "c0", "c1", "c1"], ["zero_b1"]),
        _const("ten", np.float32(10.0)),
        helper.make_node("Add", ["zero_b1", "ten"], [contract.OBJECT_SCORE]),
    ]
    float_ = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(n, float_, ["B", *s]) for n, s in spec.feature_shapes.items()] + [
        helper.make_tensor_value_info(contract.POINT_COORDS, float_, ["B", "P", 2]),
        helper.make_tensor_value_info(contract.POINT_LABELS, TensorProto.INT32, ["B", "P"]),
        helper.make_tensor_value_info(contract.MASK_INPUT, float_, ["B", 1, low, low]),
        helper.make_tensor_value_info(contract.HAS_MASK_INPUT, float_, ["B", 1]),
    ]
    outputs = [
        helper.make_tensor_value_info(contract.MULTI_MASKS, float_, ["B", 3, low, low]),
        helper.make_tensor_value_info(contract.MULTI_SCORES, float_, ["B", 3]),
        helper.make_tensor_value_info(contract.SINGLE_MASK, float_, ["B", 1, low, low]),
        helper.make_tensor_value_info(contract.SINGLE_SCORE, float_, ["B", 1]),
        helper.make_tensor_value_info(contract.OBJECT_SCORE, float_, ["B", 1]),
    ]
    return _model(nodes, inputs, outputs)


def write_repository(spec: ModelSpec, repository: Path, reach: float = REACH, seed: int | None = None) -> Path:
    """Write the synthetic encoder and decoder (see `decoder_model` for `reach`), and the session
    model, under `spec`'s Triton names; with `seed` their weights are named as a random export's
    (the disk cache keeps features only of named weights)."""
    parts = (
        ("encoder", spec.encoder_name, encoder_model, encoder_config),
        ("decoder", spec.decoder_name, partial(decoder_model, reach=reach), decoder_config),
    )
    for component, name, build, config in parts:
        version_dir = Path(repository) / name / "1"
        version_dir.mkdir(parents=True, exist_ok=True)
        onnx.save(build(spec), version_dir / "model.onnx")
        (version_dir.parent / "config.pbtxt").write_text(config(spec))
        metadata = {
            "model_id": spec.model_id,
            "component": component,
            "contract_version": contract.CONTRACT_VERSION,
            "checkpoint": "synthetic-test-fixture",
        } | ({"seed": seed} if seed is not None else {})
        (version_dir.parent / contract.METADATA_FILE).write_text(json.dumps(metadata))
    write_session_model(spec, repository)
    return Path(repository)


def instance_decoder_model(spec: ModelSpec) -> onnx.ModelProto:
    """image_embed [1, C, h, w] -> sigmoid maps [1, 3, S, S] (S: the input size), as micro-sam's decoder's shapes."""
    size = spec.input_size
    nodes = [
        _const("starts", np.array([0], np.int64)),
        _const("ends", np.array([3], np.int64)),
        _const("axes", np.array([1], np.int64)),
        helper.make_node("Slice", [contract.INSTANCE_EMBED, "starts", "ends", "axes"], ["three"]),
        _const("middle", np.float32(0.3)),
        _const("gains", np.array([12.0, -8.0, 4.0], np.float32).reshape(1, 3, 1, 1)),
        helper.make_node("Sub", ["three", "middle"], ["centred"]),
        helper.make_node("Mul", ["centred", "gains"], ["scaled"]),
        _const("sizes", np.array([1, 3, size, size], np.int64)),
        helper.make_node("Resize", ["scaled", "", "", "sizes"], ["large"], mode="linear"),
        helper.make_node("Sigmoid", ["large"], [contract.INSTANCE_MAPS]),
    ]
    embed = helper.make_tensor_value_info(contract.INSTANCE_EMBED, TensorProto.FLOAT, [1, *spec.feature_shapes["image_embed"]])
    maps = helper.make_tensor_value_info(contract.INSTANCE_MAPS, TensorProto.FLOAT, [1, 3, size, size])
    return _model(nodes, [embed], [maps])


def write_instance_decoder(spec: ModelSpec, repository: Path) -> Path:
    """The synthetic instance decoder where the export puts micro-sam's."""
    path = instance_decoder_path(repository, spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(instance_decoder_model(spec), path)
    return path


def disk_image(height: int, width: int, disks: list[tuple[float, float, float]]) -> np.ndarray:
    """uint8 grayscale image with bright disks given as (x, y, radius)."""
    yy, xx = np.mgrid[:height, :width]
    image = np.full((height, width), 20, np.uint8)
    for x, y, r in disks:
        image[(xx - x) ** 2 + (yy - y) ** 2 <= r**2] = 230
    return image


class ReadLog:
    """An array that records the windows read from it (a pyramid level, lazily read)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array, self.reads = array, []
        self.shape, self.dtype, self.ndim = array.shape, array.dtype, array.ndim

    def __getitem__(self, key):
        self.reads.append(key)
        return self.array[key]


class SlowReads(ReadLog):
    """A plane on slow storage: each window takes `seconds` to read; when each read began is kept."""

    def __init__(self, array: np.ndarray, seconds: float) -> None:
        super().__init__(array)
        self.seconds, self.started = seconds, []

    def __getitem__(self, key):
        self.started.append((key, time.perf_counter()))
        time.sleep(self.seconds)
        return super().__getitem__(key)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.asarray(self[...], dtype)  # read whole: key `...`

    def read_at(self, key) -> float:
        """When the read of `key` (a tile's window; `...`: the whole plane) began."""
        return next(t for read, t in self.started if read == key)


def slow_encodes(engine, seconds: float, monkeypatch) -> list[float]:
    """Make `engine.encode` take `seconds` longer (a slow encoder, for timing); the list it returns
    receives when each encode ended."""
    ended, encode = [], engine.encode

    def slow_encode(image: np.ndarray):
        time.sleep(seconds)
        features = encode(image)
        ended.append(time.perf_counter())
        return features

    monkeypatch.setattr(engine, "encode", slow_encode)
    return ended
