"""The Triton engine against a real Triton server started on loopback (`triton-sam serve`'s code)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from benchmarks.parity import mask_iou
from benchmarks.wire import CountingProxy, free_port
from conftest import SERVED_MODELS, start_server
from synthetic import disk_image, write_repository
from triton_sam import contract
from triton_sam.engines import CancelToken, TritonConnection, create_engine
from triton_sam.engines.triton import SAFE_CANCEL_VERSION, TritonEngine
from triton_sam.engines.triton_client import TritonClient, served_models
from triton_sam.errors import DecodeCancelled, ServerBusyError, ServerModelError, ServerUnavailableError
from triton_sam.export import write_session_model
from triton_sam.export.triton_config import SESSION_LOGITS_CACHE_SIZE
from triton_sam.features import content_signature
from triton_sam.image import encoder_input
from triton_sam.predictor import Predictor
from triton_sam.prompts import build_request, model_request
from triton_sam.registry import get_model

TINY = get_model("sam2.1_hiera_tiny")
SMALL = get_model("sam2.1_hiera_small")
IMAGE = disk_image(300, 400, [(100, 100, 50), (300, 200, 40)])
OTHER = disk_image(300, 400, [(300, 200, 70)])


def _stats(url: str, model: str) -> dict:
    """Triton's execution counts for `model`, once they stop changing (the server updates them
    just after it answers, so a read right after a call can miss that call)."""
    client = grpcclient.InferenceServerClient(url)
    try:
        previous = None
        while True:
            (stats,) = client.get_inference_statistics(model, as_json=True)["model_stats"]
            counts = {"executions": int(stats.get("execution_count", 0)), "inferences": int(stats.get("inference_count", 0))}
            if counts == previous:
                return counts
            previous = counts
            time.sleep(0.1)
    finally:
        client.close()


def _one_point(x: float = 100, y: float = 100) -> dict:
    return {"point_coords": np.array([[x, y]], np.float32), "point_labels": np.array([1])}


def test_triton_predictor_gives_the_local_masks(synthetic_server, synthetic_repository):
    with (
        Predictor(backend="triton", url=synthetic_server.grpc_url) as remote,
        Predictor(model_repository=synthetic_repository) as local,
    ):
        for predictor in (remote, local):
            predictor.set_image(IMAGE)
        assert remote.get_image_embedding().arrays == {}  # the features stayed on the server
        for prompts in (_one_point(), _one_point(300, 200), {"box": np.array([40, 40, 160, 160])}):
            for multimask in (True, False):
                ours, theirs = (
                    remote.predict(**prompts, multimask_output=multimask),
                    local.predict(**prompts, multimask_output=multimask),
                )
                for a, b in zip(ours, theirs):
                    np.testing.assert_array_equal(a, b)
        masks, _, _ = remote.predict(**_one_point())
        assert masks[1][100, 100] and not masks[1][200, 300]


def test_more_prompt_sets_than_the_servers_batch_size_are_split_and_joined_in_order(synthetic_server, synthetic_repository):
    rng = np.random.default_rng(0)
    coords = rng.uniform((0, 0), (IMAGE.shape[1], IMAGE.shape[0]), size=(40, 1, 2)).astype(np.float32)
    prompts = {"point_coords": coords, "point_labels": np.ones((40, 1), np.int32)}
    with (
        Predictor(backend="triton", url=synthetic_server.grpc_url) as remote,
        Predictor(model_repository=synthetic_repository) as local,
    ):
        assert remote.engine.max_batch is not None and remote.engine.max_batch < 40
        for predictor in (remote, local):
            predictor.set_image(IMAGE)
        for a, b in zip(remote.predict(**prompts), local.predict(**prompts), strict=True):
            assert a.shape[0] == 40
            np.testing.assert_array_equal(a, b)


def test_concurrent_decodes_batched_on_the_server_each_get_their_own_masks(synthetic_server, synthetic_repository):
    remote = TritonEngine(TINY, TritonConnection(synthetic_server.grpc_url))
    local = create_engine(TINY, "local", synthetic_repository)
    image = np.repeat(disk_image(1024, 1024, [(200, 200, 100), (700, 600, 150)])[..., None], 3, axis=2)
    remote_features, local_features = remote.encode(image), local.encode(image)
    requests = [
        build_request((1024, 1024), (1024, 1024), point_coords=np.array([[x, 1023 - x]], np.float32), point_labels=np.array([1]))
        for x in np.linspace(0, 1023, 24)
    ]
    results = [None] * len(requests)

    def decode(i: int) -> None:
        results[i] = remote.decode(remote_features, requests[i], multimask_output=bool(i % 2))

    threads = [threading.Thread(target=decode, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for i, request in enumerate(requests):
        expected = local.decode(local_features, request, multimask_output=bool(i % 2))
        np.testing.assert_array_equal(results[i].low_res_logits, expected.low_res_logits)
        np.testing.assert_array_equal(results[i].scores, expected.scores)
    remote.close()
    local.close()


def test_a_decode_costs_under_4_kb_upstream(synthetic_server):
    proxy = CountingProxy(synthetic_server.grpc_url)
    try:
        with Predictor(backend="triton", url=proxy.url) as predictor:
            predictor.set_image(IMAGE)
            predictor.predict(**_one_point(), multimask_output=False)  # connection set-up done
            up0, down0 = proxy.counts()
            calls = 20
            for i in range(calls):
                predictor.predict(**_one_point(100 + i, 100), multimask_output=False)
            up, down = proxy.counts()
    finally:
        proxy.close()
    per_call_up, per_call_down = (up - up0) / calls, (down - down0) / calls
    print(f"bytes per decode: up {per_call_up:.0f}, down {per_call_down:.0f}")
    assert per_call_up <= 4096
    assert per_call_down < 300_000  # one 256x256 float32 mask and two scores


def test_a_masks_only_decode_sends_the_logits_around_the_object_and_gives_the_same_masks(synthetic_server, synthetic_repository):
    """A hover's decode (`logits_above`): the server sends the single mask's logits only around
    the samples above the threshold; thresholded and resized they give the full logits' mask,
    for an object, for nothing above the threshold, and at another threshold."""
    proxy = CountingProxy(synthetic_server.grpc_url)
    remote = TritonEngine(TINY, TritonConnection(proxy.url))
    local = create_engine(TINY, "local", synthetic_repository)
    try:
        image = encoder_input(IMAGE, TINY)
        remote_features, local_features = remote.encode(image), local.encode(image)
        size = IMAGE.shape[:2]
        received = {}
        for x, y, threshold in ((100, 100, 0.0), (300, 200, 0.0), (300, 200, 4.0), (300, 200, 100.0)):
            request = model_request(TINY, size, **_one_point(x, y))
            expected = local.decode(local_features, request, multimask_output=False)
            for above in (None, threshold):
                before = proxy.counts()[1]
                ours = remote.decode(remote_features, replace(request, logits_above=above), multimask_output=False)
                received[(x, y, threshold, above)] = proxy.counts()[1] - before
            np.testing.assert_array_equal(ours.scores, expected.scores)
            np.testing.assert_array_equal(ours.object_score_logits, expected.object_score_logits)
            mask = local.resizer.masks(ours.low_res_logits[0], size, threshold)
            np.testing.assert_array_equal(mask, local.resizer.masks(expected.low_res_logits[0], size, threshold))
            differs = ours.low_res_logits != expected.low_res_logits
            assert (expected.low_res_logits[differs] <= threshold).all() and (ours.low_res_logits[differs] <= threshold).all()
            assert mask.any() == (threshold < 100)
    finally:
        remote.close()
        local.close()
        proxy.close()
    full, cropped = received[(100, 100, 0.0, None)], received[(100, 100, 0.0, 0.0)]
    print(f"bytes down per decode: whole logits {full}, around the object {cropped}")
    assert cropped < full / 5  # a disk of radius 50 px in a 400 px image: about a quarter of the grid a side
    assert received[(300, 200, 100.0, 100.0)] < 2048  # nothing above the threshold: one sample


def test_a_clicks_candidates_come_around_the_object_and_refine_as_the_whole_logits(synthetic_server, synthetic_repository):
    """A click's decode (multimask, `logits_above`): the three candidates' logits come only around
    the object, give the local engine's masks and scores, and as the next click's mask input
    refine exactly as the whole logits do, named by key (under 4 KB up)."""
    proxy = CountingProxy(synthetic_server.grpc_url)
    remote = TritonEngine(TINY, TritonConnection(proxy.url))
    local = create_engine(TINY, "local", synthetic_repository)
    try:
        image, size = encoder_input(IMAGE, TINY), IMAGE.shape[:2]
        remote_features, local_features = remote.encode(image), local.encode(image)
        click = model_request(TINY, size, **_one_point())
        expected = local.decode(local_features, click)
        received = {}
        for above in (None, 0.0):
            before = proxy.counts()[1]
            ours = remote.decode(remote_features, replace(click, logits_above=above))
            received[above] = proxy.counts()[1] - before
        np.testing.assert_array_equal(ours.scores, expected.scores)
        np.testing.assert_array_equal(
            local.resizer.masks(ours.low_res_logits[0], size), local.resizer.masks(expected.low_res_logits[0], size)
        )
        assert (ours.low_res_logits != expected.low_res_logits).any()  # away from the object: not sent
        two_points = {"point_coords": np.array([[100, 100], [130, 110]], np.float32), "point_labels": np.array([1, 1])}
        for candidate in range(3):
            previous = {
                engine: TINY.as_mask_input(result.low_res_logits[0, candidate : candidate + 1])
                for engine, result in ((remote, ours), (local, expected))
            }
            refined = local.decode(local_features, model_request(TINY, size, **two_points, mask_input=previous[local]))
            before = proxy.counts()[0]
            result = remote.decode(remote_features, model_request(TINY, size, **two_points, mask_input=previous[remote]))
            assert proxy.counts()[0] - before <= 4096
            np.testing.assert_array_equal(result.low_res_logits, refined.low_res_logits)
            np.testing.assert_array_equal(result.scores, refined.scores)
    finally:
        remote.close()
        local.close()
        proxy.close()
    print(f"bytes down per click: whole logits {received[None]}, around the object {received[0.0]}")
    assert received[0.0] < received[None] / 5


def test_a_refinement_names_the_logits_the_server_kept_and_gets_the_local_masks(synthetic_server, synthetic_repository):
    """A single decode's logits stay on the server: a refinement with them as mask input sends
    their key instead (under 4 KB up, not 262 KB) and gets what the local engine gets with them;
    a client that did not receive them sends them."""
    proxy = CountingProxy(synthetic_server.grpc_url)
    remote, other = (TritonEngine(TINY, TritonConnection(proxy.url)) for _ in range(2))
    local = create_engine(TINY, "local", synthetic_repository)
    try:
        image, size = encoder_input(IMAGE, TINY), IMAGE.shape[:2]
        features = {engine: engine.encode(image) for engine in (remote, other, local)}
        first = remote.decode(features[remote], model_request(TINY, size, **_one_point()))
        np.testing.assert_array_equal(
            first.low_res_logits, local.decode(features[local], model_request(TINY, size, **_one_point())).low_res_logits
        )
        two_points = {"point_coords": np.array([[100, 100], [130, 110]], np.float32), "point_labels": np.array([1, 1])}
        sent = {}
        for candidate in range(3):
            previous = TINY.as_mask_input(first.low_res_logits[0, candidate : candidate + 1])  # as `Predictor` returns it
            refine = model_request(TINY, size, **two_points, mask_input=previous)
            expected = local.decode(features[local], refine)
            for engine in (remote, other):
                before = proxy.counts()[0]
                result = engine.decode(features[engine], refine)
                sent[engine] = proxy.counts()[0] - before
                np.testing.assert_array_equal(result.low_res_logits, expected.low_res_logits)
                np.testing.assert_array_equal(result.scores, expected.scores)
            print(f"bytes up per refinement: by key {sent[remote]}, with the logits {sent[other]}")
            assert sent[remote] <= 4096 < 262_144 < sent[other]
    finally:
        for engine in (remote, other, local):
            engine.close()
        proxy.close()


@pytest.mark.parametrize("model_id", SERVED_MODELS)
def test_each_served_model_through_triton_matches_the_local_engine(model_id, models_server, exported_repository):
    client = TritonClient(TritonConnection(models_server.grpc_url))
    try:
        assert sorted(served_models(client)) == sorted(SERVED_MODELS)  # side by side on one server
    finally:
        client.close()
    rng = np.random.default_rng(0)
    rgb, grey = rng.integers(0, 255, (480, 640, 3), np.uint8), rng.integers(0, 255, (480, 640), np.uint8)  # grey: 1 channel sent
    repository = exported_repository(model_id)
    prompt_sets = [
        _one_point(320, 240),
        {"point_coords": np.array([[100, 100], [400, 300]]), "point_labels": np.array([1, 0])},
        {"box": np.array([50, 60, 500, 400])},
        {"box": np.array([[10, 10, 200, 200], [300, 200, 600, 450]])},
    ]
    with (
        Predictor(model_id, backend="triton", url=models_server.grpc_url) as remote,
        Predictor(model_id, model_repository=repository) as local,
    ):
        for image in (rgb, grey):
            remote.set_image(image)
            local.set_image(image)
            for prompts in prompt_sets:
                ours, scores, low = remote.predict(**prompts)
                theirs, ref_scores, ref_low = local.predict(**prompts)
                iou = (ours & theirs).sum(axis=(-2, -1)) / np.maximum((ours | theirs).sum(axis=(-2, -1)), 1)
                assert iou.min() >= 0.999
                np.testing.assert_allclose(scores, ref_scores, atol=1e-4)
                np.testing.assert_allclose(low, ref_low, atol=1e-3)


@pytest.mark.parametrize("model_id", SERVED_MODELS)
def test_a_best_of_multimask_decode_answers_the_best_candidate_locally_and_through_triton(
    model_id, models_server, exported_repository
):
    """A hover preview's decode: one mask, the multimask candidate with the highest predicted IoU
    (the one a click chooses) instead of the single-mask output; through Triton also cut to the
    object. SAM1's single mask is its first token, never one of the three, so there the two
    differ at every point; SAM2.1's falls back to the best candidate when its own is unstable,
    as with random weights."""
    spec = get_model(model_id)
    local = create_engine(spec, "local", exported_repository(model_id))
    remote = TritonEngine(spec, TritonConnection(models_server.grpc_url))
    try:
        image = np.random.default_rng(1).integers(0, 255, (480, 640, 3), np.uint8)
        sent, size = encoder_input(image, spec), image.shape[:2]
        features = {local: local.encode(sent), remote: remote.encode(sent)}
        differs = 0
        for x, y in ((320, 240), (100, 400), (600, 50)):
            request = model_request(spec, size, **_one_point(x, y))
            multi = local.decode(features[local], request)
            best = int(np.argmax(multi.scores[0]))
            expected = local.resizer.masks(multi.low_res_logits[0, best : best + 1], size)[0]
            single = local.decode(features[local], request, multimask_output=False)
            differs += not np.array_equal(single.low_res_logits[0, 0], multi.low_res_logits[0, best])
            for engine in (local, remote):
                for above in (None, 0.0):
                    ours = engine.decode(features[engine], replace(request, best_of_multimask=True, logits_above=above), False)
                    assert ours.low_res_logits.shape == (1, 1, spec.low_res_size, spec.low_res_size)
                    np.testing.assert_allclose(ours.scores[0, 0], multi.scores[0, best], atol=1e-4)
                    mask = local.resizer.masks(ours.low_res_logits[0], size)[0]
                    assert mask_iou(mask, expected) >= (1.0 if engine is local else 0.999)
    finally:
        local.close()
        remote.close()
    assert differs == (0 if spec.family == "sam2" else 3)


@pytest.fixture(scope="module")
def sam2_batching_server(sam2_tiny_repository):
    """The SAM2 session model behind Triton's dynamic batcher, as deployed on a GPU."""
    server = start_server(sam2_tiny_repository, session_batching=True)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def synthetic_batching_server(synthetic_repository):
    """The synthetic session model behind Triton's dynamic batcher."""
    server = start_server(synthetic_repository, session_batching=True)
    yield server
    server.stop()


