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
will give).

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

Self-contained on purpose (numpy, onnxruntime and Triton's `triton_python_backend_utils` only):
the same file runs in the NGC tritonserver image and in the server of `triton-sam serve`. The
session model's feature stores are in `triton_sam_features.py`, written next to it.
"""

import ctypes
import hashlib
import json
import sys
import threading
from pathlib import Path
from typing import NamedTuple

import triton_python_backend_utils as pb_utils

try:
    import numpy as np
    import onnxruntime as ort
except ImportError as error:  # said in Triton's log when the model fails to load
    raise ImportError(
        f"{error}. Triton's python backend runs {sys.executable or 'its stub'} (prefix {sys.prefix}), which looks "
        f"for packages in {sys.path}: install numpy<2 and onnxruntime-gpu where it looks (`triton-sam server-env` "
        "makes such an environment; `triton-sam serve --server-python` names one)."
    ) from error

# Copies of names in triton_sam.contract (this file runs alone in Triton; a test compares them).
UNKNOWN_HANDLE = "UNKNOWN_HANDLE"
IMAGE = "image"
HANDLE = "handle"
MODEL_ID_PARAMETER = "triton_sam_model_id"
COMPONENT_PARAMETER = "triton_sam_component"
ENCODE_BATCH_PARAMETER = "encode_batch"
SESSION_REQUESTS_METRIC = "triton_sam_session_requests_total"
GATHER_FILE = "gather_features.onnx"
DECODE_OUTPUTS = ("masks", "iou_predictions", "single_mask", "single_iou", "object_score_logits")
SINGLE_MASK, MULTI_MASKS, MASK_INPUT = "single_mask", "masks", "mask_input"
KEEP_LOGITS, MASK_INPUT_KEY, UNKNOWN_MASK_INPUT = "keep_logits", "mask_input_key", "UNKNOWN_MASK_INPUT"
KEPT_KEYS = "kept_keys"
MULTI_SCORES, SINGLE_SCORE, BEST_OF_MULTIMASK = "iou_predictions", "single_iou", "best_of_multimask"
CROP_THRESHOLD, SINGLE_MASK_CROP, CROP_BOX, CROP_MARGIN = "crop_threshold", "single_mask_crop", "crop_box", 2
MULTI_MASK_CROP = "masks_crop"
CROPS = {SINGLE_MASK: SINGLE_MASK_CROP, MULTI_MASKS: MULTI_MASK_CROP}  # decoder output -> its crop
UNKNOWN_MEMORY = "UNKNOWN_MEMORY"
VIDEO_DIR = "video"
# Volumes (SAM2.1): the inputs that tell a request's kind, and the other tensors.
MASK, MASK_LOGITS, MEMORY_TPOS = "mask", "mask_logits", "memory_tpos"
MEMORY_HANDLES, OBJ_PTRS, OBJ_PTR_TPOS = "memory_handles", "obj_ptrs", "obj_ptr_tpos"
MASK_SCORE, BINARIZE, MEMORY_HANDLE = "mask_score", "binarize", "memory_handle"
LOW_RES_LOGITS, MASK_OBJ_PTR, OBJECT_SCORE = "low_res_logits", "mask_obj_ptr", "object_score_logits"


CANCEL_POLL_S = 0.003


class Cancelled(Exception):
    """Every request of a run was cancelled by its client while it ran; the run was stopped."""


class UnknownHandle(KeyError):
    """The handle was never encoded here or has been evicted."""


class UnknownMemory(KeyError):
    """A mask memory handle was never made here or has been evicted."""


class UnknownMaskInput(KeyError):
    """A mask input key names logits never kept here or evicted."""


def _has_cuda_device() -> bool:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int(0)
        return cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0
    except OSError:
        return False


def _ort_session(path: Path) -> "ort.InferenceSession":
    """An ONNX Runtime session on the GPU when there is one (asking for CUDA without one only logs
    errors). ONNX Runtime falls back to the CPU when it cannot load its CUDA libraries (CUDA and
    cuDNN of its build: pip's nvidia-* packages, or the system's): said in Triton's log."""
    providers = ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in ort.get_available_providers() and _has_cuda_device():
        if hasattr(ort, "preload_dlls"):
            ort.preload_dlls()  # from pip's nvidia-* packages, where installed
        providers.insert(0, "CUDAExecutionProvider")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=providers)
    if providers[0] not in session.get_providers():
        pb_utils.Logger.log_warn(
            f"{path}: this machine has a GPU, but ONNX Runtime {ort.__version__} could not load its CUDA "
            "libraries (the CUDA and cuDNN versions it was built for): running on the CPU"
        )
    return session


