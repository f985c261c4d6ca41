"""Find on every plane of a stack: SAM3's instances of a phrase as a `Method` of
`automatic.AutomaticSegmentation`, which runs it plane by plane with its progress bar, stop and
layer of the stack's shape (the Find section's "Find on all planes")."""

from __future__ import annotations

import numpy as np

from ..concepts import ConceptProcessor
from ..concepts.instances import label_image
from ..engines import CancelToken
from .automatic_methods import Advance, Crop, Region, stop_if_cancelled


class ConceptSearch:
    """Every instance of `phrase` scoring above `threshold` on each plane, found by `processor`
    (one of its own: runs here may overlap the Find section's) on the plane's region encoded whole."""

    name, failure_hint = "concepts", ""

    def __init__(self, processor: ConceptProcessor, phrase: str, threshold: float) -> None:
        self.title = f"Find '{phrase}'"
        self.model = processor.engine.spec.model_id
        self.parameters = {"phrase": phrase, "score_threshold": threshold, "weights_id": processor.engine.weights_id}
        self._processor, self._phrase, self._threshold = processor, phrase, threshold

    def steps(self, plane_hw: tuple[int, int], crops: list[Crop]) -> int:
        """The plane's encode (or its features from the cache), then the detector."""
        return 2

    def progress(self, done: int, total: int) -> str:
        return f"{self.title}: {'the plane is encoded, the detector runs' if done < total else 'found'} ..."

    def labels(self, plane, contrast, advance: Advance, cancel: CancelToken, crops: list[Crop], region: Region) -> np.ndarray:
        y0, x0, y1, x1 = region
        processor = self._processor
        state = processor.set_image(np.asarray(plane[y0:y1, x0:x1]), {}, contrast)
        advance(1, 2)
        stop_if_cancelled(cancel, self.title)
        processor.set_confidence_threshold(self._threshold)
        processor.set_text_prompt(self._phrase, state)
        stop_if_cancelled(cancel, self.title)
        advance(2, 2)
        return label_image(state["masks"], state["scores"]).astype(np.uint32)

    def nothing_found(self) -> str:
        return (
            f"Found no instance of '{self._phrase}' scoring above {self._threshold:.2f}, so no layer was added: "
            "lower the Score slider or try another phrase, and run it again."
        )