def test_back_to_back_decodes_behind_the_dynamic_batcher_never_wait_in_its_queue(synthetic_batching_server):
    """One client's decodes, each sent when the last is answered, find the instance free: none may
    wait in the batcher's queue. With a queue policy in the config (Triton 2.51), 2-5 % of them
    waited ~540 ms there (the batcher missed the free instance and slept its default 500 ms)."""
    url = synthetic_batching_server.grpc_url
    engine = TritonEngine(TINY, TritonConnection(url))
    features = engine.encode(encoder_input(IMAGE, TINY))
    client = grpcclient.InferenceServerClient(url)

    def queued_ms() -> float:
        (stats,) = client.get_inference_statistics(TINY.session_name, as_json=True)["model_stats"]
        return int(stats["inference_stats"]["queue"]["ns"]) / 1e6

    try:
        before = queued_ms()
        for i in range(200):
            engine.decode(features, model_request(TINY, IMAGE.shape[:2], **_one_point(100 + i % 50, 100)), bool(i % 2))
        time.sleep(0.5)  # the server updates its statistics just after it answers
        waited = queued_ms() - before
    finally:
        client.close()
        engine.close()
    print(f"time in the batcher's queue over 200 decodes: {waited:.1f} ms")
    assert waited < 250


def test_a_server_that_encodes_tiles_together_gets_them_together_and_they_decode_as_locally(
    synthetic_batching_server, synthetic_server, synthetic_repository
):
    """A session model that batches encodes (on a GPU; forced here) tells clients its `encode_batch`:
    a large plane's tiles go there that many to a request (one server run each), others one by
    one; every tile then decodes as the local engine decodes it."""
    from triton_sam.tiled_predictor import TiledPredictor

    plane = np.random.default_rng(3).integers(0, 256, (2600, 3000), np.uint8)  # 16 tiles, no two alike
    points = [[300, 300], [1400, 896], [2900, 2500]]
    with (
        TiledPredictor(backend="triton", url=synthetic_batching_server.grpc_url) as batched,
        TiledPredictor(backend="triton", url=synthetic_server.grpc_url) as one_by_one,
        TiledPredictor(model_repository=synthetic_repository) as local,
    ):
        assert (batched.engine.encode_batch, one_by_one.engine.encode_batch, local.engine.encode_batch) == (4, 1, 1)
        before = _settled_requests(synthetic_batching_server, TINY.session_name)
        progress = []
        batched.set_image(plane)
        batched.encode_tiles(on_progress=lambda done, total: progress.append(done))
        assert progress == [4, 8, 12, 16]
        assert _delta(before, _settled_requests(synthetic_batching_server, TINY.session_name)) == {"encoded": 4}
        for predictor in (one_by_one, local):
            predictor.set_image(plane)
        for point in points:
            expected = local.predict(point_coords=[point], point_labels=[1])
            for predictor in (batched, one_by_one):
                for ours, theirs in zip(predictor.predict(point_coords=[point], point_labels=[1]), expected):
                    np.testing.assert_array_equal(ours, theirs)


