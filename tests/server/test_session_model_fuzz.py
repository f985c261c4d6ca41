"""Malformed requests sent straight to the session model: each gets an error, the server keeps serving."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.utils import InferenceServerException

from synthetic import disk_image
from triton_sam import Predictor, contract
from triton_sam.registry import get_model

TINY = get_model("sam2.1_hiera_tiny")
OUTPUTS = (*contract.DECODER_OUTPUTS, contract.SINGLE_MASK_CROP, contract.MULTI_MASK_CROP, contract.CROP_BOX, contract.KEPT_KEYS)
DTYPES = {"FP32": np.float32, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16, "UINT8": np.uint8, "BOOL": np.bool_}


def _tensor(name: str, array: np.ndarray) -> grpcclient.InferInput:
    datatype = "BYTES" if array.dtype == np.object_ else next(k for k, v in DTYPES.items() if v == array.dtype)
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


@st.composite
def malformed_requests(draw):
    """Decode requests with random batch/point counts, dtypes, handles, values (NaN and huge too),
    mask inputs by value or by keys the server does not keep, crop thresholds, and outputs asked for."""
    batch = draw(st.integers(1, 3))
    points = draw(st.integers(0, 4))
    coord_batch = draw(st.sampled_from([batch, batch + 1]))
    values = st.floats(allow_nan=True, allow_infinity=True, width=32)
    coords = np.array(draw(st.lists(values, min_size=coord_batch * points * 2, max_size=coord_batch * points * 2)), np.float32)
    coords = coords.reshape(coord_batch, points, 2).astype(draw(st.sampled_from([np.float32, np.float16])))
    labels = np.array(draw(st.lists(st.integers(-5, 5), min_size=coord_batch * points, max_size=coord_batch * points)), np.int32)
    labels = labels.reshape(coord_batch, points).astype(draw(st.sampled_from([np.int32, np.int64])))
    handle = draw(st.sampled_from(["known", "unknown", "empty"]))
    inputs = {contract.POINT_COORDS: coords, contract.POINT_LABELS: labels, "_handle": (handle, batch)}
    if draw(st.booleans()):
        side = draw(st.sampled_from([256, 64]))
        inputs[contract.MASK_INPUT] = np.zeros((batch, 1, side, side), np.float32)
    if draw(st.booleans()):  # logits by key: unknown, empty, or one too many
        key = draw(st.sampled_from([b"0" * 32, b""]))
        inputs[contract.MASK_INPUT_KEY] = np.array([[key]] * draw(st.sampled_from([batch, batch + 1])), dtype=np.object_)
    for flag in (contract.KEEP_LOGITS, contract.BEST_OF_MULTIMASK):
        if draw(st.booleans()):
            inputs[flag] = np.array([[draw(st.booleans())]] * batch, np.bool_)
    if draw(st.booleans()):
        thresholds = draw(st.lists(values, min_size=batch, max_size=batch + 1))
        inputs[contract.CROP_THRESHOLD] = np.array(thresholds, np.float32)[:, None]
    if draw(st.booleans()):
        del inputs[draw(st.sampled_from([contract.POINT_COORDS, contract.POINT_LABELS]))]
    inputs["_outputs"] = draw(st.lists(st.sampled_from(OUTPUTS), unique=True))  # none: every output
    return inputs


@pytest.fixture(scope="module")
def known_handle(synthetic_server):
    with Predictor(backend="triton", url=synthetic_server.grpc_url) as predictor:
        predictor.set_image(disk_image(100, 100, [(50, 50, 20)]))
        return predictor.get_image_embedding().handle


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=malformed_requests())
def test_the_server_answers_every_malformed_request_and_keeps_serving(synthetic_server, known_handle, request):
    client = grpcclient.InferenceServerClient(synthetic_server.grpc_url)
    kind, batch = request.pop("_handle")
    outputs = request.pop("_outputs")
    value = {"known": known_handle, "unknown": "0" * 32, "empty": ""}[kind]
    tensors = [_tensor(contract.HANDLE, np.array([[value.encode()]] * batch, dtype=np.object_))]
    tensors += [_tensor(name, array) for name, array in request.items()]
    try:
        asked = [grpcclient.InferRequestedOutput(name) for name in outputs] or None
        result = client.infer(TINY.session_name, tensors, outputs=asked, client_timeout=10)
        answered = [result.as_numpy(name) for name in outputs or OUTPUTS]
        assert all(array.shape[0] == batch for array in answered if array is not None)  # for each prompt set
    except InferenceServerException as error:
        assert error.status() != "StatusCode.DEADLINE_EXCEEDED", error  # an answer, not a hang
        assert error.message()
    finally:
        client.close()
    assert _still_serves(synthetic_server.grpc_url, known_handle)


def _still_serves(url: str, handle: str) -> bool:
    client = grpcclient.InferenceServerClient(url)
    try:
        tensors = [
            _tensor(contract.HANDLE, np.array([[handle.encode()]], dtype=np.object_)),
            _tensor(contract.POINT_COORDS, np.array([[[512.0, 512.0]]], np.float32)),
            _tensor(contract.POINT_LABELS, np.array([[1]], np.int32)),
        ]
        return client.infer(TINY.session_name, tensors, client_timeout=10).as_numpy(contract.SINGLE_MASK).shape == (
            1,
            1,
            256,
            256,
        )
    finally:
        client.close()
