"""triton-sam's Triton python-backend models; exported as `model.py` (see `TritonPythonModel`).

Session model (`triton_sam_component: "session"`) keeps image features on the server. An
*encode* request sends the image (`image`, [B,H,W,C] uint8, any size: the encoder resizes) and gets back a
`handle` per image; a *decode* request sends only `handle` and the prompts (well under 4 KB) and
gets mask logits back under the decoder's output names; with `crop_threshold` it may ask for
`single_mask_crop` or `masks_crop` and `crop_box` instead of `single_mask` or `masks`: the mask
logits only around the samples above that threshold (a hover preview's or a click's, sent often
over a user's network). Features live in a bounded LRU in this process, so the model runs as one
instance. An unknown or evicted handle fails with NOT_FOUND
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
`1/model.onnx` it runs), `cache_size` (images kept), `logits_cache_size` (masks kept),
`encode_batch` (new images of one shape, from the requests of one run, encoded together: a large
plane's tiles; 1 where absent) and `feature_buffers` ("auto": on a GPU the
features stay in GPU memory, one slot per image, and the decoder reads them there; "on": the same
buffers in host memory, for tests; "off": numpy arrays). Rows of a batched decode are gathered
from the slots by `gather_features.onnx`, written next to this file. What it did with each request is counted
on Triton's metrics endpoint as `triton_sam_session_requests_total{model, outcome}` (Triton's own
statistics count a request cancelled here as a success).

ONNX model (`encoder` / `decoder`): runs the `model.onnx` next to it. The Triton server of
nvidia-pytriton has only the python backend, so `triton-sam serve` uses this in place of the
onnxruntime backend: same names, tensors and batching as on the NGC image.

Imports numpy, onnxruntime and Triton's `triton_python_backend_utils` only, and the modules
written next to it (`server.models.write_python_model`), never triton-sam: the same files run in
the NGC tritonserver image and in the server of `triton-sam serve`. Next to it: the tensor
contract (`triton_sam_contract.py`, triton-sam's `contract.py`), the array computations the
client does alike (`triton_sam_arrays.py`), the feature stores (`triton_sam_features.py`), the
video graphs (`triton_sam_video.py`) and the instance-segmentation requests (`triton_sam_instance.py`).
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
from triton_sam_arrays import best_candidate, content_signature, crop_box, logits_signature  # noqa: E402
from triton_sam_features import BufferFeatureStore, FeatureStore, LruStore  # noqa: E402
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
    requested_outputs,
    required,
    response,
    run_cancellable,
    text,
)
from triton_sam_volumes import video_requests  # noqa: E402

IMAGE, HANDLE = contract.ENCODER_INPUT, contract.HANDLE
CROPS = {contract.SINGLE_MASK: contract.SINGLE_MASK_CROP, contract.MULTI_MASKS: contract.MULTI_MASK_CROP}  # output -> its crop


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
            self.model = SessionModel(model_dir.parent, params, RequestCounts(config["name"]), version_dir)
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
            responses.append(response(wanted, self.ort_session.run(wanted, feeds)))
        return responses


class _Decode(NamedTuple):
    """One decode request as read: its rows (cached features), prompts, crop thresholds (or None),
    whether to keep the mask logits it answers and whether its single mask is the best candidate."""

    request: object
    rows: list
    prompts: dict
    crop: object
    keep: bool
    best: bool


class SessionModel:
    """Encode (image -> handle, features cached here) or decode (handle + prompts -> masks).

    On a GPU, decodes that arrive together (dynamic batching) with the same number of points run
    as one decoder call. On a CPU each runs alone: there a batch costs as much compute as its rows
    and copies every row's features (BENCHMARKS.md, annotators: batching is slower there).
    """

    def __init__(self, repository: Path, params: dict, counts: RequestCounts, model_dir: Path) -> None:
        self.counts = counts
        self.model_id = params[contract.MODEL_ID_PARAMETER]
        self.encoder = ort_session(repository / params[contract.ENCODER_MODEL_PARAMETER] / "1" / "model.onnx")
        self.decoder = ort_session(repository / params[contract.DECODER_MODEL_PARAMETER] / "1" / "model.onnx")
        low_res = {i.name: i.shape for i in self.decoder.get_inputs()}[contract.MASK_INPUT][-1]
        self.low_res = low_res if isinstance(low_res, int) else 256
        on_gpu = "CUDAExecutionProvider" in self.decoder.get_providers()
        self.batch_decodes = on_gpu
        self.cache = _feature_store(self.encoder, self.decoder, params, on_gpu, model_dir)
        # Images to one encoder run: what the config says, at most what the cache holds.
        self.encode_batch = min(max(1, int(params.get(contract.ENCODE_BATCH_PARAMETER) or 1)), self.cache.capacity)
        self.kept_logits = LruStore(int(params.get(contract.LOGITS_CACHE_SIZE_PARAMETER, "256")))
        self.mask_input_clamp = (
            float(params[contract.MASK_INPUT_CLAMP_PARAMETER]) if params.get(contract.MASK_INPUT_CLAMP_PARAMETER) else None
        )
        self.video = video_requests(model_dir, params)
        self.instances = InstanceRequests(model_dir, self.model_id)

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
                    responses[id(request)] = self.instances.run(request, self.cache, self._row(request))
                    self.counts.add("instance_maps")
                else:
                    decodes.append(request)
            except (UnknownHandle, UnknownMemory, ValueError) as error:
                self.counts.add("failed")
                responses[id(request)] = failure(error)
        groups: dict = {}  # (points, outputs) -> [_Decode]
        for request in decodes:
            try:
                rows, prompts = self._decode_inputs(request)
                crop = _crop_threshold(request, len(rows))
                keep, best = flag(request, contract.KEEP_LOGITS), flag(request, contract.BEST_OF_MULTIMASK)
            except (UnknownHandle, ValueError, KeyError) as error:
                self.counts.add("failed")
                responses[id(request)] = failure(error)
                continue
            key = (prompts[contract.POINT_COORDS].shape[1], tuple(_decoder_outputs(request, crop is not None, best)))
            if not self.batch_decodes:
                key += (id(request),)
            groups.setdefault(key, []).append(_Decode(request, rows, prompts, crop, keep, best))
        for (_, wanted, *_), members in groups.items():
            responses.update(self._decode_together(list(wanted), members))
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
            new.update((h, image) for h, image in zip(handles[id(request)], images) if h not in self.cache)
        by_shape: dict = {}
        for handle, image in new.items():
            by_shape.setdefault(image.shape, []).append(handle)
        for group in by_shape.values():
            start = 0
            while start < len(group):
                batch = group[start : start + self.encode_batch]
                self._encode_together(batch, [new[h] for h in batch])
                start += len(batch)
        for request_id, answer in handles.items():
            self.counts.add("encoded")
            responses[request_id] = response([HANDLE], [np.array([[h.encode()] for h in answer], dtype=np.object_)])
        return responses

    def _encode_together(self, handles: list, images: list) -> None:
        """One encoder run for `images`; if a batch fails (a GPU out of memory for several large
        images), its images are encoded one by one, and so are all later ones."""
        try:
            self.cache.encode(handles, {IMAGE: np.stack(images)}, self.encoder)
        except Exception as error:
            if len(handles) == 1:
                raise
            pb_utils.Logger.log_warn(f"encoding {len(handles)} images together failed, now one at a time: {error}")
            self.encode_batch = 1
            for handle, image in zip(handles, images):
                if handle not in self.cache:
                    self.cache.encode([handle], {IMAGE: image[None]}, self.encoder)

    def _row(self, request):
        """The kept features (an entry of `cache`) of the request's one handle."""
        handle = text(required(request, HANDLE).reshape(-1)[0])
        try:
            return self.cache.get(handle)
        except KeyError:
            raise UnknownHandle(handle) from None

    def _host_features(self, request) -> dict:
        """The features of the request's one handle as numpy arrays."""
        return self.cache.host(self._row(request))

    def _decode_inputs(self, request) -> tuple:
        """One request's rows (cached features, one per prompt set) and prompt tensors."""
        handles = required(request, HANDLE).reshape(-1)
        coords = required(request, contract.POINT_COORDS).astype(np.float32)
        labels = required(request, contract.POINT_LABELS).astype(np.int32)
        batch = len(handles)
        if coords.shape[0] != batch or labels.shape[:2] != coords.shape[:2]:
            raise ValueError(f"handle {handles.shape}, point_coords {coords.shape}, point_labels {labels.shape} disagree")
        try:
            rows = [self.cache.get(text(h)) for h in handles]
        except KeyError as error:
            raise UnknownHandle(error.args[0]) from None
        mask = self._mask_input(request, batch)
        prompts = {
            contract.POINT_COORDS: coords,
            contract.POINT_LABELS: labels,
            contract.MASK_INPUT: mask if mask is not None else np.zeros((batch, 1, self.low_res, self.low_res), np.float32),
            contract.HAS_MASK_INPUT: np.full((batch, 1), float(mask is not None), np.float32),
        }
        return rows, prompts

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

    def _decode_together(self, wanted: list, members: list) -> dict:
        """One decoder run for several requests' rows; each request gets its own rows back."""
        rows = [row for member in members for row in member.rows]
        prompts = {name: _joined([member.prompts[name] for member in members]) for name in members[0].prompts}
        try:
            outputs = run_cancellable(
                lambda options: self.cache.run_decoder(self.decoder, wanted, rows, prompts, options),
                [member.request for member in members],
            )
        except Cancelled as error:
            self.counts.add("cancelled_running", len(members))
            return {id(member.request): failure(error) for member in members}
        self.counts.add("decoded", len(members))
        responses, start = {}, 0
        for member in members:
            arrays = {name: o[start : start + len(member.rows)] for name, o in zip(wanted, outputs)}
            if member.best:
                best = best_candidate(arrays[contract.MULTI_MASKS], arrays[contract.MULTI_SCORES])
                arrays.update(zip((contract.SINGLE_MASK, contract.SINGLE_SCORE), best))
            answered = _answered_masks(member.request)
            if member.keep and answered in arrays:
                arrays[contract.KEPT_KEYS] = self._keep(arrays[answered])
            if member.crop is not None:
                arrays.update(_cropped_above(arrays, member.crop, member.request.requested_output_names()))
            names = requested_outputs(member.request, arrays)
            responses[id(member.request)] = response(names, [arrays[name] for name in names])
            start += len(member.rows)
        return responses


