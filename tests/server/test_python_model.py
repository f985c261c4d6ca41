"""The Triton python model run in this process, with a stand-in for Triton's
`triton_python_backend_utils`: its constants agree with the client's, and the session model's
feature buffers (how it keeps features in GPU memory) give what its numpy cache gives."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from synthetic import disk_image
from triton_sam import contract
from triton_sam.export.triton_config import SESSION_MAX_BATCH
from triton_sam.features import content_signature
from triton_sam.image import encoder_input
from triton_sam.registry import get_model
from triton_sam.server.models.triton_sam_arrays import logits_signature

TINY = get_model("sam2.1_hiera_tiny")


class _Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self.name, self.array = name, array

    def as_numpy(self) -> np.ndarray:
        return self.array


class _Response:
    def __init__(self, output_tensors=None, error=None) -> None:
        self.outputs = {t.name: t.array for t in output_tensors or []}
        self.error = error


class _Error:
    CANCELLED, NOT_FOUND, INVALID_ARG = "CANCELLED", "NOT_FOUND", "INVALID_ARG"

    def __init__(self, message: str, code: str) -> None:
        self.message, self.code = message, code


class _Request:
    def __init__(self, outputs: tuple[str, ...] = (), **inputs: np.ndarray) -> None:
        self.inputs, self.outputs = inputs, list(outputs)

    def requested_output_names(self) -> list[str]:
        return self.outputs

    def is_cancelled(self) -> bool:
        return False


class _Logger:
    warnings: list[str] = []
    infos: list[str] = []

    @classmethod
    def log_warn(cls, message: str) -> None:
        cls.warnings.append(message)

    @classmethod
    def log_info(cls, message: str) -> None:
        cls.infos.append(message)


class _Counter:
    def __init__(self, labels: dict) -> None:
        self.labels, self.value = labels, 0

    def increment(self, count: int) -> None:
        self.value += count


class _MetricFamily:
    COUNTER = "counter"

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name, self.description, self.kind = name, description, kind

    def Metric(self, labels: dict) -> _Counter:  # noqa: N802 (Triton's name)
        return _Counter(labels)


def _stub_backend_utils() -> types.ModuleType:
    stub = types.ModuleType("triton_python_backend_utils")
    stub.Tensor, stub.InferenceResponse, stub.TritonError, stub.Logger = _Tensor, _Response, _Error, _Logger
    stub.MetricFamily = _MetricFamily
    stub.get_input_tensor_by_name = lambda request, name: _Tensor(name, request.inputs[name]) if name in request.inputs else None
    return stub


def _load_python_model(directory) -> types.ModuleType:
    """model.py written into `directory` as the export writes it, loaded as Triton loads it (with
    the stand-in for its utilities in place)."""
    from triton_sam.server.models import write_python_model

    path = write_python_model(directory)
    loader = importlib.util.spec_from_file_location("triton_sam_python_model_under_test", path)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def backend_utils():
    stub = _stub_backend_utils()
    saved = sys.modules.get(stub.__name__)
    sys.modules[stub.__name__] = stub
    yield stub
    if saved is None:
        del sys.modules[stub.__name__]
    else:
        sys.modules[stub.__name__] = saved


@pytest.fixture(scope="module")
def python_model(backend_utils, tmp_path_factory):
    return _load_python_model(tmp_path_factory.mktemp("model_py"))


def test_a_server_environment_without_onnx_runtime_says_where_the_backend_looked(backend_utils, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # not importable
    with pytest.raises(ImportError, match="install numpy<2 and onnxruntime-gpu where it looks") as raised:
        _load_python_model(tmp_path)
    assert str(sys.path) in str(raised.value) and "onnxruntime" in str(raised.value)


def _session_model(
    python_model,
    repository,
    buffers: str,
    cache_size: int = 16,
    logits_cache_size: int = 256,
    encode_batch: int = 1,
    spec=TINY,
    graphs: str = "auto",
):
    params = {
        contract.MODEL_ID_PARAMETER: spec.model_id,
        "encoder_model": spec.encoder_name,
        "decoder_model": spec.decoder_name,
        "cache_size": str(cache_size),
        "logits_cache_size": str(logits_cache_size),
        "mask_input_clamp": str(spec.low_res_clamp or ""),
        "feature_buffers": buffers,
        contract.ENCODE_BATCH_PARAMETER: str(encode_batch),
        contract.GRAPH_DECODES_PARAMETER: graphs,
    }
    counts = python_model.RequestCounts(spec.session_name)  # its outcomes checked, as on a server
    device_counts = python_model.DeviceCounts(spec.session_name)
    return python_model.SessionModel(repository, params, counts, repository / spec.session_name / "1", device_counts)


def test_the_python_model_imports_the_contract_and_the_array_helpers_written_next_to_it(python_model):
    """One contract: the session model reads triton-sam's own `contract.py`, written next to it,
    and computes signatures with the client's own functions (no copies kept equal by a test)."""
    from pathlib import Path

    from triton_sam.server.models import ARRAYS_FILE, CONTRACT_FILE, triton_sam_arrays

    directory = Path(python_model.__file__).parent
    assert (directory / CONTRACT_FILE).read_text() == Path(contract.__file__).read_text()
    assert (directory / ARRAYS_FILE).read_text() == Path(triton_sam_arrays.__file__).read_text()
    assert python_model.contract.CONTRACT_VERSION == contract.CONTRACT_VERSION
    assert (python_model.IMAGE, python_model.HANDLE) == (contract.ENCODER_INPUT, contract.HANDLE)
    image = encoder_input(disk_image(30, 40, [(10, 10, 5)]), TINY)
    assert python_model.content_signature(image, TINY.model_id) == content_signature(image, TINY.model_id)
    logits = np.random.default_rng(0).normal(size=(256, 256)).astype(np.float32)
    assert python_model.logits_signature(logits) == logits_signature(logits)
    assert logits_signature(logits) != logits_signature(np.nextafter(logits, 1, where=np.eye(256, dtype=bool), out=logits.copy()))


