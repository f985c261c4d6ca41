"""SAM3's concept path exported to ONNX gives what `sam3` computes, on the same random-init weights.

So far the text encoder: a phrase through our tokenizer and `text_encoder.onnx` (`PhraseEncoder`)
against sam3's `VETextEncoder` (tokenizer included), as `Sam3Processor.set_text_prompt` runs it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import PARITY_SEED, require_export_extra
from triton_sam.concepts import PhraseEncoder

pytestmark = pytest.mark.parity

PHRASES = ["nucleus", "mitotic cell", "a very long description of dividing nuclei next to debris and dust " * 2]


@pytest.fixture(scope="module")
def text_encoders(tmp_path_factory):
    """(sam3's features of each of PHRASES as (mask, features), our export of its text encoder as a
    PhraseEncoder), both with the parity seed's weights: made in a process of its own (~6.7 GB)."""
    require_export_extra()
    pytest.importorskip("sam3")
    directory = tmp_path_factory.mktemp("concepts")
    reference = tmp_path_factory.mktemp("sam3_text") / "features.npz"
    script = Path(__file__).with_name("sam3_text_reference.py")
    done = subprocess.run(
        [sys.executable, str(script), str(PARITY_SEED), str(directory), str(reference), *PHRASES], capture_output=True, text=True
    )
    if done.returncode:
        pytest.fail(f"{script.name} failed:\n{done.stderr[-4000:]}")
    print(done.stdout.strip())
    with np.load(reference) as arrays:
        expected = [(arrays[f"mask{index}"], arrays[f"features{index}"]) for index in range(len(PHRASES))]
    return expected, PhraseEncoder(directory)


def test_text_features_match_sam3(text_encoders):
    official, ours = text_encoders
    for phrase, (mask, expected) in zip(PHRASES, official, strict=True):
        got, got_mask = ours(phrase)
        assert (got_mask == mask).all()
        assert np.abs(got - expected).max() < 1e-4, phrase


def test_each_phrase_is_encoded_once(text_encoders):
    _, ours = text_encoders
    runs = ours.runs
    first = ours("nucleus")[0]
    again = ours("nucleus")[0]
    assert again is first and ours.runs <= runs + 1