def _feature_store(encoder, decoder, params: dict, on_gpu: bool, model_dir: Path):
    """Where the session model keeps features (see the module docstring's `feature_buffers`)."""
    capacity = int(params.get(contract.CACHE_SIZE_PARAMETER, "16"))
    # The features the decoder takes: not SAM3's detector maps (kept here once it answers concept requests).
    decoder_inputs = {i.name for i in decoder.get_inputs()}
    names = [output.name for output in encoder.get_outputs() if output.name in decoder_inputs]
    buffers = params.get(contract.FEATURE_BUFFERS_PARAMETER, "auto")
    if buffers == "off" or (buffers == "auto" and not on_gpu):
        return FeatureStore(capacity, names)
    device = "cuda" if on_gpu else "cpu"
    gather = ort_session(model_dir / contract.GATHER_FILE)
    # The decoder's inputs say the feature shapes (the encoder's outputs may be symbolic: any image size).
    decoder_shapes = {i.name: i.shape[1:] for i in decoder.get_inputs()}
    shapes = [decoder_shapes[name] for name in names]
    return BufferFeatureStore(capacity, names, shapes, device, gather)


def _decoder_outputs(request, cropped: bool, best: bool) -> list:
    """The decoder's outputs a decode request needs: those it asks for (all if none), the masks
    whose crop it asks for where it is `cropped` (it sends a crop threshold), and the multimask
    candidates in place of the single mask where it wants the `best` of them."""
    requested = request.requested_output_names()
    wanted = [name for name in contract.DECODER_OUTPUTS if name in requested]
    if cropped:
        wanted += [name for name, crop in CROPS.items() if crop in requested and name not in wanted]
    wanted = wanted or list(contract.DECODER_OUTPUTS)
    if best:
        wanted = [n for n in wanted if n not in (contract.SINGLE_MASK, contract.SINGLE_SCORE)]
        wanted += [n for n in (contract.MULTI_MASKS, contract.MULTI_SCORES) if n not in wanted]
    return wanted