def content_signature(image: np.ndarray, model_id: str) -> str:
    """Content signature of one preprocessed image: equal images share one cache entry."""
    digest = hashlib.blake2b(np.ascontiguousarray(image).tobytes(), digest_size=16)
    digest.update(str(image.shape).encode())  # SAM1 inputs vary in shape
    digest.update(model_id.encode())
    return digest.hexdigest()


def logits_signature(logits: np.ndarray) -> str:
    """Signature of one mask's low-res logits ([S, S] float32): its key as a later mask input."""
    return hashlib.blake2b(np.ascontiguousarray(logits, np.float32).tobytes(), digest_size=16).hexdigest()


class RequestCounts:
    """Counters of what the session model did with its requests, one per outcome."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.family = pb_utils.MetricFamily(
            name=SESSION_REQUESTS_METRIC,
            description="Session model requests by outcome (encoded, decoded, cancelled_queued, cancelled_running, failed)",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.metrics = {}

    def add(self, outcome: str, count: int = 1) -> None:
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
        if params.get(COMPONENT_PARAMETER) == "session":
            version_dir = model_dir / args["model_version"]
            self.model = SessionModel(model_dir.parent, params, RequestCounts(config["name"]), version_dir)
        else:
            self.model = OnnxModel(model_dir / args["model_version"] / "model.onnx", config)

    def execute(self, requests):
        live = [r for r in requests if not r.is_cancelled()]  # cancelled while waiting: skip the work
        self.model.counts.add("cancelled_queued", len(requests) - len(live))
        done = dict(zip(map(id, live), self.model.run(live)))
        return [done[id(r)] if id(r) in done else _cancelled() for r in requests]


class _NoCounts:
    """Stand-in for `RequestCounts` where nothing is counted."""

    def add(self, outcome: str, count: int = 1) -> None:
        pass


def _cancelled() -> "pb_utils.InferenceResponse":
    return _error("request cancelled before it ran", pb_utils.TritonError.CANCELLED)


def _failure(error: Exception) -> "pb_utils.InferenceResponse":
    """The error response for a request that could not be served."""
    if isinstance(error, Cancelled):
        return _error("request cancelled while it ran", pb_utils.TritonError.CANCELLED)
    if isinstance(error, UnknownHandle):
        message = f"{UNKNOWN_HANDLE}: no embedding for handle {error.args[0]} (evicted or never encoded)"
        return _error(message, pb_utils.TritonError.NOT_FOUND)
    if isinstance(error, UnknownMemory):
        message = f"{UNKNOWN_MEMORY}: no mask memory {error.args[0]} (evicted or never made)"
        return _error(message, pb_utils.TritonError.NOT_FOUND)
    if isinstance(error, UnknownMaskInput):
        message = f"{UNKNOWN_MASK_INPUT}: no kept mask logits {error.args[0]} (evicted or never kept)"
        return _error(message, pb_utils.TritonError.NOT_FOUND)
    return _error(f"invalid request: {error}", pb_utils.TritonError.INVALID_ARG)


def _response(names: list, arrays: list) -> "pb_utils.InferenceResponse":
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, a) for n, a in zip(names, arrays)])


def _wanted(request, available) -> list:
    """The outputs the client asked for (all of them if it did not say)."""
    return [n for n in request.requested_output_names() if n in available] or list(available)


class OnnxModel:
    """Runs one ONNX file on each request, returning the outputs the client asked for."""

    counts = _NoCounts()

    def __init__(self, path: Path, config: dict) -> None:
        self.ort_session = _ort_session(path)
        self.inputs = [i.name for i in self.ort_session.get_inputs()]
        self.outputs = [o["name"] for o in config["output"]]

    def run(self, requests) -> list:
        responses = []
        for request in requests:
            try:
                feeds = {name: _required(request, name) for name in self.inputs}
            except ValueError as error:
                responses.append(_failure(error))
                continue
            wanted = _wanted(request, self.outputs)
            responses.append(_response(wanted, self.ort_session.run(wanted, feeds)))
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
        self.model_id = params[MODEL_ID_PARAMETER]
        self.encoder = _ort_session(repository / params["encoder_model"] / "1" / "model.onnx")
        self.decoder = _ort_session(repository / params["decoder_model"] / "1" / "model.onnx")
        low_res = {i.name: i.shape for i in self.decoder.get_inputs()}["mask_input"][-1]
        self.low_res = low_res if isinstance(low_res, int) else 256
        on_gpu = "CUDAExecutionProvider" in self.decoder.get_providers()
        self.batch_decodes = on_gpu
        self.cache = _feature_store(self.encoder, self.decoder, params, on_gpu, model_dir)
        # Images to one encoder run: what the config says, at most what the cache holds.
        self.encode_batch = min(max(1, int(params.get(ENCODE_BATCH_PARAMETER) or 1)), self.cache.capacity)
        self.kept_logits = _lru_store(int(params.get("logits_cache_size", "256")))
        self.mask_input_clamp = float(params["mask_input_clamp"]) if params.get("mask_input_clamp") else None
        self.video = _video_requests(model_dir, params)

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
                else:
                    decodes.append(request)
            except (UnknownHandle, UnknownMemory, ValueError) as error:
                self.counts.add("failed")
                responses[id(request)] = _failure(error)
        groups: dict = {}  # (points, outputs) -> [_Decode]
        for request in decodes:
            try:
                rows, prompts = self._decode_inputs(request)
                crop = _crop_threshold(request, len(rows))
                keep, best = _flag(request, KEEP_LOGITS), _flag(request, BEST_OF_MULTIMASK)
            except (UnknownHandle, ValueError, KeyError) as error:
                self.counts.add("failed")
                responses[id(request)] = _failure(error)
                continue
            key = (prompts["point_coords"].shape[1], tuple(_decoder_outputs(request, crop is not None, best)))
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
                responses[id(request)] = _failure(error)
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
            responses[request_id] = _response([HANDLE], [np.array([[h.encode()] for h in answer], dtype=np.object_)])
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

    def _host_features(self, request) -> dict:
        """The features of the request's one handle as numpy arrays."""
        handle = _text(_required(request, HANDLE).reshape(-1)[0])
        try:
            return self.cache.host(self.cache.get(handle))
        except KeyError:
            raise UnknownHandle(handle) from None

    def _decode_inputs(self, request) -> tuple:
        """One request's rows (cached features, one per prompt set) and prompt tensors."""
        handles = _required(request, HANDLE).reshape(-1)
        coords = _required(request, "point_coords").astype(np.float32)
        labels = _required(request, "point_labels").astype(np.int32)
        batch = len(handles)
        if coords.shape[0] != batch or labels.shape[:2] != coords.shape[:2]:
            raise ValueError(f"handle {handles.shape}, point_coords {coords.shape}, point_labels {labels.shape} disagree")
        try:
            rows = [self.cache.get(_text(h)) for h in handles]
        except KeyError as error:
            raise UnknownHandle(error.args[0]) from None
        mask = self._mask_input(request, batch)
        prompts = {
            "point_coords": coords,
            "point_labels": labels,
            "mask_input": mask if mask is not None else np.zeros((batch, 1, self.low_res, self.low_res), np.float32),
            "has_mask_input": np.full((batch, 1), float(mask is not None), np.float32),
        }
        return rows, prompts

    def _mask_input(self, request, batch: int):
        """The request's mask input [B, 1, S, S]: sent, or kept here under the keys sent; None if neither."""
        mask = pb_utils.get_input_tensor_by_name(request, MASK_INPUT)
        keys = pb_utils.get_input_tensor_by_name(request, MASK_INPUT_KEY)
        if keys is None:
            return None if mask is None else mask.as_numpy()
        keys = [_text(k) for k in keys.as_numpy().reshape(-1)]
        if mask is not None or len(keys) != batch:
            raise ValueError(f"send '{MASK_INPUT}' or '{MASK_INPUT_KEY}' (one per prompt set), not both")
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
            outputs = _run_cancellable(
                lambda options: self.cache.run_decoder(self.decoder, wanted, rows, prompts, options),
                [member.request for member in members],
            )
        except Cancelled as error:
            self.counts.add("cancelled_running", len(members))
            return {id(member.request): _failure(error) for member in members}
        self.counts.add("decoded", len(members))
        responses, start = {}, 0
        for member in members:
            arrays = {name: o[start : start + len(member.rows)] for name, o in zip(wanted, outputs)}
            if member.best:
                arrays.update(_best_candidates(arrays[MULTI_MASKS], arrays[MULTI_SCORES]))
            answered = _answered_masks(member.request)
            if member.keep and answered in arrays:
                arrays[KEPT_KEYS] = self._keep(arrays[answered])
            if member.crop is not None:
                arrays.update(_cropped_above(arrays, member.crop, member.request.requested_output_names()))
            names = _wanted(member.request, arrays)
            responses[id(member.request)] = _response(names, [arrays[name] for name in names])
            start += len(member.rows)
        return responses


