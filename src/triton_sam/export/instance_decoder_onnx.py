"""Export micro-sam's instance-segmentation decoder ("AIS") to ONNX.

micro-sam's decoder is torch_em's UNETR decoder run on SAM's image embedding (its
`instance_segmentation.DecoderAdapter`): foreground, center-distance and boundary-distance maps,
sigmoid-activated, at the encoder's padded input resolution (1024 x 1024 for SAM1 models). The
graph stops there: `MaskResizer.logits` crops and resizes the maps to the image as
`UNETR.postprocess_masks` does, wherever the maps are needed (no image-sized outputs to move out
of a server for an image smaller than the input). torch_em builds the modules at export time only.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from .. import contract
from ..download import file_sha256
from ..errors import CheckpointError
from ..registry import ModelSpec
from ..repository import instance_decoder_path, write_metadata
from .onnx_file import export_onnx
from .quiet import INSTANCE_DECODER_TRACE, ignoring

INSTANCE_MAPS = contract.INSTANCE_MAPS
IMAGE_EMBED = contract.INSTANCE_EMBED
MAP_CHANNELS = 3  # foreground, center distances, boundary distances


class _EncoderShape(nn.Module):
    """What torch_em's UNETR reads of its encoder to build the decoder (the encoder itself never runs here)."""

    def __init__(self, img_size: int, embed_dim: int) -> None:
        super().__init__()
        self.img_size, self.embed_dim, self.in_chans = img_size, embed_dim, 3


class _ImageStatsNorm(nn.Module):
    """A `BatchNorm2d` as micro-sam runs it: in training mode (`get_decoder` never calls `eval`), so
    normalised with the image's own statistics, its running statistics unused. For one image a run
    that is an instance norm with the batch norm's affine weights (ONNX `InstanceNormalization`)."""

    def __init__(self, norm: nn.BatchNorm2d) -> None:
        super().__init__()
        self.weight, self.bias, self.eps = norm.weight, norm.bias, norm.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.instance_norm(x, weight=self.weight, bias=self.bias, eps=self.eps)


class _ConvThenUpsample(nn.Module):
    """torch_em's `Upsampler2d` (upsample, then a 1 x 1 convolution) in the other order: bilinear
    upsampling mixes pixels with weights that sum to one and the convolution mixes channels, so
    they commute, and the convolution runs on a quarter of the pixels."""

    def __init__(self, upsampler: nn.Module) -> None:
        super().__init__()
        self.conv, self.scale_factor, self.mode = upsampler.conv, upsampler.scale_factor, upsampler.mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(self.conv(x), scale_factor=self.scale_factor, mode=self.mode, align_corners=False)


class _UpsampleThenFoldedConv(nn.Module):
    """A bilinear `Upsampler2d` and the 3 x 3 convolution after it (torch_em's `Deconv2DBlock`) as
    one convolution on the upsampled input: the 1 x 1 convolution folded into the 3 x 3 one, which
    then reads the block's narrower input (deconv1: 256 channels, not 512; half the work). The
    1 x 1's bias is zero-padded at the border like the rest of its output: a channel of ones,
    zero-padded alike, carries it through the 3 x 3 weights."""

    def __init__(self, upsampler: nn.Module, conv: nn.Conv2d) -> None:
        super().__init__()
        pointwise, spatial = upsampler.conv.weight.double()[:, :, 0, 0], conv.weight.double()
        weight = torch.einsum("omyx,mi->oiyx", spatial, pointwise)
        bias_weight = torch.einsum("omyx,m->oyx", spatial, upsampler.conv.bias.double()).unsqueeze(1)
        self.conv = nn.Conv2d(weight.shape[1] + 1, weight.shape[0], conv.kernel_size, padding=conv.padding)
        self.conv.weight.data = torch.cat([weight, bias_weight], dim=1).float()
        self.conv.bias.data = conv.bias.data.clone()
        self.scale_factor, self.mode = upsampler.scale_factor, upsampler.mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.cat([x, torch.ones_like(x[:, :1])], dim=1)
        return self.conv(F.interpolate(x, scale_factor=self.scale_factor, mode=self.mode, align_corners=False))


