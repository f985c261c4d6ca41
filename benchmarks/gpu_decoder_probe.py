"""Where a one-point `Predictor.predict` spends its time on a GPU, and what shorter decoder paths give.

Issue #16 wants `predict` at <= 0.5x the official fp32 predictor's time on a GPU; on an H100 it
was 0.95x (4.4 ms against 4.7). This times, alternating, on this machine's first provider:
  predict   Predictor.predict as it is (decoder, then the mask resize)
  decode    the engine's decode alone (dynamic shapes, features bound on the device)
  resize    the mask resize alone (three masks to the image's size)
  static    the decoder with its batch and point count fixed (ONNX Runtime folds the shape
            arithmetic: about half the nodes), same IO binding
  graph     static, replayed as a CUDA graph (ONNX Runtime `enable_cuda_graph`; inputs and outputs
            in fixed device buffers, prompts copied in): CUDA only
and how far each variant's low-res logits are from the engine's decode. Its "session_batch" part
(`session_batch_probe`): the session model's batched decodes, stage by stage (issue #38).

Usage: python -m benchmarks.gpu_decoder_probe [MODEL] [RUNS]   (exports random weights into .bench/
if needed, as the other benchmarks do; runs on the CPU too, without `graph`)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from triton_sam import Predictor, contract
from triton_sam.engines.local import prompt_feeds
from triton_sam.engines.providers import device_of
from triton_sam.prompts import model_request
from triton_sam.registry import get_model
from triton_sam.repository import locate

from . import session_batch_probe
from .fixtures import BENCH_SHAPE, bench_image, exported_repository

OUTPUTS = contract.decoder_output_names(True)  # masks, scores, object scores


def static_session(path: Path, providers: list, points: int) -> ort.InferenceSession:
    """The decoder with batch 1 and `points` prompt points fixed at load (its shape arithmetic folds)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_free_dimension_override_by_name("batch", 1)
    options.add_free_dimension_override_by_name("points", points)
    return ort.InferenceSession(str(path), options, providers=providers)


def main(model_id: str = "sam2.1_hiera_tiny", runs: int = 50) -> dict:
    spec = get_model(model_id)
    repository = exported_repository(model_id, 0, Path(".bench"))
    predictor = Predictor(model_id, model_repository=repository)
    engine = predictor.engine
    image = bench_image(BENCH_SHAPE)
    point = {"point_coords": np.array([[BENCH_SHAPE[1] * 0.4, BENCH_SHAPE[0] * 0.45]]), "point_labels": np.array([1])}
    predictor.set_image(image)
    features = predictor.get_image_embedding()
    request = model_request(spec, BENCH_SHAPE, **point)
    feeds = prompt_feeds(request, spec.low_res_size)
    points = feeds[contract.POINT_COORDS].shape[1]
    provider = engine.providers[0]
    device = device_of(provider) or "cpu"
    on_device = {name: ort.OrtValue.ortvalue_from_numpy(a, device, 0) for name, a in features.host_arrays().items()}
    decoder_path = locate(spec, repository).decoder
    reference = engine.decode(features, request).low_res_logits

    static = static_session(decoder_path, list(dict.fromkeys([provider, "CPUExecutionProvider"])), points)

    def static_decode():
        binding = static.io_binding()
        for name, value in on_device.items():
            binding.bind_ortvalue_input(name, value)
        for name, array in feeds.items():
            binding.bind_cpu_input(name, array)
        for name in OUTPUTS:
            binding.bind_output(name, "cpu")
        static.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()[0]

    variants = {
        "predict": lambda: predictor.predict(**point)[2],
        "decode": lambda: engine.decode(features, request).low_res_logits,
        "resize": lambda: engine.resizer.masks(reference, BENCH_SHAPE),
        "static": static_decode,
    }
    notes = {}
    if device == "cuda":
        try:
            variants["graph"] = graph_decode(decoder_path, on_device, feeds, spec.low_res_size)
        except Exception as error:  # what ONNX Runtime says is the finding
            notes["graph"] = f"{type(error).__name__}: {error}"
    for name, call in list(variants.items()):  # warm-up (and CUDA graph capture)
        try:
            call(), call()
        except Exception as error:
            notes[name] = f"{type(error).__name__}: {error}"
            del variants[name]
    times = {name: [] for name in variants}
    for _ in range(runs):
        for name, call in variants.items():
            started = time.perf_counter()
            call()
            times[name].append((time.perf_counter() - started) * 1e3)
    agreement = {
        name: float(np.max(np.abs(np.asarray(variants[name]()) - reference)))
        for name in ("predict", "decode", "static", "graph")
        if name in variants
    }
    return {
        "model": model_id,
        "provider": provider,
        "points": points,
        "median_ms": {name: round(float(np.median(t)), 3) for name, t in times.items()},
        "p95_ms": {name: round(float(np.percentile(t, 95)), 3) for name, t in times.items()},
        "max_abs_logit_diff_vs_decode": agreement,
        "not_run": notes,
        "session_batch": session_batch_probe.main(model_id, repository, provider, max(3, runs // 5)),
    }


def graph_decode(path: Path, on_device: dict, feeds: dict, low_res_size: int):
    """The static decoder replayed as a CUDA graph: every input and output in a fixed device
    buffer (the features' own; prompts copied into theirs), outputs copied out after each replay."""
    providers = [("CUDAExecutionProvider", {"enable_cuda_graph": "1"}), "CPUExecutionProvider"]
    session = static_session(path, providers, feeds[contract.POINT_COORDS].shape[1])
    prompts = {name: ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0) for name, array in feeds.items()}
    shapes = {OUTPUTS[0]: (1, 3, low_res_size, low_res_size), OUTPUTS[1]: (1, 3), OUTPUTS[2]: (1, 1)}
    outputs = {name: ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32, "cuda", 0) for name, shape in shapes.items()}
    binding = session.io_binding()
    for name, value in {**on_device, **prompts}.items():
        binding.bind_ortvalue_input(name, value)
    for name, value in outputs.items():
        binding.bind_ortvalue_output(name, value)

    def decode():
        for name, array in feeds.items():
            prompts[name].update_inplace(array)
        session.run_with_iobinding(binding)
        return outputs[OUTPUTS[0]].numpy()

    return decode


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:2], *map(int, sys.argv[2:3])), indent=1))
