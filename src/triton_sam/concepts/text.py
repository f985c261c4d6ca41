"""Phrases to SAM3's text features with the exported text encoder, each phrase encoded once."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..engines.local_concepts import LocalConcepts
from ..engines.providers import usable_providers
from .tokenizer import VOCAB_FILE, Tokenizer


class PhraseEncoder:
    """`encoder(phrase)` -> (features float32 [1, 32, 256], padding mask bool [1, 32]) from the
    text encoder and merges file in `directory` (an export's `concepts` folder)."""

    def __init__(self, directory: Path, providers: Sequence[str] | None = None):
        directory = Path(directory)
        self.tokenizer = Tokenizer(directory / VOCAB_FILE)
        self._graphs = LocalConcepts(directory, providers or usable_providers())

    @property
    def runs(self) -> int:
        """Text encoder runs (phrases not found among those kept)."""
        return self._graphs.text_runs

    def __call__(self, phrase: str) -> tuple[np.ndarray, np.ndarray]:
        tokens = self.tokenizer(phrase)
        return self._graphs.text_features(tokens), tokens == 0
