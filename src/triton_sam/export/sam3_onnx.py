"""Export SAM3's tracker (its interactive point/box model) so that our pipeline reproduces
`SAM3InteractiveImagePredictor` exactly.

The tracker is SAM2's prompt encoder and mask decoder (the same code, line for line) on SAM3's
ViT backbone at 1008 x 1008 with three feature levels, so SAM2's export wrappers serve it: the
encoder with SAM3's mean/std (0.5) and `no_mem_embed` always added, the decoder unchanged. The
encoder also answers the concept detector's three maps (`contract.DETECTOR_MAPS`, SAM3's other
neck on the same trunk run): one encode serves points, boxes and concepts.

Everything is exported from one official model, sam3's image model with its interactive tracker
(`build_sam3_image_model(enable_inst_interactivity=True)`, as `Sam3Processor` runs it): the
tracker on the image model's ViT, and the concept graphs (text encoder, detector) from the same
weights. The concept graphs are exported first; the encoder and decoder then from `tracker_of`'s
tracker alone, the rest of the model let go. Needs the `export` extra (torch, sam3).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .. import contract
from ..registry import ModelSpec
from . import sam2_onnx, sam3_concepts_onnx, sam3_detector_onnx
from .checkpoint import with_weights
from .onnx_file import half_copy
from .quiet import SAM3_BUILD, ignoring

_MEAN = _STD = (0.5, 0.5, 0.5)


class _CudaFactoriesOnCpu(TorchFunctionMode):
    """Turn `device="cuda"` arguments into "cpu" (see `cpu_safe_build`)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


@contextmanager
def cpu_safe_build() -> Iterator[None]:
    """Build sam3 models on a machine without CUDA.

    sam3 0.1.4 precomputes position encodings with a hard-coded `device="cuda"`
    (facebookresearch/sam3#587), which fails without a GPU; those tensors go to the CPU instead.
    """
    if torch.cuda.is_available():
        yield
        return
    with _CudaFactoriesOnCpu():
        yield


def official_model(spec: ModelSpec) -> nn.Module:
    """sam3's image model with its interactive tracker as sam3 builds it (its random init: the
    global generator's), the text encoder's uninitialised weights filled (`fill_uninitialised`)."""
    with ignoring(SAM3_BUILD):
        from sam3 import model_builder

        with cpu_safe_build():
            build_image_model = getattr(model_builder, spec.config)
            model = build_image_model(
                bpe_path=str(sam3_concepts_onnx.vocab_file()),
                device="cpu",
                checkpoint_path=None,  # loaded and checked by `with_weights`
                load_from_HF=False,
                enable_inst_interactivity=True,
            )
    sam3_concepts_onnx.fill_uninitialised(model.backbone.language_backbone)
    return model.eval()


def build_model(spec: ModelSpec, checkpoint: Path | None = None, seed: int | None = None) -> nn.Module:
    """`official_model` with random weights (seeded) or a `sam3.pt`'s; its tracker runs on the image
    model's ViT (`tracker_of`) and its detector on the ViT's position encoding."""
    model = with_weights(partial(official_model, spec), spec, checkpoint, seed)
    # After loading: as attributes they join the state dict, which the checkpoint is checked against.
    model.position_encoding = model.backbone.vision_backbone.position_encoding
    model.inst_interactive_predictor.model.backbone = _vision_only(model.backbone)
    return model


def _vision_only(backbone: nn.Module) -> nn.Module:
    """The image model's backbone without its text encoder: what `build_tracker(with_backbone=True)`
    gives the tracker, on the same ViT and necks (so the tracker alone holds no text encoder)."""
    from sam3.model.vl_combiner import SAM3VLBackbone

    return SAM3VLBackbone(visual=backbone.vision_backbone, text=None, scalp=backbone.scalp)


def tracker_of(model: nn.Module) -> nn.Module:
    """The interactive tracker of `build_model`'s image model, with its backbone."""
    return model.inst_interactive_predictor.model


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the (even, odd) channel pairs of `x` [..., L, C] by angles given as cos/sin [L, C/2]:
    the complex product of sam3's `apply_rotary_enc`, in real arithmetic."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2).type_as(x)


@contextmanager
def real_valued_rope(trunk: nn.Module) -> Iterator[None]:
    """Let the ViT's 2D RoPE export: ONNX has no complex tensors (`view_as_complex`), so each
    attention layer rotates queries and keys with the real and imaginary parts of its `freqs_cis`."""
    layers = [m for m in trunk.modules() if getattr(m, "freqs_cis", None) is not None]
    for layer in layers:
        cos, sin = layer.freqs_cis.real.contiguous(), layer.freqs_cis.imag.contiguous()
        layer._apply_rope = lambda q, k, cos=cos, sin=sin: (_rotate(q, cos, sin), _rotate(k, cos, sin))
    try:
        yield
    finally:
        for layer in layers:
            del layer._apply_rope


class Encoder(sam2_onnx.Encoder):
    """uint8 image batch [B, H, W, C] -> the tracker's features (SAM2's encoder outputs), then the
    detector's maps at 288, 144 and 72 px, all from one run of the trunk: sam3's backbone answers
    both necks' outputs, of which `Sam3TrackerBase.forward_image` keeps only the tracker's."""

    def __init__(self, model: nn.Module, spec: ModelSpec) -> None:
        super().__init__(model, spec, mean=_MEAN, std=_STD, add_no_mem_embed=True)

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, ...]:
        both = self.model.backbone.forward_image(self.model_input(image))
        tracker = dict(both["sam2_backbone_out"])
        fpn = list(tracker["backbone_fpn"])  # as Sam3TrackerBase.forward_image: levels 0 and 1 projected once
        fpn[0], fpn[1] = self.model.sam_mask_decoder.conv_s0(fpn[0]), self.model.sam_mask_decoder.conv_s1(fpn[1])
        tracker["backbone_fpn"] = fpn
        return (*self.features(tracker, image.shape[0]), *(level.float() for level in both["backbone_fpn"]))


def export_encoder(
    tracker: nn.Module, spec: ModelSpec, path: Path, external_data: bool | None = None, half: bool = False
) -> None:
    """The encoder of `tracker_of`'s tracker in float32, or with its backbone in float16 (`half`;
    pre-processing stays float32)."""
    tracker = half_copy(tracker) if half else tracker
    with real_valued_rope(tracker.backbone.vision_backbone.trunk):
        sam2_onnx.export_image_encoder(Encoder(tracker, spec), spec, path, external_data, contract.DETECTOR_MAPS)


export_decoder = sam2_onnx.export_decoder  # `tracker_of`'s prompt encoder and mask decoder are SAM2's


def export_concepts(model: nn.Module, directory: Path) -> list[Path]:
    """The concept graphs into `directory`: the text encoder (with the tokenizer's merges) and the detector."""
    with torch.no_grad():
        written = sam3_concepts_onnx.export_text_encoder(model.backbone.language_backbone, directory)
        return [*written, sam3_detector_onnx.export_detector(model, directory)]
