import json
import subprocess
import sys

import pytest

from synthetic import write_repository
from triton_sam import contract
from triton_sam.errors import ModelFileError, ModelNotFoundError
from triton_sam.registry import get_model
from triton_sam.repository import EXPORT_REVISION, exported_models, locate

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


def _set_metadata(repository, **changes) -> None:
    """Change both exported graphs' metadata, as an export with other options would have written it."""
    for component in (TINY.encoder_name, TINY.decoder_name):
        meta_path = repository / component / contract.METADATA_FILE
        meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), **changes}))


def _models_listing(repository) -> str:
    command = [sys.executable, "-m", "triton_sam.cli", "models", "--model-repository", str(repository)]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def test_random_weight_exports_are_marked_in_models_and_the_engine(tmp_path):
    """`--random-init` exports make noise, not masks: `triton-sam models` and the engine's status say so."""
    from triton_sam.engines.local import LocalEngine

    write_repository(TINY, tmp_path)
    listed = _models_listing(tmp_path)
    assert f"{TINY.model_id:28s} exported\n" in listed
    assert not locate(TINY, tmp_path).random_weights and "random" not in LocalEngine(locate(TINY, tmp_path)).describe()
    _set_metadata(tmp_path, checkpoint="random-init", seed=0)  # as `export --random-init` writes it
    listed = _models_listing(tmp_path)
    assert f"{TINY.model_id:28s} exported (random weights: the interface works, masks are noise)" in listed
    assert "random weights: masks are noise" in LocalEngine(locate(TINY, tmp_path)).describe()


def test_exports_by_older_export_code_still_load_and_models_says_to_export_again(tmp_path):
    """Same contract, older graphs (before `export_revision`): they work; `models` names the gain of a new export."""
    write_repository(TINY, tmp_path)
    for component in (TINY.encoder_name, TINY.decoder_name):
        meta_path = tmp_path / component / contract.METADATA_FILE
        meta = json.loads(meta_path.read_text())
        del meta["export_revision"]
        meta_path.write_text(json.dumps(meta))
    assert locate(TINY, tmp_path).export_revision == 1 < EXPORT_REVISION
    assert exported_models(tmp_path) == [TINY.model_id]
    assert "by an older triton-sam: export it again for a faster decoder and smaller hover answers" in _models_listing(tmp_path)
    _set_metadata(tmp_path, export_revision=EXPORT_REVISION)
    assert f"{TINY.model_id:28s} exported\n" in _models_listing(tmp_path)