def test_images_of_one_shape_go_together_whatever_their_order(synthetic_batching_server):
    """`encode_many` groups images by shape (a server encodes only one shape at once): two of one
    shape around one of another are two requests, and each image keeps its own handle, in order."""
    engine = TritonEngine(TINY, TritonConnection(synthetic_batching_server.grpc_url))
    rng = np.random.default_rng(5)
    images = [rng.integers(0, 256, shape, np.uint8) for shape in ((300, 400, 3), (200, 250, 3), (300, 400, 3))]
    before = _settled_requests(synthetic_batching_server, TINY.session_name)
    features = engine.encode_many(images)
    assert _delta(before, _settled_requests(synthetic_batching_server, TINY.session_name)) == {"encoded": 2}
    assert [f.handle for f in features] == [content_signature(image, TINY.model_id) for image in images]
    assert all(f.encoder_input is image for f, image in zip(features, images))
    engine.close()


def _settled_requests(server, model: str) -> dict[str, int]:
    """The session model's request counts by outcome, once a read repeats the previous one."""
    previous = None
    while (counts := server.session_requests(model)) != previous:
        previous = counts
        time.sleep(0.1)
    return counts


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {key: after.get(key, 0) - before.get(key, 0) for key in after if after.get(key, 0) != before.get(key, 0)}