def _images() -> list[np.ndarray]:
    disks = [[(60, 50, 25)], [(30, 80, 20), (100, 30, 15)], [(70, 70, 40)]]
    return [encoder_input(disk_image(120, 140 + 10 * i, d), TINY) for i, d in enumerate(disks)]


def _encode(model, image: np.ndarray) -> str:
    (response,) = model.run([_Request(image=image[None])])
    return response.outputs[contract.HANDLE][0, 0].decode()


_CROPPED = (contract.SINGLE_MASK_CROP, contract.CROP_BOX, contract.SINGLE_SCORE, contract.OBJECT_SCORE)


def _decode(model, handles: list[str], points: list, outputs: tuple[str, ...] = (), **inputs: np.ndarray) -> _Response:
    """Decode `points` (one set per handle) for `outputs` (all if none), with further `inputs`
    (e.g. `crop_threshold` for a masks-only decode)."""
    request = _Request(
        outputs,
        handle=np.array([[h.encode()] for h in handles], dtype=np.object_),
        point_coords=np.array(points, np.float32),
        point_labels=np.ones((len(handles), len(points[0])), np.int32),
        **inputs,
    )
    (response,) = model.run([request])
    return response


def test_the_requests_metric_lists_each_outcome_the_session_model_counts_and_counts_no_other(python_model):
    """One list (`contract.SESSION_REQUEST_OUTCOMES`) makes the metric's description: every outcome
    the model counts is in it (video and instance maps too), and an outcome not in it is refused."""
    counts = python_model.RequestCounts(TINY.session_name)
    listed = counts.family.description.removeprefix("Session model requests by outcome (").removesuffix(")").split(", ")
    assert listed == list(contract.SESSION_REQUEST_OUTCOMES)
    source = Path(python_model.__file__).read_text()
    counted = set(re.findall(r'counts\.add\("(\w+)"', source))
    assert {"video", "instance_maps", "encoded", "cancelled_queued"} <= counted <= set(listed)
    counts.add("instance_maps", 2)
    assert counts.metrics["instance_maps"].value == 2
    assert counts.metrics["instance_maps"].labels == {"model": TINY.session_name, "outcome": "instance_maps"}
    with pytest.raises(ValueError, match="'maps' is not one of the session model's outcomes"):
        counts.add("maps")


def test_feature_buffers_decode_as_numpy_features_with_rows_gathered_and_slots_reused(python_model, synthetic_repository):
    """Buffers in host memory run the code a GPU runs: slots written by the encoder, one row read
    in place, several gathered; a full cache evicts the oldest image and reuses its slot."""
    plain = _session_model(python_model, synthetic_repository, "off", cache_size=2)
    buffered = _session_model(python_model, synthetic_repository, "on", cache_size=2)
    assert type(buffered.devices[0].cache).__name__ == "BufferFeatureStore"
    first, second, third = _images()
    handles = [_encode(model, first) for model in (plain, buffered)]
    assert handles[0] == handles[1]
    a = _encode(buffered, second)
    _encode(plain, second)
    for rows, points in (([a], [[[512.0, 400.0]]]), ([handles[0], a], [[[500.0, 500.0]], [[200.0, 800.0]]])):
        expected, ours = _decode(plain, rows, points), _decode(buffered, rows, points)
        assert ours.error is None and set(ours.outputs) == set(contract.DECODER_OUTPUTS)
        for name, array in expected.outputs.items():
            np.testing.assert_array_equal(ours.outputs[name], array)
    c = _encode(buffered, third)  # evicts the first image: its slot now holds the third
    _encode(plain, third)
    assert _decode(buffered, [handles[0]], [[[1.0, 1.0]]]).error.code == _Error.NOT_FOUND
    expected, ours = (
        _decode(plain, [c, a], [[[300.0, 300.0]], [[600.0, 100.0]]]),
        _decode(buffered, [c, a], [[[300.0, 300.0]], [[600.0, 100.0]]]),
    )
    for name, array in expected.outputs.items():
        np.testing.assert_array_equal(ours.outputs[name], array)


