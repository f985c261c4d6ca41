"""triton-sam's Triton python-backend models; exported as `model.py` (see `TritonPythonModel`).

Session model (`triton_sam_component: "session"`) keeps image features on the server. An
*encode* request sends the image (`image`, [B,H,W,C] uint8, any size: the encoder resizes) and gets back a
`handle` per image; a *decode* request sends only `handle` and the prompts (well under 4 KB) and
gets mask logits back under the decoder's output names; with `crop_threshold` it may ask for
`single_mask_crop` or `masks_crop` and `crop_box` instead of `single_mask` or `masks`: the mask
logits only around the samples above that threshold (a hover preview's or a click's, sent often
over a user's network). Features live in a bounded LRU in this process, so the model runs as one
instance, which drives every visible GPU: each image's features on the GPU its signature picks
(`triton_sam_devices.py`, which also says why not one instance per GPU). An unknown or evicted handle fails with NOT_FOUND
and a message starting with `UNKNOWN_HANDLE`; clients re-encode and retry. A decode with
`keep_logits` keeps the mask logits it answers (another LRU; clamped to +-`mask_input_clamp` where
the config gives one, as the official predictor hands them back) under the signature of their
bytes, answered as `kept_keys` when asked, so that a refinement may send `mask_input_key` (those
signatures) instead of `mask_input` (262 KB a prompt set); an unknown key fails with NOT_FOUND and `UNKNOWN_MASK_INPUT`, and
clients send the logits themselves. With `best_of_multimask` a single-mask decode answers the
multimask candidate with the highest predicted IoU instead (a hover preview shows what a click
will give). A request with `image_hw` gets micro-sam's instance-segmentation maps of a kept image
(`triton_sam_instance.py`).

Parameters in config.pbtxt: `encoder_model`, `decoder_model` (sibling models whose
`1/model.onnx` it runs), `cache_size` (images kept on each device), `logits_cache_size` (masks kept),
`encode_batch` (new images of one shape and device, from the requests of one run, encoded together: a
large plane's tiles; 1 where absent) and `feature_buffers` ("auto": on a GPU the
features stay in GPU memory, one slot per image, and the decoder reads them there; "on": the same
buffers in host memory, for tests; "off": numpy arrays). Rows of a batched decode are gathered
from the slots by `gather_features.onnx`, written next to this file. What it did with each request is counted
on Triton's metrics endpoint as `triton_sam_session_requests_total{model, outcome}` (Triton's own
statistics count a request cancelled here as a success), and by device as
`triton_sam_session_device_{encoded_images,decoded_rows}_total{model, device}`.

ONNX model (`encoder` / `decoder`): runs the `model.onnx` next to it. The Triton server of
nvidia-pytriton has only the python backend, so `triton-sam serve` uses this in place of the
onnxruntime backend: same names, tensors and batching as on the NGC image.

Imports numpy, onnxruntime and Triton's `triton_python_backend_utils` only, and the modules
written next to it (`server.models.write_python_model`), never triton-sam: the same files run in
the NGC tritonserver image and in the server of `triton-sam serve`. Next to it: the tensor
contract (`triton_sam_contract.py`, triton-sam's `contract.py`), the array computations the
client does alike (`triton_sam_arrays.py`), the feature stores (`triton_sam_features.py`), the
video graphs (`triton_sam_video.py`), the instance-segmentation and SAM3 concept requests
(`triton_sam_instance.py`, `triton_sam_concepts.py`)
and the devices (`triton_sam_devices.py`).
"""

import json
import sys
from pathlib import Path
from typing import NamedTuple

import triton_python_backend_utils as pb_utils

try:
    import numpy as np
    import onnxruntime  # noqa: F401 (said here, before the modules next to this file need it)
except ImportError as error:  # said in Triton's log when the model fails to load
    raise ImportError(
        f"{error}. Triton's python backend runs {sys.executable or 'its stub'} (prefix {sys.prefix}), which looks "
        f"for packages in {sys.path}: install numpy<2 and onnxruntime-gpu where it looks (`triton-sam server-env` "
        "makes such an environment; `triton-sam serve --server-python` names one)."
    ) from error

