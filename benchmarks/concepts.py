"""`python -m benchmarks concepts`: SAM3's concept prompts, ours next to sam3's own `Sam3Processor`.

The same random-init weights on every side (`triton-sam export sam3_tracker --random-init`'s, and
sam3's image model built from the same seed by the export's builder). On each of a few images (the
bench image, shifted: no cache answers): `set_image`, a phrase (`set_text_prompt`) and the phrase
with one exemplar box (`add_geometric_prompt`), sam3's and our `ConceptProcessor`'s, locally (ONNX
Runtime) and through a local Triton server (its session model alone; it keeps the image's detector
maps). All at threshold 0, every query's instance made (random weights score every query alike).
Our processor keeps a phrase's text features; sam3 encodes the phrase at every call.

Through Triton, each concept request's bytes on the wire are counted both ways (`wire.CountingProxy`)
at threshold 0 (every query's mask crop sent) and above every score (boxes and scores alone), next
to the full-size masks it would otherwise answer. So that a speed figure never hides a wrong
answer, each side's last scores and boxes are compared with sam3's. One side at a time, sam3's
first: each holds SAM3 (gigabytes), the Triton server's in a process of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from triton_sam.registry import get_model

from . import summarize, timed, timed_call
from .fixtures import BENCH_SHAPE, bench_images, exported_repository, release_memory, unpinned
from .wire import CountingProxy, loopback_server

MODEL = "sam3_tracker"
PHRASE = "nucleus"
EXEMPLAR = (0.45, 0.4, 0.2, 0.25)  # cx, cy, w, h in [0, 1]: add_geometric_prompt's format
REFERENCE = "sam3"


def _sam3_steps(seed: int, device: str) -> dict[str, Callable]:
    """sam3's `Sam3Processor` on the export's weights: set_image(image) -> state, phrase(state),
    exemplar(state) -> state (its "scores" and "boxes" every query's)."""
    import torch
    from PIL import Image
    from sam3.model.sam3_image_processor import Sam3Processor

    from triton_sam.export.sam3_onnx import build_model

    torch.set_grad_enabled(False)
    model = build_model(get_model(MODEL), seed=seed).to(device)
    processor = Sam3Processor(model, device=device, confidence_threshold=0.0)

    def exemplar(state: dict) -> dict:
        state["geometric_prompt"] = model._get_dummy_prompt()  # this box alone
        return processor.add_geometric_prompt(list(EXEMPLAR), True, state)

    return {
        "set_image": lambda image: processor.set_image(Image.fromarray(image)),
        "phrase": lambda state: processor.set_text_prompt(PHRASE, state),
        "exemplar": exemplar,
    }


def _our_steps(processor) -> dict[str, Callable]:
    """Our `ConceptProcessor`'s same steps (threshold 0)."""
    processor.set_confidence_threshold(0.0)

    def exemplar(state: dict) -> dict:
        processor.reset_all_prompts(state)
        state["prompt"] = PHRASE  # the phrase given before, its detection not timed again
        return processor.add_geometric_prompt(EXEMPLAR, True, state)

    return {
        "set_image": processor.set_image,
        "phrase": lambda state: processor.set_text_prompt(PHRASE, state),
        "exemplar": exemplar,
    }


def _measure(steps: dict[str, Callable], images: list[np.ndarray], repeats: int) -> tuple[dict, dict]:
    """Each step's timings over `images` (the first a warm-up, untimed), and the last exemplar's
    scores and boxes (numpy)."""
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for index, image in enumerate(images):
        seconds, state = timed_call(steps["set_image"], image)
        timings = {"set_image": [seconds]}
        for name in ("phrase", "exemplar"):
            timings[name] = [timed(steps[name], state) for _ in range(repeats)]
        if index:
            for name, seconds in timings.items():
                samples[name].extend(seconds)
    last = {key: _numpy(state[key]) for key in ("scores", "boxes")}
    return {name: summarize(seconds) for name, seconds in samples.items()}, last


def _numpy(values) -> np.ndarray:
    """float32 numpy of sam3's tensors (wherever they are) or of our arrays."""
    return np.asarray(values.cpu() if hasattr(values, "cpu") else values, np.float32)


def _wire_bytes(processor, concepts_dir: Path, proxy: CountingProxy, image: np.ndarray) -> dict[str, int]:
    """Bytes both ways of one phrase request through `proxy`, on an image that `processor` encoded
    before: at threshold 0 (every query's mask crop sent) and at 1 (boxes and scores alone). The
    phrase is tokenized here (the export's merges file in `concepts_dir`)."""
    from triton_sam.concepts import ConceptProcessor

    figures = {}
    for name, threshold in (("every_mask", 0.0), ("no_mask", 1.0)):
        floor = {"confidence_threshold": threshold, "min_threshold": threshold}
        asking = ConceptProcessor(processor.engine, concepts_dir, cache=processor.cache, **floor)
        state = asking.set_image(image)
        up, down = proxy.counts()
        asking.set_text_prompt(PHRASE, state)
        after = proxy.counts()
        figures[f"{name}_up"], figures[f"{name}_down"] = after[0] - up, after[1] - down
        figures[f"{name}_masks"] = len(state["detections"].crops)
    queries = len(state["detections"].scores)
    figures["full_size_masks"] = queries * image.shape[0] * image.shape[1] * 4  # float32 logits, one per query
    figures["queries"] = queries
    return figures


def agreement(ours: dict, theirs: dict) -> dict:
    """Our last scores and boxes against sam3's (the same queries, in order)."""
    return {
        "max_score_difference": float(np.abs(ours["scores"] - theirs["scores"]).max()),
        "max_box_difference_px": float(np.abs(ours["boxes"] - theirs["boxes"]).max()),
    }


def measure_ours(repository: Path, images: list[np.ndarray], repeats: int, backends: tuple[str, ...]) -> tuple[dict, dict, dict]:
    """`_measure` of our processor on each backend, on the SAM3 model of `repository` (with its
    concept graphs), its last answers, and (through Triton) the wire's bytes of a request."""
    from triton_sam.concepts import ConceptProcessor
    from triton_sam.engines.local import LocalEngine
    from triton_sam.engines.triton import TritonConnection, TritonEngine
    from triton_sam.repository import locate

    exported = locate(get_model(MODEL), repository)
    figures, last, wire = {}, {}, {}
    if "local" in backends:
        engine = LocalEngine(exported, detector_maps=True)
        figures["local"], last["local"] = _measure(_our_steps(ConceptProcessor(engine, exported.concepts_dir)), images, repeats)
        engine.close()
    if "triton" in backends:
        with loopback_server(repository, MODEL, sessions_only=True) as server:
            proxy = CountingProxy(server.grpc_url)
            engine = TritonEngine(get_model(MODEL), TritonConnection(proxy.url))
            processor = ConceptProcessor(engine, exported.concepts_dir)
            figures["triton"], last["triton"] = _measure(_our_steps(processor), images, repeats)
            wire = _wire_bytes(processor, exported.concepts_dir, proxy, images[0])
            engine.close()
            proxy.close()
    return figures, last, wire


def run(
    model_id: str | None = None,
    seed: int = 0,
    workdir: Path = Path(".bench"),
    shape: tuple[int, int] = BENCH_SHAPE,
    images: int = 2,
    prompts: int = 2,
    backends: tuple[str, ...] = ("local", "triton"),
    device: str = "cpu",
) -> dict:
    """Medians of each step by side on `images` images (after a warm-up one), each prompt timed
    `prompts` times on each; ratios ours / sam3's, the wire's bytes and the agreement. The suite's
    `model_id` is unused (this is SAM3's)."""
    planes = list(bench_images(tuple(shape), images + 1))
    repository = exported_repository(MODEL, seed, workdir)
    release_memory()  # an export's tracing (~12 GB), before sam3 is built
    with unpinned():
        theirs, last = _measure(_sam3_steps(seed, device), planes, prompts)
    release_memory()  # sam3's model, before ours loads
    figures, ours, wire = measure_ours(repository, planes, prompts, tuple(backends))
    return {
        "benchmark": "concepts",
        "model": MODEL,
        "shape": list(shape),
        "repeats": {"images": images, "prompts": prompts},
        "device": device,
        "by_side": {REFERENCE: theirs, **figures},
        "ratio": {
            side: {step: round(f[step]["median_ms"] / theirs[step]["median_ms"], 3) for step in f} for side, f in figures.items()
        },
        "vs_sam3": {side: agreement(found, last) for side, found in ours.items()},
        "bytes_per_request": wire,
    }
