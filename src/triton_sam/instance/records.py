"""micro-sam's "binary_mask" output of the instance segmenter: one record per object of a label image."""

from __future__ import annotations

from typing import Any

import numpy as np
from skimage.measure import regionprops

from ..errors import InvalidInputError

INSTANCE_SEGMENTATION, BINARY_MASK = "instance_segmentation", "binary_mask"


def check_output_mode(output_mode: str) -> None:
    if output_mode not in (INSTANCE_SEGMENTATION, BINARY_MASK):
        raise InvalidInputError(f"output_mode must be {INSTANCE_SEGMENTATION!r} or {BINARY_MASK!r}, got {output_mode!r}.")


def object_records(segmentation: np.ndarray) -> list[dict[str, Any]]:
    """`InstanceSegmentationWithDecoder._to_masks`: each object's mask, area, bbox as micro-sam
    writes it ([x0, w, y0, h]), the whole image as crop box ([0, W, 0, H]) and its label."""
    height, width = segmentation.shape
    return [
        {
            "segmentation": segmentation == prop.label,
            "area": prop.area,
            "bbox": [prop.bbox[1], prop.bbox[3] - prop.bbox[1], prop.bbox[0], prop.bbox[2] - prop.bbox[0]],
            "crop_box": [0, width, 0, height],
            "seg_id": prop.label,
        }
        for prop in regionprops(segmentation)
    ]