def _cancel_queued_decodes(engine: TritonEngine, server, seed: int, count: int = 6) -> tuple[list[str], dict[str, int]]:
    """Queue `count` decodes behind a long encode, cancel them while it runs; the callers' outcomes,
    in the order they returned, and the session model's request counts by outcome meanwhile.
    Each `seed` makes new images (the server's cache would answer a seen one at once)."""
    rng = np.random.default_rng(seed)
    features = engine.encode(rng.integers(0, 255, (1024, 1024, 3), np.uint8))
    request = build_request((1024, 1024), (1024, 1024), point_coords=np.array([[500.0, 500.0]]), point_labels=np.array([1]))
    engine.decode(features, request)
    before = _settled_requests(server, TINY.session_name)

    # A new image keeps the single session instance busy for seconds (SAM2 encoder on CPU) ...
    blocker = threading.Thread(target=engine.encode, args=(rng.integers(0, 255, (1024, 1024, 3), np.uint8),))
    blocker.start()
    time.sleep(0.3)
    # ... while decodes queue behind it; then they are cancelled.
    tokens = [CancelToken() for _ in range(count)]
    outcomes = []

    def decode(token: CancelToken) -> None:
        try:
            engine.decode(features, request, cancel=token)
            outcomes.append("ran")
        except DecodeCancelled:
            outcomes.append("cancelled")

    threads = [threading.Thread(target=decode, args=(token,)) for token in tokens]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    assert blocker.is_alive(), "the encoder finished before the decodes were cancelled; the test proves nothing"
    for token in tokens:
        token.cancel()
    for thread in threads:
        thread.join(30)
    outcomes.append("encoder busy" if blocker.is_alive() else "encoder done")
    blocker.join(30)
    return outcomes, _delta(before, _settled_requests(server, TINY.session_name))


