"""The devices the session model (`python_model.py`, written as `model.py`) drives, and which of
them holds an image's features. Written next to `model.py`; numpy, onnxruntime and Triton's
`triton_python_backend_utils` only.

Every visible GPU is used (`CUDA_VISIBLE_DEVICES` applies; `$TRITON_SAM_DEVICES` caps the count).
Without a GPU, `$TRITON_SAM_DEVICES` CPU stand-ins (1 by default): independent sessions and
stores, each a device to placement, so that the code of several GPUs runs in CI. Each device has
its own encoder and decoder sessions (the CUDA provider's `device_id`) and its own feature store
(`cache_size` images each). An image lives on the device its content signature picks by
rendezvous hashing over the device indices: its encode and every decode of it run there, whichever
request carries them; a device added takes about 1/N of the images. A run's work on different
devices goes at the same time, a thread per device (ONNX Runtime releases the GIL while it runs).

Why one instance driving every device, not one instance per GPU (Triton's `KIND_GPU` instance
group): each python-backend instance is its own process with its own features, and Triton hands a
request to whichever instance is free, so with one instance per GPU an image's decodes land on
instances that lack its features (N-1 of N of them on N GPUs), each a re-encode. Pinning an image
to an instance takes Triton's sequence batcher in place of the dynamic batcher: every client sends
a correlation id with start and end flags, each live sequence holds one of a bounded number of
slots until an idle timeout, and the pin is per correlation id (one user), not per image, so two
users of one image encode it twice. Measured with two CPU instances and four clients, 44 % of
decodes found no features (docs/several-servers.md). Placement by signature inside one process
needs none of that and no client change. Its cost: one process parses requests and answers for
all devices, and a run waits for its slowest device before the next run starts.
"""

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
import triton_sam_contract as contract
from triton_sam_concepts import has_concept_graphs
from triton_sam_features import BufferFeatureStore, FeatureStore
from triton_sam_graphs import DevicePointer, GraphDecoder, free_dimensions
from triton_sam_requests import cuda_devices, ort_session, released

# Decoder runs of up to this many prompt sets go to a decoder session with the batch fixed at the
# next of these sizes, the rows padded up to it (where features live in buffers: on a GPU). With
# cuDNN 9, ONNX Runtime's convolutions keep one plan per session for the last input shape and make
# a new one whenever the batch changes, as it does from run to run under dynamic batching; a
# session per size never changes shape (`benchmarks.gpu_decoder_probe`'s "session_batch", #38).
# The largest is the session model's `max_batch_size` (`export.triton_config`): Triton hands it no more.
FIXED_BATCHES = (1, 2, 4, 8, 16)