def test_decodes_run_in_a_session_of_their_batch_size_rows_padded_up_to_it(python_model, synthetic_repository):
    """Where features live in buffers (a GPU), a decoder run of a few prompt sets goes to a session
    with the batch fixed at the next of `FIXED_BATCHES` (cuDNN keeps one plan per input shape), the
    rows padded: each row's answer is the dynamic session's. Beyond the largest (the session model's
    `max_batch_size`, 16), the dynamic one runs."""
    plain = _session_model(python_model, synthetic_repository, "off")
    buffered = _session_model(python_model, synthetic_repository, "on")
    handles = [_encode(plain, image) for image in _images()]
    assert [_encode(buffered, image) for image in _images()] == handles
    assert set(buffered.devices[0].fixed_decoders) == {1}  # made with the model, not at the first hover
    for count, sizes in ((1, {1}), (3, {1, 4}), (5, {1, 4, 8}), (17, {1, 4, 8})):
        rows = [handles[row % len(handles)] for row in range(count)]
        points = [[[40.0 + 9 * row, 30.0 + 5 * row]] for row in range(count)]
        expected, ours = _decode(plain, rows, points), _decode(buffered, rows, points)
        assert ours.error is None, ours.error
        for name, array in expected.outputs.items():
            assert ours.outputs[name].shape == array.shape and array.shape[0] == count
            np.testing.assert_allclose(ours.outputs[name], array, atol=1e-5, err_msg=f"{count} rows, {name}")
        assert set(buffered.devices[0].fixed_decoders) == sizes
    assert plain.devices[0].fixed_decoders == {}
    assert sys.modules["triton_sam_devices"].FIXED_BATCHES[-1] == SESSION_MAX_BATCH  # what Triton hands it at most


def test_one_prompt_set_decodes_replay_from_the_graph_buffers_as_the_usual_run(python_model, synthetic_repository):
    """With `graph_decodes` (on a GPU by default: replayed as CUDA graphs; here the same buffers and
    copy graphs without capture), a decode of one prompt set of up to `MAX_POINTS` points reads the
    image's slot through the copy graphs and answers as the usual run: images taking turns, a slot
    reused by another image after an eviction, a kept mask input alike. More points run as usual."""
    plain = _session_model(python_model, synthetic_repository, "off")
    replaying = _session_model(python_model, synthetic_repository, "on", cache_size=2, graphs="on")
    graphs = replaying.devices[0].graphs
    assert graphs is not None and graphs.device == "cpu" and plain.devices[0].graphs is None
    images = _images()
    handles = [_encode(plain, image) for image in images]
    assert [_encode(replaying, image) for image in images[:2]] == handles[:2]
    max_points = sys.modules["triton_sam_graphs"].MAX_POINTS

    def alike(image: int, points: int, **inputs) -> dict:
        at = [[[20.0 + 17 * point + 5 * image, 40.0 + 9 * point] for point in range(points)]]
        expected, ours = _decode(plain, [handles[image]], at, **inputs), _decode(replaying, [handles[image]], at, **inputs)
        assert ours.error is None, ours.error.message
        for name, array in expected.outputs.items():
            np.testing.assert_allclose(ours.outputs[name], array, atol=1e-4, err_msg=f"image {image}, {points} points, {name}")
        return ours.outputs

    first = alike(0, 1)
    alike(1, 2)
    alike(0, 3)  # the buffers hold image 0's features
    alike(1, max_points + 1)  # as usual, not through the buffers; image 0 now the least recently used
    assert _encode(replaying, images[2]) == handles[2]  # evicts image 0: image 2 takes its slot
    third = alike(2, 1)  # the point count checked already: no usual run to catch a stale copy
    assert not np.allclose(first[contract.MULTI_MASKS], third[contract.MULTI_MASKS])
    alike(1, 1, mask_input=first[contract.SINGLE_MASK])
    assert replaying.devices[0].graphs is graphs and graphs.checked == {1, 2, 3}


def test_a_session_model_exported_without_copy_graphs_decodes_without_the_graphs_and_says_why(
    python_model, synthetic_repository, monkeypatch
):
    """An export of an earlier version lacks the copy graphs beside `model.py`: the model starts and
    decodes as usual; the log says what is missing and what to do."""
    monkeypatch.setattr(sys.modules["triton_sam_contract"], "GRAPH_COPY_FILES", ("not_exported.onnx", "graph_copy_prompts.onnx"))
    warned = len(python_model.pb_utils.Logger.warnings)
    model = _session_model(python_model, synthetic_repository, "on", graphs="on")
    assert model.devices[0].graphs is None
    (warning,) = python_model.pb_utils.Logger.warnings[warned:]
    assert "not_exported.onnx missing" in warning and "export again" in warning
    handle = _encode(model, _images()[0])
    assert _decode(model, [handle], [[[30.0, 40.0]]]).error is None


class _CountedRuns:
    """An ONNX Runtime session that counts its runs."""

    def __init__(self, session) -> None:
        self.session, self.runs = session, 0

    def __getattr__(self, name: str):
        return getattr(self.session, name)

    def run(self, *args, **kwargs):
        self.runs += 1
        return self.session.run(*args, **kwargs)

    def run_with_iobinding(self, *args, **kwargs):
        self.runs += 1
        return self.session.run_with_iobinding(*args, **kwargs)