@pytest.mark.parametrize("batching", [False, True], ids=["no-batcher", "batcher"])
def test_cancelled_queued_decodes_never_run_on_the_server(batching, request):
    server = request.getfixturevalue("sam2_batching_server" if batching else "models_server")
    assert server.session_batching == batching
    # The local server (Triton 2.51) has the cancellation crash, so by default the engine leaves
    # calls running there; this checks the cancellation it does on newer servers.
    engine = TritonEngine(TINY, TritonConnection(server.grpc_url), cancel_on_server=True)
    # Behind a batcher a superseded running decode is only cancelled when overdue (see TritonEngine).
    assert engine.cancel_running == ("overdue" if batching else "always")
    outcomes, requests = _cancel_queued_decodes(engine, server, seed=1)
    engine.close()

    assert outcomes == ["cancelled"] * 6 + ["encoder busy"]
    # Server side: only the blocking encode ran; each cancelled decode was dropped before it ran by
    # the session model (Triton 2.51's batcher dropped them itself only while it had a queue policy).
    assert requests == {"encoded": 1, "cancelled_queued": 6}


def test_on_a_server_with_the_cancellation_crash_a_cancelled_decode_waits_and_drops_its_answer(models_server):
    engine = TritonEngine(TINY, TritonConnection(models_server.grpc_url))
    assert (2, 0) <= engine.client.server_version() < SAFE_CANCEL_VERSION  # PyTriton's Triton 2.51
    assert not engine.cancel_on_server
    assert engine.cancel_running == "overdue"  # a superseded decode is waited for unless overdue
    outcomes, requests = _cancel_queued_decodes(engine, models_server, seed=3)
    engine.close()

    # Nothing is cancelled on the wire: each caller waits for its answer (after the encode) and drops it.
    assert outcomes == ["cancelled"] * 6 + ["encoder done"]
    assert requests == {"encoded": 1, "decoded": 6}


