"""Decoding an object's prompts on a tile of its plane, and what a commit stores of the result.

Qt-free. `session.InteractiveSession` decodes its hovers and prompts through an `ObjectDecoder`,
which holds only the engine and the mask threshold: it changes no object and takes no lock.
"""

from __future__ import annotations

import numpy as np

from .engines import CancelToken, Engine
from .errors import InvalidInputError
from .objects import Committed, Offset, Preview
from .planes import Plane
from .prompts import Prompts
from .tiles import Tile


def decoding_tile(plane: Plane, prompts: Prompts, encoded_only: bool = False) -> Tile | None:
    """The tile that decodes `prompts` (`encoded_only`: the best of those encoded, for a preview
    that need not wait); None when no such tile holds them all."""
    if not plane.tiled:
        return plane.tiles[0]
    try:
        return plane.tile_for(prompts, encoded_only)
    except InvalidInputError:
        return None


class ObjectDecoder:
    """Decodes prompts with `engine` into low-res logits and masks (the logits above `mask_threshold`)."""

    def __init__(self, engine: Engine, mask_threshold: float = 0.0) -> None:
        self.engine = engine
        self.spec = engine.spec
        self.mask_threshold = mask_threshold

    def low_res(
        self, plane: Plane, tile: Tile, prompts: Prompts, token: CancelToken, mask_input: np.ndarray | None, preview: bool = False
    ):
        """Low-res logits and scores of the first prompt set: a click's three candidates, or a hover
        `preview`'s one mask, the candidate that click would choose (`best_of_multimask`). Both are
        only thresholded or refined, so a server may send just the part around the object (`logits_above`)."""
        features = plane.features(tile)
        options = {"mask_input": mask_input, "logits_above": self.mask_threshold, "best_of_multimask": preview}
        request = prompts.in_tile(tile).request(self.spec, tile.shape, **options)
        result = self.engine.decode(features, request, not preview, token)
        return result.low_res_logits[0], result.scores[0]

    def hover(self, plane: Plane, tile: Tile, prompts: Prompts, token: CancelToken, mask_input: np.ndarray | None) -> Preview:
        """The preview of a hover, `prompts` ending with the cursor: as a click there would be, the
        candidate that click will choose, refining `mask_input` (the object's mask) where given."""
        low_res, scores = self.low_res(plane, tile, prompts, token, mask_input, preview=True)
        mask, xy = self.masks(low_res, tile)[0], prompts.points[-1]
        return Preview(plane.key, mask, float(scores[0]), point=xy, offset=tile.offset, tile=tile, low_res=low_res[0])

    def masks(self, low_res: np.ndarray, tile: Tile) -> np.ndarray:
        """Binary masks at the tile's reduced size (the plane's, unless tiled) from low-res logits [..., h, w]."""
        return self.engine.resizer.masks(low_res, tile.reduced_shape, self.mask_threshold)

    def committed(self, plane: Plane, shown: Preview, prompts: Prompts, candidate: int | None, object_id: int) -> Committed:
        """`shown`, made by `prompts`, as commit stores it under `object_id`: at full resolution
        (`_full_resolution`), with its `provenance` (of a tiled plane, the tile decoded too)."""
        mask, offset = self._full_resolution(shown)
        made_by = self.provenance(prompts, candidate, shown.tile if plane.tiled else None)
        return Committed(plane.key, mask, object_id, made_by, offset)

    def _full_resolution(self, shown: Preview) -> tuple[np.ndarray, Offset]:
        """A preview's mask at full resolution and its offset: as shown, unless its tile is coarse;
        then upsampled from its logits around the object only (see `MaskResizer.object_mask`)."""
        if shown.step == 1:
            return shown.mask, shown.offset
        mask, (y, x) = self.engine.resizer.object_mask(shown.low_res, shown.tile.shape, self.mask_threshold)
        return mask, (shown.offset[0] + y, shown.offset[1] + x)

    def provenance(self, prompts: Prompts, candidate: int | None, tile: Tile | None = None) -> dict:
        """What reproduces an object: its prompts in image pixels (x, y), the candidate chosen
        (None: the single mask SAM picks), the model and its weights, the mask threshold; with a
        `tile` (a tiled plane's), the tile decoded (rows y0, columns x0, y1, x1) and its step."""
        made_by = {
            "points": [list(p) for p in prompts.points],
            "labels": list(prompts.labels),
            "box": list(prompts.box) if prompts.box is not None else None,
            "candidate": candidate,
            "model_id": self.spec.model_id,
            "weights_id": self.engine.weights_id,
            "mask_threshold": self.mask_threshold,
        }
        if tile is not None:
            made_by["tile"] = [tile.y0, tile.x0, tile.y1, tile.x1]
            made_by["tile_step"] = tile.step
        return made_by
