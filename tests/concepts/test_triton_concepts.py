"""SAM3 concept requests through a real Triton server (the synthetic concept graphs of
tests/synthetic_concepts.py): `ConceptProcessor` on a Triton engine finds what it finds on the
local engine, to the bit; the slider re-filters without a request; few bytes travel."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import start_server
from synthetic import write_repository
from synthetic_concepts import BRIGHT, DIM, MEDIUM, blob_image
from triton_sam import contract
from triton_sam.concepts import ConceptProcessor
from triton_sam.concepts.processor import MIN_THRESHOLD
from triton_sam.engines import create_engine
from triton_sam.engines.local import LocalEngine
from triton_sam.engines.triton import TritonConnection, TritonEngine
from triton_sam.errors import ServerModelError
from triton_sam.image import encoder_input
from triton_sam.registry import get_model
from triton_sam.repository import locate

SAM3 = get_model("sam3_tracker")
BLOBS = {(0, 0): BRIGHT, (0, 2): BRIGHT, (2, 2): MEDIUM, (4, 4): DIM}
CASES = {  # exemplar boxes (cx, cy, w, h) and labels after the phrase
    "phrase": [],
    "positive": [([0.75, 0.75, 0.125, 0.125], True)],  # the dim blob: more like this
    "negative": [([5 / 12, 5 / 12, 0.125, 0.125], False)],  # the medium one: not this
}


def images() -> dict[str, np.ndarray]:
    """A grayscale plane taller than wide and an RGB one wider than tall (blobs cut at the edges)."""
    wide = blob_image(264, BLOBS)[:180]
    return {"gray": blob_image(240, BLOBS)[:, 30:200], "rgb": np.stack([wide, wide // 2, wide], -1)}


@pytest.fixture(scope="module")
def server(concepts_repository):
    server = start_server(concepts_repository)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def processors(concepts_repository, server):
    """(local, through Triton) processors on the same graphs."""
    exported = locate(SAM3, concepts_repository)
    local = ConceptProcessor(LocalEngine(exported, detector_maps=True), exported.concepts_dir)
    engine = TritonEngine(SAM3, TritonConnection(server.grpc_url))
    yield local, ConceptProcessor(engine, exported.concepts_dir)
    engine.close()


def asked(processor: ConceptProcessor, image: np.ndarray, case: str) -> dict:
    state = processor.set_image(image)
    processor.set_text_prompt("blob", state)
    for box, label in CASES[case]:
        processor.add_geometric_prompt(box, label, state)
    return state


@pytest.mark.parametrize("image_name", ["gray", "rgb"])
def test_triton_finds_what_the_local_processor_finds(processors, image_name):
    """Count, boxes, scores and masks equal to the bit, for a phrase, + a positive, + a negative box."""
    image = images()[image_name]
    for case in CASES:
        ours, theirs = (asked(processor, image, case) for processor in processors)
        assert len(theirs["scores"]) >= 2, case
        for key in ("scores", "boxes", "masks", "masks_logits"):
            assert theirs[key].shape == ours[key].shape and (theirs[key] == ours[key]).all(), (case, key)
        assert theirs["masks"].shape[-2:] == image.shape[:2]


def test_a_client_without_the_merges_file_tokenizes_with_the_server_s_asked_for_once(processors, server):
    """napari on a laptop has no export: the processor asks the server for its tokenizer's merges
    file with the first phrase, then finds what the local processor finds."""
    local, _ = processors
    engine = TritonEngine(SAM3, TritonConnection(server.grpc_url))
    remote = ConceptProcessor(engine)  # no concepts_dir
    image = images()["gray"]
    asked_before = server.session_requests(SAM3.session_name).get("concepts", 0)
    for case in ("phrase", "positive"):
        ours, theirs = asked(local, image, case), asked(remote, image, case)
        assert (theirs["scores"] == ours["scores"]).all() and (theirs["masks"] == ours["masks"]).all(), case
    # one merges file, then a concept request a prompt: the phrase, then the phrase and its box
    assert server.session_requests(SAM3.session_name)["concepts"] - asked_before == 1 + 3
    assert remote.detector.tokenizer.ids == local.detector.tokenizer.ids
    engine.close()


def test_the_slider_refilters_without_a_request_down_to_the_floor(processors, server):
    local, remote = processors
    state = asked(remote, images()["gray"], "positive")
    asked_before, runs = server.session_requests(SAM3.session_name).get("concepts", 0), remote.detector_runs
    for threshold in (0.95, 0.3, MIN_THRESHOLD, 0.7):
        remote.set_confidence_threshold(threshold, state)
        expected = local.set_confidence_threshold(threshold, asked(local, images()["gray"], "positive"))
        assert (state["scores"] == expected["scores"]).all() and (state["masks"] == expected["masks"]).all()
    assert server.session_requests(SAM3.session_name).get("concepts", 0) == asked_before and remote.detector_runs == runs
    remote.set_confidence_threshold(MIN_THRESHOLD / 2, state)  # below the floor sent: asked again
    assert server.session_requests(SAM3.session_name)["concepts"] == asked_before + 1 and remote.detector_runs == runs + 1
    remote.set_confidence_threshold(0.5)
    local.set_confidence_threshold(0.5)


def test_an_answer_is_a_few_crops_not_full_size_masks(processors):
    """Bytes of one concept request's answer against the masks it stands for."""
    _, remote = processors
    image = images()["rgb"]
    state = remote.set_image(image)
    tokens = remote.detector.tokenizer("blob")
    answer = remote.engine.concepts(state["features"], tokens, np.zeros((1, 0, 4), np.float32), np.zeros((1, 0), np.int64), 0.5)
    kept = answer[contract.CROPPED_QUERIES].size
    sent = sum(array.nbytes for array in answer.values())
    full_size = kept * image.shape[0] * image.shape[1] * 4  # float32 masks at the image's size
    detector = answer[contract.QUERY_LOGITS].size * 288 * 288 * 4  # every query's logits as the detector gives them
    print(f"concept request: {sent} bytes answered for {kept} instances; full-size masks {full_size}, all logits {detector}")
    assert kept >= 2 and sent < full_size / 4 and sent < detector / 20


