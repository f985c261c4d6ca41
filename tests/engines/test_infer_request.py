"""`model_infer_request`: the request protobuf would make, with each input's bytes appended once."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from triton_sam.engines.infer_request import model_infer_request


def test_the_request_parses_as_tritons_with_every_input_in_order():
    image = np.random.default_rng(0).integers(0, 256, (1, 1500, 1100, 3), dtype=np.uint8)  # 4.7 MB: a 4-byte length
    strided = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]  # not contiguous: sent as its values
    labels = np.array([[1, 0]], np.int32)
    sent = model_infer_request("sam_session", {"image": image, "coords": strided, "labels": labels}, ["handle", "x"])

    request = service_pb2.ModelInferRequest.FromString(sent)
    assert request.model_name == "sam_session"
    assert [(i.name, i.datatype, list(i.shape)) for i in request.inputs] == [
        ("image", "UINT8", [1, 1500, 1100, 3]),
        ("coords", "FP32", [4, 3]),
        ("labels", "INT32", [1, 2]),
    ]
    assert [o.name for o in request.outputs] == ["handle", "x"]
    assert list(request.raw_input_contents) == [image.tobytes(), strided.tobytes(), labels.tobytes()]


def test_an_input_of_python_objects_is_refused():
    with pytest.raises(ValueError, match="only numeric arrays"):
        model_infer_request("m", {"handle": np.array([[b"abc"]], dtype=np.object_)}, [])
