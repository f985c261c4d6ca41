"""Export models into a Triton model repository (ONNX files, config.pbtxt, metadata).

Only this package imports torch, and only when an export runs.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from .. import __version__, contract
from ..download import file_sha256
from ..errors import InvalidInputError
from ..registry import ModelSpec
from ..repository import onnx_path, write_metadata
from .triton_config import decoder_config, encoder_config


def export_model(
    spec: ModelSpec,
    output: Path,
    checkpoint: Path | None = None,
    seed: int | None = None,
    tensorrt: bool = False,
    progress=print,
) -> list[Path]:
    """Export `spec` with a checkpoint's weights, or random weights from `seed`, into `output`.

    Each Triton model directory is written next to its final place and moved in only when
    complete, so an interrupted export never leaves a model that looks usable.
    """
    if (checkpoint is None) == (seed is None):
        raise ValueError("Give exactly one of checkpoint and seed.")
    if spec.family != "sam2":
        raise InvalidInputError(f"Export of {spec.family} models is not supported yet.")
    from .sam2_onnx import build_model, export_decoder, export_encoder

    model = build_model(spec, checkpoint=checkpoint, seed=seed)
    weights = {"checkpoint_sha256": file_sha256(checkpoint)} if checkpoint else {"checkpoint": "random-init", "seed": seed}
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    written = []
    components = (
        ("encoder", spec.encoder_name, export_encoder, encoder_config),
        ("decoder", spec.decoder_name, export_decoder, decoder_config),
    )
    for component, name, export_onnx, config in components:
        progress(f"Exporting {spec.model_id} {component} ...")
        with tempfile.TemporaryDirectory(dir=output, prefix=f".{name}.") as staging:
            staging = Path(staging)
            target = onnx_path(staging, name)
            target.parent.mkdir(parents=True)
            export_onnx(model, spec, target)
            (target.parent.parent / "config.pbtxt").write_text(config(spec, tensorrt=tensorrt))
            metadata = {
                "model_id": spec.model_id,
                "component": component,
                "contract_version": contract.CONTRACT_VERSION,
                "triton_sam_version": __version__,
                **weights,
            }
            write_metadata(target.parent.parent, metadata)
            final = output / name
            if final.exists():
                shutil.rmtree(final)
            (staging / name).rename(final)
        written.append(onnx_path(output, name))
    return written
