"""`python -m benchmarks triton`: the Triton path next to the local engine, in one run.

A local Triton server (`triton-sam serve`'s code) serves a random-init export. Reported: encode,
hover-decode and refinement latency through Triton on loopback (the server as `triton-sam serve` runs
it, batching off) and with the local engine (calls alternate), bytes on the wire per call (a counting
proxy), the hover decodes' time inside the server by stage (Triton's statistics), decode throughput
with 1, 4 and 16 concurrent clients, with the session model's dynamic batching and with it switched
off, a large plane's tiles encoded together (the server's `encode_batch`) and one by one, and how long
a 4096-px encode request keeps Python's lock while it goes out (ours next to tritonclient's `infer`).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from triton_sam import contract
from triton_sam.engines import Engine, ImageFeatures, create_engine
from triton_sam.engines.triton import TritonClient, TritonConnection, TritonEngine
from triton_sam.image import encoder_input
from triton_sam.prompts import DecodeRequest, model_request
from triton_sam.registry import DEFAULT_MODEL, ModelSpec, get_model

from . import summarize, timed, timed_call
from .fixtures import BENCH_SHAPE, bench_image, exported_repository
from .wire import CountingProxy, loopback_server


def _encoder_inputs(spec: ModelSpec, shape: tuple[int, int], count: int) -> list[np.ndarray]:
    """`count` different encoder inputs (the server caches by content, so repeats would not encode)."""
    base = encoder_input(bench_image(shape), spec)
    return [np.roll(base, 7 * i, axis=1) for i in range(count)]


def _hover_request(spec: ModelSpec, i: int = 0) -> DecodeRequest:
    """A hover preview's decode as the session asks for it: one point, the best candidate's mask
    only (`logits_above`, `best_of_multimask`)."""
    size = spec.input_size
    point = {"point_coords": np.array([[size * 0.4 + i % 50, size * 0.45]], np.float32), "point_labels": np.array([1])}
    return model_request(spec, (size, size), **point, logits_above=0.0, best_of_multimask=True)


def _refinement(engine: Engine, features: ImageFeatures, spec: ModelSpec, i: int) -> tuple[DecodeRequest, DecodeRequest]:
    """A click's decode (one point, three masks) and, for its answer, a second click's: two points
    and the best of the first's logits as the mask input (as `Predictor` returns them), as the
    session refines an object (its masks only thresholded or refined: `logits_above`)."""
    size = spec.input_size
    point = [size * 0.4 + i % 50, size * 0.45]
    click = model_request(spec, (size, size), point_coords=[point], point_labels=[1], logits_above=0.0)
    first = engine.decode(features, click)
    best = spec.as_mask_input(first.low_res_logits[0, int(np.argmax(first.scores[0]))])
    second = [point[0] + 30, point[1] + 10]
    prompts = {"point_coords": [point, second], "point_labels": [1, 1], "mask_input": best[None], "logits_above": 0.0}
    return model_request(spec, (size, size), **prompts)


def _throughput(url: str, spec: ModelSpec, image: np.ndarray, clients: int, duration_s: float) -> dict:
    """Decodes per second with `clients` threads, each with its own connection, for `duration_s`."""
    engines = [TritonEngine(spec, TritonConnection(url)) for _ in range(clients)]
    features = engines[0].encode(image)
    counts = [0] * clients
    latencies: list[float] = []
    stop = time.monotonic() + duration_s

    def client(index: int) -> None:
        while time.monotonic() < stop:
            latencies.append(timed(engines[index].decode, features, _hover_request(spec, counts[index]), False))
            counts[index] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for engine in engines:
        engine.close()
    return {"clients": clients, "decodes_per_s": sum(counts) / duration_s, "latency": summarize(latencies)}


def _session_stats(url: str, spec: ModelSpec) -> dict:
    """Triton's own statistics of the session model (JSON form)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        (stats,) = client.get_inference_statistics(spec.session_name, as_json=True)["model_stats"]
    finally:
        client.close()
    return stats


def server_batch_sizes(url: str, spec: ModelSpec) -> dict[str, int]:
    """How many executions the server ran at each batch size (Triton's own statistics)."""
    stats = _session_stats(url, spec)
    return {b["batch_size"]: int(b["compute_infer"]["count"]) for b in stats.get("batch_stats", [])}


SERVER_STAGES = ("queue", "compute_input", "compute_infer", "compute_output")


