"""`traceable_attention` computes what `nn.MultiheadAttention` computes, and its trace follows the lengths."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from triton_sam.export.traceable_attention import traceable_attention  # noqa: E402


@pytest.mark.parametrize("by_head", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
def test_attention_matches_torch_with_both_masks(batch_first, by_head):
    torch.manual_seed(0)
    layer = torch.nn.MultiheadAttention(32, 4, batch_first=batch_first).eval()
    query, key = torch.randn(5, 2, 32), torch.randn(7, 2, 32)
    if batch_first:
        query, key = query.transpose(0, 1), key.transpose(0, 1)
    padding = torch.tensor([[False] * 5 + [True] * 2, [False] * 7])
    bias = torch.randn(2 * 4, 5, 7)  # per batch item and head, as sam3's decoder gives its box bias
    with torch.no_grad():
        expected = layer(query, key, key, key_padding_mask=padding, attn_mask=bias, need_weights=False)[0]
        with traceable_attention(layer, [layer] if by_head else []):
            got = layer(query, key, key, key_padding_mask=padding, attn_mask=bias)[0]
    assert torch.allclose(got, expected, atol=1e-5)


def test_a_trace_takes_other_lengths():
    layer = torch.nn.MultiheadAttention(16, 2).eval().requires_grad_(False)  # traced as constants
    with torch.no_grad(), traceable_attention(layer):
        traced = torch.jit.trace(lambda q, k: layer(q, k, k)[0], (torch.randn(3, 1, 16), torch.randn(4, 1, 16)))
        query, key = torch.randn(6, 1, 16), torch.randn(2, 1, 16)
        assert torch.allclose(traced(query, key), layer(query, key, key)[0], atol=1e-6)


@pytest.mark.parametrize("by_head", [False, True])
def test_layers_named_by_head_compute_one_head_at_a_time(by_head):
    """Their graph has one softmax per head (SAM3's fusion encoder: 860 MB of scores at once
    otherwise); other layers' one for all heads."""
    layer = torch.nn.MultiheadAttention(16, 2).eval().requires_grad_(False)
    with torch.no_grad(), traceable_attention(layer, [layer] if by_head else []):
        traced = torch.jit.trace(lambda q, k: layer(q, k, k)[0], (torch.randn(3, 1, 16), torch.randn(4, 1, 16)))
    assert sum(node.kind() == "aten::softmax" for node in traced.graph.nodes()) == (2 if by_head else 1)
