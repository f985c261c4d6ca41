"""The session model's concept requests run in this process as in `test_python_model`, on both
feature stores (numpy arrays; slot buffers, whose detector reads the maps in their slots): the
answer is the local detector's, cropped (tests/synthetic_concepts.py's graphs)."""

from __future__ import annotations

import numpy as np
import pytest
import test_python_model
from test_python_model import _encode, _Request, _session_model

from synthetic_concepts import BRIGHT, MEDIUM, blob_image
from triton_sam import contract
from triton_sam.concepts import ConceptProcessor
from triton_sam.engines.local import LocalEngine
from triton_sam.image import encoder_input
from triton_sam.registry import get_model
from triton_sam.repository import locate

SAM3 = get_model("sam3_tracker")
backend_utils, python_model = test_python_model.backend_utils, test_python_model.python_model  # its fixtures


@pytest.mark.parametrize("buffers", ["off", "on"])
def test_the_answer_is_the_local_detectors_cropped_with_or_without_exemplars(python_model, concepts_repository, buffers):
    model = _session_model(python_model, concepts_repository, buffers, spec=SAM3)
    exported = locate(SAM3, concepts_repository)
    local = ConceptProcessor(LocalEngine(exported, detector_maps=True), exported.concepts_dir)
    image = encoder_input(blob_image(192, {(0, 0): BRIGHT, (3, 1): MEDIUM}), SAM3)
    handle = _encode(model, image)
    tokens = local.detector.tokenizer("cell")
    for exemplars in ([], [([0.25, 0.58, 0.1, 0.1], False)]):
        state = local.set_image(image)
        local.set_text_prompt("cell", state)
        inputs = {contract.TEXT_TOKENS: tokens, contract.SCORE_FLOOR: np.array([[0.5]], np.float32)}
        for box, label in exemplars:
            local.add_geometric_prompt(box, label, state)
            inputs |= {contract.EXEMPLAR_BOXES: np.array([[box]], np.float32), contract.EXEMPLAR_LABELS: np.array([[int(label)]])}
        (answer,) = model.run([_Request(contract.CONCEPT_OUTPUTS, handle=np.array([[handle.encode()]], np.object_), **inputs)])
        assert answer.error is None, answer.error.message
        found, outputs = state["detections"], answer.outputs
        kept = found.queries[found.scores[found.queries] > 0.5]
        assert outputs[contract.CROPPED_QUERIES][0].tolist() == kept.tolist() and len(kept) == 2 - len(exemplars)
        expected = [found.crops[list(found.queries).index(query)] for query in kept]
        assert (outputs[contract.MASK_CROPS][0] == np.concatenate([crop.reshape(-1) for crop in expected])).all()
        assert (outputs[contract.QUERY_BOXES][0] == found.boxes).all() and outputs[contract.MASK_CROP_BOXES].shape == (
            1,
            len(kept),
            4,
        )