def _crop_threshold(request, batch: int):
    """The request's crop threshold per row ([B] float32), None if it sends none (then it gets no
    crop: Triton lists every output as requested when a client names none)."""
    tensor = pb_utils.get_input_tensor_by_name(request, contract.CROP_THRESHOLD)
    if tensor is None:
        return None
    thresholds = tensor.as_numpy().astype(np.float32).reshape(-1)
    if thresholds.shape != (batch,) or not np.isfinite(thresholds).all():
        raise ValueError(
            f"'{contract.CROP_THRESHOLD}' must be one finite number per prompt set, got {list(tensor.as_numpy().shape)}"
        )
    return thresholds


def _answered_masks(request) -> str:
    """The decoder output whose masks a decode request gets, whole or cropped: the candidates where
    it asks for them (or for nothing in particular), else the single mask."""
    requested = request.requested_output_names()
    return (
        contract.SINGLE_MASK
        if requested and contract.MULTI_MASKS not in requested and contract.MULTI_MASK_CROP not in requested
        else contract.MULTI_MASKS
    )


def _cropped_above(arrays: dict, thresholds: np.ndarray, requested) -> dict:
    """The `requested` crops of the decoder's mask `arrays` ([B, C, S, S]): cut to the samples above
    each row's threshold, grown by `contract.CROP_MARGIN` (one box for the batch and every mask;
    `triton_sam_arrays.crop_box`), and that box per row."""
    masks = {name: arrays[name] for name, crop in CROPS.items() if crop in requested and name in arrays}
    if not masks:
        return {}
    y0, x0, y1, x1 = crop_box(list(masks.values()), thresholds, contract.CROP_MARGIN)
    crops = {CROPS[name]: np.ascontiguousarray(logits[:, :, y0:y1, x0:x1]) for name, logits in masks.items()}
    return {**crops, contract.CROP_BOX: np.tile(np.array([y0, x0, y1, x1], np.int32), (len(thresholds), 1))}


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
