"""Where a batched decode of the session model spends its time, stage by stage (issue #38).

On an H200, Triton runs of 3 or 15 decodes took ~140-160 ms whatever their size, while a run of 1
took ~9 ms. This runs the session model's own feature store (`BufferFeatureStore`: features in
buffers on this machine's device, rows of a batch gathered by the gather graph) in this process,
with sessions made as `triton_sam_requests.ort_session` makes them: one image's features stored
(and a second's, for rows of two slots), then batches of one-point prompt sets decoded and each
stage timed: `bind` (the rows gathered, prompts bound), `run` (the decoder), `copy` (outputs to
numpy) and `answer` (each request's share of the arrays: its rows, the best candidate, the crop).

Orders: `steady` (one batch size again and again) and `alternating` (a batch, then a decode of one,
as under load: the batch size changes on every run). Decoder sessions:
  default   ONNX Runtime's CUDA options (cudnn_conv_algo_search EXHAUSTIVE), as on the H200 run
  product   `contract.CUDA_PROVIDER_OPTIONS` (HEURISTIC), what the server and local engine now use
  per_size  product options, a session per batch size with that size fixed: no conv sees a new shape
With cuDNN 9, ONNX Runtime's Conv and ConvTranspose rebuild their cuDNN plan whenever their input
shape differs from the last run's; `alternating` minus `steady` is that cost. `encode_ms`: one
image's encode with the default and the product options (the encoder's convs get plans of either
search too). On the CPU the variants are alike (CUDA options do nothing there).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from triton_sam import contract
from triton_sam.engines.providers import CUDA, device_of
from triton_sam.registry import get_model
from triton_sam.repository import locate
from triton_sam.server.models.triton_sam_arrays import best_candidate, crop_box
from triton_sam.server.models.triton_sam_features import BufferFeatureStore

from .fixtures import BENCH_SHAPE, bench_image

SIZES = (1, 3, 15)  # the batch sizes Triton's dynamic batcher formed on the H200 (1, 4 and 16 clients)
WANTED = [contract.MULTI_MASKS, contract.MULTI_SCORES, contract.OBJECT_SCORE]
STAGES = ("bind", "run", "copy", "answer")
VARIANTS = {"default": {}, "product": contract.CUDA_PROVIDER_OPTIONS, "per_size": contract.CUDA_PROVIDER_OPTIONS}


def session(path, provider: str, cuda_options: dict, fixed: dict | None = None) -> ort.InferenceSession:
    """A session as the session model makes one (`ort_session`), with `cuda_options` on a GPU and
    the `fixed` dimensions (name -> size) fixed."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    providers: list = ["CPUExecutionProvider"]
    if provider == CUDA:
        providers.insert(0, (CUDA, {"device_id": 0, **cuda_options}))
    else:
        options.enable_cpu_mem_arena = options.enable_mem_pattern = False
    for name, size in (fixed or {}).items():
        options.add_free_dimension_override_by_name(name, size)
    return ort.InferenceSession(str(path), options, providers=providers)


def feature_store(spec, repository: Path, provider: str, encoder) -> tuple:
    """The session model's store of features on `provider`'s device (its gather graph), holding the
    bench image's features and its mirror's: (store, [slot of each])."""
    names = [output.name for output in encoder.get_outputs() if output.name in spec.feature_shapes]
    gather = session(repository / spec.session_name / "1" / contract.GATHER_FILE, provider, {})
    shapes = [list(spec.feature_shapes[name]) for name in names]
    store = BufferFeatureStore(4, names, shapes, device_of(provider) or "cpu", gather)
    image = bench_image(BENCH_SHAPE)
    for handle, picture in (("a", image), ("b", np.ascontiguousarray(image[:, ::-1]))):
        store.encode([handle], {contract.ENCODER_INPUT: picture[None]}, encoder)
    return store, [store.get("a"), store.get("b")]


def prompts(batch: int, low_res: int = 256) -> dict:
    """One point per row, no mask input: a hover decode's prompts, `batch` of them."""
    coords = np.tile(np.array([[[400.0, 450.0]]], np.float32), (batch, 1, 1))
    return {
        contract.POINT_COORDS: coords,
        contract.POINT_LABELS: np.ones((batch, 1), np.int32),
        contract.MASK_INPUT: np.zeros((batch, 1, low_res, low_res), np.float32),
        contract.HAS_MASK_INPUT: np.zeros((batch, 1), np.float32),
    }