class Device:
    """One device (a GPU, or the CPU standing in for one): its encoder and decoder sessions and the
    features of the images placed on it."""

    def __init__(self, index: int, repository: Path, params: dict, model_dir: Path) -> None:
        self.index = index
        self.encoder = ort_session(repository / params[contract.ENCODER_MODEL_PARAMETER] / "1" / "model.onnx", index)
        self.decoder_path = repository / params[contract.DECODER_MODEL_PARAMETER] / "1" / "model.onnx"
        self.decoder = ort_session(self.decoder_path, index)
        self.on_gpu = "CUDAExecutionProvider" in self.decoder.get_providers()
        self.cache = _feature_store(self, params, model_dir)
        coords = next(i for i in self.decoder.get_inputs() if i.name == contract.POINT_COORDS)
        self.batch_dimension = coords.shape[0] if isinstance(self.cache, BufferFeatureStore) else None
        self.fixed_decoders: dict = {}  # batch size -> the decoder session with that batch fixed (None: failed)
        # now, not at the first hover; on a GPU every size, each run once: a session made and its
        # convolutions planned while annotators wait holds their decodes up (#38: before this, 16
        # annotators on an H200 saw a p99 of 318 ms, 32 ms after it together with the graphs)
        for batch in FIXED_BATCHES if self.on_gpu else FIXED_BATCHES[:1]:
            self._fixed_decoder(batch)
        self.graphs = self._graph_decoder(params, model_dir)

    def run_decoder(self, wanted: list, rows: list, prompts: dict, options) -> list:
        """The decoder's `wanted` outputs for `rows` (entries of `cache`, one per prompt set) and their
        `prompts`: in a session of a fixed batch (`FIXED_BATCHES`), rows padded, where there is one."""
        count = len(rows)
        if count > 1:
            options = released(self.decoder, options)
        graphs = self.graphs
        if (
            count == 1
            and graphs is not None
            and graphs.takes(prompts, wanted)
            and graphs.handles(1, prompts[contract.POINT_COORDS].shape[1])
        ):
            replayed = self._replayed(wanted, rows[0], prompts, options)
            if replayed is not None:
                return replayed
        batch = next((size for size in FIXED_BATCHES if size >= count), None)
        decoder = self._fixed_decoder(batch)
        if decoder is None:
            return self.cache.run_decoder(self.decoder, wanted, rows, prompts, options)
        if batch == count:  # (every hover: nothing to pad or trim)
            return self.cache.run_decoder(decoder, wanted, rows, prompts, options)
        rows = rows + rows[-1:] * (batch - count)  # the last row again: its answers are dropped
        prompts = {name: np.concatenate([array, np.repeat(array[-1:], batch - count, 0)]) for name, array in prompts.items()}
        outputs = self.cache.run_decoder(decoder, wanted, rows, prompts, options)
        return [output[:count] for output in outputs]

    def _replayed(self, wanted: list, slot: int, prompts: dict, options):
        """The `wanted` outputs of one prompt set's decode through the graphs; None where they turned
        themselves off (a failure, or a point count's first replay off the usual run: logged)."""
        graphs, points = self.graphs, prompts[contract.POINT_COORDS].shape[1]
        store = self.cache
        features = {
            name: DevicePointer(store.device, store.device_id, store.slot_pointer(name, slot)) for name in graphs.features
        }
        try:
            answer = graphs.decode(store.version(slot), features, prompts)
        except Exception as error:  # ONNX Runtime's errors have no common type
            return self._graphs_off(f"{type(error).__name__}: {error}")
        replayed = [answer[name] for name in wanted]
        if points in graphs.checked:
            return replayed
        usual = store.run_decoder(self._fixed_decoder(1) or self.decoder, wanted, [slot], prompts, options)
        why = graphs.mismatch(points, replayed, usual)
        return replayed if why is None else self._graphs_off(why)

    def _graphs_off(self, why: str) -> None:
        pb_utils.Logger.log_warn(f"device {self.index}: decodes replayed as CUDA graphs are off ({why}); the usual ones run")
        graphs, self.graphs = self.graphs, None
        graphs.close()

    def _graph_decoder(self, params: dict, model_dir: Path) -> GraphDecoder | None:
        """The decoder replaying one-prompt-set decodes as CUDA graphs (`triton_sam_graphs`), where
        features live in buffers and `graph_decodes` is "on", or "auto" on a GPU unless
        `$TRITON_SAM_CUDA_GRAPHS` says 0 (on the CPU "on" runs the same buffers without capture);
        None elsewhere, and where the export has no copy graphs or they cannot be made (logged)."""
        wanted = params.get(contract.GRAPH_DECODES_PARAMETER, "auto")
        allowed = self.on_gpu and contract.cuda_graphs_allowed(os.environ.get(contract.CUDA_GRAPHS_ENV))
        if not isinstance(self.cache, BufferFeatureStore) or not (wanted == "on" or (wanted == "auto" and allowed)):
            return None
        copies = [model_dir / name for name in contract.GRAPH_COPY_FILES]
        if not all(path.is_file() for path in copies):
            missing = ", ".join(path.name for path in copies if not path.is_file())
            pb_utils.Logger.log_warn(f"no CUDA-graph decodes: {missing} missing beside model.py (export again to have them)")
            return None
        inputs = {i.name: i.shape for i in self.decoder.get_inputs()}
        low = inputs[contract.MASK_INPUT][-1]
        try:
            return GraphDecoder(
                self.decoder_path,
                free_dimensions(self.decoder, contract.POINT_COORDS),
                {name: [1, *self.cache.shapes[name]] for name in self.cache.names if name in inputs},
                contract.graph_prompts(low),
                contract.graph_outputs(low),
                tuple(copies),
                capture=self.on_gpu,
                device_id=self.index,
            )
        except Exception as error:  # a failed capture, memory: the usual decodes answer, slower only
            pb_utils.Logger.log_warn(f"device {self.index}: no CUDA-graph decodes ({type(error).__name__}: {error})")
            return None

    def _fixed_decoder(self, batch: int | None):
        """The decoder session with the batch fixed at `batch`, made on first use; None where there
        is none: no buffers, a batch fixed in the file, past `FIXED_BATCHES`, or one that failed to
        load (logged once; the dynamic session answers, slower only)."""
        if not isinstance(self.batch_dimension, str) or batch is None:
            return None
        if batch not in self.fixed_decoders:
            try:
                session = ort_session(self.decoder_path, self.index, {self.batch_dimension: batch})
                if self.on_gpu:
                    session.run(None, _zeros(session))
                self.fixed_decoders[batch] = session
            except Exception as error:  # ONNX Runtime's errors have no common type (memory, say)
                pb_utils.Logger.log_warn(
                    f"device {self.index}: no decoder session of batch {batch} ({error}); the usual one runs"
                )
                self.fixed_decoders[batch] = None
        return self.fixed_decoders[batch]


