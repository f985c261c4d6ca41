"""`triton-sam export <micro-sam model> --random-init` writes the instance decoder beside the session
model, and `InstanceSegmenter` runs on it (vit_t_lm: micro-sam's cheapest model with a decoder); a
checkpoint holding its decoder exports it; a decoder for a model without one is refused."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from benchmarks.microsam_checkpoints import MODEL_STATE, write_checkpoint, write_decoder
from conftest import cli_export, require_export_extra
from synthetic import disk_image
from triton_sam import Predictor
from triton_sam.download import file_sha256
from triton_sam.instance import InstanceSegmenter
from triton_sam.registry import get_model
from triton_sam.repository import instance_decoder_path, read_metadata

MODEL = "vit_t_lm"


def test_random_init_export_writes_a_decoder_the_segmenter_runs(exported_repository):
    repository = exported_repository(MODEL)
    decoder = instance_decoder_path(repository, get_model(MODEL))
    assert decoder.is_file()
    assert read_metadata(decoder.parent) | {"decoder": "random-init", "seed": 0} == read_metadata(decoder.parent)

    image = disk_image(120, 160, [(50, 60, 20)])
    with Predictor(MODEL, model_repository=repository) as predictor:
        segmenter = InstanceSegmenter(predictor)
        segmenter.initialize(image)
        maps = segmenter.get_state()
        labels = segmenter.generate(min_size=0)
    assert {name: value.shape for name, value in maps.items()} == dict.fromkeys(maps, (120, 160))
    assert all(np.all((0 <= value) & (value <= 1)) for value in maps.values())  # sigmoid maps
    assert labels.shape == (120, 160)


def test_a_checkpoint_holding_its_decoder_exports_it(tmp_path):
    """torch_em's training layout keeps the decoder under "decoder_state": no --decoder needed."""
    require_export_extra()
    import torch

    state = torch.load(write_decoder(tmp_path / "decoder.pt", "vit_t", 1), weights_only=True)
    checkpoint = write_checkpoint(tmp_path / "vit_t_lm.pt", "vit_t", 1, MODEL_STATE, decoder_state=state)
    cli_export(MODEL, tmp_path / "repo", "--checkpoint", str(checkpoint))
    decoder = instance_decoder_path(tmp_path / "repo", get_model(MODEL))
    assert read_metadata(decoder.parent)["decoder_sha256"] == file_sha256(checkpoint)


def test_a_decoder_for_a_model_without_one_is_refused_before_exporting(tmp_path):
    command = ["export", "sam_vit_b", "--random-init", "--decoder", str(tmp_path / "x.pt"), "--output", str(tmp_path / "repo")]
    done = subprocess.run([sys.executable, "-m", "triton_sam.cli", *command], capture_output=True, text=True)
    assert done.returncode == 2 and "sam_vit_b has no instance-segmentation decoder" in done.stderr
    assert not (tmp_path / "repo").exists()


def test_a_widening_upsampler_block_folds_into_one_convolution_equal_to_torch_ems():
    """deconv1's 1 x 1 convolution folded into its 3 x 3 one: the same output, border included
    (where the 3 x 3 pads the 1 x 1's output, bias and all, with zeros)."""
    require_export_extra()
    import torch
    from torch_em.model.unetr import Deconv2DBlock

    from triton_sam.export.instance_decoder_onnx import _UpsampleThenFoldedConv, _widens_after_bilinear

    torch.manual_seed(0)
    block = Deconv2DBlock(8, 16, use_conv_transpose=False).eval()
    assert _widens_after_bilinear(block) and not _widens_after_bilinear(Deconv2DBlock(16, 8, use_conv_transpose=False))
    upsampler, conv = block.block[0], block.block[1].block
    torch.nn.init.normal_(upsampler.conv.bias)  # torch_em's initial biases are small: make the border count
    x = torch.randn(1, 8, 12, 10)
    with torch.no_grad():
        expected, folded = conv(upsampler(x)), _UpsampleThenFoldedConv(upsampler, conv)(x)
    torch.testing.assert_close(folded, expected, rtol=1e-5, atol=1e-5)


def test_the_head_on_its_two_parts_equals_torch_ems_head_on_their_concatenation():
    """decoder_head normalised and convolved part by part: the same output as on the concatenation."""
    require_export_extra()
    import torch
    from torch_em.model.unet import ConvBlock2d

    from triton_sam.export.instance_decoder_onnx import _HeadOnParts

    torch.manual_seed(0)
    head = ConvBlock2d(16, 8).eval()
    torch.nn.init.normal_(head.block[1].bias)  # the bias is added once, not once a part
    parts = torch.randn(1, 8, 12, 10) * 3 + 1, torch.randn(1, 8, 12, 10)
    with torch.no_grad():
        expected, got = head(torch.cat(parts, dim=1)), _HeadOnParts(head)(*parts)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
