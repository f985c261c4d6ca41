"""Automatic instance segmentation with micro-sam's decoder ("AIS"): `InstanceSegmenter`."""

from .segmenter import InstanceSegmenter
from .watershed import WatershedSettings, instance_labels

__all__ = ["InstanceSegmenter", "WatershedSettings", "instance_labels"]
