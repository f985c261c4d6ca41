"""Export SAM2.1 to ONNX so that our pipeline reproduces `SAM2ImagePredictor` exactly.

The encoder does everything the official `set_image` does: scaling to 0..1, the antialiased
resize to the input size (in float, on the server's device), mean/std normalisation,
`no_mem_embed`, and the `conv_s0`/`conv_s1` high-resolution features.
The decoder reproduces `SAM2ImagePredictor._predict`: the prompt encoder (with its padding point),
the mask decoder with high-resolution features, and the official single-mask choice.
Needs the `export` extra (torch, sam2).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from .. import contract
from ..registry import ModelSpec
from .checkpoint import with_weights
from .onnx_file import export_decoder_module, export_onnx, half_copy, param_dtype
from .resize import antialiased_resize

_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)


def build_model(spec: ModelSpec, checkpoint: Path | None = None, seed: int | None = None) -> nn.Module:
    """The official SAM2 model of `spec`: random weights (seeded) or a checkpoint's weights."""
    from sam2.build_sam import build_sam2

    return with_weights(lambda: build_sam2(spec.config, ckpt_path=None, device="cpu", mode="eval"), spec, checkpoint, seed)


class Encoder(nn.Module):
    """uint8 image batch [B, H, W, C] (any H x W; C = 1 grey or 3 RGB) -> image_embed,
    high_res_feats_0, high_res_feats_1.

    Also serves SAM3's tracker, which differs only in its mean/std and in always adding
    `no_mem_embed` (SAM2 adds it when `directly_add_no_mem_embed`).
    """

    def __init__(
        self,
        model: nn.Module,
        spec: ModelSpec,
        mean: tuple[float, ...] = _MEAN,
        std: tuple[float, ...] = _STD,
        add_no_mem_embed: bool | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.size = spec.input_size
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1))
        shapes = spec.feature_shapes
        # The backbone's levels, finest first: high_res_feats_0, high_res_feats_1, image_embed.
        self.feature_sizes = [shapes[name][1:] for name in ("high_res_feats_0", "high_res_feats_1", "image_embed")]
        self.add_no_mem_embed = model.directly_add_no_mem_embed if add_no_mem_embed is None else add_no_mem_embed

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.features(self.model.forward_image(self.model_input(image)), image.shape[0])

    def model_input(self, image: torch.Tensor) -> torch.Tensor:
        """uint8 [B, H, W, C] -> the backbone's normalised [B, 3, size, size] input."""
        x = image.permute(0, 3, 1, 2).float() / 255.0  # as ToTensor, before the resize
        x = antialiased_resize(x, self.size, self.size).expand(-1, 3, -1, -1)
        x = (x - self.mean) / self.std
        return x.to(param_dtype(self.model))

    def features(self, backbone_out: dict, batch: int) -> tuple[torch.Tensor, ...]:
        """The model's `forward_image` output -> image_embed, high_res_feats_0, high_res_feats_1."""
        _, vision_feats, _, _ = self.model._prepare_backbone_features(backbone_out)
        if self.add_no_mem_embed:
            vision_feats[-1] = vision_feats[-1] + self.model.no_mem_embed
        feats = [feat.permute(1, 2, 0).reshape(batch, -1, *size).float() for feat, size in zip(vision_feats, self.feature_sizes)]
        return feats[2], feats[0], feats[1]


class Decoder(nn.Module):
    """Feature maps + prompts (one prompt set per batch item) -> multimask and single-mask logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.prompt_encoder = model.sam_prompt_encoder
        self.mask_decoder = model.sam_mask_decoder

    def forward(
        self,
        image_embed: torch.Tensor,
        high_res_feats_0: torch.Tensor,
        high_res_feats_1: torch.Tensor,
        point_coords: torch.Tensor,
        point_labels: torch.Tensor,
        mask_input: torch.Tensor,
        has_mask_input: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        masks, iou, _, object_scores = self._decode(
            image_embed, high_res_feats_0, high_res_feats_1, point_coords, point_labels, mask_input, has_mask_input
        )
        single_mask, single_iou = self._single(masks, iou)
        return masks[:, 1:], iou[:, 1:], single_mask, single_iou, object_scores

    def _decode(self, image_embed, high_res_feats_0, high_res_feats_1, point_coords, point_labels, mask_input, has_mask_input):
        """The four tokens' masks, scores and output tokens, and the object score: the prompt
        encoder (SAM2's padding point; the mask or `no_mask_embed`) and the mask decoder."""
        sparse = self.prompt_encoder._embed_points(point_coords, point_labels, pad=True)
        has_mask = has_mask_input.reshape(-1, 1, 1, 1)
        no_mask = self.prompt_encoder.no_mask_embed.weight.reshape(1, -1, 1, 1)
        dense = self.prompt_encoder._embed_masks(mask_input) * has_mask + no_mask * (1 - has_mask)
        return self.mask_decoder.predict_masks(
            image_embeddings=image_embed,
            image_pe=self.prompt_encoder.get_dense_pe(),
            sparse_prompt_embeddings=sparse,
            dense_prompt_embeddings=dense,
            repeat_image=False,
            high_res_features=[high_res_feats_0, high_res_feats_1],
        )

    def _single(self, masks: torch.Tensor, iou: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The official single-mask choice among the four tokens' masks."""
        if self.mask_decoder.dynamic_multimask_via_stability:
            return self.mask_decoder._dynamic_multimask_via_stability(masks, iou)
        return masks[:, 0:1], iou[:, 0:1]


@contextmanager
def constant_position_embedding(trunk: nn.Module, input_size: int) -> Iterator[None]:
    """Let the export store Hiera's position embedding as a constant.

    Hiera interpolates its position embedding (bicubic) on every forward pass; for the fixed
    input size that is a constant, and left in the graph it cost 18% of the ONNX encoder's time.
    """
    side = input_size // trunk.patch_embed.proj.stride[0]
    with torch.no_grad():
        constant = trunk._get_pos_embed((side, side))
    trunk._get_pos_embed = lambda hw: constant
    try:
        yield
    finally:
        del trunk._get_pos_embed


def export_image_encoder(
    encoder: nn.Module, spec: ModelSpec, path: Path, external_data: bool | None = None, more_outputs: tuple[str, ...] = ()
) -> None:
    """Export an encoder taking uint8 [B, H, W, C] images, all four dynamic; its outputs are the
    features, then `more_outputs` (SAM3's detector maps)."""
    image = torch.zeros(1, 600, 800, 3, dtype=torch.uint8)  # not the input size: the resize must be traced
    names = [*spec.feature_shapes, *more_outputs]
    dynamic = {contract.ENCODER_INPUT: {0: "batch", 1: "height", 2: "width", 3: "channels"}}
    dynamic.update({name: {0: "batch"} for name in names})
    export_onnx(encoder.eval(), (image,), path, [contract.ENCODER_INPUT], names, dynamic, external_data)


def export_encoder(model: nn.Module, spec: ModelSpec, path: Path, external_data: bool | None = None, half: bool = False) -> None:
    """The encoder in float32, or with its backbone in float16 (`half`; pre-processing stays float32)."""
    model = half_copy(model) if half else model
    with constant_position_embedding(model.image_encoder.trunk, spec.input_size):
        export_image_encoder(Encoder(model, spec), spec, path, external_data)


def export_decoder(model: nn.Module, spec: ModelSpec, path: Path) -> None:
    export_decoder_module(Decoder(model), spec, path, points=[[500.0, 400.0], [200.0, 300.0]], labels=[1, 0])
