"""`TiledPredictor`: the `Predictor` API for planes of any size, at native resolution (see `tiles`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from .engines import CancelToken, Engine, ImageFeatures, create_engine
from .features import FeatureCache
from .image import ContrastLimits, ReadAhead, encoder_input, read_window
from .predictor import EngineOwner, decode_masks
from .prompts import model_request
from .registry import DEFAULT_MODEL, get_model
from .tiles import (
    TILE_OVERLAP,
    Tile,
    needs_tiling,
    place,
    prompt_corners,
    prompts_in_tile,
    tile_for_prompts,
    tile_grid,
)

LIMITS_SAMPLE_SIDE = 2048  # contrast limits of a non-uint8 plane come from at most ~this^2 pixels


class TiledPredictor(EngineOwner):
    """Predict masks on a large plane from tiles of the model's input size at native resolution.

    `set_image` takes any array that slices (numpy, dask, zarr) and encodes nothing; a tile is
    encoded the first time a prompt needs it (or by `encode_tiles`, e.g. the tiles in view) and its
    features are cached by content. Planes up to `tiles.TILING_FACTOR` x the input size are one
    tile: the whole plane, as `Predictor` does. One prompt set at a time (points, box); all of its
    prompts are decoded with one tile (`tiles.tile_for_prompts`). With `step` > 1 the tiles are
    coarser: each covers `step` x the input size a side, encoded from its crop reduced as a whole
    plane is (for objects larger than a native tile; a crop over `spec.max_read_side` is first
    block-averaged while read, never held whole); masks still come at full resolution.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        backend: str = "local",
        model_repository: str | Path | None = None,
        *,
        engine: Engine | None = None,
        cache: FeatureCache | None = None,
        overlap: int = TILE_OVERLAP,
        mask_threshold: float = 0.0,
        **engine_options,
    ) -> None:
        self.spec = get_model(model)
        self.engine = engine or create_engine(self.spec, backend, model_repository, **engine_options)
        self.cache = cache or FeatureCache(self.engine)
        self.overlap = overlap
        self.mask_threshold = mask_threshold
        self.tiles: list[Tile] = []
        self._plane = None
        self._contrast: ContrastLimits | None = None

    @property
    def original_size(self) -> tuple[int, int] | None:
        """(H, W) of the plane that was set."""
        return None if self._plane is None else tuple(self._plane.shape[:2])

    def set_image(self, image, contrast_limits: ContrastLimits | None = None, step: int = 1) -> None:
        """Take the plane (HxW or HxWxC); non-uint8 planes are scaled to uint8 with `contrast_limits`
        (default: min and max of a strided sample of the plane, the same for every tile). `step`:
        see the class docstring."""
        if getattr(image, "ndim", 0) not in (2, 3):
            raise ValueError(f"Expected a plane of shape HxW or HxWxC, got shape {getattr(image, 'shape', None)}.")
        self._plane, self._contrast = image, plane_limits(image, contrast_limits)
        shape = tuple(image.shape[:2])
        whole = not needs_tiling(shape, self.spec.input_size)
        self.tiles = [Tile(0, 0, *shape)] if whole else tile_grid(shape, self.spec.input_size, self.overlap, step)

    def reset_predictor(self) -> None:
        self._plane, self._contrast, self.tiles = None, None, []

    def tile_features(self, tile: Tile) -> ImageFeatures:
        """The features of one tile (encoded now unless cached)."""
        self._require_image()
        return self.cache.features(self._tile_input(tile))

    def _tile_input(self, tile: Tile) -> np.ndarray:
        window = read_window(self._plane, tile.y0, tile.y1, tile.x0, tile.x1, self.spec.max_read_side)
        return encoder_input(window, self.spec, self._contrast)

    def encode_tiles(self, tiles: Sequence[Tile] | None = None, on_progress: Callable[[int, int], None] | None = None) -> None:
        """Encode `tiles` (default: all) ahead of prompts, `Engine.encode_batch` at a time, each
        batch read while the one before it is encoded (`image.ReadAhead`); `on_progress(done,
        total)` after each."""
        self._require_image()
        tiles = self.tiles if tiles is None else tiles
        done = 0
        with ReadAhead(self._tile_input) as ahead:
            for batch, model_inputs in ahead.in_batches(tiles, self.engine.encode_batch):
                self.cache.features_many(model_inputs)
                done += len(batch)
                if on_progress is not None:
                    on_progress(done, len(tiles))

    def predict_in_tile(
        self,
        point_coords: np.ndarray | None = None,
        point_labels: np.ndarray | None = None,
        box: np.ndarray | None = None,
        multimask_output: bool = True,
        return_logits: bool = False,
        cancel: CancelToken | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Tile]:
        """Masks [C, h, w] of the tile that decodes the prompts (plane coordinates in), with scores,
        low-res logits and that tile: no plane-sized arrays, for planes too large for them."""
        self._require_image()
        tile = tile_for_prompts(self.tiles, prompt_corners(point_coords, box))
        points, tile_box = prompts_in_tile(tile, point_coords, box)
        request = model_request(self.spec, tile.shape, point_coords=points, point_labels=point_labels, box=tile_box)
        features = self.tile_features(tile)
        masks, scores, low_res = decode_masks(
            self.engine, features, request, tile.shape, multimask_output, return_logits, self.mask_threshold, cancel
        )
        return masks[0], scores[0], low_res[0], tile

    def predict(
        self,
        point_coords: np.ndarray | None = None,
        point_labels: np.ndarray | None = None,
        box: np.ndarray | None = None,
        multimask_output: bool = True,
        return_logits: bool = False,
        cancel: CancelToken | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As `Predictor.predict` for one prompt set: masks [C, H, W] on the whole plane (logits
        outside the decoding tile are -inf)."""
        prompts = (point_coords, point_labels, box)
        masks, scores, low_res, tile = self.predict_in_tile(*prompts, multimask_output, return_logits, cancel)
        return place(masks, tile, self.original_size, fill=-np.inf if return_logits else 0), scores, low_res

    def _require_image(self) -> None:
        if self._plane is None:
            raise RuntimeError("A plane must be set with .set_image(...) before mask prediction.")


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
