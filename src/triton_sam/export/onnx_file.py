"""Writing exported modules as ONNX files, large ones with their weights in one external file."""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import torch
from torch import nn

from .. import contract
from ..registry import ModelSpec
from .fast_mask_decoder import fast_mask_decoder
from .head_by_head import head_by_head
from .quiet import TRACE, ignoring

OPSET = 18  # Resize with antialias (the encoder's resize)
# Above this, weights go to `model.onnx.data` next to `model.onnx`: protobuf cannot hold 2 GB
# (SAM1 vit_h's encoder is 2.5 GB). ONNX Runtime and Triton find the file through the model.
EXTERNAL_DATA_BYTES = 2**30


def half_copy(module: nn.Module) -> nn.Module:
    """A float16 copy of `module` (the original stays float32: the decoder is exported from it)."""
    return copy.deepcopy(module).half()


def param_dtype(module: nn.Module) -> torch.dtype:
    """The dtype `module` computes in (that of its parameters)."""
    return next(module.parameters()).dtype


def external_data_path(path: Path) -> Path:
    return path.with_name(path.name + ".data")


def export_onnx(
    module: nn.Module,
    args: tuple,
    path: Path,
    inputs: list[str],
    outputs: list[str],
    dynamic: dict,
    external_data: bool | None = None,
) -> None:
    """`torch.onnx.export` to `path`, mask decoders in their faster exact forms and large attentions
    head by head; weights in one external file if larger than `EXTERNAL_DATA_BYTES`
    (`external_data=None`), or as `external_data` says."""
    path = Path(path)
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        exported = Path(scratch) / path.name
        with torch.no_grad(), fast_mask_decoder(module), head_by_head(module), ignoring(TRACE):
            torch.onnx.export(
                module,
                args,
                str(exported),
                input_names=inputs,
                output_names=outputs,
                dynamic_axes=dynamic,
                opset_version=OPSET,
                do_constant_folding=True,
                dynamo=False,
            )
        files = list(Path(scratch).iterdir())  # torch writes one file per weight above 2 GB
        if external_data is None:
            external_data = sum(f.stat().st_size for f in files) > EXTERNAL_DATA_BYTES
        if files == [exported] and not external_data:
            exported.replace(path)
            return
        import onnx

        onnx.save_model(
            onnx.load(str(exported)),
            str(path),
            save_as_external_data=external_data,
            all_tensors_to_one_file=True,
            location=external_data_path(path).name,
        )


def export_decoder_module(
    decoder: nn.Module,
    spec: ModelSpec,
    path: Path,
    points: list,
    labels: list,
    outputs: list[str] | tuple[str, ...] = contract.DECODER_OUTPUTS,
) -> None:
    """Export a decoder wrapper with the contract's inputs and `outputs`; `points`/`labels` are one
    example prompt set (batch and number of points stay dynamic)."""
    low = spec.low_res_size
    features = tuple(torch.randn(1, *shape) for shape in spec.feature_shapes.values())
    prompts = (
        torch.tensor([points], dtype=torch.float32),
        torch.tensor([labels], dtype=torch.int32),
        torch.zeros(1, 1, low, low),
        torch.zeros(1, 1),
    )
    names = [*spec.feature_shapes, *contract.PROMPT_INPUTS]
    dynamic = {name: {0: "batch"} for name in [*names, *outputs]}
    dynamic[contract.POINT_COORDS] = {0: "batch", 1: "points"}
    dynamic[contract.POINT_LABELS] = {0: "batch", 1: "points"}
    export_onnx(decoder.eval(), features + prompts, path, names, list(outputs), dynamic)
