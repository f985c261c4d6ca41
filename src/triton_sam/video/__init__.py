"""Propagating objects through the planes of a volume or time-lapse with SAM2.1's memory."""

from .predictor import VolumePredictor, VolumeState

__all__ = ["VolumePredictor", "VolumeState"]
