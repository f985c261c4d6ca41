"""`traceable_attention` computes what `nn.MultiheadAttention` computes, and its trace follows the lengths."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from triton_sam.export.traceable_attention import traceable_attention  # noqa: E402


@pytest.mark.parametrize("batch_first", [False, True])
def test_attention_matches_torch_with_both_masks(batch_first):
    torch.manual_seed(0)
    layer = torch.nn.MultiheadAttention(32, 4, batch_first=batch_first).eval()
    query, key = torch.randn(5, 2, 32), torch.randn(7, 2, 32)
    if batch_first:
        query, key = query.transpose(0, 1), key.transpose(0, 1)
    padding = torch.tensor([[False] * 5 + [True] * 2, [False] * 7])
    bias = torch.randn(2 * 4, 5, 7)  # per batch item and head, as sam3's decoder gives its box bias
    with torch.no_grad():
        expected = layer(query, key, key, key_padding_mask=padding, attn_mask=bias, need_weights=False)[0]
        with traceable_attention(layer):
            got = layer(query, key, key, key_padding_mask=padding, attn_mask=bias)[0]
    assert torch.allclose(got, expected, atol=1e-5)


def test_a_trace_takes_other_lengths():
    layer = torch.nn.MultiheadAttention(16, 2).eval().requires_grad_(False)  # traced as constants
    with torch.no_grad(), traceable_attention(layer):
        traced = torch.jit.trace(lambda q, k: layer(q, k, k)[0], (torch.randn(3, 1, 16), torch.randn(4, 1, 16)))
        query, key = torch.randn(6, 1, 16), torch.randn(2, 1, 16)
        assert torch.allclose(traced(query, key), layer(query, key, key)[0], atol=1e-6)