class _HeadOnParts(nn.Module):
    """torch_em's UNETR `decoder_head` (a `ConvBlock2d`: instance norm without weights, 3 x 3
    convolution, ...) on the concatenation of `parts`, without making it: the norm is per channel
    and the convolution a sum over channels, so each part is normalised and convolved with its
    channels' weights and the results added (no 128-channel copy at 1024 x 1024; ONNX Runtime
    adds a sum inside the convolution that makes the next)."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        norm, self.conv, *rest = head.block
        self.eps, self.rest = norm.eps, nn.Sequential(*rest)

    def forward(self, *parts: torch.Tensor) -> torch.Tensor:
        normed = [F.instance_norm(part, eps=self.eps) for part in parts]
        weights = self.conv.weight.split([part.shape[1] for part in parts], dim=1)
        total = F.conv2d(normed[0], weights[0], self.conv.bias, padding=self.conv.padding)
        for part, weight in zip(normed[1:], weights[1:], strict=True):
            total = F.conv2d(part, weight, padding=self.conv.padding) + total
        return self.rest(total)


def _widens_after_bilinear(block: nn.Module) -> bool:
    """Whether `block` is a `Deconv2DBlock` with a bilinear `Upsampler2d` to more channels than it reads."""
    from torch_em.model.unet import Upsampler2d
    from torch_em.model.unetr import Deconv2DBlock

    if not isinstance(block, Deconv2DBlock) or not isinstance(block.block[0], Upsampler2d):
        return False
    conv = block.block[0].conv
    return block.block[0].mode == "bilinear" and conv.in_channels < conv.out_channels


def _for_inference(module: nn.Module) -> nn.Module:
    """`module` with each `BatchNorm2d` inside replaced by `_ImageStatsNorm`, the upsampler and
    convolution of each widening `Deconv2DBlock` by `_UpsampleThenFoldedConv` and each other
    bilinear `Upsampler2d` by `_ConvThenUpsample`."""
    from torch_em.model.unet import Upsampler2d

    for name, child in module.named_children():
        if _widens_after_bilinear(child):
            upsampler, single_conv, *rest = child.block
            child.block = nn.Sequential(_UpsampleThenFoldedConv(upsampler, single_conv.block), *rest)
            _for_inference(child)
        elif isinstance(child, nn.BatchNorm2d):
            setattr(module, name, _ImageStatsNorm(child))
        elif isinstance(child, Upsampler2d) and child.mode == "bilinear":
            setattr(module, name, _ConvThenUpsample(child))
        else:
            _for_inference(child)
    return module


class InstanceDecoder(nn.Module):
    """image_embed [1, 256, 64, 64] -> sigmoid maps [1, 3, 1024, 1024], as micro-sam's `DecoderAdapter` computes them."""

    def __init__(self, unetr: nn.Module) -> None:
        super().__init__()
        for name in ("base", "decoder", "deconv1", "deconv2", "deconv3", "deconv4", "deconv_out", "out_conv"):
            setattr(self, name, getattr(unetr, name))
        self.decoder_head = _HeadOnParts(unetr.decoder_head)
        self.final_activation = unetr.final_activation

    def forward(self, image_embed: torch.Tensor) -> torch.Tensor:
        z9 = self.deconv1(image_embed)
        z6 = self.deconv2(z9)
        z3 = self.deconv3(z6)
        z0 = self.deconv4(z3)
        x = self.decoder(self.base(image_embed), encoder_inputs=[z9, z6, z3])
        x = self.decoder_head(self.deconv_out(x), z0)
        return self.final_activation(self.out_conv(x))