def _feature_store(encoder, decoder, params: dict, on_gpu: bool, model_dir: Path):
    """Where the session model keeps features (see the module docstring's `feature_buffers`)."""
    sys.path.insert(0, str(Path(__file__).parent))  # the stores live next to this file
    from triton_sam_features import BufferFeatureStore, FeatureStore

    capacity = int(params.get("cache_size", "16"))
    names = [output.name for output in encoder.get_outputs()]
    buffers = params.get("feature_buffers", "auto")
    if buffers == "off" or (buffers == "auto" and not on_gpu):
        return FeatureStore(capacity, names)
    device = "cuda" if on_gpu else "cpu"
    gather = _ort_session(model_dir / GATHER_FILE)
    # The decoder's inputs say the feature shapes (the encoder's outputs may be symbolic: any image size).
    decoder_shapes = {i.name: i.shape[1:] for i in decoder.get_inputs()}
    shapes = [decoder_shapes[name] for name in names]
    return BufferFeatureStore(capacity, names, shapes, device, gather)


def _lru_store(capacity: int):
    """An empty least-recently-used map of `capacity` entries (`triton_sam_features.LruStore`)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from triton_sam_features import LruStore

    return LruStore(capacity)


def _video_requests(model_dir: Path, params: dict):
    """The model's volume requests if its video graphs were exported, else None."""
    sys.path.insert(0, str(Path(__file__).parent))
    from triton_sam_video import has_video_graphs

    if not has_video_graphs(model_dir / VIDEO_DIR):
        return None
    return VideoRequests(model_dir / VIDEO_DIR, int(params.get("memory_cache_size", "512")))


