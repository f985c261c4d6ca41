import numpy as np
import onnxruntime as ort
import pytest

from triton_sam.engines import CancelToken, create_engine
from triton_sam.engines.local import CPU_DECODE_BATCH, LocalEngine
from triton_sam.engines.providers import CPU, CUDA, TENSORRT, cuda_device_count, provider_options, usable_providers
from triton_sam.errors import DecodeCancelled, InvalidInputError, ModelFileError
from triton_sam.prompts import build_request
from triton_sam.registry import get_model
from triton_sam.repository import locate

TINY = get_model("sam2.1_hiera_tiny")


@pytest.fixture(scope="module")
def engine(synthetic_repository):
    return create_engine(TINY, "local", synthetic_repository)


def _request(batch: int = 1):
    return build_request((1024, 1024), (1024, 1024), point_coords=np.full((batch, 1, 2), 500.0), point_labels=np.ones((batch, 1)))


def test_only_providers_that_can_start_are_chosen():
    providers = usable_providers()
    assert providers[-1] == CPU
    assert set(providers) <= set(ort.get_available_providers())
    if cuda_device_count() == 0:
        assert providers == [CPU]


def test_cuda_sessions_ask_for_cudnn_heuristics_so_a_new_batch_size_costs_little():
    """cuDNN 9 plans are rebuilt on every change of a conv's input shape in ONNX Runtime; its
    default search makes that ~tens of ms a conv (issue #38). TensorRT keeps its options."""
    assert provider_options(CUDA, None) == {"cudnn_conv_algo_search": "HEURISTIC"}
    assert provider_options(CPU, None) == {}
    assert provider_options(TENSORRT, "/cache")["trt_engine_cache_path"] == "/cache"


def test_engine_runs_on_the_chosen_providers(engine):
    assert engine.providers[0] == usable_providers()[0]
    assert "local ONNX Runtime" in engine.describe()


def test_encode_returns_every_feature_map(engine):
    features = engine.encode(np.full((1024, 1024, 3), 255, np.uint8))
    assert {k: v.shape[1:] for k, v in features.arrays.items()} == TINY.feature_shapes
    assert features.nbytes == sum(4 * int(np.prod(s)) for s in TINY.feature_shapes.values())
    np.testing.assert_allclose(features.arrays["image_embed"], 1.0)


def test_decode_shapes_for_multimask_single_and_batches(engine):
    features = engine.encode(np.zeros((1024, 1024, 3), np.uint8))
    multi = engine.decode(features, _request(), multimask_output=True)
    assert multi.low_res_logits.shape == (1, 3, 256, 256) and multi.scores.shape == (1, 3)
    single = engine.decode(features, _request(3), multimask_output=False)
    assert single.low_res_logits.shape == (3, 1, 256, 256) and single.scores.shape == (3, 1)
    np.testing.assert_array_equal(single.low_res_logits[0, 0], multi.low_res_logits[0, 1])


def test_a_batch_decodes_as_its_prompt_sets_alone(engine):
    """On a CPU a batch runs a few prompt sets at a time: the parts come back whole and in order."""
    image = np.tile(np.linspace(0, 255, 1024, dtype=np.uint8)[None, :, None], (1024, 1, 3))
    features = engine.encode(image)
    points = np.linspace(100.0, 900.0, CPU_DECODE_BATCH + 3).reshape(-1, 1, 1).repeat(2, axis=2)
    request = build_request((1024, 1024), (1024, 1024), point_coords=points, point_labels=np.ones(points.shape[:2]))
    batch = engine.decode(features, request)
    alone = [
        engine.decode(features, build_request((1024, 1024), (1024, 1024), point_coords=p[None], point_labels=[[1]]))
        for p in points
    ]
    np.testing.assert_array_equal(batch.low_res_logits, np.concatenate([a.low_res_logits for a in alone]))
    np.testing.assert_array_equal(batch.scores, np.concatenate([a.scores for a in alone]))


def test_engines_of_one_model_share_its_sessions(engine, synthetic_repository):
    """Start pressed again, or a generator made beside the panel's engine, loads no weights again."""
    other = create_engine(TINY, "local", synthetic_repository)
    assert other._encoder is engine._encoder and other._decoder is engine._decoder


def test_a_cancelled_decode_raises_and_a_fresh_one_still_works(engine):
    features = engine.encode(np.zeros((1024, 1024, 3), np.uint8))
    token = CancelToken()
    token.cancel()
    with pytest.raises(DecodeCancelled):
        engine.decode(features, _request(), cancel=token)
    assert engine.decode(features, _request(), cancel=CancelToken()).scores.shape == (1, 3)


def test_cancel_token_runs_callbacks_once_even_when_registered_late():
    token, calls = CancelToken(), []
    token.on_cancel(lambda: calls.append("early"))
    token.cancel()
    token.cancel()
    token.on_cancel(lambda: calls.append("late"))
    assert calls == ["early", "late"] and token.cancelled


def test_corrupt_model_file_says_how_to_fix_it(synthetic_repository, tmp_path):
    import shutil

    broken = tmp_path / "repo"
    shutil.copytree(synthetic_repository, broken)
    locate(TINY, broken).decoder.write_bytes(b"not an onnx model")
    with pytest.raises(ModelFileError, match="export the model again"):
        LocalEngine(locate(TINY, broken))


def test_unknown_backend_is_refused(synthetic_repository):
    with pytest.raises(InvalidInputError, match="Unknown backend"):
        create_engine(TINY, "carrier-pigeon", synthetic_repository)


def test_cancel_stops_a_running_sam2_decode(sam2_tiny_repository):
    """RunOptions.terminate really interrupts ONNX Runtime mid-run, well before it would finish."""
    import threading
    import time

    engine = create_engine(TINY, "local", sam2_tiny_repository)
    features = engine.encode(np.zeros((1024, 1024, 3), np.uint8))
    request = _request(batch=24)
    start = time.perf_counter()
    engine.decode(features, request)
    full = time.perf_counter() - start

    token = CancelToken()
    threading.Timer(full * 0.1, token.cancel).start()
    with pytest.raises(DecodeCancelled, match="while running") as raised:
        engine.decode(features, request, cancel=token)
    assert raised.value.__cause__ is not None  # ONNX Runtime itself stopped the run


def test_features_kept_as_onnx_runtime_buffers_decode_as_numpy_features(engine, synthetic_repository):
    """The GPU path (features bound to device memory, fed back by IO binding), run with CPU buffers."""
    bound = LocalEngine(locate(TINY, synthetic_repository), feature_device="cpu")
    image = np.random.default_rng(0).integers(0, 256, (600, 900, 1), dtype=np.uint8)
    plain, kept = engine.encode(image), bound.encode(image)
    assert not kept.arrays and set(kept.device) == set(TINY.feature_shapes) and kept.nbytes == plain.nbytes
    for name, array in plain.arrays.items():
        np.testing.assert_array_equal(kept.host_arrays()[name], array)
    for batch in (1, 2):  # a batch of prompt sets goes through host copies
        for multimask in (True, False):
            ours = bound.decode(kept, _request(batch), multimask)
            expected = engine.decode(plain, _request(batch), multimask)
            np.testing.assert_array_equal(ours.low_res_logits, expected.low_res_logits)
            np.testing.assert_array_equal(ours.scores, expected.scores)
    token = CancelToken()
    token.cancel()
    with pytest.raises(DecodeCancelled):
        bound.decode(kept, _request(), cancel=token)
