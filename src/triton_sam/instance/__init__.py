"""Automatic instance segmentation with micro-sam's decoder ("AIS"): `InstanceSegmenter`, and
`TiledInstanceSegmenter` for large planes."""

from .segmenter import InstanceSegmenter
from .tiled import TiledInstanceSegmenter
from .watershed import WatershedSettings, instance_labels

__all__ = ["InstanceSegmenter", "TiledInstanceSegmenter", "WatershedSettings", "instance_labels"]
