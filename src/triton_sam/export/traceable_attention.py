"""`nn.MultiheadAttention` in a form whose trace keeps sequence lengths dynamic.

torch's own forward reshapes by lengths read as Python ints, which a trace freezes: SAM3's detector
then only accepts the number of exemplar boxes it was traced with (its prompt grows with them).
This computes the same (eval mode: no dropout) with shapes that follow the inputs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[L, B, E] -> [B, heads, L, E / heads]."""
    return x.unflatten(-1, (heads, -1)).permute(1, 2, 0, 3)


def attention(
    attention: nn.MultiheadAttention, query, key, value, key_padding_mask=None, need_weights=False, attn_mask=None, **_
):
    """`attention(query, key, value, ...)` as torch computes it in eval mode, `nn.MultiheadAttention.forward`'s
    arguments (no weights asked for: sam3 asks for none); returns (output, None)."""
    if attention.batch_first:
        query, key, value = (x.transpose(0, 1) for x in (query, key, value))
    w_q, w_k, w_v = attention.in_proj_weight.chunk(3)
    b_q, b_k, b_v = attention.in_proj_bias.chunk(3)
    heads = attention.num_heads
    q = _heads(F.linear(query, w_q, b_q), heads)
    k = _heads(F.linear(key, w_k, b_k), heads)
    v = _heads(F.linear(value, w_v, b_v), heads)
    logits = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if attn_mask is not None and attn_mask.dim() == 3:  # [B * heads, L, S]
        attn_mask = attn_mask.unflatten(0, (-1, heads))
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask[:, None, None]
    logits = logits + _masks(key_padding_mask, attn_mask)
    out = (logits.softmax(-1) @ v).permute(2, 0, 1, 3).flatten(2)
    out = attention.out_proj(out)
    return (out.transpose(0, 1) if attention.batch_first else out), None


def _masks(*masks: torch.Tensor | None) -> torch.Tensor | float:
    """The sum of additive masks: bool ones as -inf where True, float ones as they are."""
    total: torch.Tensor | float = 0.0
    for mask in masks:
        if mask is None:
            continue
        if mask.dtype == torch.bool:
            mask = torch.zeros_like(mask, dtype=torch.float32).masked_fill(mask, float("-inf"))
        total = total + mask
    return total


@contextmanager
def traceable_attention(model: nn.Module) -> Iterator[None]:
    """Every `nn.MultiheadAttention` in `model` computes with `attention` while the block runs."""
    layers = [m for m in model.modules() if isinstance(m, nn.MultiheadAttention)]
    for layer in layers:
        layer.forward = lambda *args, layer=layer, **kwargs: attention(layer, *args, **kwargs)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward
