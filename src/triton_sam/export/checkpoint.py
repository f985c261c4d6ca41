"""Read official checkpoints into official models, refusing files that do not fit."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ..errors import CheckpointError
from ..registry import ModelSpec


def load_checkpoint(model: nn.Module, spec: ModelSpec, checkpoint: Path) -> None:
    """Load an official checkpoint (SAM2: `{"model": state_dict}`; SAM1, MobileSAM: the state dict,
    or micro-sam's layouts of it (`micro_sam_weights`); SAM3: the video model's state dict, read
    into the image model with its tracker (`sam3_image_weights`)) with `weights_only=True` (no pickled code runs),
    refusing one made for another model."""
    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    except Exception as error:
        raise CheckpointError(f"Cannot read checkpoint {checkpoint}: {error}") from error
    weights = state.get("model") if spec.family == "sam2" and isinstance(state, dict) else state
    if not isinstance(weights, dict):
        layout = "a dict with a 'model' state dict" if spec.family == "sam2" else "a state dict"
        raise CheckpointError(f"{checkpoint} is not an official {spec.family} checkpoint (expected {layout}).")
    if spec.family == "sam3":
        weights = sam3_image_weights(weights)
    elif spec.family in ("sam1", "mobile_sam"):
        weights = micro_sam_weights(weights)
    own = model.state_dict()
    problems = {
        "missing": [k for k in own if k not in weights],
        "unexpected": [k for k in weights if k not in own],
        "wrong shape": [k for k, v in weights.items() if k in own and tuple(own[k].shape) != tuple(v.shape)],
    }
    if any(problems.values()):
        details = "; ".join(
            f"{label}: {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}" for label, keys in problems.items() if keys
        )
        raise CheckpointError(f"Checkpoint {checkpoint} does not match {spec.model_id} ({details}). Is it another model size?")
    model.load_state_dict(weights, strict=True)


def micro_sam_weights(state: dict) -> dict:
    """SAM1/MobileSAM weights as micro-sam reads them (`micro_sam.util._load_checkpoint`): a state
    dict as it is, or torch_em's `{"model_state": ..., "decoder_state": ...}` with the SAM's keys
    under `model_state`, each perhaps prefixed "sam." (the decoder is not the SAM's: left out)."""
    if not isinstance(state.get("model_state"), dict):
        return state
    prefix = "sam."
    return {key.removeprefix(prefix): value for key, value in state["model_state"].items()}


def sam3_image_weights(state: dict) -> dict:
    """The image-model-with-tracker weights in an official `sam3.pt` (the video model's state dict,
    possibly under "model"), as sam3's `build_sam3_image_model` reads them: `detector.*` are the
    image model's (backbone, text encoder, detector), `tracker.*` its interactive tracker's."""
    state = state["model"] if isinstance(state.get("model"), dict) else state
    prefixes = {"detector.": "", "tracker.": "inst_interactive_predictor.model."}
    return {new + key[len(old) :]: value for key, value in state.items() for old, new in prefixes.items() if key.startswith(old)}


def with_weights(build: Callable[[], nn.Module], spec: ModelSpec, checkpoint: Path | None, seed: int | None) -> nn.Module:
    """`build()` an official model with random weights drawn from `seed`, or a checkpoint's weights."""
    if seed is not None:
        torch.manual_seed(seed)
    model = build()
    if checkpoint is not None:
        load_checkpoint(model, spec, checkpoint)
    return model
