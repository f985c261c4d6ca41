"""Export models into a Triton model repository (ONNX files, config.pbtxt, metadata).

Only this package imports torch, and only when an export runs.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path
from types import ModuleType

import onnx
from onnx import TensorProto, helper

from .. import __version__, contract
from ..download import file_sha256
from ..engines.graph_decoder import copy_graphs
from ..errors import InvalidInputError
from ..registry import ModelSpec
from ..repository import ENCODER_FP16, ENCODER_FP32, concepts_path, onnx_path, video_path, write_metadata
from ..server.models import write_python_model
from ..server.models.triton_sam_video import SETTINGS_FILE, has_video_graphs
from .triton_config import SESSION_CACHE_SIZE, decoder_config, encoder_config, session_config


def _metadata(spec: ModelSpec, component: str, **extra) -> dict:
    return {
        "model_id": spec.model_id,
        "component": component,
        "contract_version": contract.CONTRACT_VERSION,
        "triton_sam_version": __version__,
        **extra,
    }


def _family_module(spec: ModelSpec) -> ModuleType:
    """The export code of `spec`'s family (imports torch and the official package)."""
    if spec.family == "sam2":
        from . import sam2_onnx

        return sam2_onnx
    if spec.family in ("sam1", "mobile_sam"):
        from . import sam1_onnx

        return sam1_onnx
    if spec.family == "sam3":
        from . import sam3_onnx

        return sam3_onnx
    raise InvalidInputError(f"Export of {spec.family} models is not supported.")


GATHER_FILE = contract.GATHER_FILE  # the session model's graph that gathers rows of its feature buffers


