import re

import numpy as np
import pytest

from triton_sam.errors import ModelNotFoundError
from triton_sam.registry import MODELS, get_model


def test_models_are_registered_with_checkpoints_and_hashes():
    assert {"sam2.1_hiera_tiny", "sam2.1_hiera_small", "sam2.1_hiera_base_plus", "sam2.1_hiera_large"} <= set(MODELS)
    assert {"sam_vit_b", "sam_vit_l", "sam_vit_h", "mobile_sam", "sam3_tracker"} <= set(MODELS)
    gated = {"sam3_tracker"}  # no hash to check against: the user downloads it (test_download)
    checksum = re.compile(r"sha256:[0-9a-f]{64}|xxh128:[0-9a-f]{32}")
    for spec in MODELS.values():
        assert spec.url.startswith("https://") and (spec.filename or spec.url.endswith(spec.checkpoint_filename))
        assert (spec.checksum is None) == (spec.model_id in gated)
        assert spec.model_id in gated or checksum.fullmatch(spec.checksum)
        assert spec.encoder_name == f"{spec.model_id}_encoder" and spec.decoder_name == f"{spec.model_id}_decoder"
        assert spec.description and spec.source
    filenames = [spec.checkpoint_filename for spec in MODELS.values()]
    assert len(set(filenames)) == len(filenames)  # one checkpoint folder holds them all


MICRO_SAM_MODELS = [
    *(f"vit_{size}_lm" for size in "tbl"),
    *(f"vit_{size}_em_organelles" for size in "tbl"),
    *(f"vit_{size}_histopathology" for size in "blh"),
    "vit_b_medical_imaging",
]


def test_micro_sams_models_are_registered_as_micro_sams_registry_has_them():
    """Names, URLs and xxh128 checksums of the weights and of the instance-segmentation decoder as
    micro-sam's own registry (`micro_sam.util.models()`) gives them; vit_t is MobileSAM's architecture."""
    micro_sam_util = pytest.importorskip("micro_sam.util")
    registry = micro_sam_util.models()
    fine_tunes = {name for name in registry.registry if len(name) > 5 and not name.endswith("_decoder")}
    assert fine_tunes == set(MICRO_SAM_MODELS)
    for model_id in MICRO_SAM_MODELS:
        spec = get_model(model_id)
        assert (spec.url, spec.checksum) == (registry.urls[model_id], registry.registry[model_id])
        decoder = f"{model_id}_decoder"
        assert (spec.decoder_url, spec.decoder_checksum) == (registry.urls[decoder], registry.registry[decoder])
        assert (spec.family, spec.config) == (("mobile_sam", "vit_t") if model_id.startswith("vit_t") else ("sam1", model_id[:5]))
        assert spec.checkpoint_filename == f"{model_id}.pt" and spec.decoder_filename == f"{model_id}_decoder.pt"
    assert get_model("vit_b_lm").description == "light microscopy: cells and nuclei"
    assert get_model("sam_vit_b").decoder_url is None and get_model("sam_vit_b").decoder_filename is None


def test_config_names_exist_in_the_official_packages():
    sam2 = pytest.importorskip("sam2")
    from importlib.resources import files

    from mobile_sam import sam_model_registry as mobile_sam_registry
    from segment_anything import sam_model_registry

    builders = {"sam1": sam_model_registry, "mobile_sam": mobile_sam_registry}
    for spec in MODELS.values():
        if spec.family == "sam3":
            from sam3 import model_builder

            assert callable(getattr(model_builder, spec.config, None)), spec.config
        elif spec.family == "sam2":
            assert files(sam2).joinpath(spec.config).is_file(), spec.config
        else:
            assert spec.config in builders[spec.family], spec.config


@pytest.mark.parametrize(
    "model_id, image_hw, input_hw",
    [
        ("sam2.1_hiera_tiny", (300, 400), (1024, 1024)),
        ("sam_vit_b", (300, 400), (768, 1024)),
        ("sam_vit_b", (1000, 10), (1024, 10)),
        ("mobile_sam", (5, 3), (1024, 614)),
        ("sam3_tracker", (300, 400), (1008, 1008)),
    ],
)
def test_input_size_follows_the_family(model_id, image_hw, input_hw):
    assert get_model(model_id).input_hw(image_hw) == input_hw


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(ModelNotFoundError, match="sam2.1_hiera_tiny"):
        get_model("sam9")


def test_low_res_logits_are_clamped_as_each_familys_official_predictor_clamps_them():
    """What `Predictor` returns and a refinement sends back: SAM2ImagePredictor and SAM3's image
    predictor clamp their low-res logits to +-32, SAM1's and MobileSAM's SamPredictor do not."""
    pytest.importorskip("sam2")
    import inspect
    import re

    from mobile_sam.predictor import SamPredictor as MobileSamPredictor
    from sam2.sam2_image_predictor import SAM2ImagePredictor
    from sam3.model.sam1_task_predictor import SAM3InteractiveImagePredictor
    from segment_anything.predictor import SamPredictor

    def official_clamp(*methods) -> float | None:
        sources = "".join(inspect.getsource(method) for method in methods)
        found = {float(bound) for bound in re.findall(r"clamp\(low_res_masks, -([\d.]+), ", sources)}
        assert len(found) <= 1
        return found.pop() if found else None

    official = {
        "sam2": official_clamp(SAM2ImagePredictor._predict),
        "sam3": official_clamp(SAM3InteractiveImagePredictor._predict),
        "sam1": official_clamp(SamPredictor.predict, SamPredictor.predict_torch),
        "mobile_sam": official_clamp(MobileSamPredictor.predict, MobileSamPredictor.predict_torch),
    }
    assert official["sam2"] == 32.0
    logits = np.linspace(-100, 100, 256 * 256, dtype=np.float32).reshape(1, 256, 256)
    for spec in MODELS.values():
        assert spec.low_res_clamp == official[spec.family], spec.model_id
        clamp = spec.low_res_clamp or np.inf
        np.testing.assert_array_equal(spec.as_mask_input(logits), np.clip(logits, -clamp, clamp))
