"""`AutomaticMaskGenerator`: every object in an image from a grid of point prompts, as
`SAM2AutomaticMaskGenerator` (and `SamAutomaticMaskGenerator` for SAM1-family models) finds them.

Each batch of grid points is one decoder call (one request through Triton, so a server's dynamic
batcher and GPU see large batches). Masks are kept as their bounding box's pixels, and upsampled
to full resolution only after the predicted-IoU filter and a chunk at a time, so memory follows
the objects found rather than points x masks x pixels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..engines import CancelToken, Engine, ImageFeatures, create_engine
from ..errors import DecodeCancelled, InvalidInputError
from ..features import FeatureCache
from ..image import ContrastLimits, encoder_input
from ..masks import remove_holes_and_specks
from ..predictor import EngineOwner
from ..prompts import model_request
from ..registry import DEFAULT_MODEL, get_model
from .geometry import box_area, crop_boxes, layer_point_grids, near_crop_edge
from .records import FoundMask, check_output_mode, clean_small_regions, nms, to_record

Progress = Callable[[int, int], None]  # (batches done, batches in all)
Crop = tuple[int, int, int, int]  # x0, y0, x1, y1 (exclusive) of the image
SAM1_FAMILIES = ("sam1", "mobile_sam")
UPSAMPLE_BYTES = 64 * 2**20  # full-resolution logits held at once while scoring masks


class AutomaticMaskGenerator(EngineOwner):
    """Masks for everything in an image: prompts on a grid, filtered by predicted IoU and stability,
    duplicates removed by box NMS, optionally again on overlapping crops.

    The parameters are the official generators' (see `SAM2AutomaticMaskGenerator`); the model is
    named as in `Predictor`; a `cache` (`FeatureCache` of the same engine) reuses encoded planes.
    `pred_iou_thresh` defaults to 0.8 (SAM2.1, SAM3) or 0.88 (SAM1 family),
    as theirs do. `generate` returns their records.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        backend: str = "local",
        model_repository: str | Path | None = None,
        *,
        engine: Engine | None = None,
        cache: FeatureCache | None = None,
        points_per_side: int | None = 32,
        points_per_batch: int = 64,
        pred_iou_thresh: float | None = None,
        stability_score_thresh: float = 0.95,
        stability_score_offset: float = 1.0,
        mask_threshold: float = 0.0,
        box_nms_thresh: float = 0.7,
        crop_n_layers: int = 0,
        crop_nms_thresh: float = 0.7,
        crop_overlap_ratio: float = 512 / 1500,
        crop_n_points_downscale_factor: int = 1,
        point_grids: list[np.ndarray] | None = None,
        min_mask_region_area: int = 0,
        output_mode: str = "binary_mask",
        use_m2m: bool = False,
        multimask_output: bool = True,
        **engine_options,
    ) -> None:
        if (points_per_side is None) == (point_grids is None):
            raise InvalidInputError("Give exactly one of points_per_side and point_grids.")
        if points_per_batch < 1:
            raise InvalidInputError(f"points_per_batch must be at least 1, got {points_per_batch}.")
        check_output_mode(output_mode)
        self.spec = get_model(model)
        if point_grids is None:
            point_grids = layer_point_grids(points_per_side, crop_n_layers, crop_n_points_downscale_factor)
        if len(point_grids) < crop_n_layers + 1:
            raise InvalidInputError(f"point_grids needs one grid per crop layer ({crop_n_layers + 1}), got {len(point_grids)}.")
        self.point_grids = [np.asarray(grid, np.float64) for grid in point_grids]
        self.sam1 = self.spec.family in SAM1_FAMILIES
        self.points_per_batch = points_per_batch
        self.pred_iou_thresh = (0.88 if self.sam1 else 0.8) if pred_iou_thresh is None else pred_iou_thresh
        self.stability_score_thresh = stability_score_thresh
        self.stability_score_offset = stability_score_offset
        self.mask_threshold = mask_threshold
        self.box_nms_thresh = box_nms_thresh
        self.crop_n_layers = crop_n_layers
        self.crop_nms_thresh = crop_nms_thresh
        self.crop_overlap_ratio = crop_overlap_ratio
        self.min_mask_region_area = min_mask_region_area
        self.output_mode = output_mode
        self.use_m2m = use_m2m
        self.multimask_output = multimask_output
        self.engine = engine or create_engine(self.spec, backend, model_repository, **engine_options)
        self.cache = cache

    def batches(self, image_hw: tuple[int, int], crops: Sequence[Crop] | None = None) -> int:
        """Decoder calls (batches of points) a `generate` on an image of `image_hw` makes."""
        return sum(-(-len(self.point_grids[layer]) // self.points_per_batch) for _, layer in self._crops(image_hw, crops))

    def _crops(self, image_hw: tuple[int, int], crops: Sequence[Crop] | None) -> list[tuple[Crop, int]]:
        """The crops prompted and their layers: the official crop layers, or `crops` (layer 0's grid each)."""
        if crops is None:
            return crop_boxes(image_hw, self.crop_n_layers, self.crop_overlap_ratio)
        return [(tuple(int(v) for v in crop), 0) for crop in crops]

    def generate(
        self,
        image: np.ndarray,
        contrast_limits: ContrastLimits | None = None,
        progress: Progress | None = None,
        cancel: CancelToken | None = None,
    ) -> list[dict[str, Any]]:
        """Records of the masks found in `image` (HxW or HxWx3; uint8 as is, other dtypes scaled
        from `contrast_limits`), in the official order; raises DecodeCancelled if cancelled."""
        image_hw = image.shape[:2]
        return [to_record(found, image_hw, self.output_mode) for found in self.find(image, contrast_limits, progress, cancel)]

    def find(
        self,
        image: np.ndarray,
        contrast_limits: ContrastLimits | None = None,
        progress: Progress | None = None,
        cancel: CancelToken | None = None,
        crops: Sequence[Crop] | None = None,
    ) -> list[FoundMask]:
        """The masks of `generate`, each as its box's pixels (what a caller painting labels needs).

        `crops` (x0, y0, x1, y1) replace the crop layers: each is prompted with the first grid and
        encoded on its own, masks cut by a crop's inner edge are dropped and duplicates across crops
        removed, as between the official crops. Large planes pass their tiles (any array that
        slices: only the crops are read)."""
        if len(image.shape) not in (2, 3) or min(image.shape[:2]) < 1:
            raise InvalidInputError(f"image must be HxW or HxWxC, got shape {image.shape}.")
        image_hw = tuple(image.shape[:2])
        counter = _Counter(self.batches(image_hw, crops), progress)
        crops = self._crops(image_hw, crops)
        found: list[FoundMask] = []
        for start in range(0, len(crops), self.engine.encode_batch):  # crops encoded together where the engine can
            group = crops[start : start + self.engine.encode_batch]
            features = self._encode([self._crop_input(image, contrast_limits, crop) for crop, _ in group])
            for (crop, layer), crop_features in zip(group, features, strict=True):
                found += self._crop(crop_features, image.shape[:2], crop, self.point_grids[layer], counter, cancel)
        if len(crops) > 1:
            areas = box_area(np.array([m.crop_box for m in found], np.int64).reshape(-1, 4))
            found = nms(found, (1 / areas).astype(np.float32), self.crop_nms_thresh)
        if self.sam1 and self.min_mask_region_area > 0:
            threshold = max(self.box_nms_thresh, self.crop_nms_thresh)
            found = clean_small_regions(found, image_hw, self.min_mask_region_area, threshold)
        return found

    def _crop_input(self, image, contrast_limits: ContrastLimits | None, crop: Crop) -> np.ndarray:
        """The encoder input of one crop of `image` (only the crop is read)."""
        x0, y0, x1, y1 = crop
        return encoder_input(np.asarray(image[y0:y1, x0:x1]), self.spec, contrast_limits)

    def _encode(self, encoder_inputs: list[np.ndarray]) -> list[ImageFeatures]:
        """Features of crops' encoder inputs: from the cache where one was given."""
        return self.cache.features_many(encoder_inputs) if self.cache is not None else self.engine.encode_many(encoder_inputs)

    def _crop(self, features: ImageFeatures, image_hw, crop, grid, counter, cancel) -> list[FoundMask]:
        """The masks found in one crop (encoded as `features`), duplicates removed, in image coordinates."""
        x0, y0, x1, y1 = crop
        crop_hw = (y1 - y0, x1 - x0)
        points = grid * np.array(crop_hw[::-1], np.float64)
        if not self.sam1:
            points = points.astype(np.float32)  # as SAM2's generator holds (and reports) them
        found: list[FoundMask] = []
        for start in range(0, len(points), self.points_per_batch):
            _check(cancel)
            found += self._batch(features, points[start : start + self.points_per_batch], crop, image_hw, cancel)
            counter.step()
        return nms(found, np.array([m.predicted_iou for m in found], np.float32), self.box_nms_thresh)

    def _batch(self, features: ImageFeatures, points, crop, image_hw, cancel) -> list[FoundMask]:
        """Decode one batch of points (one call), keep the masks that pass the filters."""
        x0, y0, x1, y1 = crop
        crop_hw = (y1 - y0, x1 - x0)
        low_res, scores = self._decode(features, points[:, None, :], crop_hw, None, self.multimask_output, cancel)
        per_point = low_res.shape[1]
        low_res, scores = low_res.reshape(-1, *low_res.shape[2:]), scores.reshape(-1)
        points = np.repeat(points, per_point, axis=0)
        if self.use_m2m:  # each mask once more as its own prompt, with its point
            low_res, scores = self._refine(features, points, low_res, crop_hw, cancel)
        keep = np.flatnonzero(scores > self.pred_iou_thresh) if self.pred_iou_thresh > 0.0 else np.arange(len(scores))
        if keep.size == 0:
            return []
        image_box = (0, 0, image_hw[1], image_hw[0])
        found = []
        for indices in np.array_split(keep, -(-len(keep) // self._chunk(crop_hw))):
            logits = self._upsample(low_res[indices], crop_hw)
            for index, mask_logits in zip(indices, logits, strict=True):
                stability = self._stability(mask_logits)
                if self.stability_score_thresh > 0.0 and not stability >= self.stability_score_thresh:  # NaN (empty) fails
                    continue
                point = points[index]
                candidate = FoundMask.from_mask(
                    mask_logits > self.mask_threshold,
                    (x0, y0),
                    predicted_iou=float(scores[index]),
                    stability_score=float(stability),
                    point=(float(point[0] + x0), float(point[1] + y0)),  # in the points' own precision
                    crop_box=tuple(crop),
                )
                if not near_crop_edge(np.array([candidate.box]), crop, image_box)[0]:
                    found.append(candidate)
        return found

    def _decode(self, features, points, crop_hw, mask_input, multimask, cancel) -> tuple[np.ndarray, np.ndarray]:
        """Low-res logits [B, C, h, w] and predicted IoUs [B, C] of one positive point per prompt set."""
        request = model_request(
            self.spec, crop_hw, point_coords=points, point_labels=np.ones(points.shape[:2], np.int32), mask_input=mask_input
        )
        result = self.engine.decode(features, request, multimask, cancel)
        return result.low_res_logits, result.scores

    def _refine(self, features, points, low_res, crop_hw, cancel) -> tuple[np.ndarray, np.ndarray]:
        """`use_m2m`: decode each mask again with its point and its own low-res logits as mask prompt."""
        refined, scores = [], []
        prompts = self.spec.as_mask_input(low_res)[:, None]
        for start in range(0, len(points), self.points_per_batch):
            part = slice(start, start + self.points_per_batch)
            masks, ious = self._decode(features, points[part, None, :], crop_hw, prompts[part], False, cancel)
            refined.append(masks[:, 0])
            scores.append(ious[:, 0])
        return np.concatenate(refined), np.concatenate(scores)

    def _upsample(self, low_res: np.ndarray, crop_hw: tuple[int, int]) -> np.ndarray:
        """Full-resolution logits as the official predictor makes them (SAM2.1 removing small
        holes and specks first where `min_mask_region_area` asks, as its predictor does)."""
        if self.min_mask_region_area > 0 and not self.sam1:
            low_res = remove_holes_and_specks(low_res, self.min_mask_region_area)
        return self.engine.resizer.logits(low_res, crop_hw)

    def _stability(self, logits: np.ndarray) -> np.float32:
        """IoU of the mask thresholded `stability_score_offset` above and below `mask_threshold`."""
        inner = np.count_nonzero(logits > self.mask_threshold + self.stability_score_offset)
        outer = np.count_nonzero(logits > self.mask_threshold - self.stability_score_offset)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.float32(inner) / np.float32(outer)

    @staticmethod
    def _chunk(crop_hw: tuple[int, int]) -> int:
        return max(1, UPSAMPLE_BYTES // (4 * crop_hw[0] * crop_hw[1]))


class _Counter:
    """Counts finished batches and reports them to a progress callback."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.done, self.total, self.progress = 0, total, progress

    def step(self) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total)


def _check(cancel: CancelToken | None) -> None:
    if cancel is not None and cancel.cancelled:
        raise DecodeCancelled("automatic segmentation cancelled")
