"""SAM3's concept request on a Triton server (`TritonEngine.concepts`): the session model runs the
text encoder and the detector next to the image's kept detector maps (no maps sent: 111 MB an
image) and answers every query's box and score and the mask logits only of those scoring above the
floor asked for, each cropped to its box (`server/models/triton_sam_concepts.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .. import contract
from ..errors import ServerModelError
from .base import ImageFeatures

if TYPE_CHECKING:
    from .triton import TritonEngine


def concepts(
    engine: TritonEngine, features: ImageFeatures, tokens: np.ndarray, boxes: np.ndarray, labels: np.ndarray, floor: float
) -> dict[str, np.ndarray]:
    """The session model's answer (`contract.CONCEPT_OUTPUTS`) for the image of `features`, a phrase's
    token ids (int64 [1, 32]) and exemplar boxes ([1, N, 4], labels [1, N]; N may be 0)."""
    arrays = {
        contract.TEXT_TOKENS: np.asarray(tokens, np.int64).reshape(1, -1),
        contract.SCORE_FLOOR: np.array([[floor]], np.float32),
    }
    if np.size(labels):  # none sent where there are none (Triton's tensors have no empty shapes here)
        arrays[contract.EXEMPLAR_BOXES] = np.asarray(boxes, np.float32).reshape(1, -1, 4)
        arrays[contract.EXEMPLAR_LABELS] = np.asarray(labels, np.int64).reshape(1, -1)
    return _asked(engine, features, arrays, list(contract.CONCEPT_OUTPUTS))


def vocabulary(engine: TritonEngine, features: ImageFeatures) -> bytes:
    """The tokenizer's merges file beside the server's concept graphs (`contract.VOCABULARY`), asked
    about the image of `features` (any image the server keeps)."""
    answer = _asked(engine, features, {contract.VOCABULARY_WANTED: np.ones((1, 1), bool)}, [contract.VOCABULARY])
    return answer[contract.VOCABULARY].tobytes()


def _asked(engine: TritonEngine, features: ImageFeatures, arrays: dict, outputs: list[str]) -> dict[str, np.ndarray]:
    """A concept request's `outputs`, with what to do where the server cannot answer it."""
    names = {output["name"] for output in engine.session_config(features.handle).get("output", [])}
    if not set(outputs) <= names:
        raise ServerModelError(_missing(engine, "its model repository was exported before triton-sam served them"))
    try:
        return engine.call(features, arrays, outputs)
    except ServerModelError as error:
        if contract.NO_CONCEPT_GRAPHS in str(error):
            raise ServerModelError(_missing(engine, "its repository has no concept graphs")) from error
        raise


def _missing(engine: TritonEngine, why: str) -> str:
    """What to do where the server cannot answer concept requests, and `why`."""
    return (
        f"{engine.spec.session_name} on {engine.describe()} answers no SAM3 concept requests ({why}): export "
        f"{engine.spec.model_id} again with its concept graphs (`triton-sam export {engine.spec.model_id} --checkpoint "
        f"sam3.pt`, without --no-concepts: {contract.TEXT_ENCODER_FILE} and {contract.DETECTOR_FILE} in "
        f"<repository>/{engine.spec.session_name}/1/{contract.CONCEPTS_DIR}/) and restart the server."
    )
