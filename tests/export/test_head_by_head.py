"""Global attention head by head (`triton_sam.export.head_by_head`) computes what each family's
official encoder computes, and the exported graph holds one head's scores at a time."""

from __future__ import annotations

import pytest

from conftest import require_export_extra

HEADS = 4
GLOBAL_BLOCK = 1  # of 3 in each small encoder below; the others are windowed


def _sam1(size: int):
    from segment_anything.modeling.image_encoder import ImageEncoderViT

    return ImageEncoderViT(
        img_size=size, patch_size=8, embed_dim=32, depth=3, num_heads=HEADS, out_chans=16, use_rel_pos=True,
        rel_pos_zero_init=False, window_size=4, global_attn_indexes=(GLOBAL_BLOCK,),
    )  # fmt: skip


def _sam2(size: int):
    from sam2.modeling.backbones.hieradet import Hiera

    # Heads double at each stage: 4 in the third, where block 3 (of 5) attends globally.
    return Hiera(embed_dim=16, num_heads=1, stages=(1, 1, 2, 1), global_att_blocks=(3,), window_spec=(4, 4, 2, 2),
                 window_pos_embed_bkg_spatial_size=(4, 4))  # fmt: skip


def _sam3(size: int):
    from sam3.model.vitdet import ViT

    return ViT(
        img_size=size, patch_size=14, embed_dim=32, depth=3, num_heads=HEADS, rel_pos_blocks=(), window_size=4,
        global_att_blocks=(GLOBAL_BLOCK,), use_rope=True, pretrain_img_size=size, pretrain_use_cls_token=False,
        retain_cls_token=False, use_act_checkpoint=False,
    )  # fmt: skip


FAMILIES = {"sam1": (_sam1, 128), "sam2": (_sam2, 128), "sam3": (_sam3, 112)}


def _last(output):
    """The encoder's last output (Hiera and SAM3's ViT return a list of stages)."""
    return output if not isinstance(output, (list, tuple)) else output[-1]


@pytest.mark.parametrize("family", FAMILIES)
def test_head_by_head_computes_the_official_encoder_and_patches_only_global_attention(family):
    require_export_extra()
    if family == "sam3":
        pytest.importorskip("sam3")
    import torch

    from triton_sam.export.head_by_head import head_by_head

    torch.manual_seed(0)
    build, size = FAMILIES[family]
    encoder = build(size).eval()
    image = torch.randn(2, 3, size, size)
    with torch.no_grad():
        official = _last(encoder(image))
        with head_by_head(encoder):
            patched = [name for name, module in encoder.named_modules() if "forward" in vars(module)]
            ours = _last(encoder(image))
    global_attentions = [f"{name}.attn" for name, m in encoder.named_modules() if getattr(m, "window_size", None) == 0]
    assert len(global_attentions) == 1
    assert patched == global_attentions
    assert torch.allclose(ours, official, rtol=0, atol=1e-6), (ours - official).abs().max()
    assert not [module for module in encoder.modules() if "forward" in vars(module)]  # the official code is back


@pytest.mark.parametrize("family", ["sam1", "sam2"])
def test_the_exported_graph_takes_one_heads_softmax_at_a_time(family, tmp_path):
    """Each windowed block keeps its one softmax over all heads; the global block has one per head."""
    require_export_extra()
    import numpy as np
    import onnx
    import onnxruntime as ort
    import torch

    from triton_sam.export.onnx_file import export_onnx

    class LastStage(torch.nn.Module):
        def __init__(self, encoder):
            super().__init__()
            self.encoder = encoder

        def forward(self, image):
            return _last(self.encoder(image))

    torch.manual_seed(0)
    build, size = FAMILIES[family]
    encoder = LastStage(build(size)).eval()
    image = torch.randn(1, 3, size, size)
    path = tmp_path / "encoder.onnx"
    export_onnx(encoder, (image,), path, ["image"], ["features"], {"image": {0: "batch"}})
    softmaxes = [node for node in onnx.load(str(path)).graph.node if node.op_type == "Softmax"]
    blocks = len([m for m in encoder.modules() if hasattr(m, "window_size")])
    assert len(softmaxes) == (blocks - 1) + HEADS
    with torch.no_grad():
        official = encoder(image).numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (ours,) = session.run(["features"], {"image": image.numpy()})
    np.testing.assert_allclose(ours, official, rtol=0, atol=1e-5)
