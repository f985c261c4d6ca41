"""`nn.MultiheadAttention` in a form whose trace keeps sequence lengths dynamic.

torch's own forward reshapes by lengths read as Python ints, which a trace freezes: SAM3's detector
then only accepts the number of exemplar boxes it was traced with (its prompt grows with them).
This computes the same (eval mode: no dropout) with shapes that follow the inputs. Layers named
`by_head` compute one head at a time, as `head_by_head` does for image encoders: the same numbers
from one head's score matrix (SAM3's fusion encoder, 5184 image tokens attending to each other:
107 MB instead of 860 MB). Chosen by layer, not from traced shapes (a trace would warn).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[L, B, E] -> [B, heads, L, E / heads]."""
    return x.unflatten(-1, (heads, -1)).permute(1, 2, 0, 3)


def attention(
    attention: nn.MultiheadAttention,
    query,
    key,
    value,
    key_padding_mask=None,
    need_weights=False,
    attn_mask=None,
    *,
    by_head: bool = False,
    **_,
):
    """`attention(query, key, value, ...)` as torch computes it in eval mode, `nn.MultiheadAttention.forward`'s
    arguments (no weights asked for: sam3 asks for none), heads one at a time if `by_head`; returns (output, None)."""
    if attention.batch_first:
        query, key, value = (x.transpose(0, 1) for x in (query, key, value))
    w_q, w_k, w_v = attention.in_proj_weight.chunk(3)
    b_q, b_k, b_v = attention.in_proj_bias.chunk(3)
    heads = attention.num_heads
    q = _heads(F.linear(query, w_q, b_q), heads)
    k = _heads(F.linear(key, w_k, b_k), heads)
    v = _heads(F.linear(value, w_v, b_v), heads)
    if attn_mask is not None and attn_mask.dim() == 3:  # [B * heads, L, S]
        attn_mask = attn_mask.unflatten(0, (-1, heads))
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask[:, None, None]
    mask = _masks(key_padding_mask, attn_mask)
    if not by_head:
        out = _attend(q, k, v, mask)
    else:
        per_head = isinstance(mask, torch.Tensor) and mask.dim() == 4  # [B, 1 or heads, L, S]
        masks = mask.expand(-1, heads, -1, -1).split(1, 1) if per_head else [mask] * heads
        out = torch.cat([_attend(*head, m) for *head, m in zip(q.split(1, 1), k.split(1, 1), v.split(1, 1), masks)], 1)
    out = out.permute(2, 0, 1, 3).flatten(2)
    out = attention.out_proj(out)
    return (out.transpose(0, 1) if attention.batch_first else out), None


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | float) -> torch.Tensor:
    """Scaled dot-product attention of q, k, v [B, heads, L, E] with an additive `mask`."""
    return ((q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5 + mask).softmax(-1)) @ v


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
def traceable_attention(model: nn.Module, by_head: Collection[nn.Module] = ()) -> Iterator[None]:
    """Every `nn.MultiheadAttention` in `model` computes with `attention` while the block runs, those
    in `by_head` one head at a time."""
    layers = [m for m in model.modules() if isinstance(m, nn.MultiheadAttention)]
    for layer in layers:
        split = any(layer is other for other in by_head)
        layer.forward = lambda *args, layer=layer, split=split, **kwargs: attention(layer, *args, by_head=split, **kwargs)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward
