"""Tiny SAM3 concept graphs with the real contract (text encoder, detector), for fast tests.

The image is cut into a GRID x GRID grid of cells, one detector query a cell: its instance is the
cell's bright pixels (mask logits `20 * (brightness - 0.25)` inside the cell, -40 outside; its box
the cell's), scored `GAIN * (b - MIDDLE) + shift + pull` where b is the brightest of the cell (its
blob's brightness); presence is sure. `shift`, the phrase's: the mean of its tokens' first text
feature (`token_shift`: within +-TOKEN_SHIFT, so two phrases score differently but a blob of
BRIGHT, MEDIUM or DIM brightness stays above or below 0.5 and 0.95 whatever the phrase). `pull`,
the exemplars': each adds +-EXEMPLAR_GAIN (positive / negative) to the queries whose brightness is
within ~SIMILAR of the brightest in its box ("more like this", "not this"). The tokenizer's merges
file holds no merges: a phrase's tokens are its characters.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from synthetic import _const, _model
from triton_sam import contract
from triton_sam.concepts.tokenizer import CONTEXT_LENGTH, VOCAB_FILE
from triton_sam.registry import ModelSpec
from triton_sam.repository import concepts_path

GRID = 6
QUERIES = GRID * GRID
SIDE = 288  # the detector's finest map
CELL = SIDE // GRID
GAIN, MIDDLE = 12.0, 0.45
MASK_LEVEL = 0.25  # a query's mask: its cell's pixels brighter than this
TOKEN_SHIFT = 0.3
EXEMPLAR_GAIN, SIMILAR = 6.0, 0.08
VOCABULARY = 256 * 2 + 2  # bytes, bytes ending a word, start and end (no merges)
BRIGHT, MEDIUM, DIM = 230, 150, 80  # uint8 blob values: scores ~0.99, 0.8-0.9, 0.1-0.2 (at the scale of 255)


def token_shift(token: int) -> float:
    """A token's first text feature: -TOKEN_SHIFT, 0 or TOKEN_SHIFT (0 for start and end)."""
    return 0.0 if token >= VOCABULARY - 2 else TOKEN_SHIFT * (token % 3 - 1)


def text_encoder_model() -> onnx.ModelProto:
    """Token ids [B, 32] -> features [B, 32, 256]: a table whose first column is `token_shift`."""
    table = np.zeros((VOCABULARY, 256), np.float32)
    table[:, 0] = [token_shift(token) for token in range(VOCABULARY)]
    nodes = [_const("table", table), helper.make_node("Gather", ["table", contract.TEXT_TOKENS], [contract.TEXT_FEATURES])]
    tokens = helper.make_tensor_value_info(contract.TEXT_TOKENS, TensorProto.INT64, ["B", CONTEXT_LENGTH])
    features = helper.make_tensor_value_info(contract.TEXT_FEATURES, TensorProto.FLOAT, ["B", CONTEXT_LENGTH, 256])
    return _model(nodes, [tokens], [features])


