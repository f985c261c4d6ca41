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

import hashlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import raise_error_grpc, service_pb2
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from .. import contract
from ..errors import DecodeCancelled, ServerBusyError, ServerModelError, ServerUnavailableError
from ..prompts import DecodeRequest
from ..registry import MODELS, ModelSpec
from .base import CANCEL_ALWAYS, CANCEL_OVERDUE, CancelToken, DecodeResult, Engine, ImageFeatures, best_candidates
from .connection import ENV_API_KEY, TritonConnection, default_timeout_s, default_url
from .infer_request import MODEL_INFER_METHOD, model_infer_request

if TYPE_CHECKING:
    from ..features import FeatureCache
    from ..video.backend import VideoBackend

REENCODE_ATTEMPTS = 3
# Passing channel_args replaces tritonclient's own unlimited message sizes: set them again. Keep
# reconnect backoff short so a restarted server is found again within a second or two.
CHANNEL_ARGS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
_UNREACHABLE = ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED")
_OVERLOADED = ("Exceeds maximum queue size", "Request timeout expired")  # Triton's queue policy refusals
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


def logits_signature(logits: np.ndarray) -> str:
    """Signature of one mask's low-res logits ([S, S] float32): its key as a later mask input
    (the session model computes the same for the logits it keeps)."""
    return hashlib.blake2b(np.ascontiguousarray(logits, np.float32).tobytes(), digest_size=16).hexdigest()


@dataclass(frozen=True)
class Recipe:
    """The decode that made kept logits this client received only as a crop, and which of its
    masks they are: run again, it makes the server keep them again. Where it refined such logits,
    `parent` holds their signature and recipe (a chain of clicks outlives the client's bound)."""

    request: DecodeRequest
    multimask_output: bool
    candidate: int
    parent: tuple[str, Recipe] | None = None


@dataclass(frozen=True)
class _Kept:
    key: str  # the server's signature of the logits
    recipe: Recipe | None  # None: the client holds the logits themselves


class KeptLogits:
    """The mask logits the server keeps for this client as mask inputs, as far as it knows: the
    newest `capacity` (the server's own bound; other clients may make it evict sooner), each
    under the signature of the mask input this client would send for them (clamped as
    `spec.as_mask_input` does): the server's key and, for those received only as a crop, their
    `Recipe`. Older mask inputs are sent as they are."""

    def __init__(self, spec: ModelSpec, capacity: int) -> None:
        self.spec = spec
        self.capacity = max(1, capacity)
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._lock = threading.Lock()

    def _signatures(self, masks: np.ndarray) -> list[str]:
        """Signatures of the mask inputs the logits of `masks` ([..., S, S], as decoded) would make."""
        return [logits_signature(logits) for logits in self.spec.as_mask_input(masks).reshape(-1, *masks.shape[-2:])]

    def add(self, masks: np.ndarray, keys: np.ndarray | None = None, made_by: tuple[DecodeRequest, bool] | None = None) -> None:
        """Note the logits of one decode's `masks` ([1, C, S, S], as received) as kept: under the
        server's `keys` ([1, C] bytes) and the decode that `made_by` them (request, multimask)
        where `masks` are rebuilt from a crop, else under their own signatures."""
        signatures = self._signatures(masks)
        server_keys = signatures if keys is None else [key.decode() for key in keys.reshape(-1)]
        with self._lock:
            recipes = [None if made_by is None else Recipe(*made_by, c, self._parent(made_by[0])) for c in range(len(signatures))]
            for signature, key, recipe in zip(signatures, server_keys, recipes, strict=True):
                self._kept[signature] = _Kept(key, recipe)
                self._kept.move_to_end(signature)
            while len(self._kept) > self.capacity:
                self._kept.popitem(last=False)

    def _parent(self, request: DecodeRequest) -> tuple[str, Recipe] | None:
        """The signature and recipe of `request`'s mask input, if it is kept logits received as a crop (lock held)."""
        if request.mask_input is None:
            return None
        signature = logits_signature(request.mask_input[0, 0])
        kept = self._kept.get(signature)
        return None if kept is None or kept.recipe is None else (signature, kept.recipe)

    def keys(self, mask_input: np.ndarray) -> np.ndarray | None:
        """The server's keys for a request's `mask_input` [B, 1, S, S] as its bytes tensor [B, 1]; None unless all are kept."""
        signatures = [logits_signature(logits) for logits in mask_input[:, 0]]
        with self._lock:
            if not all(signature in self._kept for signature in signatures):
                return None
            for signature in signatures:
                self._kept.move_to_end(signature)
            return np.array([[self._kept[signature].key.encode()] for signature in signatures], dtype=np.object_)

    def recall(self, signature: str, recipe: Recipe) -> None:
        """Note logits the client bound dropped as kept again, under no key the server knows:
        naming them fails, and `recipe` runs again (a chain of refinements being restored)."""
        with self._lock:
            self._kept.setdefault(signature, _Kept(signature, recipe))

    def lost(self, mask_input: np.ndarray) -> list[tuple[str, Recipe]]:
        """The server forgot some of `mask_input`'s logits: forget those this client holds itself
        (it sends them now), and return the signatures and recipes of the others."""
        recipes = []
        with self._lock:
            for signature in {logits_signature(logits) for logits in mask_input[:, 0]}:
                kept = self._kept.get(signature)
                if kept is not None and kept.recipe is not None:
                    recipes.append((signature, kept.recipe))
                else:
                    self._kept.pop(signature, None)
        return recipes

    def rebind(self, signature: str, recipe: Recipe, masks: np.ndarray) -> None:
        """`recipe` ran again and made `masks` ([S, S]), kept: the mask input of `signature` names
        them now (the same logits, unless the server's decoder is not deterministic)."""
        (again,) = self._signatures(masks)
        with self._lock:
            if again in self._kept:
                self._kept[signature] = _Kept(self._kept[again].key, recipe)
                self._kept.move_to_end(signature)