def _same_shape_images(count: int) -> list[np.ndarray]:
    return [encoder_input(disk_image(120, 140, [(30 + 10 * i, 40 + 12 * i, 15 + i)]), TINY) for i in range(count)]


def _assert_decode_alike(model, expected_model, handles: list[str]) -> None:
    """Every handle decodes on `model` exactly as on `expected_model`."""
    for number, handle in enumerate(handles):
        points = [[[100.0 + 50 * number, 300.0]]]
        expected, ours = _decode(expected_model, [handle], points), _decode(model, [handle], points)
        assert ours.error is None, ours.error
        for name, array in expected.outputs.items():
            np.testing.assert_array_equal(ours.outputs[name], array)


@pytest.mark.parametrize("buffers", ["off", "on"])
def test_images_of_one_shape_are_encoded_together_as_one_by_one(python_model, synthetic_repository, buffers):
    """With `encode_batch`, the new images of a run (two requests here) go through the encoder a
    batch of one shape at a time; each keeps what it gets encoded alone."""
    plain = _session_model(python_model, synthetic_repository, "off")
    batched = _session_model(python_model, synthetic_repository, buffers, encode_batch=4)
    batched.devices[0].encoder = _CountedRuns(batched.devices[0].encoder)
    images, other = _same_shape_images(6), _images()[1]
    _encode(batched, images[0])  # cached: not encoded again
    batched.devices[0].encoder.runs = 0
    first = _Request(image=np.stack(images[:4]))
    second = _Request(image=np.stack([images[i] for i in (5, 3, 4)]))  # image 3 twice, across the requests
    responses = batched.run([first, _Request(image=other[None]), second])
    assert batched.devices[0].encoder.runs == 3  # images 1-4, image 5, the other shape
    handles = [[h[0].decode() for h in r.outputs[contract.HANDLE]] for r in responses]
    expected = [[_encode(plain, i) for i in images[:4]], [_encode(plain, other)], [_encode(plain, images[i]) for i in (5, 3, 4)]]
    assert handles == expected
    _assert_decode_alike(batched, plain, [h for request in handles for h in request])


@pytest.mark.parametrize("buffers", ["off", "on"])
def test_encoder_outputs_the_decoder_does_not_take_are_not_kept(python_model, synthetic_repository, tmp_path, buffers):
    """SAM3's encoder also answers the concept detector's maps: the session model keeps only the
    decoder's features (until it answers concept requests) and decodes as without them."""
    repository = Path(shutil.copytree(synthetic_repository, tmp_path / "repository"))
    path = repository / TINY.encoder_name / "1" / "model.onnx"
    encoder, extra = onnx.load(path), contract.DETECTOR_MAPS[-1]
    encoder.graph.node.append(helper.make_node("Identity", ["image_embed"], [extra]))
    encoder.graph.output.append(helper.make_tensor_value_info(extra, TensorProto.FLOAT, None))
    onnx.save(encoder, path)
    model, plain = _session_model(python_model, repository, buffers), _session_model(python_model, synthetic_repository, "off")
    device = model.devices[0]
    assert extra in [o.name for o in device.encoder.get_outputs()] and device.cache.names == list(TINY.feature_shapes)
    image = _images()[1]
    assert _encode(model, image) == _encode(plain, image)
    _assert_decode_alike(model, plain, [_encode(model, image)])


def test_a_batch_fills_free_slots_that_are_not_side_by_side(python_model, synthetic_repository):
    """The encoder writes a batch into the free slots' stretches, one run each; every image decodes
    from its own slot afterwards."""
    plain = _session_model(python_model, synthetic_repository, "off")
    batched = _session_model(python_model, synthetic_repository, "on", cache_size=4, encode_batch=4)
    images = _same_shape_images(6)
    handles = [_encode(batched, image) for image in images[:4]]  # slots 0-3
    _decode(batched, [handles[1]], [[[1.0, 1.0]]])
    _decode(batched, [handles[3]], [[[1.0, 1.0]]])  # slots 0 and 2 are now the least recently used
    batched.devices[0].encoder = _CountedRuns(batched.devices[0].encoder)
    (response,) = batched.run([_Request(image=np.stack(images[4:]))])
    assert batched.devices[0].encoder.runs == 2 and sorted(batched.devices[0].cache._items.values()) == [0, 1, 2, 3]
    new = [h[0].decode() for h in response.outputs[contract.HANDLE]]
    assert [_encode(plain, image) for image in images] == handles + new
    _assert_decode_alike(batched, plain, [handles[1], handles[3], *new])
    assert _decode(batched, [handles[0]], [[[1.0, 1.0]]]).error.code == _Error.NOT_FOUND


