"""Mask post-processing: low-resolution decoder logits to logits or masks at the image's size.

The resizing is a small ONNX Runtime graph (`Resize`, bilinear, half-pixel centres: PyTorch's
`F.interpolate(mode="bilinear", align_corners=False)`), thresholded in the same graph when the
caller wants masks. ONNX Runtime's kernel is several times faster than numpy on a CPU, and where
the decoder runs on a GPU the resizing runs there too. SAM1 goes to the padded input, is cropped
to the image's part and resized to the image (`Sam.postprocess_masks`); SAM3 fills small holes at
low resolution first (`SAM3InteractiveImagePredictor`). `MaskResizer.object_mask` gives the same
mask for images too large for a whole-image mask (coarse tiles of large planes): it computes only
the window where the object can be.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper
from skimage.measure import label

from .registry import STRETCH, ModelSpec
from .server.models.triton_sam_arrays import bilinear_taps

_CPU = ("CPUExecutionProvider",)
_CHUNK_PIXELS = 2**22  # `object_mask` upsamples this many pixels at a time (16 MiB of float32)
_OPSET, _IR_VERSION = 18, 8  # ONNX Runtime >= 1.16 reads these


def _replace_small_regions(logits: np.ndarray, regions_of, max_area: int, value: float) -> np.ndarray:
    """`logits` with each 8-connected region of `regions_of(mask)` of at most `max_area` pixels set to `value`."""
    replaced = np.array(logits, dtype=np.float32, copy=True)
    for mask in replaced.reshape(-1, *replaced.shape[-2:]):
        regions = label(regions_of(mask), connectivity=2)
        small = np.bincount(regions.ravel()) <= max_area
        small[0] = False  # label 0 is outside the regions
        mask[small[regions]] = value
    return replaced


def fill_holes(low_res: np.ndarray, max_area: int, threshold: float = 0.0, value: float | None = None) -> np.ndarray:
    """`low_res` with each background region (logits <= `threshold`, 8-connected) of at most
    `max_area` pixels raised to `value`: `threshold` + 10 by default, as SAM2/SAM3's
    `postprocess_masks` does (SAM2's video predictor uses 0.1)."""
    value = threshold + 10.0 if value is None else value
    return _replace_small_regions(low_res, lambda mask: mask <= threshold, max_area, value)


def remove_holes_and_specks(low_res: np.ndarray, max_area: int, threshold: float = 0.0) -> np.ndarray:
    """SAM2's `postprocess_masks` with `max_hole_area` = `max_sprinkle_area` = `max_area`: small
    holes filled (+10) and small foreground specks (logits > `threshold`) dropped (-10), both
    found in the logits as given."""
    holes = fill_holes(low_res, max_area, threshold)
    specks = _replace_small_regions(low_res, lambda mask: mask > threshold, max_area, threshold - 10.0)
    return np.where(specks != low_res, specks, holes)


def bilinear_weights(n_out: int, n_in: int, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Rows `start:stop` of the [n_out, n_in] matrix that resizes n_in samples to n_out bilinearly
    (see `bilinear_taps`)."""
    first, second, weight = bilinear_taps(n_out, n_in, start, stop)
    weights = np.zeros((len(first), n_in), np.float32)
    rows = np.arange(len(first))
    np.add.at(weights, (rows, first), (1 - weight).astype(np.float32))
    np.add.at(weights, (rows, second), weight.astype(np.float32))
    return weights


def _reach(n_out: int, n_in: int, lo: int, hi: int) -> tuple[int, int]:
    """Output samples start:stop of a bilinear n_in -> n_out resize that read source samples lo..hi."""
    first = bilinear_taps(n_out, n_in)[0]
    inside = np.flatnonzero((first >= lo - 1) & (first <= hi))
    return int(inside[0]), int(inside[-1]) + 1


def upsampled_object(source: np.ndarray, image_hw: tuple[int, int], threshold: float) -> tuple[np.ndarray, tuple[int, int]]:
    """The mask (logits > `threshold`) of `source` [h, w] resized bilinearly to `image_hw`, as the
    crop around its pixels and that crop's (row, column): only output pixels between source
    samples of which one is above the threshold can be (a bilinear value lies between its four
    samples), so only they are computed, a chunk of rows at a time."""
    above = source > threshold
    rows, cols = np.flatnonzero(above.any(axis=1)), np.flatnonzero(above.any(axis=0))
    if not rows.size:
        return np.zeros((0, 0), bool), (0, 0)
    (height, width), (h, w) = image_hw, source.shape
    r0, r1 = _reach(height, h, rows[0], rows[-1])
    c0, c1 = _reach(width, w, cols[0], cols[-1])
    across = source @ bilinear_weights(width, w, c0, c1).T  # [h, c1 - c0]
    mask = np.zeros((r1 - r0, c1 - c0), bool)
    chunk = max(1, _CHUNK_PIXELS // (c1 - c0))
    for start in range(r0, r1, chunk):
        stop = min(start + chunk, r1)
        mask[start - r0 : stop - r0] = bilinear_weights(height, h, start, stop) @ across > threshold
    found_rows, found_cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    if not found_rows.size:
        return np.zeros((0, 0), bool), (0, 0)
    crop = mask[found_rows[0] : found_rows[-1] + 1, found_cols[0] : found_cols[-1] + 1]
    return crop, (r0 + int(found_rows[0]), c0 + int(found_cols[0]))


def _resize(nodes: list, source: str, sizes_hw: str, target: str) -> None:
    """Append nodes resizing `source` [N, C, h, w] to [N, C, *`sizes_hw`] bilinearly, as PyTorch."""
    nodes += [
        helper.make_node("Shape", [source], [f"{target}_nc"], end=2),
        helper.make_node("Concat", [f"{target}_nc", sizes_hw], [f"{target}_sizes"], axis=0),
        helper.make_node(
            "Resize", [source, "", "", f"{target}_sizes"], [target], mode="linear", coordinate_transformation_mode="half_pixel"
        ),
    ]


def resize_graph(spec: ModelSpec) -> onnx.ModelProto:
    """low_res [N, C, h, w], image_hw int64 [2], threshold float [] -> logits [N, C, H, W] and masks (bool)."""
    nodes: list = []
    if spec.resize == STRETCH:
        _resize(nodes, "low_res", "image_hw", "logits")
    else:  # to the padded square input, crop to the image's part, then to the image
        square = helper.make_tensor("square", TensorProto.INT64, [2], [spec.input_size] * 2)
        nodes.append(helper.make_node("Constant", [], ["square_hw"], value=square))
        _resize(nodes, "low_res", "square_hw", "padded")
        zeros = helper.make_tensor("zeros", TensorProto.INT64, [2], [0, 0])
        axes = helper.make_tensor("axes", TensorProto.INT64, [2], [2, 3])
        nodes += [
            helper.make_node("Constant", [], ["crop_start"], value=zeros),
            helper.make_node("Constant", [], ["crop_axes"], value=axes),
            helper.make_node("Slice", ["padded", "crop_start", "input_hw", "crop_axes"], ["cropped"]),
        ]
        _resize(nodes, "cropped", "image_hw", "logits")
    nodes.append(helper.make_node("Greater", ["logits", "threshold"], ["masks"]))
    float_ = TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("low_res", float_, ["N", "C", "h", "w"]),
        helper.make_tensor_value_info("image_hw", TensorProto.INT64, [2]),
        helper.make_tensor_value_info("threshold", float_, []),
    ]
    if spec.resize != STRETCH:
        inputs.append(helper.make_tensor_value_info("input_hw", TensorProto.INT64, [2]))
    outputs = [
        helper.make_tensor_value_info("logits", float_, ["N", "C", "H", "W"]),
        helper.make_tensor_value_info("masks", TensorProto.BOOL, ["N", "C", "H", "W"]),
    ]
    graph = helper.make_graph(nodes, "triton_sam_mask_resize", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], ir_version=_IR_VERSION)


class MaskResizer:
    """Low-res logits of one model -> logits or masks at the image's size, as its official predictor.

    Thread-safe; `providers` are ONNX Runtime's (the decoder's, so that both run on one device);
    `device_work` is held around each run (the engine's, on CUDA: `graph_decoder.DEVICE_WORK`).
    """

    def __init__(
        self, spec: ModelSpec, providers: Sequence[str] = _CPU, device_work: AbstractContextManager | None = None
    ) -> None:
        self.spec = spec
        self._device_work = nullcontext() if device_work is None else device_work
        options = ort.SessionOptions()
        options.log_severity_level = 3  # Resize placement notes on GPUs are not for users
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._ort_session = ort.InferenceSession(
            resize_graph(spec).SerializeToString(), sess_options=options, providers=list(providers)
        )
        self._run_options = ort.RunOptions()
        self._run_options.only_execute_path_to_fetches = True  # masks alone skip copying logits out

    def logits(self, low_res: np.ndarray, image_hw: tuple[int, int], threshold: float = 0.0) -> np.ndarray:
        """Float logits [..., H, W]; `threshold` tells SAM3's holes from its masks."""
        return self._run("logits", low_res, image_hw, threshold)

    def masks(self, low_res: np.ndarray, image_hw: tuple[int, int], threshold: float = 0.0) -> np.ndarray:
        """Boolean masks [..., H, W]: logits above `threshold`."""
        return self._run("masks", low_res, image_hw, threshold)

    def object_mask(self, low_res: np.ndarray, image_hw: tuple[int, int], threshold: float = 0.0):
        """The mask of one low-res logit map [h, w] at `image_hw`, as `masks` gives it, computed
        only around the object: (crop around its pixels, the crop's (row, column) in the image).
        Memory follows the object, not the image (a coarse tile of a large plane is up to tens of
        thousands of pixels a side). Empty: a 0x0 crop."""
        spec = self.spec
        source = np.asarray(low_res, np.float32)
        if spec.fill_hole_area:
            source = fill_holes(source, spec.fill_hole_area, threshold)
        if spec.resize != STRETCH:  # SAM1: to the padded square input, cropped to the image's part
            (h, w), side = spec.input_hw(image_hw), spec.input_size
            n = source.shape[-1]
            source = bilinear_weights(side, n, 0, h) @ source @ bilinear_weights(side, n, 0, w).T
        return upsampled_object(source, image_hw, threshold)

    def _run(self, output: str, low_res: np.ndarray, image_hw: tuple[int, int], threshold: float) -> np.ndarray:
        spec = self.spec
        if spec.fill_hole_area:
            low_res = fill_holes(low_res, spec.fill_hole_area, threshold)
        lead = low_res.shape[:-2]
        feeds = {
            "low_res": np.ascontiguousarray(low_res, np.float32).reshape(
                1, -1, *low_res.shape[-2:]
            ),  # ORT splits channels over threads
            "image_hw": np.array(image_hw, np.int64),
            "threshold": np.array(threshold, np.float32),
        }
        if spec.resize != STRETCH:
            feeds["input_hw"] = np.array(spec.input_hw(image_hw), np.int64)
        with self._device_work:
            (result,) = self._ort_session.run([output], feeds, self._run_options)
        return result.reshape(*lead, *image_hw)
