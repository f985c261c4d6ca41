"""`ConceptProcessor`: `sam3`'s `Sam3Processor` API (every instance of a phrase or of exemplar boxes)
on the exported graphs, run locally with ONNX Runtime.

The image is encoded through a `FeatureCache` of an engine that keeps SAM3's detector maps, so the
tracker's point and box prompts on the same image (a `Predictor` given that cache's features)
encode nothing again.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .. import contract
from ..engines import Engine
from ..engines.ort_sessions import shared_session
from ..engines.providers import usable_providers
from ..errors import InvalidInputError
from ..features import FeatureCache
from ..image import ContrastLimits, encoder_input
from .instances import Detections, instances
from .text import PhraseEncoder

NO_PHRASE = "visual"  # what sam3 encodes when only boxes are given


class ConceptProcessor:
    """Set an image, then find every instance of a phrase and/or exemplar boxes.

    Mirrors `sam3.model.sam3_image_processor.Sam3Processor`: each call takes and returns a `state`
    dict whose "masks" (bool [N, 1, H, W]), "masks_logits" (probabilities, float32 [N, 1, H, W]),
    "boxes" (x0, y0, x1, y1 in image pixels, [N, 4]) and "scores" ([N]) are the instances scoring
    above `confidence_threshold`; numpy arrays where sam3 gives tensors. `engine` must keep the
    detector maps (`LocalEngine(exported, detector_maps=True)`); `concepts_dir` holds the text
    encoder and the detector (`contract.CONCEPTS_DIR`).
    """

    def __init__(
        self,
        engine: Engine,
        concepts_dir: str | Path,
        *,
        cache: FeatureCache | None = None,
        confidence_threshold: float = 0.5,
        providers: Sequence[str] | None = None,
    ) -> None:
        if not engine.detector_maps:
            raise InvalidInputError(f"{engine.describe()} does not keep SAM3's detector maps: create it with detector_maps=True.")
        self.engine = engine
        self.cache = cache if cache is not None else FeatureCache(engine)  # an empty one given is falsy
        providers = providers or usable_providers()
        self.phrases = PhraseEncoder(Path(concepts_dir), providers)
        self._detector = shared_session(Path(concepts_dir) / contract.DETECTOR_FILE, providers)
        self.confidence_threshold = confidence_threshold
        self.detector_runs = 0

    def set_image(self, image: np.ndarray, state: dict | None = None, contrast_limits: ContrastLimits | None = None) -> dict:
        """Encode `image` (H x W or H x W x 3; through the cache: once per image) into `state`."""
        state = {} if state is None else state
        state["original_height"], state["original_width"] = image.shape[:2]
        state["features"] = self.cache.features(encoder_input(image, self.engine.spec, contrast_limits))
        return state

    def set_text_prompt(self, prompt: str, state: dict) -> dict:
        """Find the instances of `prompt` (with the exemplar boxes given so far)."""
        self._require_image(state)
        state["prompt"] = prompt
        return self._detect(state)

    def add_geometric_prompt(self, box: Sequence[float], label: bool, state: dict) -> dict:
        """Add an exemplar box (cx, cy, w, h normalised to [0, 1]; `label` True: more like this,
        False: not this) and find the instances again; without a phrase, sam3's "visual"."""
        self._require_image(state)
        state.setdefault("prompt", NO_PHRASE)
        state.setdefault("exemplars", []).append((np.asarray(box, np.float32).reshape(4), bool(label)))
        return self._detect(state)

    def set_confidence_threshold(self, threshold: float, state: dict | None = None) -> dict | None:
        """Keep instances scoring above `threshold` from now on; re-filters the last detection (no new run)."""
        self.confidence_threshold = threshold
        if state is not None and "detections" in state:
            state.update(instances(state["detections"], threshold, (state["original_height"], state["original_width"])))
        return state

    def reset_all_prompts(self, state: dict) -> None:
        """Forget the phrase, the exemplars and the instances found (the image stays set)."""
        for key in ("prompt", "exemplars", "detections", "boxes", "masks", "masks_logits", "scores"):
            state.pop(key, None)

    def _detect(self, state: dict) -> dict:
        """Run the detector on the image's maps, the phrase and the exemplars; keep its raw outputs
        in state["detections"] and the instances above the threshold."""
        text, padding = self.phrases(state["prompt"])
        exemplars = state.get("exemplars", [])
        boxes = np.array([box for box, _ in exemplars], np.float32).reshape(1, -1, 4)
        labels = np.array([[int(label) for _, label in exemplars]], np.int64).reshape(1, -1)
        maps = state["features"].host_arrays()
        feeds = {name: maps[name] for name in contract.DETECTOR_MAPS}
        feeds.update({contract.TEXT_FEATURES: text, contract.TEXT_PADDING: padding})
        feeds.update({contract.EXEMPLAR_BOXES: boxes, contract.EXEMPLAR_LABELS: labels})
        state["detections"] = Detections(*self._detector.run(list(contract.DETECTOR_OUTPUTS), feeds))
        self.detector_runs += 1
        return self.set_confidence_threshold(self.confidence_threshold, state)

    @staticmethod
    def _require_image(state: dict) -> None:
        if "features" not in state:
            raise RuntimeError("An image must be set with .set_image(...) before prompting.")
