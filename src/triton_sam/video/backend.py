"""Where a volume's planes and memories live, as `VolumePredictor` sees it: a `VideoBackend`.

Each engine says where (`Engine.video`): the local engine runs the video graphs in this process,
a Triton engine on its server's session model (memories kept there). Both run the same code on a
plane's features (`server/models/triton_sam_video.py`), so `VolumePredictor` talks to either alike
and never asks which engine it has.

A plane is what `plane()` returns for an encoder input (features here, a handle there), a memory
what `remember()` returns (an array here, a handle there).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from ..engines.base import ImageFeatures
from ..features import FeatureCache
from ..prompts import DecodeRequest
from .memory import MemoryInputs, VideoSettings


@dataclass(frozen=True)
class TrackingOutput:
    """The tracking decoder's outputs for one prompt set (batch of one)."""

    multi_masks: np.ndarray  # [1, 3, S, S]
    multi_scores: np.ndarray  # [1, 3]
    single_mask: np.ndarray  # [1, 1, S, S]
    single_score: np.ndarray  # [1, 1]
    object_score_logits: np.ndarray  # [1, 1]
    obj_ptr: np.ndarray  # [1, 4, C]: single-mask token's pointer, then the multimask tokens'


class VideoBackend(ABC):
    """Planes encoded through a feature cache (each once while cached, keyed by content),
    `encode_batch` at a time where the engine encodes several together, and the video graphs
    run on them."""

    cache: FeatureCache
    settings: VideoSettings  # the official predictor's settings at export

    @property
    def encode_batch(self) -> int:
        """How many planes `planes` should be given at once (see `Engine.encode_batch`)."""
        return self.cache.engine.encode_batch

    def plane(self, encoder_input: np.ndarray):
        return self.planes([encoder_input])[0]

    def planes(self, encoder_inputs: list[np.ndarray]) -> list:
        return [self._plane(features) for features in self.cache.features_many(encoder_inputs)]

    def _plane(self, features: ImageFeatures):
        """A plane as the video graphs take it."""
        return features

    @abstractmethod
    def track(self, plane, inputs: MemoryInputs | None, request: DecodeRequest) -> TrackingOutput:
        """Decode one object on `plane` conditioned on its memories (`inputs`; None: an initial
        conditioning plane, no memories)."""

    @abstractmethod
    def remember(self, plane, low_res: np.ndarray, score: np.ndarray, binarize: bool):
        """A mask memory of `plane` and one mask's low-res logits."""

    @abstractmethod
    def mask_as_output(self, plane, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A mask prompt [H, W] taken as the object's mask: (low-res logits, object score logits, object pointer)."""
