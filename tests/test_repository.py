import json
import subprocess
import sys

import pytest

from synthetic import write_repository
from triton_sam import contract
from triton_sam.errors import ModelFileError, ModelNotFoundError
from triton_sam.registry import get_model
from triton_sam.repository import (
    ENV_MODEL_REPOSITORY,
    default_model_repository,
    exported_models,
    locate,
    user_model_repository,
    working_folder_note,
)

TINY = get_model("sam2.1_hiera_tiny")
SMALL = get_model("sam2.1_hiera_small")


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


def _line(spec, state: str) -> str:
    """`triton-sam models`' line for `spec` in `state`."""
    return f"{spec.model_id:24s} {state:26s} {spec.description}\n"


def _models_listing(repository) -> str:
    command = [sys.executable, "-m", "triton_sam.cli", "models", "--model-repository", str(repository)]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def test_random_weight_exports_are_marked_in_models_and_the_engine(tmp_path):
    """`--random-init` exports make noise, not masks: `triton-sam models` and the engine's status say
    so. Their seed names their weights, for the disk cache as a checkpoint's hash does."""
    from triton_sam.engines.local import LocalEngine

    write_repository(TINY, tmp_path)
    listed = _models_listing(tmp_path)
    assert _line(TINY, "exported") in listed and "Random" not in listed
    assert not locate(TINY, tmp_path).random_weights and "random" not in LocalEngine(locate(TINY, tmp_path)).describe()
    _set_metadata(tmp_path, checkpoint="random-init", seed=0)  # as `export --random-init` writes it
    listed = _models_listing(tmp_path)
    assert _line(TINY, "exported, random weights") in listed
    assert "Random weights: the interface works, the masks are noise." in listed
    assert "random weights: masks are noise" in LocalEngine(locate(TINY, tmp_path)).describe()
    assert locate(TINY, tmp_path).weights_id == f"{TINY.model_id}-seed-0"  # the disk cache keeps their features under it


def test_an_export_under_the_previous_contract_is_refused_with_how_to_export_again(tmp_path):
    """One contract version: exports written before it (contract 2) are not sniffed for what they
    can do, one message says to export them again."""
    write_repository(TINY, tmp_path)
    _set_metadata(tmp_path, contract_version=2)
    with pytest.raises(ModelFileError, match=r"contract version 2; this triton-sam needs 3\. Export it again") as refused:
        locate(TINY, tmp_path)
    assert f"triton-sam export {TINY.model_id} --checkpoint PATH" in str(refused.value)
    assert exported_models(tmp_path) == []


def _default_in(folder, monkeypatch, env=None):
    """`default_model_repository()` and `triton-sam models`' first line, started in `folder`."""
    monkeypatch.chdir(folder)
    if env is None:
        monkeypatch.delenv(ENV_MODEL_REPOSITORY, raising=False)
    else:
        monkeypatch.setenv(ENV_MODEL_REPOSITORY, str(env))
    command = [sys.executable, "-m", "triton_sam.cli", "models"]
    listed = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return default_model_repository(), listed


def test_the_default_repository_is_the_users_own_wherever_a_command_starts(tmp_path, monkeypatch):
    """Issue #40: one repository per user (`$TRITON_SAM_MODEL_REPOSITORY` wins; an old
    `./model_repository` with exported models is still used, with a note); `triton-sam models`
    says which folder it checked, and with nothing there, how to fill it."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    users = tmp_path / "data" / "triton-sam" / "model_repository"
    assert user_model_repository() == users
    elsewhere, project = tmp_path / "elsewhere", tmp_path / "project"
    for folder in (elsewhere, project / "model_repository"):
        folder.mkdir(parents=True)

    repository, listed = _default_in(elsewhere, monkeypatch)
    assert repository == users and listed.startswith(f"Model repository: {users}\n{_line(TINY, 'not exported')}")
    assert f"None exported yet. Run `triton-sam setup {TINY.model_id} --output {users}`" in listed

    repository, listed = _default_in(project, monkeypatch)  # an empty ./model_repository (as the checkout has)
    assert repository == users and "note:" not in listed

    write_repository(TINY, users)
    repository, listed = _default_in(elsewhere, monkeypatch)
    assert repository == users and _line(TINY, "exported") in listed and "None exported" not in listed

    write_repository(SMALL, project / "model_repository")  # exported where earlier versions exported
    repository, listed = _default_in(project, monkeypatch)
    assert repository == project / "model_repository"
    note, where, *_ = listed.splitlines()
    assert note == working_folder_note(repository) and str(users) in note and ENV_MODEL_REPOSITORY in note
    assert where == f"Model repository: {repository}" and _line(SMALL, "exported") in listed

    chosen = tmp_path / "chosen"
    for folder in (elsewhere, project):  # the environment wins everywhere
        repository, listed = _default_in(folder, monkeypatch, env=chosen)
        assert repository == chosen and listed.startswith(f"Model repository: {chosen}\n")


def test_a_missing_model_names_the_folder_and_the_command_that_fills_it(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_MODEL_REPOSITORY, str(tmp_path / "models"))
    with pytest.raises(ModelNotFoundError) as missing:
        locate(TINY)
    said = str(missing.value)
    assert f"not exported in {tmp_path / 'models'}" in said
    assert f"`triton-sam setup {TINY.model_id} --output {tmp_path / 'models'}`" in said
