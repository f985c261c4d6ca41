"""Where `ConceptProcessor` runs SAM3's text encoder and detector: here with ONNX Runtime on the
image's detector maps (`LocalDetector`), or on the Triton server that keeps the image's features
(`ServerDetector`). Both answer a `Found`, so that the post-processing is one."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .. import contract
from ..engines import Engine, ImageFeatures
from ..engines.ort_sessions import shared_session
from ..errors import InvalidInputError
from .instances import Detections, Found, found_answered, found_in
from .text import PhraseEncoder
from .tokenizer import VOCAB_FILE, Tokenizer


class LocalDetector:
    """The graphs in `concepts_dir` run here on the maps of an engine that keeps them
    (`LocalEngine(exported, detector_maps=True)`); every query's mask is kept (it is here already),
    so no threshold runs it again."""

    def __init__(self, engine: Engine, concepts_dir: Path | None, providers: Sequence[str]) -> None:
        if not engine.detector_maps:
            raise InvalidInputError(f"{engine.describe()} does not keep SAM3's detector maps: create it with detector_maps=True.")
        if concepts_dir is None:
            raise InvalidInputError("SAM3's concept graphs run here: give their folder (an export's `locate(...).concepts_dir`).")
        self.phrases = PhraseEncoder(concepts_dir, providers)
        self._detector = shared_session(concepts_dir / contract.DETECTOR_FILE, providers)

    def floor(self, threshold: float) -> float:
        return -np.inf

    def __call__(self, features: ImageFeatures, phrase: str, boxes: np.ndarray, labels: np.ndarray, floor: float) -> Found:
        text, padding = self.phrases(phrase)
        maps = features.host_arrays()
        feeds = {name: maps[name] for name in contract.DETECTOR_MAPS}
        feeds.update({contract.TEXT_FEATURES: text, contract.TEXT_PADDING: padding})
        feeds.update({contract.EXEMPLAR_BOXES: boxes, contract.EXEMPLAR_LABELS: labels})
        return found_in(Detections(*self._detector.run(list(contract.DETECTOR_OUTPUTS), feeds)), floor)


class ServerDetector:
    """The session model's concept request (`Engine.concepts`): the phrase tokenized here with the
    merges file in `concepts_dir` (the export's, or sam3's `bpe_simple_vocab_16e6.txt.gz`), else with
    the server's (asked for once, with the first phrase); masks sent only for queries scoring above
    min(threshold, `min_threshold`): a threshold moved down to `min_threshold` filters again without
    a request, one below it asks again."""

    def __init__(self, engine: Engine, concepts_dir: Path | None, min_threshold: float) -> None:
        self.engine, self.min_threshold = engine, min_threshold
        here = None if concepts_dir is None else concepts_dir / VOCAB_FILE
        self.tokenizer = Tokenizer(here) if here is not None and here.is_file() else None

    def floor(self, threshold: float) -> float:
        return min(threshold, self.min_threshold)

    def __call__(self, features: ImageFeatures, phrase: str, boxes: np.ndarray, labels: np.ndarray, floor: float) -> Found:
        if self.tokenizer is None:
            self.tokenizer = Tokenizer(self.engine.concepts_vocabulary(features))
        return found_answered(self.engine.concepts(features, self.tokenizer(phrase), boxes, labels, floor), floor)


def concept_detector(
    engine: Engine, concepts_dir: Path | None, providers: Sequence[str], min_threshold: float
) -> LocalDetector | ServerDetector:
    """The server's detector where `engine` answers concept requests, else the local one."""
    if engine.answers_concepts:
        return ServerDetector(engine, concepts_dir, min_threshold)
    return LocalDetector(engine, concepts_dir, providers)
