"""SAM3's concept request answered here (`LocalEngine.concepts`) as a Triton server's session model
answers it (`server/models/triton_sam_concepts.py`): the text encoder (a phrase's features kept by
its token ids) and the detector on the image's detector maps, the masks of the queries above the
floor cropped. One request for every engine, so a `FallbackEngine` fallen back to its local engine
goes on answering Find."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .. import contract
from ..server.models.triton_sam_arrays import concept_answer
from .ort_sessions import on_cpu, release_cpu_arena, shared_session

TEXTS_KEPT = 64  # text features are 32 KB a phrase: a session's phrases all fit


class LocalConcepts:
    """The text encoder and the detector of an export's concept graphs (`directory`), on `providers`."""

    def __init__(self, directory: Path, providers: Sequence[str]) -> None:
        self.directory, self.providers = Path(directory), providers
        self._text_encoder = shared_session(self.directory / contract.TEXT_ENCODER_FILE, providers)
        self._texts: dict[tuple[int, ...], np.ndarray] = {}  # token ids -> text features, oldest first
        self.text_runs = 0

    def text_features(self, tokens: np.ndarray) -> np.ndarray:
        """The text encoder's features (float32 [1, 32, 256]) of a phrase's token ids, each phrase run once."""
        key = tuple(tokens.reshape(-1).tolist())
        if key not in self._texts:
            (self._texts[key],) = self._text_encoder.run([contract.TEXT_FEATURES], {contract.TEXT_TOKENS: tokens})
            self.text_runs += 1
            if len(self._texts) > TEXTS_KEPT:
                del self._texts[next(iter(self._texts))]
        return self._texts[key]

    @functools.cached_property
    def _detector(self) -> ort.InferenceSession:
        """The detector's session, opened with the first request (a phrase's features need only the text encoder)."""
        return shared_session(self.directory / contract.DETECTOR_FILE, self.providers)

    def answer(
        self, maps: dict[str, np.ndarray], tokens: np.ndarray, boxes: np.ndarray, labels: np.ndarray, floor: float
    ) -> dict[str, np.ndarray]:
        """`contract.CONCEPT_OUTPUTS` for an image's detector `maps` (`Engine.concepts`' request)."""
        tokens = np.asarray(tokens, np.int64).reshape(1, -1)
        feeds = {name: maps[name] for name in contract.DETECTOR_MAPS}
        feeds.update({contract.TEXT_FEATURES: self.text_features(tokens), contract.TEXT_PADDING: tokens == 0})
        feeds[contract.EXEMPLAR_BOXES] = np.asarray(boxes, np.float32).reshape(1, -1, 4)
        feeds[contract.EXEMPLAR_LABELS] = np.asarray(labels, np.int64).reshape(1, -1)
        # On a CPU the arena's peak (~0.5 GB) is given back: a request is a click, not a mouse move.
        run_options = release_cpu_arena(ort.RunOptions()) if on_cpu(self.providers) else None
        detected = self._detector.run(list(contract.DETECTOR_OUTPUTS), feeds, run_options)
        return dict(zip(contract.CONCEPT_OUTPUTS, concept_answer(*detected, floor)))

    def vocabulary(self) -> bytes:
        """The tokenizer's merges file beside the graphs."""
        return (self.directory / contract.VOCABULARY_FILE).read_bytes()
