"""`TiledInstanceSegmenter`: micro-sam's `TiledInstanceSegmentationWithDecoder` on a triton-sam predictor.

Tiles and halos are micro-sam's, one to one (`tiles.halo_tiles`): the plane is cut from its top
left into inner tiles of `tile_shape` (h, w), the last of a row or column shorter; each is encoded
grown by `halo` (h, w) on every side within the plane (micro-sam's outer block, at most
`tile_shape + 2 * halo`, resized to the encoder's input as a whole image of its size is); the
decoder's maps of that outer tile, at its size, give the plane its inner tile's part. The watershed
then runs once on the whole plane's maps, as micro-sam's `generate()` does with its default
`tile_shape=None` (its block-wise parallel watershed, `generate(tile_shape=, halo=)`, is not offered).

The plane is read a tile at a time from any array that slices (numpy, dask, zarr), every tile
scaled to uint8 with the same contrast limits, and encoded through a `FeatureCache` (`planes.Plane`):
tiles encoded before, by this segmenter or anything sharing the cache, are not encoded again.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..features import FeatureCache
from ..image import ContrastLimits
from ..planes import Plane, plane_limits
from ..predictor import Predictor
from ..tiled_predictor import TiledPredictor
from ..tiles import halo_tiles
from .segmenter import InstanceSegmenter

DEFAULT_HALO = (64, 64)  # pixels of context on each side of a tile


class TiledInstanceSegmenter(InstanceSegmenter):
    """Use as micro-sam's: `initialize(image, tile_shape=..., halo=...)`, then `generate(...)` (the
    parameters and outputs of `InstanceSegmenter.generate`); `get_state`/`set_state` hold the
    whole plane's maps. Without `tile_shape`, a tile grown by its halo is the encoder's input
    (1024 x 1024 for micro-sam's models: encoded at native resolution), and a plane no larger is
    one tile, segmented as `InstanceSegmenter` segments it.

    `predictor` (a `Predictor` or `TiledPredictor`) names the model and where it runs; it is not
    set to the image (a large plane is no one image: prompts on it go to a `TiledPredictor`).
    `cache` defaults to one of the predictor's engine, so that initializing again encodes nothing.
    For napari, `initialize_steps` yields progress between batches of tiles (a worker can stop it).
    """

    def __init__(self, predictor: Predictor | TiledPredictor, cache: FeatureCache | None = None) -> None:
        super().__init__(predictor, cache if cache is not None else FeatureCache(predictor.engine))

    def initialize(
        self,
        image,
        contrast_limits: ContrastLimits | None = None,
        tile_shape: tuple[int, int] | None = None,
        halo: tuple[int, int] = DEFAULT_HALO,
    ) -> None:
        """Compute the decoder's maps of `image` (H x W or H x W x C) tile by tile (`initialize_steps`)."""
        for _ in self.initialize_steps(image, contrast_limits, tile_shape, halo):
            pass

    def initialize_steps(
        self,
        image,
        contrast_limits: ContrastLimits | None = None,
        tile_shape: tuple[int, int] | None = None,
        halo: tuple[int, int] = DEFAULT_HALO,
    ) -> Iterator[tuple[int, int]]:
        """Encode the tiles not cached yet, `Engine.encode_batch` at a time, decode each batch's
        tiles and put their inner parts together, yielding (tiles done, tiles) after each batch;
        the maps are set once all are done. Non-uint8 planes are scaled with `contrast_limits`
        (default: min and max of a strided sample of the plane)."""
        engine = self.predictor.engine
        size = tuple(image.shape[:2])
        if tile_shape is None:
            tile_shape = (engine.spec.input_size - 2 * halo[0], engine.spec.input_size - 2 * halo[1])
        tiles = halo_tiles(size, tile_shape, halo)
        plane = Plane(image, self.cache, contrast_limits=plane_limits(image, contrast_limits))
        maps = np.empty((3, *size), np.float32)
        for start in range(0, len(tiles), engine.encode_batch):
            batch = tiles[start : start + engine.encode_batch]
            for _ in plane.encode_tiles([outer for outer, _ in batch]):
                pass
            for outer, inner in batch:
                outer_maps = engine.instance_maps(plane.features(outer), outer.shape)
                maps[(slice(None), *inner.window)] = outer_maps[(slice(None), *inner.within(outer))]
            yield start + len(batch), len(tiles)
        self._maps = maps
