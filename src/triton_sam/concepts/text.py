"""Phrases to SAM3's text features with the exported text encoder, each phrase encoded once."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .. import contract
from ..engines.ort_sessions import shared_session
from ..engines.providers import usable_providers
from .tokenizer import VOCAB_FILE, Tokenizer

PHRASES_KEPT = 64  # text features are 32 KB a phrase: a session's phrases all fit


class PhraseEncoder:
    """`encoder(phrase)` -> (features float32 [1, 32, 256], padding mask bool [1, 32]) from the
    text encoder and merges file in `directory` (an export's `concepts` folder)."""

    def __init__(self, directory: Path, providers: Sequence[str] | None = None):
        directory = Path(directory)
        self.tokenizer = Tokenizer(directory / VOCAB_FILE)
        self._session = shared_session(directory / contract.TEXT_ENCODER_FILE, providers or usable_providers())
        self._kept: OrderedDict[str, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self.runs = 0  # text encoder runs (phrases not found among those kept)

    def __call__(self, phrase: str) -> tuple[np.ndarray, np.ndarray]:
        if phrase in self._kept:
            self._kept.move_to_end(phrase)
            return self._kept[phrase]
        tokens = self.tokenizer(phrase)
        (features,) = self._session.run([contract.TEXT_FEATURES], {contract.TEXT_TOKENS: tokens})
        self.runs += 1
        self._kept[phrase] = features, tokens == 0
        if len(self._kept) > PHRASES_KEPT:
            self._kept.popitem(last=False)
        return self._kept[phrase]