class TritonClient:
    """A gRPC connection to one Triton server, with the options every call needs."""

    def __init__(self, connection: TritonConnection | None = None) -> None:
        connection = connection or TritonConnection()
        self.url = connection.url or default_url()
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

    def unreachable(self, error: Exception) -> ServerUnavailableError:
        return ServerUnavailableError(
            f"Triton server at {self.url} is not answering. Check that it runs (`triton-sam serve`, or the "
            f"Docker deployment) and that the URL and port are right. ({_message(error)})"
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
        self, model_name: str, inputs: dict[str, np.ndarray], outputs: list[str], timeout_s: float | None
    ) -> grpcclient.InferResult:
        """`grpc.infer` for inputs of megabytes (an image), copied once on the way while Python's
        lock is held, not three times (`infer_request`); raises InferenceServerException as it does."""
        request = model_infer_request(model_name, inputs, outputs)
        try:
            response = self._model_infer(request, metadata=tuple(self.headers.items()), timeout=timeout_s)
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


def _message(error: Exception) -> str:
    if isinstance(error, InferenceServerException):
        return f"{error.status()}: {error.message()}"
    return str(error)


def _parameter(config: dict, key: str) -> str | None:
    return config.get("parameters", {}).get(key, {}).get("string_value")


def served_models(client: TritonClient) -> list[str]:
    """Ids of the triton-sam models whose session model is ready on the server."""
    try:
        index = client.grpc.get_model_repository_index(headers=client.headers, as_json=True, client_timeout=client.timeout_s)
    except InferenceServerException as error:
        raise client.unreachable(error) from error
    ready = {m["name"] for m in index.get("models", []) if m.get("state") == "READY"}
    return [model_id for model_id, spec in MODELS.items() if spec.session_name in ready]