def test_a_server_without_concept_graphs_says_what_to_export(tmp_path):
    repository = write_repository(SAM3, tmp_path / "repo")
    server = start_server(repository)
    try:
        engine = TritonEngine(SAM3, TritonConnection(server.grpc_url))
        features = engine.encode(encoder_input(images()["gray"], SAM3))
        with pytest.raises(ServerModelError, match=f"answers no SAM3 concept requests.*{contract.DETECTOR_FILE}"):
            engine.concepts(features, np.ones((1, 32), np.int64), np.zeros((1, 0, 4)), np.zeros((1, 0)), 0.5)
        assert "concepts" not in server.session_requests(SAM3.session_name)
        engine.close()
    finally:
        server.stop()


def test_auto_finds_on_the_local_engine_once_the_server_is_gone(processors, concepts_repository):
    """`backend="auto"` (the panel's default): a phrase found through its server; the server
    stopped, the same state's next prompts are found by the local engine (the image encoded there
    from the kept input, with its detector maps), as the local processor finds them."""
    local, _ = processors
    server = start_server(concepts_repository)
    engine = create_engine(SAM3, "auto", concepts_repository, url=server.grpc_url, detector_maps=True, retry_s=60.0)
    auto = ConceptProcessor(engine)  # the merges file: the server's, then the local export's
    image = images()["rgb"]
    try:
        state = asked(auto, image, "phrase")
        assert engine.fallback_reason is None and state["features"].on_server and len(state["scores"]) >= 2
    finally:
        server.stop()
    for case in ("positive", "negative"):
        for box, label in CASES[case]:
            found = auto.add_geometric_prompt(box, label, state)
        expected = asked(local, image, case)
        assert (found["scores"] == expected["scores"]).all() and (found["masks"] == expected["masks"]).all(), case
        auto.reset_all_prompts(state)
        auto.set_text_prompt("blob", state)
    assert engine.fallback_reason is not None and "local" in engine.describe()
    engine.close()
