"""Exact rewrites of the SAM mask decoder that ONNX Runtime runs faster, applied while exporting.

The two-way transformer's cross-attentions between a few prompt tokens and the 4096 image
positions project every image position through 256x128 matrices and split it into heads, at
every decode. The projections are linear, so they can move to the token side: scores and
outputs then take one image-sized product each and no image-sized transposes. `LayerNorm2d`
reduces over the channels of an NCHW map, which ONNX Runtime does slowly; channels last, it is
one fused `LayerNormalization`. Same functions (SAM1, MobileSAM, SAM2, SAM3 share them), other
rounding (about 1e-6); the decoder's time saved is in BENCHMARKS.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn


def _per_head(linear: nn.Linear, heads: int) -> torch.Tensor:
    """`linear`'s weight [out, in] split by output head: [heads, out / heads, in]."""
    out_features, in_features = linear.weight.shape
    return linear.weight.view(heads, out_features // heads, in_features)


def tokens_to_image(attention: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """`attention(q, k, v)` for few queries [B, Nq, C] and many keys [B, Nk, C].

    Each head's query goes back through the key projection, so the keys are used as they come;
    `q . k_bias` is constant along the softmax and drops out. The weights sum to one, so the
    value projection applies to their weighted sum of values.
    """
    heads = attention.num_heads
    batch, queries, _ = q.shape
    q = attention.q_proj(q)
    head_dim = q.shape[-1] // heads
    q = q.view(batch, queries, heads, head_dim).transpose(1, 2)  # [B, heads, Nq, head_dim]
    q = (q @ _per_head(attention.k_proj, heads)) * head_dim**-0.5  # [B, heads, Nq, C]
    channels = q.shape[-1]
    weights = (q.reshape(batch, heads * queries, channels) @ k.transpose(1, 2)).softmax(-1)
    values = (weights @ v).view(batch, heads, queries, channels)
    out = values @ _per_head(attention.v_proj, heads).transpose(1, 2) + attention.v_proj.bias.view(heads, 1, head_dim)
    return attention.out_proj(out.transpose(1, 2).reshape(batch, queries, heads * head_dim))


def image_to_tokens(attention: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """`attention(q, k, v)` for many queries [B, Nq, C] and few keys [B, Nk, C].

    The query projection folds into the keys (one [C, heads x Nk] matrix) and the output
    projection into the values (one [heads x Nk, C] matrix): two image-sized products in all.
    """
    heads = attention.num_heads
    batch, keys, _ = k.shape
    queries = q.shape[1]
    k = attention.k_proj(k)
    head_dim = k.shape[-1] // heads
    k = k.view(batch, keys, heads, head_dim).permute(0, 2, 3, 1) * head_dim**-0.5  # [B, heads, head_dim, Nk]
    to_scores = _per_head(attention.q_proj, heads).transpose(1, 2) @ k  # [B, heads, C, Nk]
    channels = to_scores.shape[2]
    to_scores = to_scores.permute(0, 2, 1, 3).reshape(batch, channels, heads * keys)
    score_bias = (attention.q_proj.bias.view(heads, 1, head_dim) @ k).reshape(batch, 1, heads * keys)
    scores = (q @ to_scores + score_bias).view(batch, queries, heads, keys)
    weights = scores.softmax(-1).view(batch, queries, heads * keys)
    v = attention.v_proj(v).view(batch, keys, heads, head_dim).transpose(1, 2)  # [B, heads, Nk, head_dim]
    out_weight = attention.out_proj.weight
    values = v @ out_weight.view(out_weight.shape[0], heads, head_dim).permute(1, 2, 0)  # [B, heads, Nk, C]
    return weights @ values.reshape(batch, heads * keys, -1) + attention.out_proj.bias


def channels_last_layer_norm(norm: nn.Module, channels: tuple[int], x: torch.Tensor) -> torch.Tensor:
    """`LayerNorm2d` (over the channels of [B, C, H, W]) as a `layer_norm` over the last axis."""
    return F.layer_norm(x.permute(0, 2, 3, 1), channels, norm.weight, norm.bias, norm.eps).permute(0, 3, 1, 2)


def _rewrites(module: nn.Module) -> Iterator[tuple[nn.Module, partial]]:
    """(submodule, its faster forward) for every two-way transformer and output upscaling in `module`."""
    for sub in module.modules():
        if hasattr(sub, "final_attn_token_to_image"):  # a TwoWayTransformer
            for layer in sub.layers:
                yield layer.cross_attn_token_to_image, partial(tokens_to_image, layer.cross_attn_token_to_image)
                yield layer.cross_attn_image_to_token, partial(image_to_tokens, layer.cross_attn_image_to_token)
            yield sub.final_attn_token_to_image, partial(tokens_to_image, sub.final_attn_token_to_image)
        if hasattr(sub, "output_upscaling"):  # a MaskDecoder
            for norm in sub.output_upscaling:
                if type(norm).__name__ == "LayerNorm2d":
                    yield norm, partial(channels_last_layer_norm, norm, (norm.weight.shape[0],))


@contextmanager
def replaced_forward(module: nn.Module, forward) -> Iterator[None]:
    """Within the block, `module` computes with `forward`."""
    module.forward = forward
    try:
        yield
    finally:
        del module.forward


@contextmanager
def replaced_forwards(rewrites: Iterable[tuple[nn.Module, Callable]]) -> Iterator[None]:
    """Within the block, each (module, forward) of `rewrites` computes with its forward."""
    with ExitStack() as stack:
        for sub, forward in list(rewrites):
            stack.enter_context(replaced_forward(sub, forward))
        yield


def fast_mask_decoder(module: nn.Module):
    """Within the block, every mask decoder inside `module` computes in the faster forms."""
    return replaced_forwards(_rewrites(module))
