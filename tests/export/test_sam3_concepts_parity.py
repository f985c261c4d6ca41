"""SAM3's concept path exported to ONNX gives what `sam3` computes, on the same random-init weights.

So far the text encoder: a phrase through our tokenizer and `text_encoder.onnx` (`PhraseEncoder`)
against sam3's `VETextEncoder` (tokenizer included), as `Sam3Processor.set_text_prompt` runs it.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from conftest import PARITY_SEED, release_memory, require_export_extra
from triton_sam.concepts import PhraseEncoder

pytestmark = pytest.mark.parity

PHRASES = ["nucleus", "mitotic cell", "a very long description of dividing nuclei next to debris and dust " * 2]


@pytest.fixture(scope="module")
def text_encoders(tmp_path_factory):
    """(sam3's text encoder with the parity seed's weights, our export of it as a PhraseEncoder)."""
    require_export_extra()
    pytest.importorskip("sam3")
    from triton_sam.export.sam3_concepts_onnx import build_text_encoder, export_text_encoder

    official = build_text_encoder(PARITY_SEED)
    directory = tmp_path_factory.mktemp("concepts")
    start = time.perf_counter()
    written = export_text_encoder(official, directory)
    sizes = ", ".join(f"{path.name} {path.stat().st_size / 2**20:.0f} MiB" for path in written)
    print(f"text encoder export: {time.perf_counter() - start:.1f} s ({sizes})")
    yield official, PhraseEncoder(directory)
    del official
    release_memory()


def test_text_features_match_sam3(text_encoders):
    import torch

    official, ours = text_encoders
    for phrase in PHRASES:
        with torch.no_grad():
            mask, features, _ = official([phrase], device="cpu")  # sequence first, as sam3 keeps them
        expected = features.transpose(0, 1).numpy()
        got, got_mask = ours(phrase)
        assert (got_mask == mask.numpy()).all()
        assert np.abs(got - expected).max() < 1e-4, phrase


def test_each_phrase_is_encoded_once(text_encoders):
    _, ours = text_encoders
    runs = ours.runs
    first = ours("nucleus")[0]
    again = ours("nucleus")[0]
    assert again is first and ours.runs <= runs + 1