class _NoBatches(_CountedRuns):
    """An encoder that fails on more than one image at a time, as a GPU out of memory would."""

    def io_binding(self):
        binding = self.session.io_binding()
        bind_cpu_input = binding.bind_cpu_input

        def checked(name, array):
            if len(array) > 1:
                raise RuntimeError("Failed to allocate memory for requested buffer")
            bind_cpu_input(name, array)

        binding.bind_cpu_input = checked
        return binding

    def run(self, names, feeds, *args):
        if len(feeds[contract.ENCODER_INPUT]) > 1:
            raise RuntimeError("Failed to allocate memory for requested buffer")
        return super().run(names, feeds, *args)


@pytest.mark.parametrize("buffers", ["off", "on"])
def test_a_batch_the_encoder_cannot_take_is_encoded_one_by_one_and_so_is_all_after_it(
    python_model, synthetic_repository, buffers
):
    plain = _session_model(python_model, synthetic_repository, "off")
    batched = _session_model(python_model, synthetic_repository, buffers, encode_batch=4)
    batched.devices[0].encoder = _NoBatches(batched.devices[0].encoder)
    images = _same_shape_images(5)
    (response,) = batched.run([_Request(image=np.stack(images[:3]))])
    assert response.error is None and batched.encode_batch == 1
    assert "3 images together failed" in _Logger.warnings[-1] and "Failed to allocate" in _Logger.warnings[-1]
    (later,) = batched.run([_Request(image=np.stack(images[3:]))])
    assert later.error is None
    handles = [h[0].decode() for r in (response, later) for h in r.outputs[contract.HANDLE]]
    assert handles == [_encode(plain, image) for image in images]
    _assert_decode_alike(batched, plain, handles)


def test_a_gpu_onnx_runtime_cannot_use_is_said_in_the_log_and_the_model_runs_on_the_cpu(
    python_model, synthetic_repository, monkeypatch
):
    """On a GPU machine whose server environment lacks ONNX Runtime's CUDA libraries, ONNX Runtime
    quietly runs on the CPU: the session model says so. Here: a GPU claimed, onnxruntime-gpu
    without CUDA's libraries (as on every machine without a GPU)."""
    import onnxruntime as ort

    from triton_sam.gpu import cuda_device_count

    if cuda_device_count():
        pytest.skip("a real GPU: ONNX Runtime may find its libraries")
    assert "CUDAExecutionProvider" in ort.get_available_providers()  # onnxruntime-gpu, as installed on Linux
    requests = sys.modules[python_model.ort_session.__module__]  # triton_sam_requests.py, next to model.py
    monkeypatch.setattr(requests, "cuda_devices", lambda: 1)
    _Logger.warnings.clear()
    model = _session_model(python_model, synthetic_repository, "off")
    assert model.devices[0].decoder.get_providers() == ["CPUExecutionProvider"] and not model.batch_decodes
    assert len(_Logger.warnings) == 2 and all("could not load its CUDA libraries" in w for w in _Logger.warnings)
    assert TINY.encoder_name in _Logger.warnings[0] and TINY.decoder_name in _Logger.warnings[1]


def _releases_arena(options) -> bool:
    """Whether run `options` give the CPU arena's unused memory back when the run ends."""
    try:
        return options.get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"
    except (AttributeError, RuntimeError):  # no options, or none of that key
        return False


@pytest.mark.parametrize("buffers", ["off", "on"])
def test_on_the_cpu_encodes_and_batched_decodes_give_the_arena_back_and_a_one_point_decode_keeps_it(
    python_model, synthetic_repository, buffers, monkeypatch
):
    """Sessions on the CPU use ONNX Runtime's arena (without it every intermediate was paged in
    anew: a ViT-B encode 10.4 s instead of 6.7 s); runs with a large peak hand it back."""
    import onnxruntime as ort

    model = _session_model(python_model, synthetic_repository, buffers)
    device = model.devices[0]
    options = device.encoder.get_session_options()
    assert options.enable_cpu_mem_arena and not options.enable_mem_pattern
    runs = []  # (session, whether the run released its arena)
    run, run_bound = ort.InferenceSession.run, ort.InferenceSession.run_with_iobinding

    def recorded_run(session, output_names, feeds, run_options=None):
        runs.append((session, _releases_arena(run_options)))
        return run(session, output_names, feeds, run_options)

    def recorded_run_bound(session, binding, run_options=None):
        runs.append((session, _releases_arena(run_options)))
        return run_bound(session, binding, run_options)

    monkeypatch.setattr(ort.InferenceSession, "run", recorded_run)
    monkeypatch.setattr(ort.InferenceSession, "run_with_iobinding", recorded_run_bound)
    handles = [_encode(model, image) for image in _images()[:1] + _images()[:1]]
    assert [released for session, released in runs if session is device.encoder] == [True]  # the second from the cache

    def decoder_runs(handles: list, points: list) -> list:
        """Whether each decoder run of that decode released its arena (fixed-batch sessions may be made by it)."""
        runs.clear()
        assert _decode(model, handles, points).error is None
        decoders = [device.decoder, *device.fixed_decoders.values()]
        return [released for session, released in runs if any(session is decoder for decoder in decoders)]

    assert decoder_runs(handles[:1], [[[60.0, 50.0]]]) == [False]
    assert decoder_runs(handles, [[[60.0, 50.0]], [[30.0, 80.0]]]) == [True]