def _request_ns(url: str, model: str) -> dict[str, int]:
    """Count and total server time (ns) of the requests `model` answered."""
    client = grpcclient.InferenceServerClient(url)
    try:
        (stats,) = client.get_inference_statistics(model, as_json=True)["model_stats"]
    finally:
        client.close()
    success = stats["inference_stats"]["success"]
    return {"success_count": int(success.get("count", 0)), "success_ns": int(success.get("ns", 0))}


def test_a_decode_cancelled_while_running_is_stopped_on_the_server(models_server):
    url = models_server.grpc_url
    engine = TritonEngine(TINY, TritonConnection(url), cancel_on_server=True)  # as on servers after 2.57
    features = engine.encode(np.random.default_rng(2).integers(0, 255, (1024, 1024, 3), np.uint8))
    boxes = np.array([[10 + i, 20, 600 + i, 700] for i in range(16)], np.float32)
    heavy = build_request((1024, 1024), (1024, 1024), box=boxes)  # 16 prompt sets: a long decoder run

    for _ in range(2):  # the second: ONNX Runtime's first run of a shape is slower
        before = _request_ns(url, TINY.session_name)
        engine.decode(features, heavy)
        while (finished := _request_ns(url, TINY.session_name))["success_count"] == before["success_count"]:
            time.sleep(0.01)  # Triton updates its statistics just after it answers
    full_run_ns = finished["success_ns"] - before["success_ns"]

    before_outcomes = _settled_requests(models_server, TINY.session_name)
    token = CancelToken()
    threading.Timer(full_run_ns / 4e9, token.cancel).start()  # a quarter of the way in
    with pytest.raises(DecodeCancelled):
        engine.decode(features, heavy, cancel=token)
    deadline = time.monotonic() + 10
    # The client stops waiting at once; the server answers once it stopped the run.
    while _request_ns(url, TINY.session_name)["success_count"] == finished["success_count"]:
        assert time.monotonic() < deadline, "the server never answered the cancelled request"
        time.sleep(0.05)
    # The session model counts a run as cancelled_running only when ONNX Runtime stopped it before
    # its end. (Its server time is a poor witness: on a busy CI machine one such run took 704 ms of
    # the full run's 907.)
    outcomes = _delta(before_outcomes, _settled_requests(models_server, TINY.session_name))
    engine.close()
    assert outcomes == {"cancelled_running": 1}


