"""Segment all with a micro-sam model's instance-segmentation decoder (`InstanceDecoder`), a
`Method` of `automatic.AutomaticSegmentation` beside the point grid.

Each crop (the region segmented, or a large plane's tiles in view, at native resolution) is
encoded through the panel's cache (a plane or tile encoded before is not encoded again) and run
through the decoder where the engine runs (`InstanceSegmenter.initialize`); the crops' maps are
put together over the region, each pixel from the tile it lies deepest in (neighbouring tiles
overlap), and micro-sam's watershed cuts the region's objects at once (`InstanceSegmenter.generate`),
so that an object across tiles stays one.
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from ..engines import CancelToken, Engine
from ..features import FeatureCache
from ..instance import InstanceSegmenter, WatershedSettings
from ..instance.segmenter import MAP_NAMES
from ..predictor import Predictor
from .automatic_methods import Advance, Crop, Region, stop_if_cancelled

CANCELLED = "Segment all with the decoder"
NO_EDGE = np.iinfo(np.int32).max  # the depth of a pixel from a tile's edge on the region's border (no neighbour there)


class InstanceDecoder:
    """micro-sam's automatic instance segmentation ("AIS") with the form's watershed `settings`."""

    title, name = "Segment all", "decoder"
    failure_hint = " Choose 'Point grid' in Segment all to find objects from prompts instead."

    def __init__(self, engine: Engine, cache: FeatureCache, settings: WatershedSettings) -> None:
        self.model, self.parameters = engine.spec.model_id, asdict(settings)
        self._segmenter = InstanceSegmenter(Predictor(self.model, engine=engine), cache)

    def steps(self, plane_hw: tuple[int, int], crops: list[Crop]) -> int:
        """Each crop's maps, then the watershed."""
        return len(crops) + 1

    def progress(self, done: int, total: int) -> str:
        if done < total - 1:
            return f"Segment all: the decoder's maps of {done} of {total - 1} tiles."
        return "Segment all: the decoder's maps are done; the watershed cuts the objects ..."

    def labels(self, plane, contrast, advance: Advance, cancel: CancelToken, crops: list[Crop], region: Region) -> np.ndarray:
        y0, x0, y1, x1 = region
        maps = np.zeros((len(MAP_NAMES), y1 - y0, x1 - x0), np.float32)
        depth = np.full((y1 - y0, x1 - x0), -1, np.int32)  # of each pixel in the tile its maps come from
        total = self.steps(plane.shape[:2], crops)
        for done, crop in enumerate(crops, 1):
            stop_if_cancelled(cancel, CANCELLED)
            cx0, cy0, cx1, cy1 = crop
            self._segmenter.initialize(np.asarray(plane[cy0:cy1, cx0:cx1]), contrast)
            state = self._segmenter.get_state()
            paste(maps, depth, np.stack([state[name] for name in MAP_NAMES]), crop, region)
            advance(done, total)
        stop_if_cancelled(cancel, CANCELLED)
        self._segmenter.set_state(dict(zip(MAP_NAMES, maps, strict=True)))
        labels = self._segmenter.generate(**self.parameters).astype(np.uint32)
        stop_if_cancelled(cancel, CANCELLED)
        advance(total, total)
        return labels

    def nothing_found(self) -> str:
        settings = self.parameters
        return (
            "Segment all found no object, so no layer was added: lower 'Foreground >' (now "
            f"{settings['foreground_threshold']}) or 'Min. size (px)' (now {settings['min_size']}), or raise "
            f"'Center distance <' (now {settings['center_distance_threshold']}) or 'Boundary distance <' (now "
            f"{settings['boundary_distance_threshold']}), and run it again."
        )


def paste(maps: np.ndarray, depth: np.ndarray, crop_maps: np.ndarray, crop: Crop, region: Region) -> None:
    """`crop_maps` ([3, h, w], of `crop`) into the `region`'s `maps` where the crop's pixels lie
    deeper in it (from its edges inside the region) than in the crops pasted before."""
    x0, y0, x1, y1 = crop
    ry0, rx0, ry1, rx1 = region
    rows, columns = _depth(y0, y1, ry0, ry1), _depth(x0, x1, rx0, rx1)
    inside = np.minimum.outer(rows, columns)
    window = (slice(y0 - ry0, y1 - ry0), slice(x0 - rx0, x1 - rx0))
    deeper = inside > depth[window]
    depth[window][deeper] = inside[deeper]
    maps[(slice(None), *window)][:, deeper] = crop_maps[:, deeper]


def _depth(start: int, stop: int, region_start: int, region_stop: int) -> np.ndarray:
    """Each position's distance from the crop's nearest edge along one axis, edges on the region's border aside."""
    positions = np.arange(start, stop, dtype=np.int64)
    after = positions - start if start > region_start else np.full(positions.size, NO_EDGE)
    before = stop - 1 - positions if stop < region_stop else np.full(positions.size, NO_EDGE)
    return np.minimum(after, before).astype(np.int32)