def timed_decode(store, decoder, rows: list, feeds: dict) -> dict:
    """One decode of `rows` as the session model runs it, each stage's milliseconds."""
    times, started = {}, time.perf_counter()
    binding = store.decoder_binding(decoder, WANTED, rows, feeds)
    times["bind"] = time.perf_counter()
    decoder.run_with_iobinding(binding, ort.RunOptions())
    times["run"] = time.perf_counter()
    masks, scores, _ = binding.copy_outputs_to_cpu()
    times["copy"] = time.perf_counter()
    for row in range(len(rows)):  # each request: its row, its best candidate, the crop it is sent
        best_mask, _ = best_candidate(masks[row : row + 1], scores[row : row + 1])
        y0, x0, y1, x1 = crop_box([best_mask], np.zeros(1, np.float32), contract.CROP_MARGIN)
        np.ascontiguousarray(best_mask[:, :, y0:y1, x0:x1])
    times["answer"] = time.perf_counter()
    previous, spent = started, {}
    for stage in STAGES:
        spent[stage], previous = (times[stage] - previous) * 1e3, times[stage]
    return spent


def medians(samples: list) -> dict:
    """Median milliseconds of each stage and of their total over `samples`."""
    result = {stage: round(float(np.median([s[stage] for s in samples])), 3) for stage in STAGES}
    result["total"] = round(float(np.median([sum(s.values()) for s in samples])), 3)
    return result


def probe_variant(store, slots: list, decoders, runs: int) -> dict:
    """`decoders(batch)` -> the session decoding that batch size: stage medians, steady (rows of one
    slot, and of two) and alternating with a decode of one."""
    steady: dict = {"one_slot": {}, "two_slots": {}}
    for batch in SIZES:
        for kind, rows in (("one_slot", [slots[0]] * batch), ("two_slots", [slots[i % 2] for i in range(batch)])):
            feeds = prompts(batch)
            timed_decode(store, decoders(batch), rows, feeds)  # warm-up: this shape's first run
            steady[kind][str(batch)] = medians([timed_decode(store, decoders(batch), rows, feeds) for _ in range(runs)])
    alternating = {}
    for batch in SIZES[1:]:
        samples: dict = {"batch": [], "single": []}
        for _ in range(runs):
            samples["batch"].append(timed_decode(store, decoders(batch), [slots[0]] * batch, prompts(batch)))
            samples["single"].append(timed_decode(store, decoders(1), [slots[0]], prompts(1)))
        alternating[str(batch)] = {name: medians(values) for name, values in samples.items()}
    return {"steady": steady, "alternating": alternating}


def main(model_id: str, repository: Path, provider: str, runs: int) -> dict:
    """The session batch part of `benchmarks.gpu_decoder_probe`'s JSON."""
    spec = get_model(model_id)
    files = locate(spec, repository)
    encoder = session(files.encoder, provider, contract.CUDA_PROVIDER_OPTIONS)
    store, slots = feature_store(spec, repository, provider, encoder)
    encodes = {name: encode_ms(files.encoder, provider, VARIANTS[name], runs) for name in ("default", "product")}
    decoders = {name: session(files.decoder, provider, VARIANTS[name]) for name in ("default", "product")}
    batch_dim = decoders["default"].get_inputs()[0].shape[0]  # its name in the exported decoder
    per_size = {batch: session(files.decoder, provider, VARIANTS["per_size"], {batch_dim: batch}) for batch in SIZES}
    picks = {"default": lambda _: decoders["default"], "product": lambda _: decoders["product"], "per_size": per_size.get}
    variants = {name: probe_variant(store, slots, pick, runs) for name, pick in picks.items()}
    return {
        "provider": provider,
        "buffers": store.device,
        "sizes": list(SIZES),
        "runs": runs,
        "encode_ms": encodes,
        "variants": variants,
    }


def encode_ms(path: Path, provider: str, cuda_options: dict, runs: int) -> float:
    """Median milliseconds of one bench image's encode (batch 1) by an encoder with `cuda_options`."""
    encoder = session(path, provider, cuda_options)
    feeds = {contract.ENCODER_INPUT: bench_image(BENCH_SHAPE)[None]}
    encoder.run(None, feeds)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        encoder.run(None, feeds)
        times.append((time.perf_counter() - started) * 1e3)
    return round(float(np.median(times)), 3)