@pytest.fixture(scope="module")
def small_cache_server(tmp_path_factory):
    """A server whose session model keeps one image and three masks' logits, plus a model exported
    under another contract."""
    repository = write_repository(TINY, tmp_path_factory.mktemp("small_cache_repo"))
    write_session_model(TINY, repository, cache_size=1)
    config = repository / TINY.session_name / "config.pbtxt"
    logits = f'key: "logits_cache_size" value: {{ string_value: "{SESSION_LOGITS_CACHE_SIZE}" }}'
    config.write_text(config.read_text().replace(logits, logits.replace(f'"{SESSION_LOGITS_CACHE_SIZE}"', '"3"')))
    write_repository(SMALL, repository)
    config = repository / SMALL.session_name / "config.pbtxt"
    version = f'key: "triton_sam_contract_version" value: {{ string_value: "{contract.CONTRACT_VERSION}" }}'
    config.write_text(config.read_text().replace(version, version.replace(f'"{contract.CONTRACT_VERSION}"', '"999"')))
    server = start_server(repository)
    yield server
    server.stop()


def test_an_evicted_embedding_is_encoded_again_without_the_caller_noticing(small_cache_server):
    url = small_cache_server.grpc_url
    with Predictor(backend="triton", url=url) as first, Predictor(backend="triton", url=url) as second:
        first.set_image(IMAGE)
        expected = first.predict(**_one_point())[0]
        second.set_image(disk_image(300, 400, [(50, 50, 20)]))  # evicts the first image (cache of one)
        before = _stats(url, TINY.session_name)
        masks = first.predict(**_one_point())[0]
        after = _stats(url, TINY.session_name)
    np.testing.assert_array_equal(masks, expected)
    assert after["inferences"] - before["inferences"] == 3  # failed decode, encode again, decode


def test_logits_the_server_no_longer_keeps_are_sent_without_the_caller_noticing(small_cache_server):
    url = small_cache_server.grpc_url
    first, second, fresh = (TritonEngine(TINY, TritonConnection(url)) for _ in range(3))
    image, size = encoder_input(IMAGE, TINY), IMAGE.shape[:2]
    features = {engine: engine.encode(image) for engine in (first, second, fresh)}
    logits = first.decode(features[first], model_request(TINY, size, **_one_point())).low_res_logits
    second.decode(features[second], model_request(TINY, size, **_one_point(300, 200)))  # its 3 masks evict the first's
    refine = model_request(TINY, size, **_one_point(110, 100), mask_input=TINY.as_mask_input(logits[0, :1]))
    before = _stats(url, TINY.session_name)
    result = first.decode(features[first], refine)
    after = _stats(url, TINY.session_name)
    expected = fresh.decode(features[fresh], refine)  # a client that never kept them sends the logits
    for engine in (first, second, fresh):
        engine.close()
    np.testing.assert_array_equal(result.low_res_logits, expected.low_res_logits)
    np.testing.assert_array_equal(result.scores, expected.scores)
    assert after["inferences"] - before["inferences"] == 2  # by key (failed), then with the logits


def test_cropped_clicks_the_server_forgot_are_decoded_again_and_refinements_stay_exact(small_cache_server, synthetic_repository):
    """Three clicks, each refining the last with logits received only around the object; before
    the third, another client's click evicts them all: the engine decodes the first two clicks
    again (the server keeps their logits again), and the third gets what the whole logits give."""
    url = small_cache_server.grpc_url
    remote, other = (TritonEngine(TINY, TritonConnection(url)) for _ in range(2))
    local = create_engine(TINY, "local", synthetic_repository)
    image, size = encoder_input(IMAGE, TINY), IMAGE.shape[:2]
    features = {engine: engine.encode(image) for engine in (remote, other, local)}
    clicks = [[(100, 100)], [(100, 100), (130, 110)], [(100, 100), (130, 110), (80, 120)]]
    previous = {remote: None, local: None}
    try:
        for number, points in enumerate(clicks):
            if number == 2:
                other.decode(features[other], model_request(TINY, size, **_one_point(300, 200), logits_above=0.0))
                before = _stats(url, TINY.session_name)
            prompts = {"point_coords": np.array(points, np.float32), "point_labels": np.ones(len(points), int)}
            results = {}
            for engine, above in ((remote, 0.0), (local, None)):
                request = model_request(TINY, size, **prompts, mask_input=previous[engine], logits_above=above)
                results[engine] = engine.decode(features[engine], request)
                best = int(np.argmax(results[engine].scores[0]))
                previous[engine] = TINY.as_mask_input(results[engine].low_res_logits[0, best : best + 1])
            np.testing.assert_array_equal(results[remote].scores, results[local].scores)
            ours, theirs = results[remote].low_res_logits, results[local].low_res_logits
            differs = ours != theirs  # only away from the object, where neither is above the threshold
            assert (ours[differs] <= 0).all() and (theirs[differs] <= 0).all() and (ours > 0).any()
        after = _stats(url, TINY.session_name)
    finally:
        for engine in (remote, other, local):
            engine.close()
    assert after["inferences"] - before["inferences"] == 5  # third (forgotten), second (forgotten), first, second, third