def test_a_malformed_image_is_refused_and_nothing_is_cached(python_model, synthetic_repository):
    model = _session_model(python_model, synthetic_repository, "on")
    (response,) = model.run([_Request(image=np.zeros((1, 8, 8, 2), np.uint8))])
    assert response.error.code == _Error.INVALID_ARG and "uint8 [B, H, W, 1 or 3]" in response.error.message
    assert len(model.devices[0].cache.free) == model.devices[0].cache.capacity


def test_the_video_graphs_track_with_the_clients_names():
    from triton_sam.server.models import triton_sam_video

    assert triton_sam_video.TRACK_OUTPUTS == (*contract.DECODER_OUTPUTS, contract.OBJ_PTR)


@pytest.mark.parametrize("buffers", ["off", "on"])
def test_video_requests_compute_what_the_local_video_graphs_compute(python_model, exported_repository, buffers):
    """Remember a mask, track with that memory, take a mask as the object's: the session model
    (features as arrays or in buffers) gives what `LocalVideo` gives in process."""
    from conftest import require_export_extra
    from triton_sam.engines.local import LocalEngine
    from triton_sam.features import FeatureCache
    from triton_sam.prompts import DecodeRequest
    from triton_sam.repository import locate
    from triton_sam.video.memory import MemoryInputs

    require_export_extra()
    repository = exported_repository(TINY.model_id)
    model = _session_model(python_model, repository, buffers)
    engine = LocalEngine(locate(TINY, repository), feature_device="cpu")
    local = engine.video(FeatureCache(engine))
    image = _images()[0]
    handle, plane = _encode(model, image), local.plane(image)
    logits = np.random.default_rng(0).standard_normal((1, 1, 256, 256)).astype(np.float32) * 4
    score = np.ones((1, 1), np.float32)

    (remembered,) = model.run(
        [_Request(handle=_handles(handle), mask_logits=logits, mask_score=score, binarize=np.ones((1, 1), np.float32))]
    )
    memory_handle = remembered.outputs[contract.MEMORY_HANDLE][0, 0]
    np.testing.assert_array_equal(model.video.memories.get(memory_handle.decode()), local.remember(plane, logits, score, True))

    inputs = MemoryInputs(
        [local.remember(plane, logits, score, True)],
        np.array([6]),
        np.ones((2, 256), np.float32),
        np.array([0.0, 0.5], np.float32),
    )
    request = DecodeRequest(np.array([[[100.0, 200.0]]], np.float32), np.array([[1]], np.int32), None)
    expected = local.track(plane, inputs, request)
    (tracked,) = model.run(
        [
            _Request(
                handle=_handles(handle),
                memory_handles=np.array([[memory_handle]], dtype=np.object_),
                memory_tpos=inputs.memory_tpos[None],
                obj_ptrs=inputs.obj_ptrs[None],
                obj_ptr_tpos=inputs.obj_ptr_tpos[None],
                point_coords=request.point_coords,
                point_labels=request.point_labels,
            )
        ]
    )
    assert tracked.error is None
    for name, array in zip((*contract.DECODER_OUTPUTS, contract.OBJ_PTR), vars(expected).values()):
        np.testing.assert_allclose(tracked.outputs[name], array, rtol=1e-4, atol=1e-4)

    mask = np.zeros((1, 120, 140), np.uint8)
    mask[0, 30:90, 20:80] = 1
    (taken,) = model.run([_Request(handle=_handles(handle), mask=mask)])
    low_res, obj_score, obj_ptr = local.mask_as_output(plane, mask[0] > 0)
    np.testing.assert_allclose(taken.outputs[contract.LOW_RES_LOGITS], low_res, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(taken.outputs[contract.OBJECT_SCORE], obj_score)
    np.testing.assert_allclose(taken.outputs[contract.MASK_OBJ_PTR][0], obj_ptr, rtol=1e-4, atol=1e-4)

    (lost,) = model.run(
        [
            _Request(
                handle=_handles(handle),
                memory_handles=np.array([[b"nope"]], dtype=np.object_),
                memory_tpos=np.zeros((1, 1), np.int64),
                obj_ptrs=np.zeros((1, 0, 256), np.float32),
                obj_ptr_tpos=np.zeros((1, 0), np.float32),
                point_coords=request.point_coords,
                point_labels=request.point_labels,
            )
        ]
    )
    assert lost.error.code == _Error.NOT_FOUND and lost.error.message.startswith(contract.UNKNOWN_MEMORY)
    assert model.counts.metrics["unknown_kept"].value == 1 and "failed" not in model.counts.metrics
    (bad,) = model.run([_Request(handle=_handles(handle), mask=np.zeros((2, 3), np.uint8))])
    assert bad.error.code == _Error.INVALID_ARG and "mask must be [1, H, W]" in bad.error.message


def _handles(handle: str) -> np.ndarray:
    return np.array([[handle.encode()]], dtype=np.object_)


def _blobs(rng: np.random.Generator, size: int) -> np.ndarray:
    """Low-res logits [1, 1, size, size] like a decoder's: a few smooth bumps on a negative floor."""
    yy, xx = np.mgrid[:size, :size]
    logits = np.full((size, size), -8.0)
    for _ in range(rng.integers(1, 4)):
        cy, cx = rng.uniform(0, size, 2)
        radius = rng.uniform(2, size / 6)
        logits += 14.0 * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * radius**2))
    return (logits + rng.normal(0, 0.3, logits.shape)).astype(np.float32)[None, None]


