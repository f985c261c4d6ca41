"""Validate user prompts and turn them into the decoder's point/label tensors.

Coordinates are (x, y) in original image pixels; an image of H x W pixels spans x 0..W, y 0..H
(edges included), and so does a tile of a plane (see `tiles`). A box becomes two corner points
labelled 2 and 3, ordered as the model's official predictor does: before the clicks for SAM2, after
them for SAM1, which also needs a padding point (label -1) when there is no box.

`Prompts` is one prompt set as a value: an object's prompts go from the plane to the tile that
decodes them (`Prompts.in_tile`) to the decoder's request (`Prompts.request`) in that one form.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import contract
from .errors import InvalidInputError
from .registry import SAM1_PROMPTS, SAM2_PROMPTS, ModelSpec
from .tiles import Tile

Point = tuple[float, float]  # (x, y)
Box = tuple[float, float, float, float]  # (x0, y0, x1, y1)
NO_PROMPTS = "Give at least one point (point_coords + point_labels) or a box."


@dataclass(frozen=True)
class DecodeRequest:
    """Prompts in model input space, batched: B prompt sets of P points each."""

    point_coords: np.ndarray  # float32 [B, P, 2]
    point_labels: np.ndarray  # int32 [B, P]
    mask_input: np.ndarray | None  # float32 [B, 1, S, S] low-res logits, or None
    # Set when the caller uses the logits only as masks (logits > logits_above) and as later mask
    # inputs to the same engine: an engine may then return any value at or below it away from the
    # object (a server sends less); as a mask input they still refine as the whole logits would.
    logits_above: float | None = None
    # With multimask_output=False: the best of the three multimask candidates (highest predicted
    # IoU) instead of the single-mask output. SAM's interactive tools show that for one click
    # (SAM2Base's multimask for one point, SAM1's ONNX `select_masks`): a hover preview asks for it
    # so that it shows what the click will give.
    best_of_multimask: bool = False

    @property
    def batch_size(self) -> int:
        return self.point_coords.shape[0]


def _as_finite(name: str, value, dtype) -> np.ndarray:
    array = np.asarray(value, dtype=dtype)
    if not np.isfinite(array).all():
        raise InvalidInputError(f"{name} contains NaN or infinite values.")
    return array


def _check_inside(name: str, xy: np.ndarray, width: float, height: float) -> None:
    outside = (xy[..., 0] < 0) | (xy[..., 0] > width) | (xy[..., 1] < 0) | (xy[..., 1] > height)
    if outside.any():
        first = xy[outside][0]
        raise InvalidInputError(
            f"{name} ({first[0]:g}, {first[1]:g}) lies outside the image "
            f"(x in 0..{width:g}, y in 0..{height:g}; coordinates are (x, y))."
        )


def _points(point_coords, point_labels) -> tuple[np.ndarray, np.ndarray] | None:
    if point_coords is None and point_labels is None:
        return None
    if point_coords is None or point_labels is None:
        raise InvalidInputError("point_coords and point_labels must be given together.")
    coords = _as_finite("point_coords", point_coords, np.float32)
    labels = np.asarray(point_labels)
    if coords.ndim == 2:
        coords, labels = coords[None], labels[None]
    if coords.ndim != 3 or coords.shape[-1] != 2 or coords.shape[1] == 0:
        raise InvalidInputError(f"point_coords must have shape Nx2 or BxNx2, got {np.shape(point_coords)}.")
    if labels.shape != coords.shape[:2]:
        raise InvalidInputError(
            f"point_labels shape {np.shape(point_labels)} does not match point_coords shape {np.shape(point_coords)}."
        )
    if not np.isin(labels, (contract.LABEL_NEGATIVE, contract.LABEL_POSITIVE)).all():
        raise InvalidInputError("point_labels must be 1 (positive) or 0 (negative).")
    return coords, labels.astype(np.int32)


def _boxes(box) -> np.ndarray | None:
    if box is None:
        return None
    boxes = _as_finite("box", box, np.float32)
    if boxes.ndim == 1:
        boxes = boxes[None]
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise InvalidInputError(f"box must have shape 4 or Bx4 (x0, y0, x1, y1), got {np.shape(box)}.")
    if (boxes[:, 2] < boxes[:, 0]).any() or (boxes[:, 3] < boxes[:, 1]).any():
        raise InvalidInputError("box must be (x0, y0, x1, y1) with x0 <= x1 and y0 <= y1.")
    return boxes.reshape(-1, 2, 2)


def _mask_input(mask_input, batch: int, low_res_size: int) -> np.ndarray | None:
    if mask_input is None:
        return None
    masks = _as_finite("mask_input", mask_input, np.float32)
    if masks.ndim == 3:
        masks = masks[None]
    expected = (1, low_res_size, low_res_size)
    if masks.ndim != 4 or masks.shape[1:] != expected or masks.shape[0] not in (1, batch):
        raise InvalidInputError(
            f"mask_input must have shape 1x{low_res_size}x{low_res_size} or Bx1x{low_res_size}x{low_res_size} "
            f"(low-res logits of a previous prediction), got {np.shape(mask_input)}."
        )
    return np.ascontiguousarray(np.broadcast_to(masks, (batch, *expected)))


def build_request(
    image_size: tuple[int, int],
    input_hw: tuple[int, int],
    point_coords=None,
    point_labels=None,
    box=None,
    mask_input=None,
    normalize_coords: bool = True,
    low_res_size: int = 256,
    prompt_format: str = SAM2_PROMPTS,
    logits_above: float | None = None,
    best_of_multimask: bool = False,
) -> DecodeRequest:
    """Validate prompts for an image of `image_size` (H, W) and scale them to the model input of
    `input_hw` (H, W; see `ModelSpec.input_hw`), in the order `prompt_format` wants.
    `logits_above`, `best_of_multimask`: see `DecodeRequest`."""
    height, width = image_size
    points = _points(point_coords, point_labels)
    boxes = _boxes(box)
    if points is None and boxes is None:
        raise InvalidInputError(NO_PROMPTS)
    extent = (width, height) if normalize_coords else (1.0, 1.0)
    if points is not None:
        _check_inside("Point", points[0], *extent)
    if boxes is not None:
        _check_inside("Box corner", boxes, *extent)

    parts = []  # (coords, labels) in the model's order
    if boxes is not None:
        corner_labels = np.array([contract.LABEL_BOX_TOP_LEFT, contract.LABEL_BOX_BOTTOM_RIGHT], np.int32)
        parts.append((boxes, np.broadcast_to(corner_labels, boxes.shape[:2])))
    if points is not None:
        parts.insert(len(parts) if prompt_format == SAM2_PROMPTS else 0, points)
    batch_sizes = {coords.shape[0] for coords, _ in parts}
    if len(batch_sizes) > 1:
        raise InvalidInputError(f"Boxes and point sets must come in the same number, got {sorted(batch_sizes)}.")
    coords = np.concatenate([c for c, _ in parts], axis=1)
    scale = np.array([width, height], np.float32) if normalize_coords else np.ones(2, np.float32)
    coords = (coords / scale) * np.array(input_hw[::-1], np.float32)
    labels = np.concatenate([label for _, label in parts], axis=1).astype(np.int32)
    batch = coords.shape[0]
    if prompt_format == SAM1_PROMPTS and boxes is None:
        coords = np.concatenate([coords, np.zeros((batch, 1, 2), np.float32)], axis=1)
        labels = np.concatenate([labels, np.full((batch, 1), contract.LABEL_PADDING, np.int32)], axis=1)
    return DecodeRequest(
        point_coords=np.ascontiguousarray(coords, dtype=np.float32),
        point_labels=np.ascontiguousarray(labels),
        mask_input=_mask_input(mask_input, batch, low_res_size),
        logits_above=logits_above,
        best_of_multimask=best_of_multimask,
    )


def model_request(spec: ModelSpec, image_size: tuple[int, int], **prompts) -> DecodeRequest:
    """`build_request` with the input size, mask size and prompt order of `spec`."""
    return build_request(
        image_size,
        spec.input_hw(image_size),
        low_res_size=spec.low_res_size,
        prompt_format=spec.prompt_format,
        **prompts,
    )


@dataclass(frozen=True)
class Prompts:
    """One prompt set in one image's pixels: points (x, y) with their labels (1 positive, 0
    negative) and at most one box (x0, y0, x1, y1)."""

    points: tuple[Point, ...] = ()
    labels: tuple[int, ...] = ()
    box: Box | None = None

    @classmethod
    def of(cls, point_coords=None, point_labels=None, box=None) -> Prompts:
        """One prompt set given as `Predictor.predict` takes it (points N x 2, labels N, box 4),
        checked as `build_request` checks it (the same messages)."""
        points, boxes = _points(point_coords, point_labels), _boxes(box)
        if points is None and boxes is None:
            raise InvalidInputError(NO_PROMPTS)
        if (points is not None and len(points[0]) > 1) or (boxes is not None and len(boxes) > 1):
            raise InvalidInputError("Give one prompt set (points N x 2, labels N, a box of 4) at a time.")
        xy = () if points is None else tuple(map(tuple, np.asarray(point_coords, np.float64).reshape(-1, 2).tolist()))
        labels = () if points is None else tuple(points[1].reshape(-1).tolist())
        return cls(xy, labels, None if boxes is None else tuple(np.asarray(box, np.float64).reshape(4).tolist()))

    @property
    def empty(self) -> bool:
        return not self.points and self.box is None

    def with_point(self, xy: Point, label: int = contract.LABEL_POSITIVE) -> Prompts:
        """These prompts and one more point."""
        return Prompts((*self.points, (float(xy[0]), float(xy[1]))), (*self.labels, int(label)), self.box)

    def corners(self) -> np.ndarray:
        """Every point and both corners of the box, (x, y) float64 [N, 2]: what must lie in a tile."""
        return np.array([*self.points, *(() if self.box is None else (self.box[:2], self.box[2:]))], np.float64).reshape(-1, 2)

    def check_inside(self, image_size: tuple[int, int]) -> None:
        """Refuse (InvalidInputError) prompts outside an image of `image_size` (H, W), as `build_request` does."""
        height, width = image_size
        if self.points:
            _check_inside("Point", np.array(self.points, np.float32), width, height)
        if self.box is not None:
            _check_inside("Box corner", np.array(self.box, np.float32).reshape(2, 2), width, height)

    def in_tile(self, tile: Tile) -> Prompts:
        """The same prompts in `tile`'s pixels (from the plane's)."""
        points = tile.to_tile(np.array(self.points, np.float64).reshape(-1, 2)).tolist()
        box = None if self.box is None else tuple(tile.to_tile(np.array(self.box, np.float64).reshape(2, 2)).reshape(4).tolist())
        return Prompts(tuple(map(tuple, points)), self.labels, box)

    def request(self, spec: ModelSpec, image_size: tuple[int, int], **options) -> DecodeRequest:
        """The decoder's request for these prompts on an image (a tile) of `image_size` (H, W) in
        `spec`'s input; `options`: `build_request`'s (`mask_input`, `logits_above`, `best_of_multimask`)."""
        points = np.array(self.points, np.float64) if self.points else None
        labels = np.array(self.labels) if self.points else None
        return model_request(spec, image_size, point_coords=points, point_labels=labels, box=self.box, **options)
