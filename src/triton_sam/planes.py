"""One image plane as the encoder sees it: its tiles, read, encoded and cached, and the tile that
decodes a set of prompts.

Qt-free. Both the interactive session (a stack of planes, one shown at a time) and `TiledPredictor`
(the Python API) hold a plane this way, so that a plane is read, encoded and decoded alike in both:
a plane of at most `tiles.TILING_FACTOR` x the model's input is one tile, the whole plane, as
`Predictor` encodes it; a larger one is covered by a grid of tiles (`tiles.tile_grid`), read one
window at a time from any array that slices (numpy, dask, zarr), never whole, coarse tiles from a
pyramid level where one is given. Every tile is scaled to uint8 with the same contrast limits (those
given, else those of a strided sample of the plane), so that a dim object is as dim in each tile.
A tile's features live in the `FeatureCache`, keyed by content; the plane remembers each tile's key
so that it knows, without reading the tile again, whether the tile is encoded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from itertools import islice

import numpy as np

from .engines import ImageFeatures
from .errors import InvalidInputError
from .features import FeatureCache
from .image import ContrastLimits, ReadAhead, encoder_input, read_window
from .prompts import Point, Prompts
from .tiles import TILE_OVERLAP, Tile, needs_tiling, tile_for_prompts, tile_grid

LIMITS_SAMPLE_SIDE = 2048  # contrast limits of a non-uint8 plane come from at most ~this^2 pixels


class Plane:
    """A plane (H x W or H x W x C) covered by `tiles`, encoded through `cache` (and its engine).

    `levels`: the plane reduced by integer factors > 1 (a pyramid), for coarse tiles; `step`: the
    tiles' (1: native resolution; see `tiles.tile_grid`); `key`: what the caller calls the plane.
    """

    def __init__(
        self,
        image,
        cache: FeatureCache,
        *,
        contrast_limits: ContrastLimits | None = None,
        levels: Mapping[int, object] | None = None,
        step: int = 1,
        overlap: int = TILE_OVERLAP,
        key: Hashable = None,
    ) -> None:
        self.image, self.cache, self.key = image, cache, key
        self.spec = cache.engine.spec
        self.size: tuple[int, int] = tuple(image.shape[:2])
        self.tiled = needs_tiling(self.size, self.spec.input_size)
        self.levels = dict(levels or {})
        self.overlap = overlap
        # A whole plane is scaled with its own limits when none are given, as `Predictor` scales it
        # (the same as those of a sample: a whole plane is within `LIMITS_SAMPLE_SIDE`).
        self.contrast = plane_limits(image, contrast_limits) if self.tiled else contrast_limits
        self.tiles: list[Tile] = self._grid(step)
        self.signatures: dict[Tile, str] = {}  # tiles encoded: their features' keys in the cache (which is bounded)
        self.held: dict[Tile, ImageFeatures] = {}  # features kept while the plane lives (`hold`)

    def _grid(self, step: int) -> list[Tile]:
        return tile_grid(self.size, self.spec.input_size, self.overlap, step) if self.tiled else [Tile(0, 0, *self.size)]

    def retile(self, step: int) -> bool:
        """Cover a tiled plane with the tiles of `step`; False when they are those already."""
        if not self.tiled or self.tiles[0].step == step:
            return False
        self.tiles = self._grid(step)
        return True

    @property
    def content(self) -> Hashable:
        """What the encoder sees of the plane, to tell whether logits decoded from it still apply:
        a whole plane's signature (once encoded), a tiled plane's contrast limits."""
        return self.contrast if self.tiled else self.signatures.get(self.tiles[0])

    def holds(self, xy: Point) -> bool:
        """Whether the point (x, y) lies on the plane (x 0..W, y 0..H, as `Prompts.check_inside`)."""
        height, width = self.size
        return 0 <= xy[0] <= width and 0 <= xy[1] <= height

    # --- reading and encoding -------------------------------------------------------------------

    def read(self, tile: Tile) -> np.ndarray:
        """The plane's pixels under `tile`, from the coarsest pyramid level whose factor divides the
        tile's step (full resolution when none does); the encoder's own resize reduces the rest, as
        it reduces a plane encoded whole, after windows over `spec.max_read_side` are reduced while read."""
        factor = max((f for f in self.levels if tile.step % f == 0), default=1)
        level = self.image if factor == 1 else self.levels[factor]
        y0, y1, x0, x1 = tile.y0 // factor, -(-tile.y1 // factor), tile.x0 // factor, -(-tile.x1 // factor)
        return read_window(level, y0, y1, x0, x1, self.spec.max_read_side)

    def encoder_input(self, tile: Tile) -> np.ndarray:
        """What the encoder gets for `tile`, read from the plane."""
        return encoder_input(self.read(tile), self.spec, self.contrast)

    def encoded(self, tile: Tile) -> bool:
        """Whether `tile` is encoded and its features still held or cached."""
        return tile in self.held or (tile in self.signatures and self.signatures[tile] in self.cache)

    def features(self, tile: Tile) -> ImageFeatures:
        """`tile`'s features: held, cached, or encoded now (if evicted or new)."""
        features = self.held.get(tile)
        if features is None and tile in self.signatures:
            features = self.cache.get(self.signatures[tile])
        if features is None:
            encoder_input = self.encoder_input(tile)
            key = self.cache.signature(encoder_input)
            features = self.cache.features(encoder_input, key)
            self.signatures[tile] = key
        return features

    def hold(self) -> ImageFeatures:
        """Encode the first tile (of a plane not tiled: the whole plane) now, and keep its features
        while the plane lives, not only in the cache."""
        tile = self.tiles[0]
        self.held[tile] = self.features(tile)
        return self.held[tile]

    def encode(self, tiles: Sequence[Tile], encoder_inputs: Sequence[np.ndarray]) -> None:
        """Encode `tiles` (read as `encoder_inputs`) into the cache, together where the engine can."""
        keys = [self.cache.signature(encoder_input) for encoder_input in encoder_inputs]
        self.cache.features_many(encoder_inputs, keys)
        self.signatures.update(zip(tiles, keys))

    def encode_tiles(
        self,
        tiles: Sequence[Tile],
        ready: Callable[[], bool] = lambda: True,
        waiting: Callable[[], Point | None] = lambda: None,
    ) -> Iterator[tuple[int, list[Tile]]]:
        """Encode `tiles` in order, skipping those encoded, `Engine.encode_batch` at a time, each
        batch read while the one before it is encoded (`image.ReadAhead`). Before each batch,
        `ready()` says whether to go on (False: stop); a tile that holds the point `waiting()` (a
        cursor waiting for its preview) goes first, alone. Yields after each batch how many of
        `tiles` are done and the tiles encoded now."""
        done, remaining = 0, list(tiles)
        batch_size = self.cache.engine.encode_batch
        with ReadAhead(self.encoder_input) as ahead:
            while remaining and ready():
                batch = self._next_tiles(remaining, waiting(), batch_size)
                for tile in batch:
                    remaining.remove(tile)
                new = [tile for tile in batch if not self.encoded(tile)]
                if new:
                    for tile in islice(self._not_encoded(remaining), batch_size):
                        ahead.start(tile)  # the next batch
                    self.encode(new, [ahead.take(tile) for tile in new])
                done += len(batch)
                yield done, new

    def _next_tiles(self, remaining: list[Tile], waiting: Point | None, batch_size: int) -> list[Tile]:
        """The tile of `remaining` that holds `waiting` best, alone; else the first of `remaining`,
        alone if it is encoded (skipped), else with the next ones not encoded yet, up to `batch_size`."""
        if waiting is not None:
            at = np.array([waiting])
            holding = [t for t in remaining if t.holds(at)]
            if holding:
                return [max(holding, key=lambda t: t.margin(at))]
        if self.encoded(remaining[0]):
            return remaining[:1]
        return [remaining[0], *islice(self._not_encoded(remaining[1:]), batch_size - 1)]

    def _not_encoded(self, tiles: list[Tile]) -> Iterator[Tile]:
        return (tile for tile in tiles if not self.encoded(tile))

    # --- prompts --------------------------------------------------------------------------------

    def tile_for(self, prompts: Prompts, encoded_only: bool = False) -> Tile | None:
        """The tile that decodes `prompts` (plane pixels): of those that hold them all, the one that
        holds them farthest from its edges (`tiles.tile_for_prompts`). Prompts off the plane, or
        that no tile holds, are refused (InvalidInputError) with a message that says so.
        `encoded_only`: the best of the tiles encoded (a preview that need not wait), None if none is."""
        prompts.check_inside(self.size)
        corners = prompts.corners()
        best = tile_for_prompts(self.tiles, corners)
        if not encoded_only or self.encoded(best):
            return best
        encoded = [tile for tile in self.tiles if tile in self.signatures and self.encoded(tile)]
        try:
            return tile_for_prompts(encoded, corners) if encoded else None
        except InvalidInputError:
            return None