@pytest.mark.parametrize("model_id", ["sam2.1_hiera_tiny", "mobile_sam", "sam3_tracker"])
def test_masks_from_the_crop_of_a_masks_only_decode_are_the_whole_logits_masks(python_model, model_id):
    """Cropped to the samples above the threshold and `CROP_MARGIN` more (SAM1's two bilinear
    resizes read three samples a side), then put back below it: the same masks at any image size."""
    from triton_sam.masks import MaskResizer
    from triton_sam.server.models.triton_sam_arrays import uncropped

    spec = get_model(model_id)
    resizer, size = MaskResizer(spec), spec.low_res_size
    rng = np.random.default_rng(1)
    for image_hw in ((300, 400), (97, 1531), (1200, 700), (2048, 2048)):
        for threshold in (0.0, 3.0):
            for name, crop_name, candidates in (
                (contract.SINGLE_MASK, contract.SINGLE_MASK_CROP, 1),
                (contract.MULTI_MASKS, contract.MULTI_MASK_CROP, 3),
            ):
                logits = np.concatenate([_blobs(rng, size) for _ in range(candidates)], axis=1)
                cropped = sys.modules["triton_sam_decodes"].cropped_above(
                    {name: logits}, np.array([threshold], np.float32), [crop_name]
                )
                crop, box = cropped[crop_name], cropped[contract.CROP_BOX]
                assert crop.shape[-2:] != (size, size)  # the test would show nothing otherwise
                restored = uncropped(crop, box, threshold, size)
                expected = resizer.masks(logits[0], image_hw, threshold)
                np.testing.assert_array_equal(resizer.masks(restored[0], image_hw, threshold), expected)
                found, (y, x) = resizer.object_mask(restored[0, -1], image_hw, threshold)
                whole = np.zeros(image_hw, bool)
                whole[y : y + found.shape[0], x : x + found.shape[1]] = found
                np.testing.assert_array_equal(whole, expected[-1])


def test_a_masks_only_decode_answers_the_single_mask_around_the_object(python_model, synthetic_repository):
    """The crop is the single mask's logits in a box around every row's samples above its
    threshold, grown by `CROP_MARGIN`; nothing above: one sample. Without a threshold, no crop
    (Triton names every output as requested when a client names none); a bad one is refused."""
    model = _session_model(python_model, synthetic_repository, "off")
    handle = _encode(model, _images()[1])
    points = [[[300.0, 240.0]], [[660.0, 900.0]]]
    whole = _decode(model, [handle, handle], points).outputs[contract.SINGLE_MASK]
    for thresholds in ([0.0, 0.0], [0.0, 100.0], [100.0, 100.0]):
        response = _decode(model, [handle, handle], points, _CROPPED, crop_threshold=np.array(thresholds, np.float32)[:, None])
        assert set(response.outputs) == set(_CROPPED)
        crop, box = response.outputs[contract.SINGLE_MASK_CROP], response.outputs[contract.CROP_BOX]
        above = (whole > np.array(thresholds)[:, None, None, None]).any(axis=(0, 1))
        if above.any():
            rows, cols = np.flatnonzero(above.any(1)), np.flatnonzero(above.any(0))
            m, last = contract.CROP_MARGIN, whole.shape[-1]
            expected_box = [max(rows[0] - m, 0), max(cols[0] - m, 0), min(rows[-1] + 1 + m, last), min(cols[-1] + 1 + m, last)]
        else:
            expected_box = [0, 0, 1, 1]
        assert box.tolist() == [expected_box] * 2
        y0, x0, y1, x1 = expected_box
        np.testing.assert_array_equal(crop, whole[:, :, y0:y1, x0:x1])
    uncropped = _decode(model, [handle], points[:1], _CROPPED)
    assert set(uncropped.outputs) == {contract.SINGLE_SCORE, contract.OBJECT_SCORE}
    every_output = (*contract.DECODER_OUTPUTS, contract.SINGLE_MASK_CROP, contract.CROP_BOX)
    assert set(_decode(model, [handle], points[:1], every_output).outputs) == set(contract.DECODER_OUTPUTS)
    wrong = _decode(model, [handle], points[:1], _CROPPED, crop_threshold=np.array([[np.nan]], np.float32))
    assert wrong.error.code == _Error.INVALID_ARG