class VideoRequests:
    """A volume's requests about one encoded plane (`handle`): track an object there, remember a
    mask as a memory (kept here in a bounded LRU, returned as a handle), or take a mask as the
    object's. Which memories a plane attends to is the client's choice."""

    def __init__(self, directory: Path, capacity: int) -> None:
        from triton_sam_video import TRACK_OUTPUTS, VideoGraphs

        self.graphs = VideoGraphs(directory, _ort_session)
        self.track_outputs = TRACK_OUTPUTS
        self.memories = _lru_store(capacity)

    def handles(self, request) -> bool:
        return any(pb_utils.get_input_tensor_by_name(request, name) is not None for name in (MASK, MASK_LOGITS, MEMORY_TPOS))

    def run(self, request, features: dict) -> "pb_utils.InferenceResponse":
        if pb_utils.get_input_tensor_by_name(request, MASK) is not None:
            mask = _required(request, MASK)
            if mask.ndim != 3 or mask.shape[0] != 1 or 0 in mask.shape:
                raise ValueError(f"mask must be [1, H, W], got {list(mask.shape)}")
            low_res, score, obj_ptr = self.graphs.mask_as_output(features, mask[0] > 0)
            return _response([LOW_RES_LOGITS, OBJECT_SCORE, MASK_OBJ_PTR], [low_res, score, obj_ptr.reshape(1, -1)])
        if pb_utils.get_input_tensor_by_name(request, MASK_LOGITS) is not None:
            logits, score = _required(request, MASK_LOGITS), _required(request, MASK_SCORE)
            binarize = bool(_required(request, BINARIZE).reshape(-1)[0] > 0.5)
            memory = self.graphs.remember(features, logits, score, binarize)
            digest = hashlib.blake2b(memory.tobytes(), digest_size=16).hexdigest()
            self.memories.put(digest, memory)
            return _response([MEMORY_HANDLE], [np.array([[digest.encode()]], dtype=np.object_)])
        return self._track(request, features)

    def _track(self, request, features: dict) -> "pb_utils.InferenceResponse":
        handles = [_text(h) for h in _required(request, MEMORY_HANDLES).reshape(-1)]
        try:
            memories = [self.memories.get(h) for h in handles]
        except KeyError as error:
            raise UnknownMemory(error.args[0]) from None
        mask = pb_utils.get_input_tensor_by_name(request, "mask_input")
        low = self.graphs.low_res
        prompts = {
            "point_coords": _required(request, "point_coords").astype(np.float32),
            "point_labels": _required(request, "point_labels").astype(np.int32),
            "mask_input": mask.as_numpy() if mask is not None else np.zeros((1, 1, low, low), np.float32),
            "has_mask_input": np.full((1, 1), float(mask is not None), np.float32),
        }
        ptrs = _required(request, OBJ_PTRS)
        outputs = self.graphs.track(
            features,
            memories,
            _required(request, MEMORY_TPOS).reshape(-1),
            ptrs.reshape(-1, ptrs.shape[-1]),
            _required(request, OBJ_PTR_TPOS).reshape(-1),
            prompts,
        )
        return _response(list(self.track_outputs), outputs)