def test_discovery_and_a_contract_mismatch_is_explained(small_cache_server):
    client = TritonClient(TritonConnection(small_cache_server.grpc_url))
    try:
        assert served_models(client) == [TINY.model_id, SMALL.model_id]
    finally:
        client.close()
    with pytest.raises(ServerModelError, match="contract version 999"):
        TritonEngine(SMALL, TritonConnection(small_cache_server.grpc_url))
    with pytest.raises(ServerModelError, match="does not serve sam2.1_hiera_large.*sam2.1_hiera_tiny"):
        TritonEngine(get_model("sam2.1_hiera_large"), TritonConnection(small_cache_server.grpc_url))


def test_restart_is_recovered_and_a_dead_server_gives_a_clear_error_quickly(synthetic_repository):
    server = start_server(synthetic_repository)
    try:
        predictor = Predictor(backend="triton", url=server.grpc_url, timeout_s=5.0, reconnect_s=2.0)
        predictor.set_image(IMAGE)
        expected = predictor.predict(**_one_point())[0]

        server.stop()
        server.start()  # same ports; the new process has no embeddings
        np.testing.assert_array_equal(predictor.predict(**_one_point())[0], expected)

        server.stop()
        started = time.monotonic()
        with pytest.raises(ServerUnavailableError, match="not answering"):
            predictor.predict(**_one_point())
        assert time.monotonic() - started < 15
        predictor.close()
    finally:
        server.stop()


def test_auto_falls_back_to_local_when_the_server_dies_and_goes_back_when_it_returns(synthetic_repository):
    server = start_server(synthetic_repository)
    try:
        predictor = Predictor(
            backend="auto", url=server.grpc_url, model_repository=synthetic_repository, reconnect_s=0.5, retry_s=0.5
        )
        assert predictor.engine.describe().startswith("Triton at")
        predictor.set_image(IMAGE)
        expected = predictor.predict(**_one_point())[0]
        server.stop()
        np.testing.assert_array_equal(predictor.predict(**_one_point())[0], expected)
        assert "local ONNX Runtime" in predictor.engine.describe()
        assert "not answering" in predictor.engine.fallback_reason

        predictor.set_image(OTHER)  # encoded locally while the server is away
        assert predictor.get_image_embedding().arrays
        expected_other = predictor.predict(**_one_point(300, 200))[0]
        server.start()  # same ports
        deadline = time.monotonic() + 30
        while predictor.engine.fallback_reason is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert predictor.engine.describe().startswith("Triton at")
        # Features encoded locally stay usable; new images are encoded on the server again.
        np.testing.assert_array_equal(predictor.predict(**_one_point(300, 200))[0], expected_other)
        predictor.set_image(IMAGE)
        assert predictor.get_image_embedding().arrays == {}
        np.testing.assert_array_equal(predictor.predict(**_one_point())[0], expected)
        predictor.close()
        assert not any(t.name == "triton-sam-reconnect" for t in threading.enumerate())
    finally:
        server.stop()


def test_auto_without_a_server_says_why_it_runs_locally(synthetic_repository):
    engine = create_engine(TINY, "auto", synthetic_repository, url=f"127.0.0.1:{free_port()}", timeout_s=1.0)
    assert "Triton not used" in engine.describe() and "not answering" in engine.describe()
    engine.close()


def test_a_full_server_queue_is_reported_as_overload_not_as_a_dead_server(synthetic_server):
    """Triton's own refusal text (queue policy); `auto` must not give up on the server for it."""
    engine = TritonEngine(TINY, TritonConnection(synthetic_server.grpc_url))
    try:
        for text in ("[request id: <id_unknown>] Exceeds maximum queue size", "Request timeout expired"):
            error = engine._error(InferenceServerException(text, status="StatusCode.UNAVAILABLE"), engine.client)
            assert isinstance(error, ServerBusyError) and "overloaded" in str(error)
        refused = InferenceServerException("failed to connect to all addresses", status="StatusCode.UNAVAILABLE")
        down = engine._error(refused, engine.client)
        assert isinstance(down, ServerUnavailableError)
    finally:
        engine.close()
