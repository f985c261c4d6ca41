"""Our torch-free tokenizer gives sam3's token ids (its SimpleTokenizer, CLIP's BPE) for any phrase."""

from __future__ import annotations

import pytest

from conftest import require_export_extra
from triton_sam.concepts.tokenizer import CONTEXT_LENGTH, Tokenizer

PHRASES = [
    "nucleus",
    "a  Mitotic   CELL!!",  # whitespace collapsed, lower case, punctuation its own token
    "café &amp; naïve 123",  # HTML entity, accents, digits one by one
    "ÆØÅ 日本語 🙂",  # bytes outside CLIP's printable set
    "it's the cell's",
    "",
    "dividing nuclei, not debris " * 5,  # longer than the context: truncated, end token kept last
]


def test_token_ids_match_sam3():
    require_export_extra()
    pytest.importorskip("sam3")
    from sam3.model.tokenizer_ve import SimpleTokenizer

    from triton_sam.export.sam3_concepts_onnx import vocab_file

    official, ours = SimpleTokenizer(vocab_file()), Tokenizer(vocab_file())
    for phrase in PHRASES:
        expected = official([phrase], context_length=CONTEXT_LENGTH).numpy()
        assert (ours(phrase) == expected).all(), phrase
