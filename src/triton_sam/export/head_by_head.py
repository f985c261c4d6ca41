"""Global attention computed one head at a time, applied while exporting.

An image encoder's global attention holds a score matrix per head over all its tokens at once:
[heads, N, N] floats, 805 MB for SAM1 ViT-B's 4096 tokens and 1.7 GB for SAM3's 5184 tokens and
16 heads. Head by head, the same products and softmaxes give the same numbers (a batched product
computes each head on its own) from one head's matrix: the encoder's peak memory falls by ~1.5 GB,
and on a CPU, where the arena hands its memory back after each encode, the next encode faults in
that much less (vit_b 1024x1024: 460k -> 66k page faults, 6.8 -> 6.3 s).

Global blocks are those with `window_size == 0` (segment_anything's and SAM3's ViT blocks, SAM2's
Hiera blocks); windowed and prompt-token attentions are small and stay as they are.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from .fast_mask_decoder import replaced_forwards


def _sdpa_by_head(sdpa, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """`sdpa(query, key, value)` on [B, heads, L, E], one head at a time."""
    heads = zip(query.split(1, 1), key.split(1, 1), value.split(1, 1))
    return torch.cat([sdpa(q, k, v) for q, k, v in heads], 1)


def sdpa_attention(attention: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`attention(x)` with its `F.scaled_dot_product_attention` (SAM2's Hiera, SAM3's ViT) one head
    at a time (without masks, as those encoders call it)."""
    sdpa = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = lambda q, k, v: _sdpa_by_head(sdpa, q, k, v)
    try:
        return type(attention).forward(attention, x)
    finally:
        F.scaled_dot_product_attention = sdpa


def vit_attention(attention: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """segment_anything's ViT `Attention.forward` (SAM1, micro-sam) on x [B, H, W, C], one head at
    a time."""
    from segment_anything.modeling.image_encoder import add_decomposed_rel_pos

    batch, height, width, _ = x.shape
    tokens = height * width
    qkv = attention.qkv(x).reshape(batch, tokens, 3, attention.num_heads, -1).permute(2, 0, 3, 1, 4)
    outputs = []
    for q, k, v in zip(*(part.split(1, 1) for part in qkv.unbind(0))):  # each [B, 1, tokens, E]
        q, k, v = (part.flatten(0, 1) for part in (q, k, v))
        scores = (q * attention.scale) @ k.transpose(-2, -1)
        if attention.use_rel_pos:
            size = (height, width)
            scores = add_decomposed_rel_pos(scores, q, attention.rel_pos_h, attention.rel_pos_w, size, size)
        outputs.append((scores.softmax(dim=-1) @ v).view(batch, 1, tokens, -1))
    x = torch.cat(outputs, 1).view(batch, attention.num_heads, height, width, -1)
    return attention.proj(x.permute(0, 2, 3, 1, 4).reshape(batch, height, width, -1))


def _global_attentions(module: nn.Module) -> Iterator[tuple[nn.Module, object]]:
    """(attention, its head-by-head forward) for every global attention block inside `module`."""
    for block in module.modules():
        if getattr(block, "window_size", None) != 0 or not isinstance(getattr(block, "attn", None), nn.Module):
            continue
        attention = block.attn
        segment_anything = type(attention).__module__.startswith("segment_anything.")
        forward = vit_attention if segment_anything else sdpa_attention
        yield attention, lambda x, attention=attention, forward=forward: forward(attention, x)


def head_by_head(module: nn.Module):
    """Within the block, the global attentions inside `module` compute one head at a time."""
    return replaced_forwards(_global_attentions(module))