def _load(path: Path):
    """What `path` holds, read with `weights_only=True` (no pickled code runs)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise CheckpointError(f"Cannot read decoder checkpoint {path}: {error}") from error


def read_decoder_state(path: Path) -> dict[str, torch.Tensor]:
    """A decoder state as micro-sam publishes it (`*_decoder.pt`: the state dict) or keeps it in a
    combined checkpoint (under "decoder_state")."""
    state = _load(path)
    state = state.get("decoder_state", state) if isinstance(state, dict) else state
    if not isinstance(state, dict) or not any(key.startswith("decoder.") for key in state):
        raise CheckpointError(f"{path} holds no micro-sam instance-segmentation decoder state.")
    return state


def holds_decoder_state(checkpoint: Path) -> bool:
    """Whether a SAM checkpoint carries its instance decoder (torch_em's "decoder_state")."""
    state = _load(checkpoint)
    return isinstance(state, dict) and isinstance(state.get("decoder_state"), dict)


def _unetr(spec: ModelSpec, conv_transpose: bool = False) -> nn.Module:
    """torch_em's UNETR as micro-sam's `get_unetr` builds it for `spec` (its encoder only a shape)."""
    from torch_em.model import UNETR

    return UNETR(
        backbone="sam",
        encoder=_EncoderShape(spec.input_size, spec.feature_shapes[IMAGE_EMBED][0]),
        out_channels=MAP_CHANNELS,
        use_sam_stats=True,
        final_activation="Sigmoid",
        use_skip_connection=False,
        resize_input=True,
        use_conv_transpose=conv_transpose,
    )


def random_decoder_state(spec: ModelSpec, seed: int) -> dict[str, torch.Tensor]:
    """A decoder state with torch_em's initialisation drawn from `seed` (tests and benchmarks)."""
    torch.manual_seed(seed)
    return {key: value for key, value in _unetr(spec).state_dict().items() if not key.startswith("encoder")}


def build_decoder(state: dict[str, torch.Tensor], spec: ModelSpec) -> InstanceDecoder:
    """torch_em's UNETR decoder with `state`'s weights (transposed-convolution upsamplers where the
    state has them, as micro-sam decides)."""
    unetr = _unetr(spec, conv_transpose=any(".block." in key for key in state if key.startswith("decoder.samplers")))
    own = {key for key in unetr.state_dict() if not key.startswith("encoder")}
    missing = sorted(own - set(state))
    if missing:
        raise CheckpointError(f"The decoder state lacks {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}.")
    unetr.load_state_dict({key: state[key] for key in own}, strict=False)
    return _for_inference(InstanceDecoder(unetr)).eval()


def export_instance_decoder(spec: ModelSpec, decoder_checkpoint: Path, output: Path) -> Path:
    """Write the ONNX file of the decoder in `decoder_checkpoint` (a `*_decoder.pt` or a checkpoint
    with a "decoder_state") for `spec` (exported in `output`)."""
    weights = {"decoder_sha256": file_sha256(decoder_checkpoint)}
    return _write(build_decoder(read_decoder_state(decoder_checkpoint), spec), spec, output, weights)


def export_random_instance_decoder(spec: ModelSpec, seed: int, output: Path) -> Path:
    """Write the ONNX file of a decoder with random weights from `seed` for `spec` (exported in `output`)."""
    decoder = build_decoder(random_decoder_state(spec, seed), spec)
    return _write(decoder, spec, output, {"decoder": "random-init", "seed": seed})


def _write(decoder: InstanceDecoder, spec: ModelSpec, output: Path, weights: dict) -> Path:
    """`decoder` as the ONNX file beside `spec`'s session model in `output`, with its metadata."""
    target = instance_decoder_path(output, spec)
    target.parent.mkdir(parents=True, exist_ok=True)
    shape = (1, *spec.feature_shapes[IMAGE_EMBED])
    # One image a run: torch_em's skip crops trace as dynamic channel counts with a dynamic batch.
    with ignoring(INSTANCE_DECODER_TRACE):
        export_onnx(decoder, (torch.zeros(shape),), target, [IMAGE_EMBED], [INSTANCE_MAPS], dynamic={})
    metadata = {"model_id": spec.model_id, "component": "instance_decoder", "contract_version": contract.CONTRACT_VERSION}
    write_metadata(target.parent, {**metadata, **weights})
    return target