def _phrase_shift() -> list:
    """Nodes giving "shift" [1, 1]: the mean first feature of the phrase's tokens (padding left out)."""
    return [
        _const("k2", np.array([2], np.int64)),
        helper.make_node("Slice", [contract.TEXT_FEATURES, "k0", "k1", "k2"], ["first"]),
        _const("tokens_shape", np.array([1, CONTEXT_LENGTH], np.int64)),
        helper.make_node("Reshape", ["first", "tokens_shape"], ["per_token"]),
        helper.make_node("Not", [contract.TEXT_PADDING], ["real"]),
        helper.make_node("Cast", ["real"], ["real_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["per_token", "real_f"], ["real_shift"]),
        helper.make_node("ReduceSum", ["real_shift", "k1"], ["shift_sum"], keepdims=1),
        helper.make_node("ReduceSum", ["real_f", "k1"], ["count"], keepdims=1),
        helper.make_node("Div", ["shift_sum", "count"], ["shift"]),
    ]


def _exemplar_pull() -> list:
    """Nodes giving "pull" [1, Q]: each exemplar's +-EXEMPLAR_GAIN on the queries as bright as the
    brightest in its box (a dummy exemplar of weight 0 keeps RoiAlign off an empty input)."""
    return [
        _const("boxes_shape", np.array([-1, 4], np.int64)),
        helper.make_node("Reshape", [contract.EXEMPLAR_BOXES, "boxes_shape"], ["boxes"]),
        _const("k4", np.array([4], np.int64)),
        helper.make_node("Slice", ["boxes", "k0", "k2", "k1"], ["centres"]),
        helper.make_node("Slice", ["boxes", "k2", "k4", "k1"], ["sizes"]),
        _const("half", np.float32(0.5)),
        helper.make_node("Mul", ["sizes", "half"], ["halves"]),
        helper.make_node("Sub", ["centres", "halves"], ["corner0"]),
        helper.make_node("Add", ["centres", "halves"], ["corner1"]),
        helper.make_node("Concat", ["corner0", "corner1"], ["unit_rois"], axis=1),
        _const("side", np.float32(SIDE)),
        helper.make_node("Mul", ["unit_rois", "side"], ["given_rois"]),
        _const("dummy_roi", np.array([[0, 0, 1, 1]], np.float32)),
        helper.make_node("Concat", ["given_rois", "dummy_roi"], ["rois"], axis=0),
        helper.make_node("Shape", ["rois"], ["rois_shape"], end=1),
        helper.make_node(
            "ConstantOfShape", ["rois_shape"], ["roi_images"], value=helper.make_tensor("z", TensorProto.INT64, [1], [0])
        ),
        helper.make_node(
            "RoiAlign", ["bright", "rois", "roi_images"], ["pooled"], output_height=4, output_width=4, sampling_ratio=2
        ),
        helper.make_node("ReduceMax", ["pooled"], ["exemplar_b"], axes=[1, 2, 3], keepdims=0),
        helper.make_node("Cast", [contract.EXEMPLAR_LABELS], ["labels_f"], to=TensorProto.FLOAT),
        _const("minus_one", np.array([-1], np.int64)),
        helper.make_node("Reshape", ["labels_f", "minus_one"], ["labels_flat"]),
        _const("two", np.float32(2.0)),
        _const("one", np.float32(1.0)),
        helper.make_node("Mul", ["labels_flat", "two"], ["labels_2"]),
        helper.make_node("Sub", ["labels_2", "one"], ["given_signs"]),
        _const("dummy_sign", np.array([0.0], np.float32)),
        helper.make_node("Concat", ["given_signs", "dummy_sign"], ["signs"], axis=0),
        _const("row_shape", np.array([1, 1, -1], np.int64)),
        helper.make_node("Reshape", ["exemplar_b", "row_shape"], ["exemplar_row"]),
        helper.make_node("Reshape", ["signs", "row_shape"], ["sign_row"]),
        helper.make_node("Unsqueeze", ["b", "k2"], ["b_column"]),
        helper.make_node("Sub", ["b_column", "exemplar_row"], ["difference"]),
        _const("similar", np.float32(SIMILAR)),
        helper.make_node("Div", ["difference", "similar"], ["scaled"]),
        helper.make_node("Mul", ["scaled", "scaled"], ["squared"]),
        helper.make_node("Neg", ["squared"], ["negated"]),
        helper.make_node("Exp", ["negated"], ["likeness"]),
        _const("exemplar_gain", np.float32(EXEMPLAR_GAIN)),
        helper.make_node("Mul", ["likeness", "sign_row"], ["signed"]),
        helper.make_node("Mul", ["signed", "exemplar_gain"], ["pulls"]),
        helper.make_node("ReduceSum", ["pulls", "k2"], ["pull"], keepdims=0),
    ]


def _cells() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each query's cell: its rows [1, Q, SIDE, 1] and columns [1, Q, 1, SIDE] (1 inside), and box [1, Q, 4]."""
    rows = np.zeros((1, QUERIES, SIDE, 1), np.float32)
    columns = np.zeros((1, QUERIES, 1, SIDE), np.float32)
    boxes = np.zeros((1, QUERIES, 4), np.float32)
    for query in range(QUERIES):
        row, column = divmod(query, GRID)
        rows[0, query, row * CELL : (row + 1) * CELL] = 1
        columns[0, query, :, column * CELL : (column + 1) * CELL] = 1
        boxes[0, query] = ((column + 0.5) / GRID, (row + 0.5) / GRID, 1 / GRID, 1 / GRID)
    return rows, columns, boxes


def detector_model() -> onnx.ModelProto:
    """The detector (see the module docstring), inputs and outputs as `contract.DETECTOR_INPUTS/OUTPUTS`."""
    rows, columns, boxes = _cells()
    nodes = [
        _const("k0", np.array([0], np.int64)),
        _const("k1", np.array([1], np.int64)),
        helper.make_node("Slice", [contract.DETECTOR_MAPS[0], "k0", "k1", "k1"], ["bright"]),
        helper.make_node("MaxPool", ["bright"], ["cell_max"], kernel_shape=[CELL, CELL], strides=[CELL, CELL]),
        _const("queries_shape", np.array([1, QUERIES], np.int64)),
        helper.make_node("Reshape", ["cell_max", "queries_shape"], ["b"]),
        *_phrase_shift(),
        *_exemplar_pull(),
        _const("middle", np.float32(MIDDLE)),
        _const("gain", np.float32(GAIN)),
        helper.make_node("Sub", ["b", "middle"], ["above"]),
        helper.make_node("Mul", ["above", "gain"], ["base"]),
        helper.make_node("Add", ["base", "shift"], ["phrased"]),
        helper.make_node("Add", ["phrased", "pull"], [contract.QUERY_LOGITS]),
        _const("mask_level", np.float32(MASK_LEVEL)),
        _const("k20", np.float32(20.0)),
        _const("k40", np.float32(40.0)),
        helper.make_node("Sub", ["bright", "mask_level"], ["over_level"]),
        helper.make_node("Mul", ["over_level", "k20"], ["everywhere"]),
        _const("rows", rows),
        _const("columns", columns),
        helper.make_node("Mul", ["rows", "columns"], ["inside"]),
        helper.make_node("Mul", ["everywhere", "inside"], ["in_cell"]),
        helper.make_node("Sub", ["inside", "one"], ["outside"]),
        helper.make_node("Mul", ["outside", "k40"], ["off_cell"]),
        helper.make_node("Add", ["in_cell", "off_cell"], [contract.QUERY_MASKS]),
        _const(contract.QUERY_BOXES, boxes),
        _const(contract.PRESENCE_LOGIT, np.array([[10.0]], np.float32)),
    ]
    float_ = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(name, float_, [1, *shape]) for name, shape in contract.DETECTOR_MAP_SHAPES.items()]
    inputs += [
        helper.make_tensor_value_info(contract.TEXT_FEATURES, float_, [1, CONTEXT_LENGTH, 256]),
        helper.make_tensor_value_info(contract.TEXT_PADDING, TensorProto.BOOL, [1, CONTEXT_LENGTH]),
        helper.make_tensor_value_info(contract.EXEMPLAR_BOXES, float_, [1, "N", 4]),
        helper.make_tensor_value_info(contract.EXEMPLAR_LABELS, TensorProto.INT64, [1, "N"]),
    ]
    outputs = [
        helper.make_tensor_value_info(contract.QUERY_BOXES, float_, [1, QUERIES, 4]),
        helper.make_tensor_value_info(contract.QUERY_LOGITS, float_, [1, QUERIES]),
        helper.make_tensor_value_info(contract.QUERY_MASKS, float_, [1, QUERIES, SIDE, SIDE]),
        helper.make_tensor_value_info(contract.PRESENCE_LOGIT, float_, [1, 1]),
    ]
    return _model(nodes, inputs, outputs)


def write_concepts(spec: ModelSpec, repository: Path) -> Path:
    """The synthetic text encoder, detector and (merge-less) merges file where the export puts SAM3's."""
    directory = concepts_path(repository, spec)
    directory.mkdir(parents=True, exist_ok=True)
    onnx.save(text_encoder_model(), directory / contract.TEXT_ENCODER_FILE)
    onnx.save(detector_model(), directory / contract.DETECTOR_FILE)
    (directory / VOCAB_FILE).write_bytes(gzip.compress(b"#version: 0.2"))
    return directory


def blob_image(size: int, blobs: dict[tuple[int, int], int], radius: int | None = None) -> np.ndarray:
    """uint8 `size` x `size` image of dark background (20) with a disk of value `blobs[(row, column)]`
    centred in each of those grid cells."""
    cell = size / GRID
    radius = radius or int(cell * 0.3)
    yy, xx = np.mgrid[:size, :size]
    image = np.full((size, size), 20, np.uint8)
    for (row, column), value in blobs.items():
        image[(xx - (column + 0.5) * cell) ** 2 + (yy - (row + 0.5) * cell) ** 2 <= radius**2] = value
    return image