def _zeros(session) -> dict:
    """Zeros for every input of `session`, dimensions left free in it taken as 1."""
    dtypes = {"tensor(float)": np.float32, "tensor(int32)": np.int32, "tensor(int64)": np.int64}
    return {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], dtypes[i.type]) for i in session.get_inputs()}


def session_devices(repository: Path, params: dict, model_dir: Path) -> list:
    """The session model's devices (see the module docstring), device 0 first."""
    first = Device(0, repository, params, model_dir)
    return [first, *(Device(index, repository, params, model_dir) for index in range(1, device_count(first.on_gpu)))]


def device_count(on_gpu: bool) -> int:
    """Every visible GPU, at most `$TRITON_SAM_DEVICES` where set; on the CPU that many stand-ins (1
    where unset)."""
    wanted = os.environ.get(contract.DEVICES_ENV, "").strip()
    if on_gpu:
        visible = max(1, cuda_devices())
        return min(visible, max(1, int(wanted))) if wanted else visible
    return max(1, int(wanted or 1))


def placed(devices: list, handle: str) -> Device:
    """The device holding the features of image `handle`: the highest hash of (device, handle)
    (rendezvous hashing: stable, and a device added takes only its share of the images); no hashing
    where there is one device, as on most servers (every encode and decode asks)."""
    if len(devices) == 1:
        return devices[0]
    return max(devices, key=lambda device: hashlib.blake2b(f"{device.index}:{handle}".encode(), digest_size=8).digest())


class DeviceRuns:
    """Runs each device's share of a run, at the same time where several devices have work."""

    def __init__(self, devices: list) -> None:
        self.pool = ThreadPoolExecutor(len(devices), thread_name_prefix="triton-sam-device") if len(devices) > 1 else None

    def run(self, work: dict) -> dict:
        """device index -> what its function in `work` (device index -> function) returned."""
        if self.pool is None or len(work) < 2:
            return {index: function() for index, function in work.items()}
        futures = {index: self.pool.submit(function) for index, function in work.items()}
        return {index: future.result() for index, future in futures.items()}


class DeviceCounts:
    """What each device did, on Triton's metrics endpoint: images encoded and prompt sets decoded
    there (`contract.DEVICE_ENCODED_METRIC`, `contract.DEVICE_DECODED_METRIC`, {model, device})."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.families = {
            work: pb_utils.MetricFamily(name=name, description=description, kind=pb_utils.MetricFamily.COUNTER)
            for work, name, description in (
                ("encoded", contract.DEVICE_ENCODED_METRIC, "Images the session model encoded, by device"),
                ("decoded", contract.DEVICE_DECODED_METRIC, "Prompt sets the session model decoded, by device"),
            )
        }
        self.metrics: dict = {}

    def add(self, work: str, device: Device, count: int) -> None:
        key = (work, device.index)
        if key not in self.metrics:
            labels = {"model": self.model_name, "device": str(device.index)}
            self.metrics[key] = self.families[work].Metric(labels=labels)
        self.metrics[key].increment(count)


def _feature_store(device: Device, params: dict, model_dir: Path):
    """Where `device` keeps features (see `python_model.py`'s docstring, `feature_buffers`)."""
    capacity = int(params.get(contract.CACHE_SIZE_PARAMETER, "16"))
    # The decoder's inputs say which features to keep and their shapes (the encoder's may be
    # symbolic); SAM3's detector maps too where the concept graphs are (111 MB an image), only there.
    shapes_of = {i.name: i.shape[1:] for i in device.decoder.get_inputs()}
    if has_concept_graphs(model_dir):
        shapes_of.update((name, list(shape)) for name, shape in contract.DETECTOR_MAP_SHAPES.items())
    names = [output.name for output in device.encoder.get_outputs() if output.name in shapes_of]
    buffers = params.get(contract.FEATURE_BUFFERS_PARAMETER, "auto")
    if buffers == "off" or (buffers == "auto" and not device.on_gpu):
        return FeatureStore(capacity, names)
    gather = ort_session(model_dir / contract.GATHER_FILE, device.index)
    shapes = [shapes_of[name] for name in names]
    if device.on_gpu:
        return BufferFeatureStore(capacity, names, shapes, "cuda", gather, device.index)
    return BufferFeatureStore(capacity, names, shapes, "cpu", gather)
