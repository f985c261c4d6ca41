"""`ConceptProcessor`: `sam3`'s `Sam3Processor` API (every instance of a phrase or of exemplar boxes)
on the exported graphs, run where the image's features are: locally with ONNX Runtime or by a
Triton server's session model (`concepts.detectors`).

The image is encoded through a `FeatureCache` of an engine that keeps SAM3's detector maps (or of
a Triton engine: its server keeps them), so the tracker's point and box prompts on the same image
(a `Predictor` given that cache's features) encode nothing again.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..engines import Engine
from ..features import FeatureCache
from ..image import ContrastLimits, encoder_input
from .detectors import ConceptDetector
from .instances import instances

NO_PHRASE = "visual"  # what sam3 encodes when only boxes are given
# The lowest threshold a Triton server's answer serves without asking again (its masks are sent for
# queries scoring above min(threshold, this)): Find's slider rarely goes lower, and a trained SAM3
# scores most of its 200 queries far below it, so few masks travel.
MIN_THRESHOLD = 0.1


class ConceptProcessor:
    """Set an image, then find every instance of a phrase and/or exemplar boxes.

    Mirrors `sam3.model.sam3_image_processor.Sam3Processor`: each call takes and returns a `state`
    dict whose "masks" (bool [N, 1, H, W]), "masks_logits" (probabilities, float32 [N, 1, H, W]),
    "boxes" (x0, y0, x1, y1 in image pixels, [N, 4]) and "scores" ([N]) are the instances scoring
    above `confidence_threshold`; numpy arrays where sam3 gives tensors. `engine` answers concept
    requests: a Triton engine (its server runs the detector), a local one keeping the detector maps
    (`LocalEngine(exported, detector_maps=True)`, its export's concept graphs), or a `FallbackEngine`
    of those. `concepts_dir` (`contract.CONCEPTS_DIR`, optional) gives the tokenizer's merges file;
    without it the engine's is used. `min_threshold`: see MIN_THRESHOLD.
    """

    def __init__(
        self,
        engine: Engine,
        concepts_dir: str | Path | None = None,
        *,
        cache: FeatureCache | None = None,
        confidence_threshold: float = 0.5,
        min_threshold: float = MIN_THRESHOLD,
    ) -> None:
        concepts_dir = None if concepts_dir is None else Path(concepts_dir)
        self.detector = ConceptDetector(engine, concepts_dir, min_threshold)
        self.engine = engine
        self.cache = cache if cache is not None else FeatureCache(engine)  # an empty one given is falsy
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
        """Keep instances scoring above `threshold` from now on; re-filters the last detection (no new
        run unless `threshold` is below the floor its masks were kept above: a Triton server's)."""
        self.confidence_threshold = threshold
        if state is not None and "detections" in state:
            if threshold < state["detections"].floor:
                return self._detect(state)
            state.update(instances(state["detections"], threshold, (state["original_height"], state["original_width"])))
        return state

    def reset_all_prompts(self, state: dict) -> None:
        """Forget the phrase, the exemplars and the instances found (the image stays set)."""
        for key in ("prompt", "exemplars", "detections", "boxes", "masks", "masks_logits", "scores"):
            state.pop(key, None)

    def _detect(self, state: dict) -> dict:
        """Run the detector on the image's maps, the phrase and the exemplars; keep its outputs (a
        `Found`) in state["detections"] and the instances above the threshold."""
        exemplars = state.get("exemplars", [])
        boxes = np.array([box for box, _ in exemplars], np.float32).reshape(1, -1, 4)
        labels = np.array([[int(label) for _, label in exemplars]], np.int64).reshape(1, -1)
        floor = self.detector.floor(self.confidence_threshold, state["features"])
        state["detections"] = self.detector(state["features"], state["prompt"], boxes, labels, floor)
        self.detector_runs += 1
        return self.set_confidence_threshold(self.confidence_threshold, state)

    @staticmethod
    def _require_image(state: dict) -> None:
        if "features" not in state:
            raise RuntimeError("An image must be set with .set_image(...) before prompting.")