sys.path.insert(0, str(Path(__file__).parent))  # the modules written next to this file
import triton_sam_contract as contract  # noqa: E402 (triton_sam/contract.py)
from triton_sam_arrays import best_candidate, content_signature, logits_signature  # noqa: E402
from triton_sam_concepts import ConceptRequests  # noqa: E402
from triton_sam_decodes import answered_masks, crop_threshold, cropped_above, decoder_outputs, in_row_order, taken  # noqa: E402
from triton_sam_devices import DeviceCounts, DeviceRuns, placed, session_devices  # noqa: E402
from triton_sam_features import LruStore  # noqa: E402
from triton_sam_instance import InstanceRequests  # noqa: E402
from triton_sam_requests import (  # noqa: E402
    Cancelled,
    UnknownHandle,
    UnknownMaskInput,
    UnknownMemory,
    cancelled,
    failure,
    flag,
    ort_session,
    released,
    requested_outputs,
    required,
    response,
    run_cancellable,
    text,
)
from triton_sam_volumes import video_requests  # noqa: E402

IMAGE, HANDLE = contract.ENCODER_INPUT, contract.HANDLE


class RequestCounts:
    """Counters of what the session model did with its requests, one per outcome of
    `contract.SESSION_REQUEST_OUTCOMES` (the metric's description lists them; no other is counted)."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.family = pb_utils.MetricFamily(
            name=contract.SESSION_REQUESTS_METRIC,
            description=f"Session model requests by outcome ({', '.join(contract.SESSION_REQUEST_OUTCOMES)})",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.metrics = {}

    def add(self, outcome: str, count: int = 1) -> None:
        if outcome not in contract.SESSION_REQUEST_OUTCOMES:
            raise ValueError(f"'{outcome}' is not one of the session model's outcomes {contract.SESSION_REQUEST_OUTCOMES}")
        if count:
            if outcome not in self.metrics:
                self.metrics[outcome] = self.family.Metric(labels={"model": self.model_name, "outcome": outcome})
            self.metrics[outcome].increment(count)


class TritonPythonModel:
    """Entry point Triton loads: the session model or an ONNX model, by the config's component."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        model_dir = Path(args["model_repository"])
        if params.get(contract.COMPONENT_PARAMETER) == "session":
            version_dir = model_dir / args["model_version"]
            counts = RequestCounts(config["name"])
            self.model = SessionModel(model_dir.parent, params, counts, version_dir, DeviceCounts(config["name"]))
        else:
            self.model = OnnxModel(model_dir / args["model_version"] / "model.onnx", config)

    def execute(self, requests):
        live = [r for r in requests if not r.is_cancelled()]  # cancelled while waiting: skip the work
        self.model.counts.add("cancelled_queued", len(requests) - len(live))
        done = dict(zip(map(id, live), self.model.run(live)))
        return [done[id(r)] if id(r) in done else cancelled() for r in requests]


class _NoCounts:
    """Stand-in for `RequestCounts` where nothing is counted."""

    def add(self, outcome: str, count: int = 1) -> None:
        pass


class OnnxModel:
    """Runs one ONNX file on each request, returning the outputs the client asked for."""

    counts = _NoCounts()

    def __init__(self, path: Path, config: dict) -> None:
        self.ort_session = ort_session(path)
        self.inputs = [i.name for i in self.ort_session.get_inputs()]
        self.outputs = [o["name"] for o in config["output"]]

    def run(self, requests) -> list:
        responses = []
        for request in requests:
            try:
                feeds = {name: required(request, name) for name in self.inputs}
            except ValueError as error:
                responses.append(failure(error))
                continue
            wanted = requested_outputs(request, self.outputs)
            responses.append(response(wanted, self.ort_session.run(wanted, feeds, released(self.ort_session))))
        return responses


class _Decode(NamedTuple):
    """One decode request as read: its rows (cached features) and the devices holding them,
    prompts, crop thresholds (or None), whether to keep the mask logits it answers and whether its
    single mask is the best candidate."""

    request: object
    rows: list
    places: list
    prompts: dict
    crop: object
    keep: bool
    best: bool


class _Part(NamedTuple):
    """The rows of a decode request on one device: their positions in the request."""

    decode: _Decode
    positions: list