class TritonEngine(Engine):
    """The session model of one SAM model on a Triton server."""

    settle_hovers = True  # decodes started mid-sweep cost the server's other annotators

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
        self.client = TritonClient(connection)
        self.encode_timeout_s = encode_timeout_s
        self.reconnect_s = reconnect_s
        try:
            config = self.client.session_config(spec)
            server_version = self.client.server_version()
        except Exception:
            self.client.close()
            raise
        version = _parameter(config, contract.CONTRACT_VERSION_PARAMETER)
        if version != str(contract.CONTRACT_VERSION):
            self.client.close()
            raise ServerModelError(
                f"{spec.session_name} on {self.client.url} uses tensor contract version {version}; this triton-sam "
                f"needs {contract.CONTRACT_VERSION}. Export the model again with this version and restart the server."
            )
        if cancel_on_server is None:
            cancel_on_server = server_version >= SAFE_CANCEL_VERSION
        self.cancel_on_server = cancel_on_server
        # Behind Triton's dynamic batcher, cancelling and resending on every mouse move delays the
        # final preview of a stroke (README, Serving), so there a running decode is cancelled only
        # when overdue, as where a cancel only drops the answer; otherwise cancelling always is fastest.
        always = self.cancel_on_server and "dynamic_batching" not in config
        self.cancel_running = CANCEL_ALWAYS if always else CANCEL_OVERDUE
        self.max_batch = int(config.get("max_batch_size", 0)) or None  # prompt sets a request may hold
        # Images the server encodes in one run (a GPU server's); at most what a request may hold.
        self.encode_batch = max(1, min(int(_parameter(config, contract.ENCODE_BATCH_PARAMETER) or 1), self.max_batch or 1))
        # Session models exported before crops answer masks-only decodes with the whole logits
        # (before crops of candidates, those of multimask ones), those before kept logits take no
        # mask input by key, and those before best-of-multimask decodes send all three
        # candidates to choose from.
        inputs = {tensor.get("name") for tensor in config.get("input", [])}
        outputs = {tensor.get("name") for tensor in config.get("output", [])}
        self.crops = contract.CROP_THRESHOLD in inputs
        self.crops_candidates = contract.MULTI_MASK_CROP in outputs
        self.chooses_best = contract.BEST_OF_MULTIMASK in inputs
        kept = contract.MASK_INPUT_KEY in inputs
        self.kept_logits = KeptLogits(spec, int(_parameter(config, "logits_cache_size") or 1)) if kept else None

    def describe(self) -> str:
        return f"Triton at {self.client.url}"

    def video(self, cache: FeatureCache) -> VideoBackend:
        """The session model's volume requests: planes and memories stay on the server."""
        from .triton_video import TritonVideo

        return TritonVideo(cache, self)

    def encode(self, image: np.ndarray) -> ImageFeatures:
        return ImageFeatures(handle=self._encode(image[None])[0], model_input=image)

    def encode_many(self, images: Sequence[np.ndarray]) -> list[ImageFeatures]:
        """Images of one shape go `encode_batch` to a request (the server encodes them together);
        the features come in the order of `images`."""
        features: list = [None] * len(images)
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for index, image in enumerate(images):
            by_shape.setdefault(image.shape, []).append(index)
        for indices in by_shape.values():
            for start in range(0, len(indices), self.encode_batch):
                batch = indices[start : start + self.encode_batch]
                if len(batch) == 1:
                    features[batch[0]] = self.encode(images[batch[0]])
                    continue
                handles = self._encode(np.stack([images[i] for i in batch]))
                for index, handle in zip(batch, handles, strict=True):
                    features[index] = ImageFeatures(handle=handle, model_input=images[index])
        return features

    def _encode(self, images: np.ndarray) -> list[str]:
        """The handles of `images` ([B, H, W, C]) encoded on the server."""
        try:
            result = self.client.infer_large(
                self.spec.session_name, {contract.ENCODER_INPUT: images}, [contract.HANDLE], self.encode_timeout_s
            )
        except InferenceServerException as error:
            raise self._error(error) from error
        return [handle.decode() for handle in result.as_numpy(contract.HANDLE).reshape(-1)]

    def decode(
        self,
        features: ImageFeatures,
        request: DecodeRequest,
        multimask_output: bool = True,
        cancel: CancelToken | None = None,
    ) -> DecodeResult:
        if features.handle is None or features.model_input is None:
            raise ValueError("TritonEngine.decode needs features from TritonEngine.encode")
        try:
            return self._decode(features.handle, request, multimask_output, cancel)
        except _HandleLost:
            pass
        except ServerUnavailableError:
            if not self._wait_until_ready(cancel):
                raise
        # The server lost the embedding (eviction, restart): encode again; the handle is content-based.
        # Under heavy load other clients' images may evict it again before the retry: try a few times.
        for _ in range(REENCODE_ATTEMPTS):
            if cancel is not None and cancel.cancelled:
                raise DecodeCancelled("decode cancelled")
            if self._encode(features.model_input[None]) != [features.handle]:
                raise ServerModelError("The server returned a different handle for the same image.")
            try:
                return self._decode(features.handle, request, multimask_output, cancel)
            except _HandleLost:
                continue
        raise ServerModelError(
            f"The server on {self.client.url} evicted this image's embedding {REENCODE_ATTEMPTS} times in a row: "
            f"its cache (`cache_size` in {self.spec.session_name}'s config.pbtxt) is too small for its clients' images."
        )

    def _wait_until_ready(self, cancel: CancelToken | None) -> bool:
        """Poll the session model for up to `reconnect_s` (a restarting server); True once ready."""
        deadline = time.monotonic() + self.reconnect_s
        while time.monotonic() < deadline and not (cancel is not None and cancel.cancelled):
            try:
                if self.client.grpc.is_model_ready(self.spec.session_name, headers=self.client.headers, client_timeout=1.0):
                    return True
            except InferenceServerException:
                pass
            time.sleep(0.1)
        return False

    def _decode(self, handle: str, request: DecodeRequest, multimask_output: bool, cancel: CancelToken | None) -> DecodeResult:
        """Send the prompt sets in requests of at most the server's batch size, all at once (its
        dynamic batcher sees them together), and join the answers."""
        if cancel is not None and cancel.cancelled:
            raise DecodeCancelled("decode cancelled before it was sent")
        if request.best_of_multimask and not multimask_output and not self.chooses_best:
            return best_candidates(self._decode(handle, request, True, cancel))
        cropped = self.crops and request.logits_above is not None and (self.crops_candidates or not multimask_output)
        # The logits of a single decode may come back as the next one's mask input (a hover's never do).
        keep = self.kept_logits is not None and request.batch_size == 1 and (multimask_output or not cropped)
        names = CROPPED_OUTPUTS[multimask_output] if cropped else contract.decoder_output_names(multimask_output)
        names = names + [contract.KEPT_KEYS] if keep and cropped else names
        for _ in range(REENCODE_ATTEMPTS):
            try:
                parts = [self._decode_arrays(handle, part, names, keep) for part in _split(request, self.max_batch)]
                sent = [self._send(arrays, names, cancel) for arrays in parts]
                answers = [self._receive(handle, *pending, names, cancel) for pending in sent]
                break
            except _MaskInputLost:  # the server forgot kept logits (evicted, restarted)
                self._restore_mask_inputs(handle, request, cancel)
        else:
            raise ServerModelError(
                f"The server on {self.client.url} forgot the mask logits of this client's refinements "
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

    def _restore_mask_inputs(self, handle: str, request: DecodeRequest, cancel: CancelToken | None) -> None:
        """The server forgot mask logits `request` names by key: send those this client holds;
        decode again those it received only as a crop, so that the server keeps them again."""
        for signature, recipe in self.kept_logits.lost(request.mask_input):
            if recipe.parent is not None:
                self.kept_logits.recall(*recipe.parent)
            again = self._decode(handle, recipe.request, recipe.multimask_output, cancel)
            self.kept_logits.rebind(signature, recipe, again.low_res_logits[0, recipe.candidate])

    def _decode_arrays(self, handle: str, request: DecodeRequest, names: list[str], keep: bool) -> dict[str, np.ndarray]:
        """Handle and prompt tensors of a decode request: the mask input by key where the server keeps
        it, the crop threshold where it asks for a crop, and whether the server should keep its logits."""
        arrays = {contract.HANDLE: np.array([[handle.encode()]] * request.batch_size, dtype=np.object_), **prompt_arrays(request)}
        keys = None if request.mask_input is None or self.kept_logits is None else self.kept_logits.keys(request.mask_input)
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

    def _send(self, arrays: dict[str, np.ndarray], names: list[str], cancel: CancelToken | None) -> tuple:
        done = threading.Event()
        outcome: dict = {}

        def finished(result, error) -> None:
            outcome["result"], outcome["error"] = result, error
            done.set()

        call = self.client.grpc.async_infer(
            self.spec.session_name,
            infer_inputs(arrays),
            finished,
            outputs=[grpcclient.InferRequestedOutput(n) for n in names],
            headers=self.client.headers,
            client_timeout=self.client.timeout_s,
        )
        if cancel is not None and self.cancel_on_server:
            cancel.on_cancel(call.cancel)
        return done, outcome, call

    def _receive(self, handle: str, done, outcome: dict, call, names: list[str], cancel: CancelToken | None) -> dict:
        if not done.wait(self.client.timeout_s + 5.0):  # the gRPC deadline fires first; never hang
            call.cancel()
            raise ServerUnavailableError(f"No answer from Triton at {self.client.url} in {self.client.timeout_s:.0f} s.")
        error = outcome["error"]
        if cancel is not None and cancel.cancelled:  # an answer (where not cancelled on the wire) is dropped
            raise DecodeCancelled("decode cancelled") from error
        if error is not None:
            if contract.UNKNOWN_HANDLE in (error.message() or ""):
                raise _HandleLost(handle)
            if contract.UNKNOWN_MASK_INPUT in (error.message() or ""):
                raise _MaskInputLost()
            raise self._error(error) from error
        return {name: outcome["result"].as_numpy(name) for name in names}

    def call(self, features: ImageFeatures, arrays: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        """One request to the session model about the image of `features` (its handle is added),
        waiting up to the encode timeout; the image is encoded again if the server lost it."""
        if features.handle is None or features.model_input is None:
            raise ValueError("TritonEngine.call needs features from TritonEngine.encode")
        for _ in range(REENCODE_ATTEMPTS):
            handles = np.array([[features.handle.encode()]], dtype=np.object_)
            try:
                result = self.client.grpc.infer(
                    self.spec.session_name,
                    infer_inputs({contract.HANDLE: handles, **arrays}),
                    outputs=[grpcclient.InferRequestedOutput(n) for n in outputs],
                    headers=self.client.headers,
                    client_timeout=self.encode_timeout_s,
                )
            except InferenceServerException as error:
                if contract.UNKNOWN_HANDLE not in (error.message() or ""):
                    raise self._error(error) from error
                self._encode(features.model_input[None])  # lost (eviction, restart): the handle is content-based
                continue
            return {name: result.as_numpy(name) for name in outputs}
        raise ServerModelError(f"The server on {self.client.url} keeps losing this image's embedding: its cache is too small.")

    def _error(self, error: InferenceServerException) -> Exception:
        if any(sign in (error.message() or "") for sign in _OVERLOADED):
            return ServerBusyError(
                f"Triton at {self.client.url} is overloaded ({_message(error)}): too many requests are waiting. "
                "It answers again when the load drops; more server capacity (GPU, instances) helps for good."
            )
        if error.status() in _UNREACHABLE or error.status() is None:
            return self.client.unreachable(error)
        return ServerModelError(f"Triton at {self.client.url} refused the request: {_message(error)}")

    def close(self) -> None:
        self.client.close()


def prompt_arrays(request: DecodeRequest) -> dict[str, np.ndarray]:
    """The prompt tensors of a request to the session model; the mask only when there is one."""
    arrays = {
        contract.POINT_COORDS: np.ascontiguousarray(request.point_coords, np.float32),
        contract.POINT_LABELS: np.ascontiguousarray(request.point_labels, np.int32),
    }
    if request.mask_input is not None:
        arrays[contract.MASK_INPUT] = np.ascontiguousarray(request.mask_input, np.float32)
    return arrays


def uncropped(crop: np.ndarray, box: np.ndarray, threshold: float, size: int) -> np.ndarray:
    """Low-res logits [B, C, size, size] from the session model's crop [B, C, h, w]
    (`contract.CROP_BOX`): the crop in its box, below `threshold` elsewhere."""
    logits = np.full((*crop.shape[:2], size, size), np.float32(threshold) - 1, np.float32)
    y0, x0, y1, x1 = (int(v) for v in box[0])
    logits[:, :, y0:y1, x0:x1] = crop
    return logits


def _split(request: DecodeRequest, size: int | None) -> list[DecodeRequest]:
    """`request` as requests of at most `size` prompt sets (itself if it fits)."""
    if size is None or request.batch_size <= size:
        return [request]
    masks = request.mask_input
    return [
        DecodeRequest(
            point_coords=request.point_coords[start : start + size],
            point_labels=request.point_labels[start : start + size],
            mask_input=None if masks is None else masks[start : start + size],
            logits_above=request.logits_above,
            best_of_multimask=request.best_of_multimask,
        )
        for start in range(0, request.batch_size, size)
    ]


def infer_inputs(arrays: dict[str, np.ndarray]) -> list[grpcclient.InferInput]:
    """gRPC input tensors of named arrays (object arrays of bytes go as BYTES)."""
    inputs = []
    for name, array in arrays.items():
        datatype = "BYTES" if array.dtype == np.object_ else np_to_triton_dtype(array.dtype)
        tensor = grpcclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs
