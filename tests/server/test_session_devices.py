"""One server driving two devices, the CPU standing in for two GPUs (`TRITON_SAM_DEVICES=2`): images
spread over both, each image's decodes run on the device that encoded it, and a request whose
images lie on both devices answers what a one-device server answers."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import start_server
from triton_sam import contract
from triton_sam.engines.triton_client import infer_inputs
from triton_sam.registry import get_model

SESSION = get_model("sam2.1_hiera_tiny").session_name
IMAGES = 12


@pytest.fixture(scope="module")
def two_devices(synthetic_repository):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(contract.DEVICES_ENV, "2")  # read by the server's python models, started here
        server = start_server(synthetic_repository)
    yield server
    server.stop()


def image(index: int) -> np.ndarray:
    return np.full((1, 32, 48, 3), 7 * index, np.uint8)


def encode(client: grpcclient.InferenceServerClient, pixels: np.ndarray) -> list[bytes]:
    answer = client.infer(SESSION, infer_inputs({contract.ENCODER_INPUT: pixels}), client_timeout=30)
    return list(answer.as_numpy(contract.HANDLE).reshape(-1))


def decode(client: grpcclient.InferenceServerClient, handles: list[bytes]) -> dict[str, np.ndarray]:
    """Every decoder output of one request: a click per handle, each at its own place."""
    click = {
        contract.HANDLE: np.array(handles, np.object_).reshape(-1, 1),
        contract.POINT_COORDS: np.array([[[4.0 + 3 * row, 10.0 + 2 * row]] for row in range(len(handles))], np.float32),
        contract.POINT_LABELS: np.ones((len(handles), 1), np.int32),
    }
    answer = client.infer(SESSION, infer_inputs(click), client_timeout=30)
    return {name: answer.as_numpy(name) for name in contract.DECODER_OUTPUTS}


def change(before: dict, after: dict) -> dict:
    """What each device did between two readings of `device_work`: (encoded, decoded) by device."""
    devices = set(after["encoded"]) | set(after["decoded"])
    return {d: tuple(after[w].get(d, 0) - before[w].get(d, 0) for w in ("encoded", "decoded")) for d in devices}


@pytest.fixture(scope="module")
def placement(two_devices) -> dict[int, str]:
    """The device that encoded each image (from the server's counters, read around each encode),
    after checking that both of its clicks ran there and nowhere else."""
    client = grpcclient.InferenceServerClient(two_devices.grpc_url)
    where = {}
    try:
        for index in range(IMAGES):
            before = two_devices.device_work(SESSION)
            (handle,) = encode(client, image(index))
            decode(client, [handle])
            decode(client, [handle])
            done = {device: work for device, work in change(before, two_devices.device_work(SESSION)).items() if work != (0, 0)}
            (where[index],) = done
            assert done[where[index]] == (1, 2), done
    finally:
        client.close()
    return where


def test_images_spread_over_both_devices_and_each_decode_runs_where_its_features_are(two_devices, placement):
    per_device = {device: list(placement.values()).count(device) for device in ("0", "1")}
    assert min(per_device.values()) >= IMAGES // 4, per_device
    requests = two_devices.session_requests(SESSION)
    assert requests.get("encoded") == IMAGES and requests.get("decoded") == 2 * IMAGES  # no re-encode
    assert "failed" not in requests


def test_a_request_with_images_on_both_devices_answers_as_one_device_does(two_devices, synthetic_server, placement):
    """One encode and one decode request, each with images on both devices (interleaved): the same
    handles and masks as a server with one device; each device decodes its own rows."""
    chosen = [i for d in ("0", "1") for i in [i for i, where in placement.items() if where == d][:2]]
    chosen = [chosen[0], chosen[2], chosen[1], chosen[3]]  # device 0, 1, 0, 1
    pixels = np.concatenate([image(i) for i in chosen])
    answers = []
    for server in (two_devices, synthetic_server):
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            before = server.device_work(SESSION)
            handles = encode(client, pixels)
            answers.append((handles, decode(client, handles), change(before, server.device_work(SESSION))))
        finally:
            client.close()
    (handles, masks, work), (one_handles, one_masks, _) = answers
    assert handles == one_handles
    assert work == {"0": (0, 2), "1": (0, 2)}  # already encoded: nothing encoded again
    for name, expected in one_masks.items():
        np.testing.assert_allclose(masks[name], expected, rtol=1e-5, atol=1e-5, err_msg=name)