def test_a_click_decode_answers_its_candidates_around_the_object_and_the_keys_of_their_kept_logits(
    python_model, synthetic_repository
):
    """A multimask decode with a crop threshold (a click's) gets its three candidates' logits in
    one box around the samples above it in any of them; kept, their keys come back, and naming
    one as a mask input is sending the whole clamped logits."""
    model = _session_model(python_model, synthetic_repository, "off")
    handle = _encode(model, _images()[1])
    point = [[[300.0, 240.0]]]
    whole = _decode(model, [handle], point).outputs[contract.MULTI_MASKS]
    click = (contract.MULTI_MASK_CROP, contract.CROP_BOX, contract.MULTI_SCORES, contract.OBJECT_SCORE, contract.KEPT_KEYS)
    response = _decode(
        model, [handle], point, click, crop_threshold=np.zeros((1, 1), np.float32), keep_logits=np.ones((1, 1), bool)
    )
    assert set(response.outputs) == set(click)
    above = (whole > 0).any(axis=(0, 1))
    assert 0 < above.sum() and not all(((whole[0, c] > 0) == above).all() for c in range(3))  # candidates differ
    rows, cols = np.flatnonzero(above.any(1)), np.flatnonzero(above.any(0))
    m, last = contract.CROP_MARGIN, whole.shape[-1]
    y0, x0, y1, x1 = max(rows[0] - m, 0), max(cols[0] - m, 0), min(rows[-1] + 1 + m, last), min(cols[-1] + 1 + m, last)
    assert response.outputs[contract.CROP_BOX].tolist() == [[y0, x0, y1, x1]]
    np.testing.assert_array_equal(response.outputs[contract.MULTI_MASK_CROP], whole[:, :, y0:y1, x0:x1])
    assert (y1 - y0) * (x1 - x0) < last * last
    keys = response.outputs[contract.KEPT_KEYS]
    clamped = TINY.as_mask_input(whole)
    assert keys.shape == (1, 3) and [k.decode() for k in keys[0]] == [logits_signature(c) for c in clamped[0]]
    refine = [[[300.0, 240.0], [320.0, 250.0]]]
    for candidate in range(3):
        named = _decode(model, [handle], refine, mask_input_key=keys[:, candidate : candidate + 1])
        sent = _decode(model, [handle], refine, mask_input=clamped[:, candidate : candidate + 1])
        for name, array in sent.outputs.items():
            np.testing.assert_array_equal(named.outputs[name], array)


def test_a_refinement_may_name_kept_logits_instead_of_sending_them(python_model, synthetic_repository):
    """A decode with `keep_logits` keeps each mask's logits, clamped as the official predictor
    hands them back, under its signature; a refinement naming them (`mask_input_key`) gets
    exactly what sending them gets. Decodes without the flag
    keep nothing; the store keeps the newest `logits_cache_size`; an evicted key, or a key and
    logits both, are refused and keep nothing."""
    model = _session_model(python_model, synthetic_repository, "off", logits_cache_size=4)
    handle = _encode(model, _images()[1])
    keep = {contract.KEEP_LOGITS: np.ones((1, 1), bool)}
    first = TINY.as_mask_input(_decode(model, [handle], [[[300.0, 240.0]]], **keep).outputs[contract.MULTI_MASKS])
    keys = [logits_signature(logits) for logits in first[0]]
    refine = [[[300.0, 240.0], [320.0, 250.0]]]
    for candidate, key in enumerate(keys):
        sent = _decode(model, [handle], refine, mask_input=first[:, candidate : candidate + 1])
        named = _decode(model, [handle], refine, mask_input_key=np.array([[key.encode()]], dtype=np.object_))
        assert sent.error is None and named.error is None
        assert set(named.outputs) == set(contract.DECODER_OUTPUTS)
        for name, array in sent.outputs.items():
            np.testing.assert_array_equal(named.outputs[name], array)
    unkept = TINY.as_mask_input(_decode(model, [handle], [[[600.0, 100.0]]]).outputs[contract.SINGLE_MASK])
    unkept_key = np.array([[logits_signature(unkept[0, 0]).encode()]], dtype=np.object_)
    assert _decode(model, [handle], refine, mask_input_key=unkept_key).error.code == _Error.NOT_FOUND
    _decode(model, [handle], [[[600.0, 100.0]]], (contract.SINGLE_MASK,), **keep)  # the fourth kept: all still there
    _decode(model, [handle], [[[100.0, 900.0]]], (contract.SINGLE_MASK,), **keep)  # a fifth evicts the oldest
    oldest, newest = (np.array([[key.encode()]], dtype=np.object_) for key in (keys[0], keys[2]))
    evicted = _decode(model, [handle], refine, mask_input_key=oldest)
    assert evicted.error.code == _Error.NOT_FOUND and evicted.error.message.startswith(contract.UNKNOWN_MASK_INPUT)
    assert _decode(model, [handle], refine, mask_input_key=newest).error is None
    both = _decode(model, [handle], refine, mask_input_key=newest, mask_input=first[:, :1])
    assert both.error.code == _Error.INVALID_ARG
    outcomes = {outcome: counter.value for outcome, counter in model.counts.metrics.items()}
    assert outcomes["unknown_kept"] == 2 and outcomes["failed"] == 1  # logits no longer held are no failure
