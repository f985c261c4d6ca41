"""A gRPC connection to one Triton server (`TritonClient`) and what it asks the server: which
triton-sam models it serves, a model's config, its version; requests of megabytes sent with one copy."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import raise_error_grpc, service_pb2
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from .. import contract
from ..errors import ServerModelError, ServerUnavailableError
from ..registry import MODELS, ModelSpec
from .connection import ENV_API_KEY, TritonConnection, default_timeout_s
from .infer_request import MODEL_INFER_METHOD, model_infer_request

# Passing channel_args replaces tritonclient's own unlimited message sizes: set them again. Keep
# reconnect backoff short so a restarted server is found again within a second or two.
CHANNEL_ARGS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class TritonClient:
    """A gRPC connection to one Triton server, with the options every call needs (the first
    server where `connection` names several)."""

    def __init__(self, connection: TritonConnection | None = None) -> None:
        connection = connection or TritonConnection()
        self.url = connection.server_urls()[0]
        self.headers = dict(connection.headers)
        api_key = connection.api_key or os.environ.get(ENV_API_KEY)
        if api_key:
            self.headers[contract.API_KEY_GRPC_HEADER] = api_key
        self.timeout_s = connection.timeout_s or default_timeout_s()
        self.grpc = grpcclient.InferenceServerClient(
            self.url, ssl=connection.ssl, root_certificates=connection.root_certificates, channel_args=CHANNEL_ARGS
        )
        self._channel = _channel(self.url, connection)
        self._model_infer = self._channel.unary_unary(
            MODEL_INFER_METHOD, request_serializer=None, response_deserializer=service_pb2.ModelInferResponse.FromString
        )

    def image_headers(self, signature: str) -> dict[str, str]:
        """The headers of a request about one image: its content signature as the affinity header
        (a consistent-hash balancer sends all of an image's requests to one server)."""
        return {**self.headers, contract.AFFINITY_HEADER: signature}

    def unreachable(self, error: Exception) -> ServerUnavailableError:
        return ServerUnavailableError(
            f"Triton server at {self.url} is not answering. Check that it runs (`triton-sam serve`, or the "
            f"Docker deployment) and that the URL and port are right. ({error_message(error)})"
        )

    def session_config(self, spec: ModelSpec) -> dict:
        """The session model's config; raises if the server is down or does not serve `spec`."""
        try:
            ready = self.grpc.is_model_ready(spec.session_name, headers=self.headers, client_timeout=self.timeout_s)
            if not ready:
                offered = ", ".join(served_models(self)) or "none"
                raise ServerModelError(
                    f"Triton at {self.url} does not serve {spec.model_id} (triton-sam models ready there: {offered}). "
                    f"Export it into the server's model repository: `triton-sam setup {spec.model_id}`."
                )
            response = self.grpc.get_model_config(
                spec.session_name, headers=self.headers, as_json=True, client_timeout=self.timeout_s
            )
        except InferenceServerException as error:
            raise self.unreachable(error) from error
        return response["config"]

    def server_version(self) -> tuple[int, ...]:
        """Triton's version, as numbers (empty if the server does not say)."""
        try:
            metadata = self.grpc.get_server_metadata(headers=self.headers, as_json=True, client_timeout=self.timeout_s)
        except InferenceServerException as error:
            raise self.unreachable(error) from error
        return _version_numbers(metadata.get("version", ""))

    def infer_large(
        self,
        model_name: str,
        inputs: dict[str, np.ndarray],
        outputs: list[str],
        timeout_s: float | None,
        headers: dict[str, str] | None = None,
    ) -> grpcclient.InferResult:
        """`grpc.infer` for inputs of megabytes (an image), copied once on the way while Python's
        lock is held, not three times (`infer_request`); raises InferenceServerException as it does.
        `headers`: instead of the client's own."""
        request = model_infer_request(model_name, inputs, outputs)
        try:
            response = self._model_infer(request, metadata=tuple((headers or self.headers).items()), timeout=timeout_s)
        except grpc.RpcError as error:
            raise_error_grpc(error)
        return grpcclient.InferResult(response)

    def close(self) -> None:
        self.grpc.close()
        self._channel.close()


def _channel(url: str, connection: TritonConnection) -> grpc.Channel:
    """A gRPC channel to `url` as tritonclient opens one for `connection` (TLS with its certificate authority)."""
    if not connection.ssl:
        return grpc.insecure_channel(url, options=CHANNEL_ARGS)
    roots = Path(connection.root_certificates).read_bytes() if connection.root_certificates else None
    return grpc.secure_channel(url, grpc.ssl_channel_credentials(root_certificates=roots), options=CHANNEL_ARGS)


def _version_numbers(version: str) -> tuple[int, ...]:
    """(2, 51, 0) for "2.51.0"; the leading numeric parts only."""
    numbers = []
    for part in version.split("."):
        if not part.isdigit():
            break
        numbers.append(int(part))
    return tuple(numbers)


def error_message(error: Exception) -> str:
    if isinstance(error, InferenceServerException):
        return f"{error.status()}: {error.message()}"
    return str(error)


def config_parameter(config: dict, key: str) -> str | None:
    """A string parameter of a model's config (as `get_model_config` answers it), None if absent."""
    return config.get("parameters", {}).get(key, {}).get("string_value")


def served_models(client: TritonClient) -> list[str]:
    """Ids of the triton-sam models whose session model is ready on the server."""
    try:
        index = client.grpc.get_model_repository_index(headers=client.headers, as_json=True, client_timeout=client.timeout_s)
    except InferenceServerException as error:
        raise client.unreachable(error) from error
    ready = {m["name"] for m in index.get("models", []) if m.get("state") == "READY"}
    return [model_id for model_id, spec in MODELS.items() if spec.session_name in ready]


def infer_inputs(arrays: dict[str, np.ndarray]) -> list[grpcclient.InferInput]:
    """gRPC input tensors of named arrays (object arrays of bytes go as BYTES)."""
    inputs = []
    for name, array in arrays.items():
        datatype = "BYTES" if array.dtype == np.object_ else np_to_triton_dtype(array.dtype)
        tensor = grpcclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs
