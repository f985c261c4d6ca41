"""`ConceptProcessor` through a real Triton server finds what `sam3`'s `Sam3Processor` finds (the
session model's concept request: detector maps kept on the server, masks answered cropped), on the
same random-init weights as test_sam3_processor_parity.py, from the exports of the same session
fixture (`sam3_reference`: sam3 is not built again)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_sam3_processor_parity import IMAGES, assert_finds_what_sam3_finds

from conftest import start_server
from triton_sam import contract
from triton_sam.concepts import ConceptProcessor
from triton_sam.engines.triton import TritonConnection, TritonEngine
from triton_sam.export import write_session_model
from triton_sam.export.triton_config import decoder_config, encoder_config
from triton_sam.registry import get_model

pytestmark = pytest.mark.parity

SAM3 = get_model("sam3_tracker")


def repository_of(exports: Path, repository: Path) -> Path:
    """A model repository over the fixture's exports (links, no copies: the encoder is GBs):
    encoder, decoder and the session model with the concept graphs next to it."""
    for component, name, config in (
        ("encoder", SAM3.encoder_name, encoder_config),
        ("decoder", SAM3.decoder_name, decoder_config),
    ):
        version_dir = repository / name / "1"
        version_dir.mkdir(parents=True)
        for file in exports.glob(f"{component}.onnx*"):  # the graph and its external data, by the names it holds
            (version_dir / ("model.onnx" if file.name == f"{component}.onnx" else file.name)).symlink_to(file)
        (version_dir.parent / "config.pbtxt").write_text(config(SAM3))
        metadata = {"model_id": SAM3.model_id, "component": component, "contract_version": contract.CONTRACT_VERSION}
        (version_dir.parent / contract.METADATA_FILE).write_text(json.dumps(metadata | {"checkpoint": "random-init"}))
    write_session_model(SAM3, repository)
    (repository / SAM3.session_name / "1" / contract.CONCEPTS_DIR).symlink_to(exports / contract.CONCEPTS_DIR)
    return repository


@pytest.fixture(scope="module")
def reference(sam3_reference, tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    """(a repository over the fixture's exports, sam3's images and `Sam3Processor`'s results)."""
    with np.load(sam3_reference / "reference.npz") as saved:
        return repository_of(sam3_reference, tmp_path_factory.mktemp("sam3_triton")), dict(saved)


@pytest.fixture(scope="module")
def processor(reference, sam3_reference):
    server = start_server(reference[0])
    engine = TritonEngine(SAM3, TritonConnection(server.grpc_url))
    yield ConceptProcessor(engine, sam3_reference / contract.CONCEPTS_DIR)  # its merges file only
    engine.close()
    server.stop()


@pytest.mark.parametrize("image_name", IMAGES)
def test_instances_through_triton_match_sam3_processor(reference, processor, image_name):
    """As test_sam3_processor_parity's local test: every query (threshold 0: every mask sent), then
    a threshold keeping several, re-filtered without a request."""
    assert_finds_what_sam3_finds(processor, reference[1], image_name)
