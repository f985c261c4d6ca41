"""Run a model on a Triton server over gRPC; the image embedding stays on the server.

`encode` sends the image (as `image.encoder_input` makes it) once to the session model, copied once
on the way (`infer_request`), and keeps the returned handle;
`decode` sends the handle and the prompts (about 1 KB). A decode can be cancelled for real:
the gRPC call is cancelled, so a queued request is dropped before it runs (by Triton's batcher
queue or by the session model) and a running one is stopped. Servers older than Triton 2.57
(25.04) can crash when a call is cancelled as its answer goes out, so there a cancelled decode
waits for its answer and drops it: each caller keeps at most one call on the server, never a pile
of abandoned ones. If the server lost the embedding (evicted, restarted) the image
is encoded again and the decode retried, without the caller noticing. Decodes whose logits are
used only as masks (`DecodeRequest.logits_above`) get them only around the object. The server
keeps the mask logits of single decodes, so a refinement (the previous logits as `mask_input`)
sends their key instead of 262 KB; where the server forgot them, the logits are sent after all,
or, where only their crop came here, the decode that made them runs again: refinements stay exact.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from .. import contract
from ..errors import DecodeCancelled, ServerBusyError, ServerModelError, ServerUnavailableError
from ..prompts import DecodeRequest
from ..registry import ModelSpec
from ..server.models.triton_sam_arrays import content_signature, uncropped
from .base import CANCEL_ALWAYS, CANCEL_OVERDUE, CancelToken, DecodeResult, Engine, ImageFeatures
from .connection import TritonConnection
from .kept_logits import KeptLogits
from .server_pool import ServerPool
from .triton_client import TritonClient, config_parameter, error_message, infer_inputs
from .triton_concepts import concepts, vocabulary
from .triton_instance import instance_maps
from .triton_requests import prompt_arrays, split_request

if TYPE_CHECKING:
    from ..features import FeatureCache
    from ..video.backend import VideoBackend

T = TypeVar("T")
REENCODE_ATTEMPTS = 3
_UNREACHABLE = ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")
_OVERLOADED = ("Exceeds maximum queue size", "Request timeout expired")  # Triton's queue policy refusals
_UNLOADED = "has no available versions"  # a stopping server unloads its models while it still answers
# Before this version Triton's gRPC frontend can crash (SIGSEGV) when a call is cancelled just as its
# answer is sent (triton-inference-server/server#7368 and #8034, fixed in March 2025). PyTriton
# 0.7.0 bundles 2.51: 16 clients cancelling hover decodes crashed it within a minute.
SAFE_CANCEL_VERSION = (2, 57)
# What a masks-only decode asks for (`DecodeRequest.logits_above`): the logits around the object.
CROPPED_OUTPUTS = {
    True: [contract.MULTI_MASK_CROP, contract.CROP_BOX, contract.MULTI_SCORES, contract.OBJECT_SCORE],
    False: [contract.SINGLE_MASK_CROP, contract.CROP_BOX, contract.SINGLE_SCORE, contract.OBJECT_SCORE],
}


class _HandleLost(Exception):
    """The server no longer has the features behind a handle."""


class _MaskInputLost(Exception):
    """The server no longer keeps the mask logits a decode named by key."""


class TritonEngine(Engine):
    """The session model of one SAM model on a Triton server, or on several (`server_pool`):
    every request about an image carries its signature (`contract.AFFINITY_HEADER`)."""

    settle_hovers = True  # decodes started mid-sweep cost the server's other annotators
    answers_concepts = True  # where its repository has SAM3's concept graphs (`triton_concepts`)

    def __init__(
        self,
        spec: ModelSpec,
        connection: TritonConnection | None = None,
        *,
        encode_timeout_s: float = 300.0,
        reconnect_s: float = 5.0,
        cancel_on_server: bool | None = None,
    ) -> None:
        """`cancel_on_server`: whether a cancelled decode's gRPC call is cancelled too; by default
        only on servers without the cancellation crash (see SAFE_CANCEL_VERSION)."""
        self.spec = spec
        connection = connection or TritonConnection()
        self.servers = ServerPool([TritonClient(connection.to(url)) for url in connection.server_urls()])
        self.encode_timeout_s = encode_timeout_s
        self.reconnect_s = reconnect_s
        self.reencodes = 0  # images encoded again because their server lacked their features
        self._routes = threading.local()  # `routed`: this thread's encodes go by one key, not by image
        try:
            self.client, config, server_version = self._first_answer()
        except Exception:
            self.servers.close()
            raise
        if cancel_on_server is None:
            cancel_on_server = server_version >= SAFE_CANCEL_VERSION
        self.cancel_on_server = cancel_on_server
        # Behind Triton's dynamic batcher, cancelling and resending on every mouse move delays the
        # final preview of a stroke (docs/serving.md), so there a running decode is cancelled only
        # when overdue, as where a cancel only drops the answer; otherwise cancelling always is fastest.
        always = self.cancel_on_server and "dynamic_batching" not in config
        self.cancel_running = CANCEL_ALWAYS if always else CANCEL_OVERDUE
        self.max_batch = int(config.get("max_batch_size", 0)) or None  # prompt sets a request may hold
        # Images the server encodes in one run (a GPU server's); at most what a request may hold.
        self.encode_batch = max(1, min(int(config_parameter(config, contract.ENCODE_BATCH_PARAMETER) or 1), self.max_batch or 1))
        self.kept_logits = KeptLogits(spec, int(config_parameter(config, contract.LOGITS_CACHE_SIZE_PARAMETER) or 1))

    def _first_answer(self) -> tuple[TritonClient, dict, tuple[int, ...]]:
        """(client, session model config, Triton version) of the first server that answers, all of
        them checked for the contract; those that do not answer are skipped for now."""
        answers = []
        for client in self.servers.clients.values():
            try:
                answers.append((client, self._checked_config(client), client.server_version()))
            except ServerUnavailableError:
                if not self.servers.fail_over(client) and not answers:  # the last, and none answered
                    raise
        return answers[0]

    def _checked_config(self, client: TritonClient) -> dict:
        """The session model's config on `client`'s server, which must use this contract."""
        config = client.session_config(self.spec)
        version = config_parameter(config, contract.CONTRACT_VERSION_PARAMETER)
        if version != str(contract.CONTRACT_VERSION):
            raise ServerModelError(
                f"{self.spec.session_name} on {client.url} uses tensor contract version {version}; this triton-sam "
                f"needs {contract.CONTRACT_VERSION}. Export it again into the server's model repository "
                f"(`triton-sam setup {self.spec.model_id}` or `triton-sam export {self.spec.model_id} --checkpoint PATH`) "
                "and restart the server."
            )
        return config

    def describe(self) -> str:
        return f"Triton at {', '.join(self.servers.clients)}"

    def _on_server(self, signature: str, run: Callable[[TritonClient], T]) -> T:
        """`run` with the client of the image of `signature`; where that server stops answering and
        another is left, with the next server in the image's order."""
        while True:
            client = self.servers.client_for(signature)
            try:
                return run(client)
            except ServerUnavailableError:
                if not self.servers.fail_over(client):
                    raise

    @contextmanager
    def routed(self, key: str) -> Iterator[None]:
        """Within, this thread's encodes go to the server of `key` (and carry it as their affinity
        header) instead of each image's own: a volume's planes where its memories are."""
        self._routes.key = key
        try:
            yield
        finally:
            self._routes.key = None

    def session_config(self, signature: str = "") -> dict:
        """The session model's config on the server of the image of `signature` (the next one where
        that one stopped answering); every server of a pool serves the same export."""
        return self._on_server(signature, lambda client: client.session_config(self.spec))

    def video(self, cache: FeatureCache) -> VideoBackend:
        """The session model's volume requests: planes and memories stay on the server."""
        from .triton_video import TritonVideo

        return TritonVideo(cache, self)

    def encode(self, image: np.ndarray) -> ImageFeatures:
        return ImageFeatures(handle=self._encode(image[None])[0], encoder_input=image)

    def instance_maps(self, features: ImageFeatures, image_hw: tuple[int, int]) -> np.ndarray:
        """Computed by the session model next to the image's features (`triton_instance`)."""
        if self.spec.decoder_url is None:
            return super().instance_maps(features, image_hw)
        return instance_maps(self, features, image_hw)

    def concepts(self, features: ImageFeatures, *request) -> dict[str, np.ndarray]:
        return concepts(self, features, *request)  # the session model's concept request (`triton_concepts`)

    def concepts_vocabulary(self, features: ImageFeatures) -> bytes:
        return vocabulary(self, features)

    def encode_many(self, images: Sequence[np.ndarray]) -> list[ImageFeatures]:
        """Images of one shape go `encode_batch` to a request (the server encodes them together);
        the features come in the order of `images`."""
        features: list = [None] * len(images)
        by_shape: dict[tuple, list[int]] = {}
        for index, image in enumerate(images):
            by_shape.setdefault((image.shape, self._server_url(image)), []).append(index)
        for indices in by_shape.values():
            for start in range(0, len(indices), self.encode_batch):
                batch = indices[start : start + self.encode_batch]
                if len(batch) == 1:
                    features[batch[0]] = self.encode(images[batch[0]])
                    continue
                handles = self._encode(np.stack([images[i] for i in batch]))
                for index, handle in zip(batch, handles, strict=True):
                    features[index] = ImageFeatures(handle=handle, encoder_input=images[index])
        return features

    def _server_url(self, image: np.ndarray) -> str:
        """The URL of the server `image` is encoded on ("" where there is one: no need to hash it)."""
        if len(self.servers) == 1:
            return ""
        return self.servers.client_for(self._route(image)).url

    def _route(self, image: np.ndarray) -> str:
        """The key an encode of `image` goes by: this thread's `routed` key, else the image's signature."""
        return getattr(self._routes, "key", None) or content_signature(image, self.spec.model_id)

    def _encode(self, images: np.ndarray) -> list[str]:
        """The handles of `images` ([B, H, W, C]) encoded on the server of the first."""
        route = self._route(images[0])
        return self._on_server(route, lambda client: self._encode_on(client, images, route))

    def _encode_on(self, client: TritonClient, images: np.ndarray, route: str) -> list[str]:
        """The handles of `images` encoded on `client`'s server, the request marked with `route`."""
        try:
            result = client.infer_large(
                self.spec.session_name,
                {contract.ENCODER_INPUT: images},
                [contract.HANDLE],
                self.encode_timeout_s,
                client.image_headers(route),
            )
        except InferenceServerException as error:
            raise self._error(error, client) from error
        self.servers.encoded(client, len(images))
        return [handle.decode() for handle in result.as_numpy(contract.HANDLE).reshape(-1)]

    def decode(
        self,
        features: ImageFeatures,
        request: DecodeRequest,
        multimask_output: bool = True,
        cancel: CancelToken | None = None,
    ) -> DecodeResult:
        if features.handle is None or features.encoder_input is None:
            raise ValueError("TritonEngine.decode needs features from TritonEngine.encode")
        return self._on_server(
            features.handle, lambda client: self._decode_encoded(client, features, request, multimask_output, cancel)
        )

    def _decode_encoded(
        self, client: TritonClient, features: ImageFeatures, request: DecodeRequest, multimask_output: bool, cancel
    ) -> DecodeResult:
        """Decode on `client`'s server, encoding the image there first where it lacks its features."""
        try:
            return self._decode(client, features.handle, request, multimask_output, cancel)
        except _HandleLost:
            pass
        except ServerUnavailableError:  # one server restarting: wait for it; several: the next one takes over
            if len(self.servers) > 1 or not self._wait_until_ready(client, cancel):
                raise
        # The server lost the embedding (eviction, restart) or never had it (another server encoded
        # it): encode again; the handle is content-based. Under heavy load other clients' images may
        # evict it again before the retry: try a few times.
        for _ in range(REENCODE_ATTEMPTS):
            if cancel is not None and cancel.cancelled:
                raise DecodeCancelled("decode cancelled")
            self._reencode(client, features)
            try:
                return self._decode(client, features.handle, request, multimask_output, cancel)
            except _HandleLost:
                continue
        raise ServerModelError(
            f"The server on {client.url} evicted this image's embedding {REENCODE_ATTEMPTS} times in a row: "
            f"its cache (`cache_size` in {self.spec.session_name}'s config.pbtxt) is too small for its clients' images."
        )

    def _reencode(self, client: TritonClient, features: ImageFeatures, route: str | None = None) -> None:
        """Encode the image of `features` again on `client`'s server, which lacks them; counted."""
        self.reencodes += 1
        if self._encode_on(client, features.encoder_input[None], route or features.handle) != [features.handle]:
            raise ServerModelError("The server returned a different handle for the same image.")

    def _wait_until_ready(self, client: TritonClient, cancel: CancelToken | None) -> bool:
        """Poll the session model for up to `reconnect_s` (a restarting server); True once ready."""
        deadline = time.monotonic() + self.reconnect_s
        while time.monotonic() < deadline and not (cancel is not None and cancel.cancelled):
            try:
                if client.grpc.is_model_ready(self.spec.session_name, headers=client.headers, client_timeout=1.0):
                    return True
            except InferenceServerException:
                pass
            time.sleep(0.1)
        return False

    def _decode(
        self, client: TritonClient, handle: str, request: DecodeRequest, multimask_output: bool, cancel: CancelToken | None
    ) -> DecodeResult:
        """Send the prompt sets in requests of at most the server's batch size, all at once (its
        dynamic batcher sees them together), and join the answers."""
        if cancel is not None and cancel.cancelled:
            raise DecodeCancelled("decode cancelled before it was sent")
        cropped = request.logits_above is not None
        # The logits of a single decode may come back as the next one's mask input (a hover's never do).
        keep = request.batch_size == 1 and (multimask_output or not cropped)
        names = CROPPED_OUTPUTS[multimask_output] if cropped else contract.decoder_output_names(multimask_output)
        names = names + [contract.KEPT_KEYS] if keep and cropped else names
        for _ in range(REENCODE_ATTEMPTS):
            try:
                parts = [self._decode_arrays(handle, part, names, keep) for part in split_request(request, self.max_batch)]
                sent = [self._send(client, handle, arrays, names, cancel) for arrays in parts]
                answers = [self._receive(client, handle, *pending, names, cancel) for pending in sent]
                break
            except _MaskInputLost:  # the server forgot kept logits (evicted, restarted, another server)
                self._restore_mask_inputs(client, handle, request, cancel)
        else:
            raise ServerModelError(
                f"The server on {client.url} forgot the mask logits of this client's refinements "
                f"{REENCODE_ATTEMPTS} times in a row: its `logits_cache_size` is too small for its clients."
            )
        results = [self._result(answer, multimask_output, request.logits_above) for answer in answers]
        if keep and cropped:
            self.kept_logits.add(results[0][0], answers[0][contract.KEPT_KEYS], (request, multimask_output))
        elif keep:
            self.kept_logits.add(results[0][0])
        if len(results) == 1:
            return DecodeResult(*results[0])
        return DecodeResult(*(np.concatenate(arrays) for arrays in zip(*results, strict=True)))

    def _result(self, answer: dict[str, np.ndarray], multimask_output: bool, threshold: float | None) -> tuple:
        """Low-res logits (rebuilt from a crop), scores and object scores of one answer."""
        masks, scores, object_scores = contract.decoder_output_names(multimask_output)
        if contract.CROP_BOX in answer:
            crop = answer[CROPPED_OUTPUTS[multimask_output][0]]
            logits = uncropped(crop, answer[contract.CROP_BOX], threshold, self.spec.low_res_size)
        else:
            logits = answer[masks]
        return logits, answer[scores], answer[object_scores]

    def _restore_mask_inputs(self, client: TritonClient, handle: str, request: DecodeRequest, cancel: CancelToken | None) -> None:
        """The server forgot mask logits `request` names by key: send those this client holds;
        decode again those it received only as a crop, so that the server keeps them again."""
        for signature, recipe in self.kept_logits.lost(request.mask_input):
            if recipe.parent is not None:
                self.kept_logits.recall(*recipe.parent)
            again = self._decode(client, handle, recipe.request, recipe.multimask_output, cancel)
            self.kept_logits.rebind(signature, recipe, again.low_res_logits[0, recipe.candidate])

    def _decode_arrays(self, handle: str, request: DecodeRequest, names: list[str], keep: bool) -> dict[str, np.ndarray]:
        """Handle and prompt tensors of a decode request: the mask input by key where the server keeps
        it, the crop threshold where it asks for a crop, and whether the server should keep its logits."""
        arrays = {contract.HANDLE: np.array([[handle.encode()]] * request.batch_size, dtype=np.object_), **prompt_arrays(request)}
        keys = None if request.mask_input is None else self.kept_logits.keys(request.mask_input)
        if keys is not None:
            del arrays[contract.MASK_INPUT]
            arrays[contract.MASK_INPUT_KEY] = keys
        if contract.CROP_BOX in names:
            arrays[contract.CROP_THRESHOLD] = np.full((request.batch_size, 1), request.logits_above, np.float32)
        if request.best_of_multimask and contract.SINGLE_SCORE in names:
            arrays[contract.BEST_OF_MULTIMASK] = np.ones((request.batch_size, 1), bool)
        if keep:
            arrays[contract.KEEP_LOGITS] = np.ones((request.batch_size, 1), bool)
        return arrays

    def _send(
        self, client: TritonClient, handle: str, arrays: dict[str, np.ndarray], names: list[str], cancel: CancelToken | None
    ) -> tuple:
        done = threading.Event()
        outcome: dict = {}

        def finished(result, error) -> None:
            outcome["result"], outcome["error"] = result, error
            done.set()

        call = client.grpc.async_infer(
            self.spec.session_name,
            infer_inputs(arrays),
            finished,
            outputs=[grpcclient.InferRequestedOutput(n) for n in names],
            headers=client.image_headers(handle),
            client_timeout=client.timeout_s,
        )
        if cancel is not None and self.cancel_on_server:
            cancel.on_cancel(call.cancel)
        return done, outcome, call

    def _receive(
        self, client: TritonClient, handle: str, done, outcome: dict, call, names: list[str], cancel: CancelToken | None
    ) -> dict:
        if not done.wait(client.timeout_s + 5.0):  # the gRPC deadline fires first; never hang
            call.cancel()
            raise ServerUnavailableError(f"No answer from Triton at {client.url} in {client.timeout_s:.0f} s.")
        error = outcome["error"]
        if cancel is not None and cancel.cancelled:  # an answer (where not cancelled on the wire) is dropped
            raise DecodeCancelled("decode cancelled") from error
        if error is not None:
            if contract.UNKNOWN_HANDLE in (error.message() or ""):
                raise _HandleLost(handle)
            if contract.UNKNOWN_MASK_INPUT in (error.message() or ""):
                raise _MaskInputLost()
            raise self._error(error, client) from error
        return {name: outcome["result"].as_numpy(name) for name in names}

    def call(
        self, features: ImageFeatures, arrays: dict[str, np.ndarray], outputs: list[str], route: str | None = None
    ) -> dict[str, np.ndarray]:
        """One request to the session model about the image of `features` (its handle is added),
        waiting up to the encode timeout, on the server of `route` (default: the image's), the next
        one where that stopped answering; the image is encoded again where the server lacks it."""
        if features.handle is None or features.encoder_input is None:
            raise ValueError("TritonEngine.call needs features from TritonEngine.encode")
        route = route or features.handle
        return self._on_server(route, lambda client: self._call_on(client, features, arrays, outputs, route))

    def _call_on(
        self, client: TritonClient, features: ImageFeatures, arrays: dict[str, np.ndarray], outputs: list[str], route: str
    ) -> dict[str, np.ndarray]:
        """`call` on `client`'s server, the request marked with `route`."""
        for _ in range(REENCODE_ATTEMPTS):
            handles = np.array([[features.handle.encode()]], dtype=np.object_)
            try:
                result = client.grpc.infer(
                    self.spec.session_name,
                    infer_inputs({contract.HANDLE: handles, **arrays}),
                    outputs=[grpcclient.InferRequestedOutput(n) for n in outputs],
                    headers=client.image_headers(route),
                    client_timeout=self.encode_timeout_s,
                )
            except InferenceServerException as error:
                if contract.UNKNOWN_HANDLE not in (error.message() or ""):
                    raise self._error(error, client) from error
                self._reencode(client, features, route)  # lost (eviction, restart, another server): content-based
                continue
            return {name: result.as_numpy(name) for name in outputs}
        raise ServerModelError(f"The server on {client.url} keeps losing this image's embedding: its cache is too small.")

    def _error(self, error: InferenceServerException, client: TritonClient) -> Exception:
        if any(sign in (error.message() or "") for sign in _OVERLOADED):
            return ServerBusyError(
                f"Triton at {client.url} is overloaded ({error_message(error)}): too many requests are waiting. "
                "It answers again when the load drops; more server capacity (GPU, instances) helps for good."
            )
        if error.status() in _UNREACHABLE or error.status() is None or _UNLOADED in (error.message() or ""):
            return client.unreachable(error)
        return ServerModelError(f"Triton at {client.url} refused the request: {error_message(error)}")

    def close(self) -> None:
        self.servers.close()


__all__ = ["TritonClient", "TritonConnection", "TritonEngine"]
