"""`InstanceSegmenter`: micro-sam's `InstanceSegmentationWithDecoder` on a triton-sam predictor.

The decoder runs where the predictor's engine keeps the image's features (no second encode), the
watershed here (`watershed.instance_labels`). A `FeatureCache` of the same engine reuses planes
encoded before (by the napari panel, a predictor, an automatic generator).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..features import FeatureCache
from ..image import ContrastLimits, encoder_input
from ..predictor import Predictor
from .records import INSTANCE_SEGMENTATION, check_output_mode, object_records
from .watershed import WatershedSettings, instance_labels

MAP_NAMES = ("foreground", "center_distances", "boundary_distances")  # micro-sam's state keys


class InstanceSegmenter:
    """Use as micro-sam's: `initialize(image)` computes the decoder's maps, `generate(...)` the
    objects (its parameters and defaults; a label image, or records with `output_mode="binary_mask"`).

    `predictor` names the model (one with an instance-segmentation decoder, e.g. micro-sam's
    `vit_b_lm`) and where it runs; it is set to the image, as micro-sam's is, for prompts after.
    """

    def __init__(self, predictor: Predictor, cache: FeatureCache | None = None) -> None:
        self.predictor = predictor
        self.cache = cache
        self._maps: np.ndarray | None = None  # [3, H, W]: foreground, center and boundary distances

    @property
    def is_initialized(self) -> bool:
        return self._maps is not None

    def initialize(self, image: np.ndarray, contrast_limits: ContrastLimits | None = None) -> None:
        """Encode `image` (or take its features from the cache) and run the decoder on them."""
        engine, size = self.predictor.engine, tuple(image.shape[:2])
        model_input = encoder_input(image, self.predictor.spec, contrast_limits)
        features = self.cache.features(model_input) if self.cache is not None else engine.encode(model_input)
        self.predictor.set_image_features(features, size)
        self._maps = engine.instance_maps(features, size)

    def generate(
        self,
        center_distance_threshold: float = 0.5,
        boundary_distance_threshold: float = 0.5,
        foreground_threshold: float = 0.5,
        foreground_smoothing: float = 1.0,
        distance_smoothing: float = 1.6,
        min_size: int = 0,
        output_mode: str = INSTANCE_SEGMENTATION,
    ) -> np.ndarray | list[dict[str, Any]]:
        """The objects of the initialized image: a uint64 label image, or micro-sam's records."""
        if self._maps is None:
            raise RuntimeError("InstanceSegmenter has not been initialized. Call initialize first.")
        check_output_mode(output_mode)
        settings = WatershedSettings(
            center_distance_threshold,
            boundary_distance_threshold,
            foreground_threshold,
            foreground_smoothing,
            distance_smoothing,
            min_size,
        )
        segmentation = instance_labels(self._maps, settings)
        return segmentation if output_mode == INSTANCE_SEGMENTATION else object_records(segmentation)

    def get_state(self) -> dict[str, np.ndarray]:
        """The decoder's maps, under micro-sam's names."""
        if self._maps is None:
            raise RuntimeError("The state has not been computed yet. Call initialize first.")
        return dict(zip(MAP_NAMES, self._maps, strict=True))

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        self._maps = np.stack([np.asarray(state[name], np.float32) for name in MAP_NAMES])

    def clear_state(self) -> None:
        self._maps = None