def _decoder_outputs(request, cropped: bool, best: bool) -> list:
    """The decoder's outputs a decode request needs: those it asks for (all if none), the masks
    whose crop it asks for where it is `cropped` (it sends a crop threshold), and the multimask
    candidates in place of the single mask where it wants the `best` of them."""
    requested = request.requested_output_names()
    wanted = [name for name in DECODE_OUTPUTS if name in requested]
    if cropped:
        wanted += [name for name, crop in CROPS.items() if crop in requested and name not in wanted]
    wanted = wanted or list(DECODE_OUTPUTS)
    if best:
        wanted = [n for n in wanted if n not in (SINGLE_MASK, SINGLE_SCORE)]
        wanted += [n for n in (MULTI_MASKS, MULTI_SCORES) if n not in wanted]
    return wanted


def _best_candidates(masks: np.ndarray, scores: np.ndarray) -> dict:
    """Each row's multimask candidate with the highest predicted IoU (the first of equals), as its
    single mask and score."""
    rows, best = np.arange(len(scores)), np.argmax(scores, axis=1)
    return {SINGLE_MASK: masks[rows, best][:, None], SINGLE_SCORE: scores[rows, best][:, None]}


def _crop_threshold(request, batch: int):
    """The request's crop threshold per row ([B] float32), None if it sends none (then it gets no
    crop: Triton lists every output as requested when a client names none)."""
    tensor = pb_utils.get_input_tensor_by_name(request, CROP_THRESHOLD)
    if tensor is None:
        return None
    thresholds = tensor.as_numpy().astype(np.float32).reshape(-1)
    if thresholds.shape != (batch,) or not np.isfinite(thresholds).all():
        raise ValueError(f"'{CROP_THRESHOLD}' must be one finite number per prompt set, got {list(tensor.as_numpy().shape)}")
    return thresholds