def gather_graph(spec: ModelSpec) -> onnx.ModelProto:
    """`<name>_slots` [N, C, H, W] for each feature map and `rows` int64 [B] -> `<name>` [B, C, H, W]."""
    nodes, inputs, outputs = [], [], []
    for name, shape in spec.feature_shapes.items():
        nodes.append(helper.make_node("Gather", [f"{name}_slots", "rows"], [name], axis=0))
        inputs.append(helper.make_tensor_value_info(f"{name}_slots", TensorProto.FLOAT, ["N", *shape]))
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["B", *shape]))
    inputs.append(helper.make_tensor_value_info("rows", TensorProto.INT64, ["B"]))
    graph = helper.make_graph(nodes, "triton_sam_gather_features", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def write_session_model(spec: ModelSpec, output: Path, cache_size: int = SESSION_CACHE_SIZE) -> Path:
    """Write the python-backend session model of `spec` (it runs the encoder and decoder files)."""
    model_dir = Path(output) / spec.session_name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    write_python_model(model_dir / "1")
    onnx.save(gather_graph(spec), model_dir / "1" / GATHER_FILE)
    for graph, name in zip(copy_graphs(spec), contract.GRAPH_COPY_FILES):
        onnx.save(graph, model_dir / "1" / name)
    video = video_path(output, spec)
    video_settings = json.loads((video / SETTINGS_FILE).read_text()) if has_video_graphs(video) else None
    (model_dir / "config.pbtxt").write_text(session_config(spec, cache_size, video_settings))
    write_metadata(model_dir, _metadata(spec, "session"))
    return model_dir / "1" / "model.py"


def export_model(
    spec: ModelSpec,
    output: Path,
    checkpoint: Path | None = None,
    seed: int | None = None,
    decoder: Path | None = None,
    tensorrt: bool = False,
    progress=print,
    external_data: bool | None = None,
    half: bool = False,
    concepts: bool = True,
) -> list[Path]:
    """Export `spec` with a checkpoint's weights, or random weights from `seed`, into `output`.

    `half` exports the encoder's backbone in float16 (for GPUs: faster, masks measured against
    the float32 official predictor in BENCHMARKS.md); its inputs and outputs stay as the contract says.

    A model with micro-sam's instance-segmentation decoder gets it beside its session model: from
    `decoder` (micro-sam's `*_decoder.pt`), else from a checkpoint that holds a "decoder_state",
    else random from `seed`.

    SAM3 gets its concept graphs (text encoder, detector; `triton_sam.concepts`) from the same
    weights beside its session model, unless `concepts` is False (an earlier export's are removed either way).

    Each Triton model directory is written next to its final place and moved in only when
    complete, so an interrupted export never leaves a model that looks usable. The encoder's
    weights go to an external file when it is too large for one ONNX file (`external_data=None`),
    or as `external_data` says.
    """
    if (checkpoint is None) == (seed is None):
        raise ValueError("Give exactly one of checkpoint and seed.")
    if decoder is not None and spec.decoder_url is None:
        raise InvalidInputError(f"{spec.model_id} has no instance-segmentation decoder; leave out the decoder file.")
    family = _family_module(spec)
    model = family.build_model(spec, checkpoint=checkpoint, seed=seed)
    source = {"checkpoint_sha256": file_sha256(checkpoint)} if checkpoint else {"checkpoint": "random-init", "seed": seed}
    weights = {**source, "encoder_precision": ENCODER_FP16 if half else ENCODER_FP32}
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(concepts_path(output, spec), ignore_errors=True)  # an earlier export's, from its weights
    with ExitStack() as moved_in_last:  # the concept graphs, once their session model is complete
        concept_files = []
        if spec.family == "sam3":
            if concepts:
                staging = moved_in_last.enter_context(_staging(output, concepts_path(output, spec)))
                concept_files = _export_concepts(family, model, spec, staging, source, progress)
            # The text encoder and detector let go: the encoder's export then peaks ~1.9 GB lower
            model = family.tracker_of(model)
        written = _export_graphs(family, model, spec, output, weights, external_data, half, tensorrt, progress)
        if spec.family == "sam2":  # before the session model, whose config then offers volumes
            from .sam2_video_onnx import export_video

            progress(f"Exporting {spec.model_id} video graphs ...")
            with _staging(output, video_path(output, spec)) as directory:
                video_files = export_video(model, spec, directory)
            written += [video_path(output, spec) / path.name for path in video_files]
        written.append(write_session_model(spec, output))
    written += [concepts_path(output, spec) / path.name for path in concept_files]
    return written + _export_instance_decoder(spec, output, checkpoint, seed, decoder, progress)


def _export_graphs(
    family: ModuleType, model, spec: ModelSpec, output: Path, weights: dict, external_data, half: bool, tensorrt: bool, progress
) -> list[Path]:
    """The encoder's and decoder's Triton model directories, each moved into `output` once complete."""
    written = []
    components = (
        ("encoder", spec.encoder_name, partial(family.export_encoder, external_data=external_data, half=half), encoder_config),
        ("decoder", spec.decoder_name, family.export_decoder, decoder_config),
    )
    for component, name, export_onnx, config in components:
        progress(f"Exporting {spec.model_id} {component} ...")
        with _staging(output, output / name) as directory:
            target = onnx_path(directory.parent, name)
            target.parent.mkdir(parents=True)
            export_onnx(model, spec, target)
            (directory / "config.pbtxt").write_text(config(spec, tensorrt=tensorrt))
            write_metadata(directory, _metadata(spec, component, **weights))
        written.append(onnx_path(output, name))
    return written


def _export_instance_decoder(
    spec: ModelSpec, output: Path, checkpoint: Path | None, seed: int | None, decoder: Path | None, progress
) -> list[Path]:
    """The instance decoder of `spec`, if it has one, from the first source `export_model` names."""
    if spec.decoder_url is None:
        return []
    from . import instance_decoder_onnx

    if decoder is None and checkpoint is not None and instance_decoder_onnx.holds_decoder_state(checkpoint):
        decoder = checkpoint
    if decoder is None and seed is None:
        progress(f"No instance-segmentation decoder exported: give micro-sam's {spec.decoder_filename} with --decoder.")
        return []
    progress(f"Exporting {spec.model_id} instance decoder ...")
    if decoder is not None:
        return [instance_decoder_onnx.export_instance_decoder(spec, decoder, output)]
    return [instance_decoder_onnx.export_random_instance_decoder(spec, seed, output)]


def _export_concepts(family: ModuleType, model, spec: ModelSpec, directory: Path, source: dict, progress) -> list[Path]:
    """SAM3's concept graphs of `model` into `directory` (their place: `repository.concepts_path`)."""
    progress(f"Exporting {spec.model_id} concept graphs (text encoder, detector) ...")
    written = family.export_concepts(model, directory)
    write_metadata(directory, _metadata(spec, "concepts", **source))
    return written


@contextmanager
def _staging(output: Path, final: Path) -> Iterator[Path]:
    """A scratch directory in `output` to write `final` into, moved to `final` if the block completes."""
    with tempfile.TemporaryDirectory(dir=output, prefix=f".{final.name}.") as scratch:
        directory = Path(scratch) / final.name
        yield directory
        if final.exists():
            shutil.rmtree(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        directory.rename(final)
