"""`Predictor`: the `SAM2ImagePredictor` API on top of any triton-sam engine."""

from __future__ import annotations

from pathlib import Path
from typing import Self

import numpy as np

from .engines import CancelToken, Engine, ImageFeatures, create_engine
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
    Masks are boolean (float logits with `return_logits=True`).
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
        self._features: ImageFeatures | None = None
        self._orig_hw: tuple[int, int] | None = None

    @property
    def is_image_set(self) -> bool:
        return self._features is not None

    @property
    def original_size(self) -> tuple[int, int] | None:
        """(H, W) of the image that was set."""
        return self._orig_hw

    def set_image(self, image: np.ndarray, contrast_limits: ContrastLimits | None = None) -> None:
        """Encode `image` (HxW or HxWx3/4; uint8 as is, other dtypes scaled from `contrast_limits`)."""
        features = self.engine.encode(encoder_input(image, self.spec, contrast_limits))
        self._features, self._orig_hw = features, image.shape[:2]

    def get_image_embedding(self) -> ImageFeatures:
        self._require_image()
        return self._features

    def reset_predictor(self) -> None:
        self._features, self._orig_hw = None, None

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
        request = model_request(
            self.spec,
            self._orig_hw,
            point_coords=point_coords,
            point_labels=point_labels,
            box=box,
            mask_input=mask_input,
            normalize_coords=normalize_coords,
        )
        masks, scores, low_res = decode_masks(
            self.engine, self._features, request, self._orig_hw, multimask_output, return_logits, self.mask_threshold, cancel
        )
        if request.batch_size == 1:
            return masks[0], scores[0], low_res[0]
        return masks, scores, low_res

    def _require_image(self) -> None:
        if self._features is None:
            raise RuntimeError("An image must be set with .set_image(...) before mask prediction.")
