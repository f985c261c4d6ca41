"""Where `ConceptProcessor` runs SAM3's text encoder and detector: where the image's features are,
through the engine's concept request (`Engine.concepts`): a Triton server's session model, or the
local engine on the detector maps it keeps (`LocalEngine(exported, detector_maps=True)`,
`engines.local_concepts`), a `FallbackEngine` on whichever it uses. The phrase is tokenized here."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..engines import Engine, ImageFeatures
from ..errors import InvalidInputError
from .instances import Found, found_answered
from .tokenizer import VOCAB_FILE, Tokenizer


class ConceptDetector:
    """`detector(features, phrase, boxes, labels, floor)`: the engine's answer as a `Found`.

    The phrase is tokenized with the merges file in `concepts_dir` (the export's, or sam3's
    `bpe_simple_vocab_16e6.txt.gz`), else with the engine's (asked for once, with the first
    phrase). Masks come for the queries above the floor: every query's where the features are here
    (nothing travels, and no threshold runs the detector again), above min(threshold,
    `min_threshold`) where they are on a server: a threshold moved down to `min_threshold` filters
    again without a request, one below it asks again.
    """

    def __init__(self, engine: Engine, concepts_dir: Path | None, min_threshold: float) -> None:
        if not engine.answers_concepts:
            why = "keeps no SAM3 detector maps (LocalEngine(exported, detector_maps=True) does) or has no concept graphs"
            raise InvalidInputError(f"{engine.describe()} runs no SAM3 concept requests: it {why}.")
        self.engine, self.min_threshold = engine, min_threshold
        here = None if concepts_dir is None else Path(concepts_dir) / VOCAB_FILE
        self.tokenizer = Tokenizer(here) if here is not None and here.is_file() else None

    def floor(self, threshold: float, features: ImageFeatures) -> float:
        return min(threshold, self.min_threshold) if features.on_server else -np.inf

    def __call__(self, features: ImageFeatures, phrase: str, boxes: np.ndarray, labels: np.ndarray, floor: float) -> Found:
        if self.tokenizer is None:
            self.tokenizer = Tokenizer(self.engine.concepts_vocabulary(features))
        return found_answered(self.engine.concepts(features, self.tokenizer(phrase), boxes, labels, floor), floor)
