"""Automatic segmentation: every object in an image from a grid of prompts (`AutomaticMaskGenerator`)."""

from .generator import AutomaticMaskGenerator
from .records import FoundMask, label_image

__all__ = ["AutomaticMaskGenerator", "FoundMask", "label_image"]
