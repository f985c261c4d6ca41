"""micro-sam's instance post-processing in numpy, scipy and scikit-image: a seeded watershed on the
decoder's boundary distances, seeds where both distances are small, inside the foreground.

The same steps as torch_em's `watershed_from_center_and_boundary_distances` (which micro-sam's
`InstanceSegmentationWithDecoder.generate` runs): its Gaussian smoothing is vigra's (kernel radius
3 sigma, mirrored borders: scipy's `mode="mirror"`), its seeds 8-connected components, its
watershed floods 4-connected. Pixels of equal height may go to either neighbouring object there as
here (the order within a level is unspecified in both), so labels agree up to such ties.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage
from skimage.measure import label
from skimage.segmentation import relabel_sequential, watershed

GAUSSIAN_TRUNCATE = 3.0  # vigra's kernel radius, in sigmas


@dataclass(frozen=True)
class WatershedSettings:
    """`InstanceSegmentationWithDecoder.generate`'s parameters, with its defaults."""

    center_distance_threshold: float = 0.5
    boundary_distance_threshold: float = 0.5
    foreground_threshold: float = 0.5
    foreground_smoothing: float = 1.0
    distance_smoothing: float = 1.6
    min_size: int = 0


def gaussian_smoothing(image: np.ndarray, sigma: float) -> np.ndarray:
    """vigra's (bioimage_cpp's) `gaussian_smoothing`: float32, mirrored borders, radius 3 sigma."""
    return ndimage.gaussian_filter(np.asarray(image, np.float32), sigma, mode="mirror", truncate=GAUSSIAN_TRUNCATE)


def size_filter(segmentation: np.ndarray, min_size: int) -> np.ndarray:
    """Objects under `min_size` pixels removed and the rest numbered 1..n, as torch_em's `size_filter`."""
    if min_size == 0:
        return segmentation
    ids, sizes = np.unique(segmentation, return_counts=True)
    segmentation[np.isin(segmentation, ids[sizes < min_size])] = 0
    return relabel_sequential(segmentation, offset=1)[0]


def instance_labels(maps: np.ndarray, settings: WatershedSettings = WatershedSettings()) -> np.ndarray:
    """The label image (uint64 [H, W], 0 background) of the decoder's maps [3, H, W] (foreground,
    center distances, boundary distances)."""
    foreground, center, boundary = maps
    if settings.foreground_smoothing > 0:
        foreground = gaussian_smoothing(foreground, settings.foreground_smoothing)
    if settings.distance_smoothing > 0:
        center = gaussian_smoothing(center, settings.distance_smoothing)
        boundary = gaussian_smoothing(boundary, settings.distance_smoothing)
    inside = foreground > settings.foreground_threshold
    seeds = (center < settings.center_distance_threshold) & (boundary < settings.boundary_distance_threshold) & inside
    markers = label(seeds, connectivity=2).astype(np.uint64)
    segmentation = watershed(boundary, markers=markers, mask=inside, connectivity=1)
    return size_filter(segmentation, settings.min_size)