def server_stage_ns(url: str, spec: ModelSpec) -> dict[str, int]:
    """The session model's requests so far and Triton's cumulative nanoseconds in each stage of them
    (`success` is a request's whole time in the server)."""
    inference = _session_stats(url, spec)["inference_stats"]
    times = {stage: int(inference.get(stage, {}).get("ns", 0)) for stage in ("success", *SERVER_STAGES)}
    return {"requests": int(inference.get("success", {}).get("count", 0)), **times}


def server_split(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """Mean milliseconds a request spent in the server and in each of its stages between two
    `server_stage_ns` readings: what the client's round trip adds is the rest."""
    requests = max(1, after["requests"] - before["requests"])
    return {stage: (after[stage] - before[stage]) / requests / 1e6 for stage in ("success", *SERVER_STAGES)}


def _latency(local: Engine, remote: Engine, proxy: CountingProxy, url: str, spec: ModelSpec, inputs, decodes: int) -> dict:
    """Encode, hover-decode and refinement latency of both engines, alternating, the bytes Triton
    moved, and the encodes' and hover decodes' time inside the server (Triton's statistics at `url`)."""
    calls = ("encode", "decode", "refine")
    times: dict[str, list[float]] = {f"{engine}_{call}": [] for call in calls for engine in ("local", "triton")}
    wire: dict[str, list[int]] = {f"{call}_{way}": [] for call in calls for way in ("up", "down")}
    features: dict[str, ImageFeatures] = {}
    server_before = server_stage_ns(url, spec)
    for image in inputs:
        seconds, features["local"] = timed_call(local.encode, image)
        times["local_encode"].append(seconds)
        up, down = proxy.counts()
        seconds, features["triton"] = timed_call(remote.encode, image)
        times["triton_encode"].append(seconds)
        after = proxy.counts()
        wire["encode_up"].append(after[0] - up)
        wire["encode_down"].append(after[1] - down)
    server_encode = server_split(server_before, server_stage_ns(url, spec))
    server_before = server_stage_ns(url, spec)
    for i in range(decodes):
        request = _hover_request(spec, i)
        times["local_decode"].append(timed(local.decode, features["local"], request, False))
        up, down = proxy.counts()
        times["triton_decode"].append(timed(remote.decode, features["triton"], request, False))
        after = proxy.counts()
        wire["decode_up"].append(after[0] - up)
        wire["decode_down"].append(after[1] - down)
    server_decode = server_split(server_before, server_stage_ns(url, spec))
    for i in range(max(1, decodes // 3)):
        times["local_refine"].append(timed(local.decode, features["local"], _refinement(local, features["local"], spec, i)))
        request = _refinement(remote, features["triton"], spec, i)
        up, down = proxy.counts()
        times["triton_refine"].append(timed(remote.decode, features["triton"], request))
        after = proxy.counts()
        wire["refine_up"].append(after[0] - up)
        wire["refine_down"].append(after[1] - down)
    stats = {key: summarize(values) for key, values in times.items()}
    stats["bytes_per_call"] = {key: int(np.median(values)) for key, values in wire.items()}
    stats["server_encode_ms"], stats["server_decode_ms"] = server_encode, server_decode
    return stats


LOCK_PLANE = (4096, 4096)  # the largest grey encoder input the client sends: 16 MiB


def _lock_held(url: str, spec: ModelSpec, calls: int) -> dict:
    """The longest a thread ticking every 1 ms (as the GUI thread's timers) waited while an encode
    request of a `LOCK_PLANE` grey image went out on another thread: ours (`infer_large`) next to
    tritonclient's `infer`, alternating. One image: the server answers it from its cache, so the
    server's work is small and the same for both; the client's copies are what differ."""
    import tritonclient.grpc as grpcclient

    image = np.random.default_rng(0).integers(0, 256, (1, *LOCK_PLANE, 1), dtype=np.uint8)
    client = TritonClient(TritonConnection(url))

    def theirs() -> None:
        tensor = grpcclient.InferInput(contract.ENCODER_INPUT, list(image.shape), "UINT8")
        tensor.set_data_from_numpy(image)
        client.grpc.infer(spec.session_name, [tensor], outputs=[grpcclient.InferRequestedOutput(contract.HANDLE)])

    def ours() -> None:
        client.infer_large(spec.session_name, {contract.ENCODER_INPUT: image}, [contract.HANDLE], None)

    ours()  # the server encodes the image once
    waits: dict[str, list[float]] = {"ours": [], "tritonclient": []}
    for _ in range(calls):
        for name, call in (("ours", ours), ("tritonclient", theirs)):
            waits[name].append(_longest_tick_gap(call))
    client.close()
    stats = {name: summarize(values) for name, values in waits.items()}
    return {"plane": list(LOCK_PLANE), **stats, "ratio": stats["ours"]["median_ms"] / stats["tritonclient"]["median_ms"]}


def _tile_encodes(url: str, spec: ModelSpec, count: int, warm_up: bool) -> dict:
    """Milliseconds per tile for `count` new tiles of a large plane sent as `TiledPredictor` sends
    them: `encode_batch` to a request where the session model encodes them together, else one by
    one. After a warm-up of one such request, as large as the first one measured (a GPU builds its
    kernels per batch size), if `warm_up`."""
    engine = TritonEngine(spec, TritonConnection(url))
    try:
        first = min(engine.encode_batch, count) if warm_up else 0
        tiles = _encoder_inputs(spec, (spec.input_size, spec.input_size), first + count)
        if first:
            engine.encode_many(tiles[:first])
        seconds, _ = timed_call(engine.encode_many, tiles[first:])
        return {"encode_batch": engine.encode_batch, "tiles": count, "per_tile_ms": 1000 * seconds / count}
    finally:
        engine.close()


def _longest_tick_gap(call) -> float:
    """Seconds of the longest gap between this thread's 1 ms sleeps while `call` runs on another."""
    done = threading.Event()

    def target() -> None:
        try:
            call()
        finally:
            done.set()

    worker = threading.Thread(target=target)
    longest, last = 0.0, time.perf_counter()
    worker.start()
    while not done.is_set():
        time.sleep(0.001)
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    worker.join()
    return longest


def run(
    model_id: str = DEFAULT_MODEL,
    encodes: int = 3,
    decodes: int = 30,
    clients: tuple[int, ...] = (1, 4, 16),
    duration_s: float = 3.0,
    lock_calls: int = 7,
    tiles: int = 8,
    shape: tuple[int, int] = BENCH_SHAPE,
    seed: int = 0,
    workdir: Path = Path(".bench"),
    warm_up: bool = True,
) -> dict:
    """Without `warm_up` (a smoke run: that it runs) the first calls, which load and tune, are timed too."""
    spec = get_model(model_id)
    repository = exported_repository(model_id, seed, workdir)
    inputs = _encoder_inputs(spec, shape, encodes + 1)
    local = create_engine(spec, "local", repository)
    result = {"benchmark": "triton", "model": model_id, "image_shape": list(shape), "local_engine": local.describe()}

    with loopback_server(repository, model_id, session_batching=False) as plain:  # as `triton-sam serve` on a CPU
        proxy = CountingProxy(plain.grpc_url)
        remote = TritonEngine(spec, TritonConnection(proxy.url))
        if warm_up:  # and connection set-up
            remote.decode(remote.encode(inputs[-1]), _hover_request(spec), False)
            local.decode(local.encode(inputs[-1]), _hover_request(spec), False)
        result.update(_latency(local, remote, proxy, plain.grpc_url, spec, inputs[:encodes], decodes))
        remote.close()
        proxy.close()
        result["decode_ratio"] = result["triton_decode"]["median_ms"] / result["local_decode"]["median_ms"]
        result["throughput_no_batching"] = [_throughput(plain.grpc_url, spec, inputs[-1], n, duration_s) for n in clients]
        result["lock_held"] = _lock_held(plain.grpc_url, spec, lock_calls)
        tiles_alone = _tile_encodes(plain.grpc_url, spec, tiles, warm_up)
    local.close()
    with loopback_server(repository, model_id, session_batching=True, batched_encodes=True) as batching:
        result["throughput_dynamic_batching"] = [_throughput(batching.grpc_url, spec, inputs[-1], n, duration_s) for n in clients]
        result["executions_by_batch_size"] = server_batch_sizes(batching.grpc_url, spec)
        tiles_batched = _tile_encodes(batching.grpc_url, spec, tiles, warm_up)
    ratio = tiles_batched["per_tile_ms"] / tiles_alone["per_tile_ms"]
    result["tile_encodes"] = {"batched": tiles_batched, "one_by_one": tiles_alone, "ratio": ratio}
    return result
