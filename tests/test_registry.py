import pytest

from triton_sam.errors import ModelNotFoundError
from triton_sam.registry import MODELS, get_model


def test_sam21_models_are_registered_with_checkpoints_and_hashes():
    assert {"sam2.1_hiera_tiny", "sam2.1_hiera_small", "sam2.1_hiera_base_plus", "sam2.1_hiera_large"} <= set(MODELS)
    for spec in MODELS.values():
        assert spec.url.startswith("https://") and spec.url.endswith(spec.checkpoint_filename)
        assert len(spec.sha256) == 64 and int(spec.sha256, 16) >= 0
        assert spec.encoder_name == f"{spec.model_id}_encoder" and spec.decoder_name == f"{spec.model_id}_decoder"


def test_config_names_exist_in_the_sam2_package():
    sam2 = pytest.importorskip("sam2")
    from importlib.resources import files

    for spec in MODELS.values():
        assert files(sam2).joinpath(spec.config).is_file(), spec.config


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(ModelNotFoundError, match="sam2.1_hiera_tiny"):
        get_model("sam9")