class SessionModel:
    """Encode (image -> handle, features cached here) or decode (handle + prompts -> masks).

    On a GPU, decodes that arrive together (dynamic batching) with the same number of points run
    as one decoder call per device, in a session of that batch size (`triton_sam_devices.FIXED_BATCHES`).
    On a CPU each runs alone: there a batch costs as much compute as its rows and copies every row's
    features (BENCHMARKS.md, annotators: batching is slower there).
    """

    def __init__(
        self, repository: Path, params: dict, counts: RequestCounts, model_dir: Path, device_counts: DeviceCounts
    ) -> None:
        self.counts, self.device_counts = counts, device_counts
        self.model_id = params[contract.MODEL_ID_PARAMETER]
        self.devices = session_devices(repository, params, model_dir)
        self.device_runs = DeviceRuns(self.devices)
        decoder = self.devices[0].decoder
        low_res = {i.name: i.shape for i in decoder.get_inputs()}[contract.MASK_INPUT][-1]
        self.low_res = low_res if isinstance(low_res, int) else 256
        self.batch_decodes = self.devices[0].on_gpu
        # Images to one encoder run: what the config says, at most what a device's cache holds.
        capacity = self.devices[0].cache.capacity
        self.encode_batch = min(max(1, int(params.get(contract.ENCODE_BATCH_PARAMETER) or 1)), capacity)
        self.kept_logits = LruStore(int(params.get(contract.LOGITS_CACHE_SIZE_PARAMETER, "256")))
        self.mask_input_clamp = (
            float(params[contract.MASK_INPUT_CLAMP_PARAMETER]) if params.get(contract.MASK_INPUT_CLAMP_PARAMETER) else None
        )
        self.video = video_requests(model_dir, params)
        self.instances = InstanceRequests(model_dir, self.model_id)
        self.concepts = ConceptRequests(model_dir, self.model_id)  # SAM3's (`triton_sam_concepts.py`)

    def run(self, requests) -> list:
        encodes = [r for r in requests if pb_utils.get_input_tensor_by_name(r, IMAGE) is not None]
        responses = self._encode(encodes)  # encodes first: the rest then see slots no later encode can reuse
        decodes = []
        for request in requests:
            if id(request) in responses:
                continue
            try:
                if self.video is not None and self.video.handles(request):
                    responses[id(request)] = self.video.run(request, self._host_features(request))
                    self.counts.add("video")
                elif self.instances.handles(request):
                    responses[id(request)] = self.instances.run(request, *self._row(request))
                    self.counts.add("instance_maps")
                elif self.concepts.handles(request):
                    responses[id(request)] = self.concepts.run(request, *self._row(request))
                    self.counts.add("concepts")
                else:
                    decodes.append(request)
            except (UnknownHandle, UnknownMemory, ValueError) as error:
                self.counts.add(_failure_outcome(error))
                responses[id(request)] = failure(error)
        groups: dict = {}  # (device, points, outputs) -> [_Part]
        for request in decodes:
            try:
                rows, places, prompts = self._decode_inputs(request)
                crop = crop_threshold(request, len(rows))
                keep, best = flag(request, contract.KEEP_LOGITS), flag(request, contract.BEST_OF_MULTIMASK)
            except (UnknownHandle, ValueError, KeyError) as error:
                self.counts.add(_failure_outcome(error))
                responses[id(request)] = failure(error)
                continue
            decode = _Decode(request, rows, places, prompts, crop, keep, best)
            key = (prompts[contract.POINT_COORDS].shape[1], tuple(decoder_outputs(request, crop is not None, best)))
            if not self.batch_decodes:
                key += (id(request),)
            for device in dict.fromkeys(places):
                positions = [i for i, place in enumerate(places) if place is device]
                groups.setdefault((device.index, *key), []).append(_Part(decode, positions))
        responses.update(self._decode_groups(groups))
        return [responses[id(r)] for r in requests]

    def _encode(self, requests: list) -> dict:
        """Encode the images of `requests` (id -> response): those not cached yet, grouped by shape
        (a large plane's tiles, several users' planes arriving together), `encode_batch` images
        to an encoder run."""
        responses, handles, new = {}, {}, {}  # handles: request id -> its images'; new: handle -> image
        for request in requests:
            try:
                images = _images(request)
            except ValueError as error:
                self.counts.add("failed")
                responses[id(request)] = failure(error)
                continue
            handles[id(request)] = [content_signature(image, self.model_id) for image in images]
            new.update((h, image) for h, image in zip(handles[id(request)], images) if h not in placed(self.devices, h).cache)
        by_device: dict = {}  # device index -> {shape -> [handle]}
        for handle, image in new.items():
            by_device.setdefault(placed(self.devices, handle).index, {}).setdefault(image.shape, []).append(handle)
        work = {
            index: (lambda d=self.devices[index], g=groups: self._encode_on(d, g, new)) for index, groups in by_device.items()
        }
        self.device_runs.run(work)
        for index, groups in by_device.items():
            self.device_counts.add("encoded", self.devices[index], sum(map(len, groups.values())))
        for request_id, answer in handles.items():
            self.counts.add("encoded")
            responses[request_id] = response([HANDLE], [np.array([[h.encode()] for h in answer], dtype=np.object_)])
        return responses

    def _encode_on(self, device, by_shape: dict, images: dict) -> None:
        """Encode on `device` the images (handle -> image) of `by_shape` (shape -> handles),
        `encode_batch` of one shape to an encoder run."""
        for group in by_shape.values():
            start = 0
            while start < len(group):
                batch = group[start : start + self.encode_batch]
                self._encode_together(device, batch, [images[h] for h in batch])
                start += len(batch)

    def _encode_together(self, device, handles: list, images: list) -> None:
        """One encoder run for `images` on `device`; if a batch fails (a GPU out of memory for
        several large images), its images are encoded one by one, and so are all later ones."""
        try:
            device.cache.encode(handles, {IMAGE: np.stack(images)}, device.encoder, released(device.encoder))
        except Exception as error:
            if len(handles) == 1:
                raise
            pb_utils.Logger.log_warn(f"encoding {len(handles)} images together failed, now one at a time: {error}")
            self.encode_batch = 1
            for handle, image in zip(handles, images):
                if handle not in device.cache:
                    device.cache.encode([handle], {IMAGE: image[None]}, device.encoder, released(device.encoder))

    def _row(self, request) -> tuple:
        """The device holding the features of the request's one handle, and those features (an
        entry of its cache)."""
        handle = text(required(request, HANDLE).reshape(-1)[0])
        device = placed(self.devices, handle)
        try:
            return device, device.cache.get(handle)
        except KeyError:
            raise UnknownHandle(handle) from None

    def _host_features(self, request) -> dict:
        """The features of the request's one handle as numpy arrays."""
        device, row = self._row(request)
        return device.cache.host(row)

    def _decode_inputs(self, request) -> tuple:
        """One request's rows (cached features, one per prompt set), the devices holding them and
        its prompt tensors."""
        handles = required(request, HANDLE).reshape(-1)
        coords = required(request, contract.POINT_COORDS).astype(np.float32)
        labels = required(request, contract.POINT_LABELS).astype(np.int32)
        batch = len(handles)
        if coords.shape[0] != batch or labels.shape[:2] != coords.shape[:2]:
            raise ValueError(f"handle {handles.shape}, point_coords {coords.shape}, point_labels {labels.shape} disagree")
        places = [placed(self.devices, text(h)) for h in handles]
        try:
            rows = [place.cache.get(text(h)) for place, h in zip(places, handles)]
        except KeyError as error:
            raise UnknownHandle(error.args[0]) from None
        mask = self._mask_input(request, batch)
        prompts = {
            contract.POINT_COORDS: coords,
            contract.POINT_LABELS: labels,
            contract.MASK_INPUT: mask if mask is not None else np.zeros((batch, 1, self.low_res, self.low_res), np.float32),
            contract.HAS_MASK_INPUT: np.full((batch, 1), float(mask is not None), np.float32),
        }
        return rows, places, prompts

    def _mask_input(self, request, batch: int):
        """The request's mask input [B, 1, S, S]: sent, or kept here under the keys sent; None if neither."""
        mask = pb_utils.get_input_tensor_by_name(request, contract.MASK_INPUT)
        keys = pb_utils.get_input_tensor_by_name(request, contract.MASK_INPUT_KEY)
        if keys is None:
            return None if mask is None else mask.as_numpy()
        keys = [text(k) for k in keys.as_numpy().reshape(-1)]
        if mask is not None or len(keys) != batch:
            raise ValueError(f"send '{contract.MASK_INPUT}' or '{contract.MASK_INPUT_KEY}' (one per prompt set), not both")
        try:
            return np.stack([self.kept_logits.get(key) for key in keys])[:, None]
        except KeyError as error:
            raise UnknownMaskInput(error.args[0]) from None

    def _keep(self, masks: np.ndarray) -> np.ndarray:
        """Keep each of `masks`' logits ([B, C, S, S]) as a mask input, under its signature; the
        signatures, [B, C] bytes."""
        if self.mask_input_clamp is not None:
            masks = np.clip(masks, -self.mask_input_clamp, self.mask_input_clamp)
        keys = []
        for logits in masks.reshape(-1, *masks.shape[-2:]):
            keys.append(logits_signature(logits).encode())
            self.kept_logits.put(keys[-1].decode(), logits.copy())
        return np.array(keys, dtype=np.object_).reshape(masks.shape[:2])

    def _decode_groups(self, groups: dict) -> dict:
        """A decoder run for each of `groups` ((device, points, outputs, ...) -> parts), the devices
        at the same time; each request answered from its rows on every device (id -> response)."""
        runs: dict = {}  # device index -> [(outputs, parts)]
        for (index, _, wanted, *_), parts in groups.items():
            runs.setdefault(index, []).append((list(wanted), parts))
        work = {i: (lambda d=self.devices[i], r=r: [self._decode_together(d, *run) for run in r]) for i, r in runs.items()}
        decodes, pieces, cancelled_ = {}, {}, {}  # request id -> _Decode, [(positions, arrays)], Cancelled
        for index, results in self.device_runs.run(work).items():
            for (wanted, parts), outputs in zip(runs[index], results):
                decodes.update((id(part.decode.request), part.decode) for part in parts)
                if isinstance(outputs, Cancelled):
                    cancelled_.update((id(part.decode.request), outputs) for part in parts)
                    continue
                self.device_counts.add("decoded", self.devices[index], sum(len(part.positions) for part in parts))
                start = 0
                for part in parts:
                    arrays = {name: o[start : start + len(part.positions)] for name, o in zip(wanted, outputs)}
                    pieces.setdefault(id(part.decode.request), []).append((part.positions, arrays))
                    start += len(part.positions)
        self.counts.add("cancelled_running", len(cancelled_))
        self.counts.add("decoded", len(decodes) - len(cancelled_))
        return {
            key: failure(cancelled_[key]) if key in cancelled_ else self._answer(decode, in_row_order(pieces[key]))
            for key, decode in decodes.items()
        }

    def _decode_together(self, device, wanted: list, parts: list):
        """One decoder run on `device` for several requests' rows there: its outputs, or `Cancelled`
        if every request was cancelled while it ran."""
        rows = [part.decode.rows[i] for part in parts for i in part.positions]
        prompts = {
            name: _joined([taken(part.decode.prompts[name], part.positions) for part in parts])
            for name in parts[0].decode.prompts
        }
        try:
            return run_cancellable(
                lambda options: device.run_decoder(wanted, rows, prompts, options),
                [part.decode.request for part in parts],
            )
        except Cancelled as error:
            return error

    def _answer(self, decode: _Decode, arrays: dict) -> "pb_utils.InferenceResponse":
        """A decode request's response from the decoder's outputs for its rows (`arrays` by name)."""
        if decode.best:
            best = best_candidate(arrays[contract.MULTI_MASKS], arrays[contract.MULTI_SCORES])
            arrays.update(zip((contract.SINGLE_MASK, contract.SINGLE_SCORE), best))
        answered = answered_masks(decode.request)
        if decode.keep and answered in arrays:
            arrays[contract.KEPT_KEYS] = self._keep(arrays[answered])
        if decode.crop is not None:
            arrays.update(cropped_above(arrays, decode.crop, decode.request.requested_output_names()))
        names = requested_outputs(decode.request, arrays)
        return response(names, [arrays[name] for name in names])


def _joined(arrays: list) -> np.ndarray:
    """Arrays joined along the batch axis; one array as it is (an image's features are 16 MB and
    more: copying them would cost every decode time)."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _images(request) -> np.ndarray:
    """An encode request's images, [B, H, W, C] uint8; ValueError if malformed."""
    images = pb_utils.get_input_tensor_by_name(request, IMAGE).as_numpy()
    if images.ndim != 4 or images.shape[-1] not in (1, 3) or images.dtype != np.uint8:
        raise ValueError(f"image must be uint8 [B, H, W, 1 or 3], got {images.dtype} {list(images.shape)}")
    return images


def _failure_outcome(error: Exception) -> str:
    """The metric's outcome of a request refused with `error`: features not held here are their own
    (the client encodes the image again), as are a memory or kept logits no longer held (the client
    sends them again); anything else a failure."""
    if isinstance(error, UnknownHandle):
        return "unknown_handle"
    return "unknown_kept" if isinstance(error, (UnknownMemory, UnknownMaskInput)) else "failed"