def _answered_masks(request) -> str:
    """The decoder output whose masks a decode request gets, whole or cropped: the candidates where
    it asks for them (or for nothing in particular), else the single mask."""
    requested = request.requested_output_names()
    return SINGLE_MASK if requested and MULTI_MASKS not in requested and MULTI_MASK_CROP not in requested else MULTI_MASKS


def _cropped_above(arrays: dict, thresholds: np.ndarray, requested) -> dict:
    """The `requested` crops of the decoder's mask `arrays` ([B, C, S, S]): cut to the samples above
    each row's threshold, grown by CROP_MARGIN (one box for the batch and every mask; (0, 0, 1, 1)
    if none is above), and that box per row."""
    masks = {name: arrays[name] for name, crop in CROPS.items() if crop in requested and name in arrays}
    if not masks:
        return {}
    above = np.zeros(next(iter(masks.values())).shape[-2:], bool)
    for logits in masks.values():
        above |= (logits > thresholds.reshape(-1, 1, 1, 1)).any(axis=(0, 1))
    rows, cols = np.flatnonzero(above.any(axis=1)), np.flatnonzero(above.any(axis=0))
    y0, x0, y1, x1 = 0, 0, 1, 1
    if rows.size:
        height, width = above.shape
        y0, y1 = max(rows[0] - CROP_MARGIN, 0), min(rows[-1] + 1 + CROP_MARGIN, height)
        x0, x1 = max(cols[0] - CROP_MARGIN, 0), min(cols[-1] + 1 + CROP_MARGIN, width)
    crops = {CROPS[name]: np.ascontiguousarray(logits[:, :, y0:y1, x0:x1]) for name, logits in masks.items()}
    return {**crops, CROP_BOX: np.tile(np.array([y0, x0, y1, x1], np.int32), (len(thresholds), 1))}


def _joined(arrays: list) -> np.ndarray:
    """Arrays joined along the batch axis; one array as it is (an image's features are 16 MB and
    more: copying them would cost every decode time)."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _run_cancellable(run, requests: list) -> list:
    """`run(options)` of an ONNX Runtime session, stopped (`options.terminate`) as soon as every
    request is cancelled.

    A hover decode superseded while it runs thus frees the instance within milliseconds instead
    of making the newest request wait behind it.
    """
    options = ort.RunOptions()
    finished = threading.Event()

    def watch() -> None:
        while not finished.wait(CANCEL_POLL_S):
            if all(r.is_cancelled() for r in requests):
                options.terminate = True
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        return run(options)
    except Exception as error:
        if options.terminate:
            raise Cancelled() from error
        raise
    finally:
        finished.set()
        watcher.join()


def _images(request) -> np.ndarray:
    """An encode request's images, [B, H, W, C] uint8; ValueError if malformed."""
    images = pb_utils.get_input_tensor_by_name(request, IMAGE).as_numpy()
    if images.ndim != 4 or images.shape[-1] not in (1, 3) or images.dtype != np.uint8:
        raise ValueError(f"image must be uint8 [B, H, W, 1 or 3], got {images.dtype} {list(images.shape)}")
    return images


def _required(request, name: str) -> np.ndarray:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        raise ValueError(f"this request needs input '{name}'")
    return tensor.as_numpy()


def _flag(request, name: str) -> bool:
    """Whether the request sends input `name` set (any of its values true)."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return tensor is not None and bool(tensor.as_numpy().any())


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _error(message: str, code) -> "pb_utils.InferenceResponse":
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))
