"""A real gRPC proxy for tests: forwards each unary call's bytes to a Triton server and records the
metadata it came with (Triton's own server side has no interceptor to look at them)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import grpc

from triton_sam.engines.triton_client import CHANNEL_ARGS


class RecordingProxy(grpc.GenericRpcHandler):
    """Forwards every call to `target` ("host:port") as raw bytes, with its `triton*` metadata;
    `calls` holds (method, metadata) of each call in the order they came."""

    def __init__(self, target: str) -> None:
        self.calls: list[tuple[str, dict[str, str]]] = []
        self._lock = threading.Lock()
        self._channel = grpc.insecure_channel(target, options=CHANNEL_ARGS)
        self._server = grpc.server(ThreadPoolExecutor(8), handlers=[self], options=CHANNEL_ARGS)
        self.url = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def service(self, handler_call_details):
        method = handler_call_details.method
        metadata = dict(handler_call_details.invocation_metadata)
        forward = self._channel.unary_unary(method)  # no (de)serializers: bytes in, bytes out

        def behaviour(request: bytes, context: grpc.ServicerContext) -> bytes:
            with self._lock:
                self.calls.append((method.rsplit("/", 1)[-1], metadata))
            try:
                return forward(request, metadata=[(k, v) for k, v in metadata.items() if k.startswith("triton")])
            except grpc.RpcError as error:
                context.abort(error.code(), error.details())

        return grpc.unary_unary_rpc_method_handler(behaviour)

    def infer_calls(self) -> list[dict[str, str]]:
        """The metadata of each inference request so far."""
        with self._lock:
            return [metadata for method, metadata in self.calls if method == "ModelInfer"]

    def close(self) -> None:
        self._server.stop(None)
        self._channel.close()
