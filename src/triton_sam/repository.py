"""A Triton model repository on disk: where exported models live and what they are.

Layout: `<repo>/<model_id>_encoder/{config.pbtxt, triton_sam.json, 1/model.onnx}` and the same
for `_decoder`. `triton_sam.json` records the model id, contract version and weights used.
One repository per user is the default of `setup`, `export`, `models`, `serve`, the Python API
and the napari panel, wherever they start (`default_model_repository` says which).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from platformdirs import user_data_dir

from . import contract
from .errors import ModelFileError, ModelNotFoundError
from .registry import MODELS, ModelSpec

ENV_MODEL_REPOSITORY = "TRITON_SAM_MODEL_REPOSITORY"
ENCODER_FP32, ENCODER_FP16 = "fp32", "fp16"  # metadata `encoder_precision`
WORKING_FOLDER_REPOSITORY = "model_repository"  # the default of earlier versions, in the working folder


def user_model_repository() -> Path:
    """The user's own repository: `model_repository` in triton-sam's folder of the platform's user
    data (`~/.local/share/triton-sam/model_repository` on Linux, `$XDG_DATA_HOME` if set)."""
    return Path(user_data_dir("triton-sam")) / "model_repository"


def default_model_repository() -> Path:
    """The repository used where none is named: `$TRITON_SAM_MODEL_REPOSITORY`; else
    `./model_repository` of the working folder if it holds exported models (where earlier versions
    exported them: they keep working); else the user's own (`user_model_repository`)."""
    if os.environ.get(ENV_MODEL_REPOSITORY):
        return Path(os.environ[ENV_MODEL_REPOSITORY]).expanduser()
    working_folder_s = _working_folder_repository()
    if working_folder_s is not None and exported_models(working_folder_s):
        return working_folder_s
    return user_model_repository()


def _working_folder_repository() -> Path | None:
    """`./model_repository`, absolute (None when the working folder was deleted)."""
    try:
        return Path.cwd() / WORKING_FOLDER_REPOSITORY
    except FileNotFoundError:
        return None


def working_folder_note(repository: Path) -> str | None:
    """One line saying why `repository` is used when it is the working folder's (None otherwise)."""
    if os.environ.get(ENV_MODEL_REPOSITORY) or Path(repository) != _working_folder_repository():
        return None
    return (
        f"note: using {repository}, which holds exported models; started elsewhere, triton-sam uses "
        f"{user_model_repository()} (move the models there, or set ${ENV_MODEL_REPOSITORY}, for one folder everywhere)."
    )


def onnx_path(repository: Path, triton_name: str) -> Path:
    return Path(repository) / triton_name / "1" / "model.onnx"


def video_path(repository: Path, spec: ModelSpec) -> Path:
    return Path(repository) / spec.session_name / "1" / contract.VIDEO_DIR


def instance_decoder_path(repository: Path, spec: ModelSpec) -> Path:
    """Where the instance-segmentation decoder of `spec` is (next to the session model, outside
    Triton's view: it runs where the features are kept)."""
    return Path(repository) / spec.session_name / "1" / contract.INSTANCE_DECODER_DIR / "model.onnx"


def concepts_path(repository: Path, spec: ModelSpec) -> Path:
    """Where SAM3's concept graphs of `spec` are (text encoder, detector: `contract.CONCEPTS_DIR`,
    next to the session model)."""
    return Path(repository) / spec.session_name / "1" / contract.CONCEPTS_DIR


def write_metadata(model_dir: Path, metadata: dict) -> None:
    (Path(model_dir) / contract.METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")


def read_metadata(model_dir: Path) -> dict | None:
    """The metadata of one exported Triton model, or None if there is none or it is unreadable."""
    try:
        return json.loads((Path(model_dir) / contract.METADATA_FILE).read_text())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class ExportedModel:
    """Encoder and decoder ONNX files of one model, with the metadata written at export."""

    spec: ModelSpec
    encoder: Path
    decoder: Path
    metadata: dict

    @property
    def video_dir(self) -> Path:
        """Where the SAM2 video graphs are (next to the session model that will serve them)."""
        return video_path(self.encoder.parents[2], self.spec)

    @property
    def instance_decoder(self) -> Path | None:
        """The exported instance-segmentation decoder (micro-sam models), or None if there is none."""
        path = instance_decoder_path(self.encoder.parents[2], self.spec)
        return path if path.is_file() else None

    @property
    def concepts_dir(self) -> Path | None:
        """The folder of SAM3's concept graphs (text encoder and detector), or None where this export has none."""
        path = concepts_path(self.encoder.parents[2], self.spec)
        files = (contract.TEXT_ENCODER_FILE, contract.DETECTOR_FILE)
        return path if all((path / name).is_file() for name in files) else None

    @property
    def random_weights(self) -> bool:
        """Exported from random weights (`--random-init`): for tests and benchmarks, masks are noise."""
        return self.metadata.get("checkpoint") == "random-init"

    @property
    def weights_id(self) -> str | None:
        """Names the weights (and encoder precision) behind these files' features; None if unknown."""
        weights = self.metadata.get("checkpoint_sha256") or (f"seed-{self.metadata['seed']}" if "seed" in self.metadata else None)
        if weights is None:
            return None
        precision = self.metadata.get("encoder_precision", ENCODER_FP32)
        return f"{self.spec.model_id}-{weights}" + ("" if precision == ENCODER_FP32 else f"-{precision}")


def setup_hint(spec: ModelSpec, repository: Path) -> str:
    """The commands that export `spec` into `repository`."""
    return (
        f"Run `triton-sam setup {spec.model_id} --output {repository}` (downloads the checkpoint), "
        f"or `triton-sam export {spec.model_id} --checkpoint PATH --output {repository}`."
    )


def locate(spec: ModelSpec, repository: Path | None = None) -> ExportedModel:
    """Find the exported files of `spec`, or explain how to create them."""
    repository = Path(repository) if repository is not None else default_model_repository()
    paths = {}
    metadata = {}
    for component, name in (("encoder", spec.encoder_name), ("decoder", spec.decoder_name)):
        path = onnx_path(repository, name)
        if not path.is_file():
            raise ModelNotFoundError(
                f"Model {spec.model_id} is not exported in {repository} (missing {path}). " + setup_hint(spec, repository)
            )
        meta = read_metadata(path.parent.parent)
        if meta is None or meta.get("model_id") != spec.model_id:
            raise ModelFileError(f"{path.parent.parent} has no valid triton-sam metadata. " + setup_hint(spec, repository))
        if meta.get("contract_version") != contract.CONTRACT_VERSION:
            raise ModelFileError(
                f"{path.parent.parent} was exported for tensor contract version {meta.get('contract_version')}; "
                f"this triton-sam needs {contract.CONTRACT_VERSION}. Export it again: " + setup_hint(spec, repository)
            )
        paths[component] = path
        metadata[component] = meta
    return ExportedModel(spec, paths["encoder"], paths["decoder"], metadata["encoder"])


def exported_models(repository: Path | None = None) -> list[str]:
    """Ids of the models fully exported in `repository` under this contract version."""
    found = []
    for model_id, spec in MODELS.items():
        try:
            locate(spec, repository)
        except (ModelNotFoundError, ModelFileError):
            continue
        found.append(model_id)
    return found
