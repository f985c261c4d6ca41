"""`Predictor`: the `SAM2ImagePredictor` API on top of any triton-sam engine."""

from __future__ import annotations

from pathlib import Path
from typing import Self

import numpy as np

from .engines import CancelToken, Engine, ImageFeatures, create_engine
from .errors import InvalidInputError
from .image import ContrastLimits, encoder_input
from .prompts import model_request
from .registry import DEFAULT_MODEL, get_model


def decode_masks(
    engine: Engine,
    features: ImageFeatures,
    request,
    image_hw: tuple[int, int],
    multimask_output: bool,
    return_logits: bool,
    mask_threshold: float,
    cancel: CancelToken | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode `request`: masks (or logits) at `image_hw`, scores, low-res logits as the official
    predictor returns them (`ModelSpec.as_mask_input`); all with the batch axis."""
    result = engine.decode(features, request, multimask_output, cancel)
    resize = engine.resizer.logits if return_logits else engine.resizer.masks
    masks = resize(result.low_res_logits, image_hw, mask_threshold)
    return masks, result.scores, engine.spec.as_mask_input(result.low_res_logits)


class EngineOwner:
    """Closing it (or leaving its `with` block) closes its engine."""

    engine: Engine

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Predictor(EngineOwner):
    """Set an image once, then predict masks from point, box and mask prompts.

    Mirrors `sam2.sam2_image_predictor.SAM2ImagePredictor`: coordinates are (x, y) in original
    image pixels; `predict` returns `(masks, scores, low_res_logits)` with the official shapes.
    Masks are boolean (float logits with `return_logits=True`). `set_image_batch` and
    `predict_batch` do the same for several images (encoded together where the engine can).
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        backend: str = "local",
        model_repository: str | Path | None = None,
        *,
        engine: Engine | None = None,
        mask_threshold: float = 0.0,
        **engine_options,
    ) -> None:
        self.spec = get_model(model)
        self.engine = engine or create_engine(self.spec, backend, model_repository, **engine_options)
        self.mask_threshold = mask_threshold
        self._images: list[tuple[ImageFeatures, tuple[int, int]]] = []  # features and (H, W) of each image set
        self._is_batch = False

    @property
    def is_image_set(self) -> bool:
        return bool(self._images)

    @property
    def original_size(self) -> tuple[int, int] | None:
        """(H, W) of the image that was set (of a batch: the last, which `predict` uses, as the official one does)."""
        return self._images[-1][1] if self._images else None

    def set_image(self, image: np.ndarray, contrast_limits: ContrastLimits | None = None) -> None:
        """Encode `image` (HxW or HxWx3/4; uint8 as is, other dtypes scaled from `contrast_limits`)."""
        self.set_image_features(self.engine.encode(encoder_input(image, self.spec, contrast_limits)), image.shape[:2])

    def set_image_features(self, features: ImageFeatures, original_size: tuple[int, int]) -> None:
        """Set an image already encoded by this predictor's engine (e.g. from a `FeatureCache`)."""
        self._images, self._is_batch = [(features, tuple(original_size))], False

    def set_image_batch(self, image_list: list[np.ndarray], contrast_limits: ContrastLimits | None = None) -> None:
        """Encode several images for `predict_batch`, as `SAM2ImagePredictor.set_image_batch` does:
        together where the engine encodes several at once (a GPU server), else one by one."""
        if not isinstance(image_list, list) or not image_list:
            raise InvalidInputError("set_image_batch takes a list of one or more images.")
        inputs = [encoder_input(image, self.spec, contrast_limits) for image in image_list]
        sizes = [tuple(image.shape[:2]) for image in image_list]
        self._images, self._is_batch = list(zip(self.engine.encode_many(inputs), sizes, strict=True)), True

    def get_image_embedding(self) -> ImageFeatures:
        self._require_image()
        return self._images[-1][0]

    def reset_predictor(self) -> None:
        self._images, self._is_batch = [], False

    def predict(
        self,
        point_coords: np.ndarray | None = None,
        point_labels: np.ndarray | None = None,
        box: np.ndarray | None = None,
        mask_input: np.ndarray | None = None,
        multimask_output: bool = True,
        return_logits: bool = False,
        normalize_coords: bool = True,
        cancel: CancelToken | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Masks for the prompts: [C, H, W] for one prompt set, [B, C, H, W] for a batch."""
        self._require_image()
        prompts = (point_coords, point_labels, box, mask_input)
        return self._predict(self._images[-1], *prompts, multimask_output, return_logits, normalize_coords, cancel)

    def predict_batch(
        self,
        point_coords_batch: list | None = None,
        point_labels_batch: list | None = None,
        box_batch: list | None = None,
        mask_input_batch: list | None = None,
        multimask_output: bool = True,
        return_logits: bool = False,
        normalize_coords: bool = True,
    ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        """`predict` on each image of `set_image_batch` with its own prompts (item i of each list,
        which holds one item per image or is None); lists of masks, scores and low-res logits."""
        if not self._is_batch:
            raise RuntimeError("predict_batch needs images set with .set_image_batch(...).")
        batches = (point_coords_batch, point_labels_batch, box_batch, mask_input_batch)
        if any(batch is not None and len(batch) != len(self._images) for batch in batches):
            raise InvalidInputError(f"Give each prompt list one item per image ({len(self._images)}).")
        results = [
            self._predict(
                image, *(None if b is None else b[i] for b in batches), multimask_output, return_logits, normalize_coords
            )
            for i, image in enumerate(self._images)
        ]
        return tuple(list(outputs) for outputs in zip(*results))

    def _predict(
        self,
        image: tuple[ImageFeatures, tuple[int, int]],
        point_coords: np.ndarray | None,
        point_labels: np.ndarray | None,
        box: np.ndarray | None,
        mask_input: np.ndarray | None,
        multimask_output: bool,
        return_logits: bool,
        normalize_coords: bool,
        cancel: CancelToken | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`predict` on one image set (its features and size)."""
        features, size = image
        request = model_request(
            self.spec,
            size,
            point_coords=point_coords,
            point_labels=point_labels,
            box=box,
            mask_input=mask_input,
            normalize_coords=normalize_coords,
        )
        masks, scores, low_res = decode_masks(
            self.engine, features, request, size, multimask_output, return_logits, self.mask_threshold, cancel
        )
        if request.batch_size == 1:
            return masks[0], scores[0], low_res[0]
        return masks, scores, low_res

    def _require_image(self) -> None:
        if not self._images:
            raise RuntimeError("An image must be set with .set_image(...) before mask prediction.")
