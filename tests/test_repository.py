import json

import pytest

from synthetic import write_repository
from triton_sam import contract
from triton_sam.errors import ModelFileError, ModelNotFoundError
from triton_sam.registry import get_model
from triton_sam.repository import exported_models, locate

TINY = get_model("sam2.1_hiera_tiny")


def test_locate_finds_an_exported_model(synthetic_repository):
    exported = locate(TINY, synthetic_repository)
    assert exported.encoder.is_file() and exported.decoder.is_file()
    assert exported_models(synthetic_repository) == ["sam2.1_hiera_tiny"]


def test_missing_model_says_how_to_get_it(tmp_path):
    with pytest.raises(ModelNotFoundError, match="triton-sam setup sam2.1_hiera_tiny"):
        locate(TINY, tmp_path)
    assert exported_models(tmp_path) == []


def test_other_contract_version_is_refused(tmp_path):
    write_repository(TINY, tmp_path)
    meta_path = tmp_path / TINY.decoder_name / contract.METADATA_FILE
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "contract_version": 999}))
    with pytest.raises(ModelFileError, match="contract version 999"):
        locate(TINY, tmp_path)
