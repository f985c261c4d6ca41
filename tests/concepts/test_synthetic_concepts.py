"""The synthetic concept graphs (tests/synthetic_concepts.py) behave as the GUI tests rely on,
through `ConceptProcessor` on the local engine with its detector maps, found by `repository.locate`."""

from __future__ import annotations

import numpy as np
import pytest

from synthetic_concepts import BRIGHT, DIM, MEDIUM, blob_image
from triton_sam import contract
from triton_sam.concepts import ConceptProcessor
from triton_sam.engines.local import LocalEngine
from triton_sam.registry import get_model
from triton_sam.repository import locate

SIZE = 240
BLOBS = {(0, 0): BRIGHT, (0, 2): BRIGHT, (2, 2): MEDIUM, (4, 4): DIM}


@pytest.fixture(scope="module")
def processor(concepts_repository) -> ConceptProcessor:
    exported = locate(get_model("sam3_tracker"), concepts_repository)
    return ConceptProcessor(LocalEngine(exported, detector_maps=True), exported.concepts_dir)


def centres(state: dict) -> set[tuple[int, int]]:
    """The grid cells (row, column) of the instances found."""
    return {(int(y1 + y0) * 3 // SIZE, int(x1 + x0) * 3 // SIZE) for x0, y0, x1, y1 in state["boxes"]}


def test_a_phrase_finds_the_bright_blobs_a_threshold_and_exemplars_change_which(processor):
    state = processor.set_image(blob_image(SIZE, BLOBS))
    found = processor.set_text_prompt("blob", state)
    assert centres(found) == {(0, 0), (0, 2), (2, 2)} and found["masks"][:, 0, 20, 20].tolist() == [True, False, False]
    other = processor.set_text_prompt("nucleus", {**state})["scores"]
    assert not np.allclose(other, found["scores"])  # the phrase counts
    runs = processor.detector_runs
    assert centres(processor.set_confidence_threshold(0.95, state)) == {(0, 0), (0, 2)} and processor.detector_runs == runs
    processor.set_confidence_threshold(0.5)
    more = processor.add_geometric_prompt([0.75, 0.75, 0.125, 0.125], True, state)  # the dim blob: more like this
    assert centres(more) == {(0, 0), (0, 2), (2, 2), (4, 4)}
    fewer = processor.add_geometric_prompt([5 / 12, 5 / 12, 0.125, 0.125], False, state)  # the medium one: not this
    assert centres(fewer) == {(0, 0), (0, 2), (4, 4)}


def test_on_the_cpu_a_detector_run_gives_its_arena_back(processor, monkeypatch):
    """The detector's peak (~0.5 GB for SAM3) is not held between Find requests (a click each)."""
    import onnxruntime as ort

    released = []
    run = ort.InferenceSession.run

    def recorded(session, names, feeds, run_options=None):
        if list(names) == list(contract.DETECTOR_OUTPUTS):
            entry = "memory.enable_memory_arena_shrinkage"
            released.append(run_options is not None and run_options.get_run_config_entry(entry) == "cpu:0")
        return run(session, names, feeds, run_options)

    monkeypatch.setattr(ort.InferenceSession, "run", recorded)
    processor.set_text_prompt("blob", processor.set_image(blob_image(SIZE, BLOBS)))
    assert released == [True]