def cache_plane(
    image,
    cache: FeatureCache,
    tiles: Sequence[Tile] = (),
    *,
    contrast_limits: ContrastLimits | None = None,
    levels: Mapping[int, object] | None = None,
    ready: Callable[[], bool] = lambda: True,
) -> None:
    """Encode a plane into `cache` without holding it (a neighbouring plane): the whole plane, or,
    of a tiled one, `tiles`, a batch at a time while `ready()` says to go on (`Plane.encode_tiles`)."""
    plane = Plane(image, cache, contrast_limits=contrast_limits, levels=levels)
    if not plane.tiled:
        plane.features(plane.tiles[0])
        return
    for _ in plane.encode_tiles(tiles, ready):
        pass


def cache_planes(
    planes: Sequence[tuple[object, Mapping[int, object] | None]],
    cache: FeatureCache,
    tiles: Sequence[Tile] = (),
    *,
    contrast_limits: ContrastLimits | None = None,
    stopped: Callable[[], bool] = lambda: False,
) -> Iterator[int]:
    """`cache_plane` each of `planes` (image, pyramid levels; e.g. every plane of a stack), yielding
    how many are done after each plane, until `stopped()` says so. Planes encoded whole go to the
    engine `Engine.encode_batch` at a time (a GPU server encodes them together), each batch read
    while the one before it is encoded (`image.ReadAhead`), as tiles are."""
    engine = cache.engine

    def tiled(image) -> bool:
        return needs_tiling(tuple(image.shape[:2]), engine.spec.input_size)

    def read(number: int):
        image = planes[number][0]
        return image if tiled(image) else np.asarray(image)  # tiles: read as encoded

    whole = not any(tiled(image) for image, _ in planes)
    with ReadAhead(read) as ahead:
        for numbers, images in ahead.in_batches(range(len(planes)), engine.encode_batch if whole else 1):
            if stopped():
                return
            if whole:
                cache.features_many([encoder_input(image, engine.spec, contrast_limits) for image in images])
            else:
                levels = planes[numbers[0]][1]
                cache_plane(images[0], cache, tiles, contrast_limits=contrast_limits, levels=levels, ready=lambda: not stopped())
            yield from (number + 1 for number in numbers)  # one per plane: napari's progress counts yields


def plane_limits(image, contrast_limits: ContrastLimits | None) -> ContrastLimits | None:
    """The contrast limits every tile of `image` is scaled with: those given, else (not uint8)
    those of a strided sample."""
    if contrast_limits is None and np.dtype(image.dtype) not in (np.uint8, np.bool_):
        return sampled_limits(image)
    return contrast_limits


def sampled_limits(image) -> tuple[float, float]:
    """Min and max of every n-th pixel of a plane (n so that about `LIMITS_SAMPLE_SIDE`^2 are read)."""
    step = max(1, math.ceil(max(image.shape[:2]) / LIMITS_SAMPLE_SIDE))
    sample = np.asarray(image[::step, ::step])
    return float(sample.min()), float(sample.max())
