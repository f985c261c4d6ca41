"""Export SAM1 (`segment_anything`) and MobileSAM (`mobile_sam`) so that our pipeline reproduces
`SamPredictor` exactly.

The encoder takes the longest-side-resized uint8 image (any H x W with longest side 1024, one grey
or three RGB channels) and does what `Sam.preprocess` does: mean/std normalisation in 0..255, zero padding to 1024 x 1024.
The decoder embeds points as `PromptEncoder` does, with clicks, box corners (labels 2, 3) and the
padding point (label -1) all given by the client in SAM1's order (`registry.SAM1_PROMPTS`), and
runs the mask decoder with one image embedding per prompt set. Needs the `export` extra.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from .. import contract
from ..registry import ModelSpec
from . import sam2_onnx
from .checkpoint import with_weights
from .onnx_file import export_decoder_module, half_copy, param_dtype
from .quiet import MOBILE_SAM_IMPORT, ignoring

# SAM1 has no object-score head: report "object present" (sigmoid ~ 1) for the shared contract.
OBJECT_PRESENT_LOGIT = 10.0


def build_model(spec: ModelSpec, checkpoint: Path | None = None, seed: int | None = None) -> nn.Module:
    """The official SAM1 / MobileSAM model of `spec`: random weights (seeded) or a checkpoint's."""
    if spec.family == "mobile_sam":
        with ignoring(MOBILE_SAM_IMPORT):
            from mobile_sam import sam_model_registry
    else:
        from segment_anything import sam_model_registry

    return with_weights(lambda: sam_model_registry[spec.config](checkpoint=None).eval(), spec, checkpoint, seed)


class Encoder(nn.Module):
    """uint8 [B, h, w, C] (longest side 1024; C = 1 grey or 3 RGB) -> image_embed [B, 256, 64, 64]."""

    def __init__(self, model: nn.Module, backbone: nn.Module | None = None) -> None:
        """`backbone`: the image encoder to run (a float16 copy), by default `model`'s own."""
        super().__init__()
        self.register_buffer("mean", model.pixel_mean.clone())
        self.register_buffer("std", model.pixel_std.clone())
        self.backbone = backbone or model.image_encoder

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = image.permute(0, 3, 1, 2).float().expand(-1, 3, -1, -1)
        x = (x - self.mean) / self.std
        size = self.backbone.img_size
        x = F.pad(x, (0, size - x.shape[-1], 0, size - x.shape[-2]))
        return self.backbone(x.to(param_dtype(self.backbone))).float()


class Decoder(nn.Module):
    """image_embed + prompts (one prompt set per batch item) -> multimask and single-mask logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.prompt_encoder = model.prompt_encoder
        self.mask_decoder = model.mask_decoder

    def _embed_points(self, coords: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """`PromptEncoder._embed_points` and `_embed_boxes` in one: a label per point picks its embedding."""
        encoder = self.prompt_encoder
        embedding = encoder.pe_layer.forward_with_coords(coords + 0.5, encoder.input_image_size)
        labels = labels.unsqueeze(-1)
        embedding = torch.where(labels == contract.LABEL_PADDING, encoder.not_a_point_embed.weight, embedding)
        for label, point_embedding in enumerate(encoder.point_embeddings):
            embedding = torch.where(labels == label, embedding + point_embedding.weight, embedding)
        return embedding

    def _predict_masks(self, image_embed: torch.Tensor, sparse: torch.Tensor, dense: torch.Tensor):
        """`MaskDecoder.predict_masks` with the image embedding given per prompt set (the official
        one repeats a single image's embedding for every prompt set)."""
        decoder = self.mask_decoder
        batch = sparse.shape[0]
        output_tokens = torch.cat([decoder.iou_token.weight, decoder.mask_tokens.weight], dim=0)
        tokens = torch.cat((output_tokens.unsqueeze(0).expand(batch, -1, -1), sparse), dim=1)
        src = image_embed + dense
        positions = self.prompt_encoder.get_dense_pe().expand(batch, -1, -1, -1)
        b, c, h, w = src.shape
        hs, src = decoder.transformer(src, positions, tokens)
        mask_tokens = hs[:, 1 : 1 + decoder.num_mask_tokens, :]
        upscaled = decoder.output_upscaling(src.transpose(1, 2).view(b, c, h, w))
        hyper_in = torch.stack([mlp(mask_tokens[:, i, :]) for i, mlp in enumerate(decoder.output_hypernetworks_mlps)], 1)
        b, c, h, w = upscaled.shape
        masks = (hyper_in @ upscaled.view(b, c, h * w)).view(b, -1, h, w)
        return masks, decoder.iou_prediction_head(hs[:, 0, :])

    def forward(
        self,
        image_embed: torch.Tensor,
        point_coords: torch.Tensor,
        point_labels: torch.Tensor,
        mask_input: torch.Tensor,
        has_mask_input: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        sparse = self._embed_points(point_coords, point_labels)
        has_mask = has_mask_input.reshape(-1, 1, 1, 1)
        no_mask = self.prompt_encoder.no_mask_embed.weight.reshape(1, -1, 1, 1)
        dense = self.prompt_encoder.mask_downscaling(mask_input) * has_mask + no_mask * (1 - has_mask)
        masks, iou = self._predict_masks(image_embed, sparse, dense)
        object_scores = torch.full_like(iou[:, :1], OBJECT_PRESENT_LOGIT)
        # multimask_output=True: the last three; False: the first (SAM1 has no stability switch).
        return masks[:, 1:], iou[:, 1:], masks[:, 0:1], iou[:, 0:1], object_scores


@contextmanager
def batch_from_shape(model: nn.Module) -> Iterator[None]:
    """Keep the batch dynamic through TinyViT's `PatchMerging` (MobileSAM).

    It reshapes with `len(x)`, which tracing freezes to the example's batch of 1; a pre-hook
    hands it the same 4D view with the batch taken from the shape, so its own reshape is skipped.
    """

    def as_image(module: nn.Module, args: tuple) -> tuple | None:
        (x,) = args
        if x.ndim != 3:
            return None
        height, width = module.input_resolution
        return (x.view(x.shape[0], height, width, -1).permute(0, 3, 1, 2),)

    hooks = [m.register_forward_pre_hook(as_image) for m in model.modules() if type(m).__name__ == "PatchMerging"]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def export_encoder(model: nn.Module, spec: ModelSpec, path: Path, external_data: bool | None = None, half: bool = False) -> None:
    """The encoder in float32, or with its backbone in float16 (`half`; pre-processing stays float32)."""
    encoder = Encoder(model, half_copy(model.image_encoder) if half else None)
    with batch_from_shape(encoder.backbone):
        sam2_onnx.export_image_encoder(encoder, spec, path, external_data)


def export_decoder(model: nn.Module, spec: ModelSpec, path: Path) -> None:
    points = [[500.0, 400.0], [200.0, 300.0], [0.0, 0.0]]
    export_decoder_module(Decoder(model), spec, path, points, labels=[1, 0, contract.LABEL_PADDING])
