"""Export SAM3's concept detector (see `triton_sam.concepts` for how the concept path splits into graphs).

The detector is `sam3`'s `Sam3Image.forward_grounding` from the image's detector maps on: geometry
encoder (exemplar boxes), fusion encoder, DETR-style decoder with its presence token, dot-product
scores and the segmentation head, traced as `Sam3Processor._forward_grounding` calls it (one image,
one prompt). The image backbone and the text encoder are not part of it: their outputs are inputs.
Needs the `export` extra (torch, sam3).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torchvision
from torch import nn

from .. import contract
from ..concepts.tokenizer import CONTEXT_LENGTH
from .onnx_file import export_onnx
from .quiet import SAM3_DETECTOR_TRACE, TRACE, ignoring
from .traceable_attention import traceable_attention

DETECTOR_SIZES = (288, 144, 72)  # the detector maps' sides at 1008 px (strides 3.5, 7, 14)
CHANNELS = 256


def _encode_boxes(encoder: nn.Module, boxes, boxes_mask, boxes_labels, img_feats):
    """sam3's `SequenceGeometryEncoder._encode_boxes` for one image, in ops whose trace keeps the
    number of boxes dynamic (0 included): sam3 reshapes by sizes read as Python values, which the
    trace freezes; and it pins memory, which needs CUDA. Boxes [N, 1, 4] -> embeddings [N, 1, C]."""
    from sam3.model.box_ops import box_cxcywh_to_xyxy

    side = DETECTOR_SIZES[-1]  # the map is square (sam3 resizes images to 1008 x 1008)
    xyxy = box_cxcywh_to_xyxy(boxes[:, 0]) * side
    rois = torch.cat([torch.zeros_like(xyxy[:, :1]), xyxy], dim=1)  # batch index 0: one image
    pooled = torchvision.ops.roi_align(img_feats, rois, encoder.roi_size)  # as sam3: aligned=False, adaptive sampling
    embed = encoder.boxes_direct_project(boxes) + encoder.boxes_pool_project(pooled).flatten(1)[:, None]
    cx, cy, w, h = boxes[:, 0].unbind(-1)
    embed = embed + encoder.boxes_pos_enc_project(encoder.pos_enc.encode_boxes(cx, cy, w, h))[:, None]
    return encoder.label_embed(boxes_labels.long()) + embed, boxes_mask


def _no_points(points, points_mask, points_labels, img_feats):
    """The detector is given no points: their (empty) embeddings, without sampling the map at none."""
    return points.new_zeros(0, *points.shape[1:-1], CHANNELS), points_mask


def _concat_unpadded(seq1, mask1, seq2, mask2):
    """sam3's `concat_padded_sequences` where nothing is padding (one image, every box valid): a
    plain concatenation, whose trace keeps the lengths dynamic (sam3's sizes its output by Python ints)."""
    return torch.cat([seq1, seq2]), torch.cat([mask1, mask2], dim=1)


@contextmanager
def traceable_geometry(model: nn.Module) -> Iterator[None]:
    """Trace the geometry encoder with the functions above in place of sam3's own."""
    from sam3.model import geometry_encoders

    encoder = model.geometry_encoder
    concat = geometry_encoders.concat_padded_sequences
    encoder._encode_boxes = functools.partial(_encode_boxes, encoder)
    encoder._encode_points = _no_points
    geometry_encoders.concat_padded_sequences = _concat_unpadded
    try:
        yield
    finally:
        del encoder._encode_boxes, encoder._encode_points
        geometry_encoders.concat_padded_sequences = concat


def backbone_out(model: nn.Module, maps: list[torch.Tensor], text: torch.Tensor, text_mask: torch.Tensor) -> dict:
    """`Sam3Processor`'s state["backbone_out"] for one image: the detector maps (288, 144, 72 px) with
    their position encodings, and one phrase's features (batch first here, sequence first there)."""
    return {
        "backbone_fpn": list(maps),
        "vision_pos_enc": [model.position_encoding(x).to(x.dtype) for x in maps],
        "language_features": text.transpose(0, 1),
        "language_mask": text_mask,
    }


def box_prompt(boxes: torch.Tensor, labels: torch.Tensor):
    """sam3's `Prompt` of exemplar boxes [1, N, 4] (cx, cy, w, h in [0, 1]) labelled [1, N] (1
    positive, 0 negative), as `add_geometric_prompt` accumulates them; N may be 0."""
    from sam3.model.geometry_encoders import Prompt

    mask = torch.zeros_like(labels, dtype=torch.bool)
    return Prompt(box_embeddings=boxes.transpose(0, 1), box_mask=mask, box_labels=labels.transpose(0, 1).long())


def find_stage():
    """`Sam3Processor`'s query: image 0, phrase 0, no other inputs."""
    from sam3.model.data_misc import FindStage

    zero = torch.zeros(1, dtype=torch.long)
    return FindStage(zero, zero, None, None, None, None, None)


class Detector(nn.Module):
    """Detector maps and position-free text features of one image and one phrase, exemplar boxes ->
    per query (200): boxes (cx, cy, w, h in [0, 1]), score logits, 288 x 288 mask logits; and the
    presence logit. `Sam3Processor` keeps queries with sigmoid(score) * sigmoid(presence) above its threshold."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, map0, map1, map2, text, text_mask, boxes, box_labels):
        backbone = backbone_out(self.model, [map0, map1, map2], text, text_mask)
        out = self.model.forward_grounding(backbone, find_stage(), None, box_prompt(boxes, box_labels))
        return out["pred_boxes"], out["pred_logits"][..., 0], out["pred_masks"], out["presence_logit_dec"]


def example_inputs() -> tuple[torch.Tensor, ...]:
    """Inputs of the right shapes and types for tracing (two boxes: their number stays dynamic)."""
    maps = tuple(torch.randn(1, CHANNELS, side, side) for side in DETECTOR_SIZES)
    text = torch.randn(1, CONTEXT_LENGTH, CHANNELS)
    text_mask = torch.arange(CONTEXT_LENGTH)[None] >= 3
    boxes = torch.tensor([[[0.3, 0.4, 0.2, 0.1], [0.6, 0.5, 0.1, 0.3]]])
    labels = torch.tensor([[1, 0]], dtype=torch.int64)
    return (*maps, text, text_mask, boxes, labels)


def export_detector(model: nn.Module, directory: Path) -> Path:
    """`detector.onnx` into `directory` (its weights inside: 112 MB in float32)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / contract.DETECTOR_FILE
    dynamic = {contract.EXEMPLAR_BOXES: {1: "boxes"}, contract.EXEMPLAR_LABELS: {1: "boxes"}}
    image_attentions = [layer.self_attn for layer in model.transformer.encoder.layers]  # 72 x 72 tokens to each other
    with traceable_geometry(model), traceable_attention(model, image_attentions), ignoring(TRACE + SAM3_DETECTOR_TRACE):
        export_onnx(
            Detector(model).eval(),
            example_inputs(),
            path,
            list(contract.DETECTOR_INPUTS),
            list(contract.DETECTOR_OUTPUTS),
            dynamic,
            external_data=False,
        )
    return path
