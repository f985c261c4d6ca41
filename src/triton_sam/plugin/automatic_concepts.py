"""Find as Segment all runs: SAM3's instances of a phrase as a `Method` of
`automatic.AutomaticSegmentation`, which runs it with its progress bar, stop and layers: on every
plane of a stack (the Find section's "Find on all planes"), and on the tiles in view of a large
plane (joined by `concepts.tiled`)."""

from __future__ import annotations

import numpy as np

from ..concepts import ConceptProcessor
from ..concepts.instances import label_image
from ..concepts.tiled import joined_labels, tile_pieces
from ..engines import CancelToken
from .automatic_methods import Advance, Crop, Region, stop_if_cancelled


class ConceptSearch:
    """Every instance of `phrase` scoring above `threshold` on each plane's region, found by
    `processor` (one of its own: runs here may overlap the Find section's) on the region encoded
    whole, or on a large plane's tiles in view, each at native resolution."""

    name, failure_hint = "concepts", ""

    def __init__(self, processor: ConceptProcessor, phrase: str, threshold: float) -> None:
        self.title = f"Find '{phrase}'"
        self.model = processor.engine.spec.model_id
        self.parameters = {"phrase": phrase, "score_threshold": threshold, "weights_id": processor.engine.weights_id}
        self._processor, self._phrase, self._threshold = processor, phrase, threshold

    def steps(self, plane_hw: tuple[int, int], crops: list[Crop]) -> int:
        """Each crop's encode (or its features from the cache) and detector run."""
        return len(crops)

    def progress(self, done: int, total: int) -> str:
        return f"{self.title}: {done} of {total} tiles searched." if total > 1 else f"{self.title} ..."

    def labels(self, plane, contrast, advance: Advance, cancel: CancelToken, crops: list[Crop], region: Region) -> np.ndarray:
        """The region's instances: of its one crop, or joined over a large plane's tiles (`concepts.tiled`)."""
        pieces = []
        for done, crop in enumerate(crops, 1):
            stop_if_cancelled(cancel, self.title)
            x0, y0, x1, y1 = crop
            state = self._processor.set_image(np.asarray(plane[y0:y1, x0:x1]), {}, contrast)
            self._processor.set_confidence_threshold(self._threshold)
            self._processor.set_text_prompt(self._phrase, state)
            stop_if_cancelled(cancel, self.title)
            if len(crops) == 1:
                advance(done, len(crops))
                return label_image(state["masks"], state["scores"]).astype(np.uint32)
            pieces += tile_pieces(state["masks"], state["scores"], crop, region, done)
            advance(done, len(crops))
        return joined_labels(pieces, region)

    def nothing_found(self) -> str:
        return (
            f"Found no instance of '{self._phrase}' scoring above {self._threshold:.2f}, so no layer was added: "
            "lower the Score slider or try another phrase, and run it again."
        )
