"""Triton `ModelInfer` requests for inputs of megabytes, serialised with their bytes copied once.

tritonclient copies an input three times while it holds Python's lock (numpy's `tobytes`, the
protobuf field, the serialised message): for a 4096-px image (16 MiB) 35-140 ms in which no other
Python thread runs, napari's GUI thread included. A protobuf message is the concatenation of its
fields, so the request without the inputs' bytes is serialised by protobuf and each input's bytes
are appended as a `raw_input_contents` field: one copy, made by `bytes.join`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from tritonclient.grpc import service_pb2
from tritonclient.utils import np_to_triton_dtype

MODEL_INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
RAW_INPUT_CONTENTS_KEY = bytes([7 << 3 | 2])  # field 7 of ModelInferRequest, length-delimited


def model_infer_request(model_name: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> bytes:
    """The serialised `ModelInferRequest` for `model_name` with numeric `inputs` (sent as raw
    contents, in order) asking for `outputs`."""
    request = service_pb2.ModelInferRequest(model_name=model_name)
    contents: list = []
    for name, array in inputs.items():
        if array.dtype.kind not in "biuf":
            raise ValueError(f"Input {name!r} has dtype {array.dtype}; only numeric arrays go as raw contents.")
        array = np.ascontiguousarray(array)
        request.inputs.add(name=name, datatype=np_to_triton_dtype(array.dtype), shape=array.shape)
        data = memoryview(array).cast("B")
        contents += [RAW_INPUT_CONTENTS_KEY, _varint(data.nbytes), data]
    for name in outputs:
        request.outputs.add(name=name)
    return b"".join([request.SerializeToString(), *contents])


def _varint(value: int) -> bytes:
    """`value` as a protobuf base-128 varint."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
