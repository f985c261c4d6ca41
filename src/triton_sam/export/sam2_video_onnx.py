"""Export SAM2.1's video path to ONNX so that `video.VolumePredictor` reproduces `SAM2VideoPredictor`.

Four graphs, written next to the session model (`<model>_session/1/video/`):
- memory attention: a plane's features conditioned on the memory bank (mask memories and
  object pointers), as `SAM2Base._prepare_memory_conditioned_features` fuses them;
- memory encoder: a plane's features and its predicted mask -> a mask memory, as
  `SAM2Base._encode_new_memory` makes it;
- tracking decoder: the image decoder plus the object pointer of each output token, so the client
  picks the mask and its pointer as `SAM2Base._forward_sam_heads` does;
- mask prompt: a user's mask made into the object's low-res logits and the decoder's mask prompt.
Which memories and pointers a plane attends to (frame selection, temporal positions) is the
client's bookkeeping, in numpy; the graphs take them as inputs. Features go in as the encoder
makes them minus `no_mem_embed` (the raw backbone features the video predictor works on).
Needs the `export` extra (torch, sam2).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .. import contract
from ..registry import ModelSpec
from ..server.models.triton_sam_video import (
    CONSTANTS_FILE,
    MASK_PROMPT_FILE,
    MEMORY_ATTENTION_FILE,
    MEMORY_ENCODER_FILE,
    SETTINGS_FILE,
    TRACKING_DECODER_FILE,
)
from .onnx_file import export_decoder_module, export_onnx
from .resize import antialiased_resize
from .sam2_onnx import Decoder

# The official video predictor's settings the client follows (`SAM2VideoPredictor` and the
# post-processing overrides `build_sam2_video_predictor` applies).
_SETTINGS = (
    "image_size",
    "num_maskmem",
    "memory_temporal_stride_for_eval",
    "max_cond_frames_in_attn",
    "max_obj_ptrs_in_encoder",
    "only_obj_ptrs_in_the_past_for_eval",
    "use_signed_tpos_enc_to_obj_ptrs",
    "multimask_output_in_sam",
    "multimask_output_for_tracking",
    "multimask_min_pt_num",
    "multimask_max_pt_num",
    "binarize_mask_from_pts_for_mem_enc",
    "use_mask_input_as_output_without_sam",
    "fill_hole_area",
    "non_overlap_masks",
    "clear_non_cond_mem_around_input",
    "add_all_frames_to_correct_as_cond",
)


def build_video_model(model: nn.Module, spec: ModelSpec) -> nn.Module:
    """The official `SAM2VideoPredictor` of `spec` holding `model`'s weights."""
    from sam2.build_sam import build_sam2_video_predictor

    video = build_sam2_video_predictor(spec.config, ckpt_path=None, device="cpu", mode="eval")
    video.load_state_dict(model.state_dict())
    return video


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """SAM2's rotary encoding (`apply_rotary_enc`) in real arithmetic: ONNX has no complex numbers.
    x [..., N, D] with (even, odd) channel pairs as complex numbers; cos/sin [N, D/2]."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    real, imag = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1)
    return rotated.flatten(-2)


def _rope_attention(attn: nn.Module, q, k_rotated, k_plain, v, cos, sin) -> torch.Tensor:
    """`RoPEAttention.forward` with keys in two parts: `k_rotated` [1, T*N, C] get the rotary
    encoding repeated per block of N tokens (`rope_k_repeat`); `k_plain` (object pointers) none."""
    heads = attn.num_heads
    q = _rotate(attn._separate_heads(attn.q_proj(q), heads), cos, sin)
    spatial = attn._separate_heads(attn.k_proj(k_rotated), heads)
    blocks = spatial.reshape(spatial.shape[0], heads, -1, cos.shape[0], spatial.shape[-1])
    spatial = _rotate(blocks, cos, sin).flatten(2, 3)
    if k_plain is None:
        keys = spatial
    else:  # split into heads without a -1 in the shape: there may be no pointers
        plain = attn.k_proj(k_plain)
        plain = plain.reshape(1, plain.shape[1], heads, attn.internal_dim // heads).transpose(1, 2)
        keys = torch.cat((spatial, plain), dim=2)
    out = F.scaled_dot_product_attention(q, keys, attn._separate_heads(attn.v_proj(v), heads))
    return attn.out_proj(attn._recombine_heads(out))


def _axial_cos_sin(attn: nn.Module, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = attn.compute_cis(end_x=side, end_y=side)
    return freqs.real.contiguous(), freqs.imag.contiguous()


class MemoryAttention(nn.Module):
    """pix_feat [1, C, H, W] (raw features), memory [T, M, H, W] (mask memories), memory_tpos
    int64 [T] (index into `maskmem_tpos_enc`), obj_ptrs [P, C], obj_ptr_tpos float [P] (signed
    distance / max distance) -> pix_feat_with_mem [1, C, H, W]."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.attention = model.memory_attention
        self.tpos_enc = model.maskmem_tpos_enc  # [num_maskmem, 1, 1, M]
        self.obj_ptr_tpos_proj = model.obj_ptr_tpos_proj
        self.hidden_dim, self.mem_dim = model.hidden_dim, model.mem_dim
        side = model.sam_image_embedding_size
        with torch.no_grad():
            backbone = model.forward_image(torch.zeros(1, 3, model.image_size, model.image_size))
            curr_pos = backbone["vision_pos_enc"][-1]  # depends on the size only
            mem_pos = model.memory_encoder.position_encoding(torch.zeros(1, self.mem_dim, side, side))
        self.register_buffer("curr_pos", curr_pos.flatten(2).transpose(1, 2))  # [1, HW, C]
        self.register_buffer("mem_pos", mem_pos.flatten(2).transpose(1, 2))  # [1, HW, M]
        layer = self.attention.layers[0]
        for name, attn in (("self", layer.self_attn), ("cross", layer.cross_attn_image)):
            cos, sin = _axial_cos_sin(attn, side)
            self.register_buffer(f"{name}_cos", cos)
            self.register_buffer(f"{name}_sin", sin)

    def forward(self, pix_feat, memory, memory_tpos, obj_ptrs, obj_ptr_tpos) -> torch.Tensor:
        batch, channels, height, width = pix_feat.shape
        curr = pix_feat.flatten(2).transpose(1, 2)
        tokens = memory.flatten(2).transpose(1, 2)  # [T, HW, M]
        tokens_pos = self.mem_pos + self.tpos_enc[memory_tpos].reshape(-1, 1, self.mem_dim)
        spatial, spatial_pos = tokens.reshape(1, -1, self.mem_dim), tokens_pos.reshape(1, -1, self.mem_dim)
        split = self.hidden_dim // self.mem_dim  # a pointer becomes `split` tokens
        ptr_pos = self.obj_ptr_tpos_proj(_sine_embedding(obj_ptr_tpos, self.hidden_dim))
        ptrs = obj_ptrs.reshape(1, -1, self.mem_dim)
        ptrs_pos = ptr_pos.repeat_interleave(split, dim=0).reshape(1, -1, self.mem_dim)
        values = torch.cat((spatial, ptrs), dim=1)

        x = curr + 0.1 * self.curr_pos if self.attention.pos_enc_at_input else curr
        for layer in self.attention.layers:
            x = x + self._self_attention(layer, x)
            normed = layer.norm2(x)
            query = normed + self.curr_pos if layer.pos_enc_at_cross_attn_queries else normed
            with_pos = layer.pos_enc_at_cross_attn_keys
            x = x + _rope_attention(
                layer.cross_attn_image,
                query,
                spatial + spatial_pos if with_pos else spatial,
                ptrs + ptrs_pos if with_pos else ptrs,
                values,
                self.cross_cos,
                self.cross_sin,
            )
            x = x + layer.linear2(layer.activation(layer.linear1(layer.norm3(x))))
        x = self.attention.norm(x)
        return x.transpose(1, 2).reshape(batch, channels, height, width)

    def _self_attention(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        normed = layer.norm1(x)
        qk = normed + self.curr_pos if layer.pos_enc_at_attn else normed
        return _rope_attention(layer.self_attn, qk, qk, None, normed, self.self_cos, self.self_sin)


def _sine_embedding(positions: torch.Tensor, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """`sam2_utils.get_1d_sine_pe`: [P] -> [P, dim]."""
    half = dim // 2
    exponents = 2 * (torch.arange(half, dtype=torch.float32) // 2) / half
    angles = positions.unsqueeze(-1) / temperature**exponents
    return torch.cat((angles.sin(), angles.cos()), dim=-1)


class MemoryEncoder(nn.Module):
    """pix_feat [1, C, H, W] (raw features), mask_logits [1, 1, 256, 256] (low-res), object_score_logits
    [1, 1], binarize [1] (1.0: the mask came from clicks; memory of its thresholded mask) ->
    maskmem_features [1, M, H, W]."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.memory_encoder = model.memory_encoder
        self.image_size = model.image_size
        self.scale, self.bias = model.sigmoid_scale_for_mem_enc, model.sigmoid_bias_for_mem_enc
        self.no_obj_embed_spatial = model.no_obj_embed_spatial  # [1, M] or None

    def forward(self, pix_feat, mask_logits, object_score_logits, binarize) -> torch.Tensor:
        size = (self.image_size, self.image_size)
        high_res = F.interpolate(mask_logits, size=size, mode="bilinear", align_corners=False)
        mask = torch.where(binarize.reshape(1, 1, 1, 1) > 0.5, (high_res > 0).float(), torch.sigmoid(high_res))
        mask = mask * self.scale + self.bias
        features = self.memory_encoder(pix_feat, mask, skip_mask_sigmoid=True)["vision_features"]
        if self.no_obj_embed_spatial is not None:
            absent = 1.0 - (object_score_logits > 0).float()
            features = features + absent[..., None, None] * self.no_obj_embed_spatial[..., None, None]
        return features


class MaskPrompt(nn.Module):
    """mask [1, 1, H, W] (0/1, any size) -> low_res_logits [1, 1, 256, 256] (the mask taken as the
    object's mask), mask_prompt [1, 1, 256, 256] (the decoder's dense prompt, for the object
    pointer) and object_score_logits [1, 1] (+10 present, -10 empty), as
    `SAM2VideoPredictor.add_new_mask` and `SAM2Base._use_mask_as_output` make them."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.mask_downsample = model.mask_downsample
        self.image_size = model.image_size
        self.low_res_size = model.sam_prompt_encoder.mask_input_size[0]

    def forward(self, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        size = self.image_size
        mask = (antialiased_resize(mask, size, size) >= 0.5).float()  # identity on a binary mask of that size
        low_res = antialiased_resize(mask * 20.0 - 10.0, self.low_res_size, self.low_res_size)
        present = (mask.flatten(1) > 0).any(dim=1, keepdim=True).float()
        return low_res, self.mask_downsample(mask), present * 20.0 - 10.0


class TrackingDecoder(Decoder):
    """The image decoder plus `obj_ptr` [B, 4, C]: the object pointer of the single-mask token
    then of the three multimask tokens, mixed with `no_obj_ptr` by the object score."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.obj_ptr_proj = model.obj_ptr_proj
        self.no_obj_ptr = model.no_obj_ptr
        self.fixed_no_obj_ptr = model.fixed_no_obj_ptr

    def forward(self, image_embed, high_res_feats_0, high_res_feats_1, point_coords, point_labels, mask_input, has_mask_input):
        masks, iou, tokens, object_scores = self._decode(
            image_embed, high_res_feats_0, high_res_feats_1, point_coords, point_labels, mask_input, has_mask_input
        )
        single_mask, single_iou = self._single(masks, iou)
        appearing = (object_scores > 0).float().unsqueeze(-1)  # [B, 1, 1]
        obj_ptr = self.obj_ptr_proj(tokens)
        if self.fixed_no_obj_ptr:
            obj_ptr = appearing * obj_ptr
        obj_ptr = obj_ptr + (1 - appearing) * self.no_obj_ptr
        return masks[:, 1:], iou[:, 1:], single_mask, single_iou, object_scores, obj_ptr


def export_video(model: nn.Module, spec: ModelSpec, directory: Path) -> list[Path]:
    """Write the three video graphs, the predictor's settings and its constants into `directory`."""
    video = build_video_model(model, spec)
    directory.mkdir(parents=True, exist_ok=True)
    side = video.sam_image_embedding_size
    hidden, mem = video.hidden_dim, video.mem_dim
    attention_args = (
        torch.randn(1, hidden, side, side),
        torch.randn(2, mem, side, side),
        torch.tensor([0, 5]),
        torch.randn(3, hidden),
        torch.tensor([0.0, 1 / 15, 2 / 15]),
    )
    names = ["pix_feat", "memory", "memory_tpos", "obj_ptrs", "obj_ptr_tpos"]
    dynamic = {
        "memory": {0: "memories"},
        "memory_tpos": {0: "memories"},
        "obj_ptrs": {0: "pointers"},
        "obj_ptr_tpos": {0: "pointers"},
    }
    export_onnx(
        MemoryAttention(video).eval(), attention_args, directory / MEMORY_ATTENTION_FILE, names, ["pix_feat_with_mem"], dynamic
    )
    low = spec.low_res_size
    encoder_args = (torch.randn(1, hidden, side, side), torch.randn(1, 1, low, low), torch.ones(1, 1), torch.ones(1))
    export_onnx(
        MemoryEncoder(video).eval(),
        encoder_args,
        directory / MEMORY_ENCODER_FILE,
        ["pix_feat", "mask_logits", "object_score_logits", "binarize"],
        ["maskmem_features"],
        {},
    )
    export_decoder_module(
        TrackingDecoder(video),
        spec,
        directory / TRACKING_DECODER_FILE,
        points=[[500.0, 400.0], [0.0, 0.0]],
        labels=[1, -1],
        outputs=[*contract.DECODER_OUTPUTS, contract.OBJ_PTR],
    )
    export_onnx(
        MaskPrompt(video).eval(),
        (torch.zeros(1, 1, 600, 800),),
        directory / MASK_PROMPT_FILE,
        ["mask"],
        ["low_res_logits", "mask_prompt", "object_score_logits"],
        {"mask": {2: "height", 3: "width"}},
    )
    settings = {name: _setting(video, name) for name in _SETTINGS}
    (directory / SETTINGS_FILE).write_text(json.dumps(settings, indent=2) + "\n")
    with torch.no_grad():
        np.savez(
            directory / CONSTANTS_FILE,
            no_mem_embed=video.no_mem_embed.reshape(-1).numpy(),
            no_obj_ptr=video.no_obj_ptr.reshape(-1).numpy(),
        )
    return [directory / name for name in (MEMORY_ATTENTION_FILE, MEMORY_ENCODER_FILE, TRACKING_DECODER_FILE, MASK_PROMPT_FILE)]


def _setting(model: nn.Module, name: str):
    value = getattr(model, name)
    return value.item() if isinstance(value, torch.Tensor) else value
