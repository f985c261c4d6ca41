"""The faster forms of the mask decoder compute what each family's official mask decoder computes."""

from __future__ import annotations

import pytest

from conftest import require_export_extra

PROMPT_TOKENS = 5  # two points and their padding, a box's two corners: any count works


def _sam2_decoder(torch):
    from sam2.modeling.sam.mask_decoder import MaskDecoder
    from sam2.modeling.sam.transformer import TwoWayTransformer

    transformer = TwoWayTransformer(depth=2, embedding_dim=256, mlp_dim=2048, num_heads=8)
    decoder = MaskDecoder(transformer_dim=256, transformer=transformer, use_high_res_features=True, pred_obj_scores=True)

    def run(batch):
        high_res = [torch.randn(batch, 32, 256, 256), torch.randn(batch, 64, 128, 128)]
        args = _common_args(torch, batch)
        return lambda: decoder.predict_masks(*args, repeat_image=False, high_res_features=high_res)

    return decoder, run


def _sam1_decoder(torch):
    from segment_anything.modeling.mask_decoder import MaskDecoder
    from segment_anything.modeling.transformer import TwoWayTransformer

    transformer = TwoWayTransformer(depth=2, embedding_dim=256, mlp_dim=2048, num_heads=8)
    decoder = MaskDecoder(transformer_dim=256, transformer=transformer)

    def run(batch):
        image_embeddings, *prompts = _common_args(torch, batch)
        # SAM1's predict_masks repeats the one image for each of the `batch` prompt sets
        return lambda: decoder.predict_masks(image_embeddings[:1], *prompts)

    return decoder, run


def _common_args(torch, batch: int) -> tuple:
    return (
        torch.randn(batch, 256, 64, 64),  # image embeddings
        torch.randn(1, 256, 64, 64),  # positional encoding
        torch.randn(batch, PROMPT_TOKENS, 256),  # sparse prompt embeddings
        torch.randn(batch, 256, 64, 64),  # dense prompt embeddings
    )


@pytest.mark.parametrize("family", ["sam2", "sam1"])
@pytest.mark.parametrize("batch", [1, 2])
def test_faster_forms_compute_the_official_decoder(family, batch):
    require_export_extra()
    import torch

    from triton_sam.export.fast_mask_decoder import fast_mask_decoder

    torch.manual_seed(batch)
    decoder, make_run = {"sam2": _sam2_decoder, "sam1": _sam1_decoder}[family](torch)
    decoder.eval()
    run = make_run(batch)
    with torch.no_grad():
        official = run()
        with fast_mask_decoder(decoder):
            fast = run()
        restored = run()
    for ours, theirs, again in zip(fast, official, restored, strict=True):
        assert ours.shape == theirs.shape
        scale = theirs.abs().max().item()
        assert torch.allclose(ours, theirs, rtol=0, atol=1e-5 * max(scale, 1.0)), (ours - theirs).abs().max()
        assert torch.equal(again, theirs)  # leaving the block puts the official code back
    patched = [m for m in decoder.modules() if "forward" in vars(m)]
    assert not patched


def test_every_image_sized_step_is_rewritten():
    """Each cross-attention of the two-way transformer and the upscaling's LayerNorm2d get a faster form."""
    require_export_extra()
    import torch

    from triton_sam.export.fast_mask_decoder import fast_mask_decoder

    decoder, _ = _sam2_decoder(torch)
    with fast_mask_decoder(decoder):
        patched = {name for name, m in decoder.named_modules() if "forward" in vars(m)}
    assert patched == {
        "transformer.layers.0.cross_attn_token_to_image",
        "transformer.layers.0.cross_attn_image_to_token",
        "transformer.layers.1.cross_attn_token_to_image",
        "transformer.layers.1.cross_attn_image_to_token",
        "transformer.final_attn_token_to_image",
        "output_upscaling.1",
    }
