"""The shipped HAProxy configuration in front of three real Triton servers: each image's requests
reach one server (the one holding its features), images spread over the servers, and a stopped
server's images move to the others while the rest stay where they were."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from benchmarks.balancer import Balancer
from conftest import require_haproxy, start_server
from synthetic import disk_image
from triton_sam import contract
from triton_sam.engines import TritonConnection
from triton_sam.engines.triton import TritonEngine
from triton_sam.engines.triton_client import infer_inputs
from triton_sam.image import encoder_input
from triton_sam.prompts import model_request
from triton_sam.registry import get_model
from triton_sam.server.local import LocalTritonServer

SESSION = get_model("sam2.1_hiera_tiny").session_name
IMAGES = 24
OUTCOMES = ("encoded", "decoded")  # of the session model's requests, counted per server


def wait_for(balancer: Balancer, expected: dict[str, str]) -> None:
    try:
        balancer.wait_for(expected)
    except TimeoutError as error:
        pytest.fail(str(error))


@pytest.fixture(scope="module")
def servers(synthetic_repository):
    started: dict[str, LocalTritonServer] = {}
    try:
        for name in ("triton-0", "triton-1", "triton-2"):
            started[name] = start_server(synthetic_repository)
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(scope="module")
def balancer(servers, tmp_path_factory):
    require_haproxy()
    with Balancer(tmp_path_factory.mktemp("haproxy"), servers) as balancer:
        wait_for(balancer, dict.fromkeys(servers, "UP L7OK"))
        yield balancer


def image(index: int) -> np.ndarray:
    return np.full((1, 32, 48, 3), index, np.uint8)


def signature(pixels: np.ndarray) -> str:
    return hashlib.sha256(pixels.tobytes()).hexdigest()[:32]


def encode_and_decode(client: grpcclient.InferenceServerClient, pixels: np.ndarray) -> None:
    """An image's encode then a click on it, both carrying its signature: the click finds the
    features only on the server that encoded them (elsewhere it fails with UNKNOWN_HANDLE)."""
    headers = {contract.AFFINITY_HEADER: signature(pixels)}
    encoded = client.infer(SESSION, infer_inputs({contract.ENCODER_INPUT: pixels}), headers=headers, client_timeout=30)
    click = {
        contract.HANDLE: encoded.as_numpy(contract.HANDLE).reshape(1, 1),
        contract.POINT_COORDS: np.array([[[10.0, 10.0]]], np.float32),
        contract.POINT_LABELS: np.array([[1]], np.int32),
    }
    outputs = [grpcclient.InferRequestedOutput(contract.SINGLE_SCORE)]
    client.infer(SESSION, infer_inputs(click), outputs=outputs, headers=headers, client_timeout=30)


def placement(balancer: Balancer, servers: dict[str, LocalTritonServer], indices) -> dict[int, str]:
    """Which server encoded and decoded each image, sent through the balancer (from each server's
    own counters, read before and after each image)."""
    client = grpcclient.InferenceServerClient(balancer.url)
    running = {name: server for name, server in servers.items() if server.is_running()}
    counts = {name: server.session_requests(SESSION) for name, server in running.items()}
    where = {}
    try:
        for index in indices:
            encode_and_decode(client, image(index))
            after = {name: server.session_requests(SESSION) for name, server in running.items()}
            moved = {name: tuple(after[name].get(k, 0) - counts[name].get(k, 0) for k in OUTCOMES) for name in running}
            (where[index],) = [name for name, change in moved.items() if change != (0, 0)]
            assert moved[where[index]] == (1, 1), moved
            counts = after
    finally:
        client.close()
    return where


def test_each_image_stays_on_one_server_and_images_spread(balancer, servers):
    first = placement(balancer, servers, range(IMAGES))
    assert placement(balancer, servers, range(IMAGES)) == first  # again: each image where it was
    per_server = {name: list(first.values()).count(name) for name in servers}
    assert min(per_server.values()) >= IMAGES // 6, per_server  # all used, none far below its third


def test_our_engine_through_the_balancer_finds_each_image_where_it_was_encoded(balancer, servers):
    """The header our client sends keeps every image's decodes on the server that holds its features:
    no decode is answered "unknown handle" (which would cost a re-encode), and the images spread."""
    spec = get_model("sam2.1_hiera_tiny")
    images = [disk_image(96, 128, [(30 + 4 * i, 60, 20)]) for i in range(IMAGES)]
    click = model_request(spec, (96, 128), point_coords=np.array([[40.0, 60.0]], np.float32), point_labels=np.array([1]))
    before = {name: server.session_requests(SESSION) for name, server in servers.items()}
    engine = TritonEngine(spec, TritonConnection(balancer.url))
    try:
        for features in [engine.encode(encoder_input(pixels, spec)) for pixels in images]:
            engine.decode(features, click)
            engine.decode(features, click)
        assert engine.reencodes == 0
    finally:
        engine.close()
    after = {name: server.session_requests(SESSION) for name, server in servers.items()}
    change = {name: [after[name].get(k, 0) - before[name].get(k, 0) for k in OUTCOMES] for name in servers}
    assert sum(encoded for encoded, _ in change.values()) == IMAGES
    assert all(decoded == 2 * encoded and encoded >= IMAGES // 6 for encoded, decoded in change.values()), change


def test_a_stopped_server_s_images_move_and_the_others_stay(balancer, servers):
    before = placement(balancer, servers, range(IMAGES))
    servers["triton-1"].stop()
    wait_for(balancer, {"triton-0": "UP L7OK", "triton-1": "DOWN L4CON", "triton-2": "UP L7OK"})
    after = placement(balancer, servers, range(IMAGES))
    moved = {index for index in before if after[index] != before[index]}
    assert moved == {index for index, name in before.items() if name == "triton-1"}
    assert "triton-1" not in after.values()
