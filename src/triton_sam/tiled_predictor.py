"""`TiledPredictor`: the `Predictor` API for planes of any size, at native resolution (see `tiles`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from .engines import CancelToken, Engine, ImageFeatures, create_engine
from .features import FeatureCache
from .image import ContrastLimits
from .planes import Plane
from .predictor import EngineOwner, decode_masks
from .prompts import Prompts
from .registry import DEFAULT_MODEL, get_model
from .tiles import TILE_OVERLAP, Tile, place


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
        self.cache = cache if cache is not None else FeatureCache(self.engine)
        self.overlap = overlap
        self.mask_threshold = mask_threshold
        self._plane: Plane | None = None

    @property
    def original_size(self) -> tuple[int, int] | None:
        """(H, W) of the plane that was set."""
        return None if self._plane is None else self._plane.size

    @property
    def tiles(self) -> list[Tile]:
        """The tiles of the plane that was set (one, the whole plane, unless it is large)."""
        return [] if self._plane is None else self._plane.tiles

    def set_image(self, image, contrast_limits: ContrastLimits | None = None, step: int = 1) -> None:
        """Take the plane (HxW or HxWxC); non-uint8 planes are scaled to uint8 with `contrast_limits`
        (default: min and max of a strided sample of the plane, the same for every tile). `step`:
        see the class docstring."""
        if getattr(image, "ndim", 0) not in (2, 3):
            raise ValueError(f"Expected a plane of shape HxW or HxWxC, got shape {getattr(image, 'shape', None)}.")
        self._plane = Plane(image, self.cache, contrast_limits=contrast_limits, step=step, overlap=self.overlap)

    def reset_predictor(self) -> None:
        self._plane = None

    def tile_features(self, tile: Tile) -> ImageFeatures:
        """The features of one tile (encoded now unless cached)."""
        self._require_image()
        return self._plane.features(tile)

    def encode_tiles(self, tiles: Sequence[Tile] | None = None, on_progress: Callable[[int, int], None] | None = None) -> None:
        """Encode `tiles` (default: all) ahead of prompts, `Engine.encode_batch` at a time, each
        batch read while the one before it is encoded (`image.ReadAhead`); `on_progress(done,
        total)` after each."""
        self._require_image()
        tiles = self.tiles if tiles is None else tiles
        for done, _ in self._plane.encode_tiles(tiles):
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
        prompts = Prompts.of(point_coords, point_labels, box)
        tile = self._plane.tile_for(prompts)
        request = prompts.in_tile(tile).request(self.spec, tile.shape)
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
