"""Run once a test session in a process of its own (the `sam3_reference` fixture; sam3's image model
takes gigabytes): build sam3's image model (with its tracker) from the parity seed's random weights
with the export's own builder (`export.sam3_onnx.build_model`, as `triton-sam export sam3_tracker
--random-init --seed SEED` builds the model whose graphs the tests read), and save into DIRECTORY
what sam3 computes with it:
- `reference.npz` (test_sam3_processor_parity): what `Sam3Processor` finds on two images for a
  phrase, a phrase + a positive box and a phrase + a negative box;
- `text.npz` (test_sam3_concepts_parity): its text encoder's features of PHRASES;
- `detector.npz` (test_sam3_concepts_parity): its detector's inputs and outputs for the same three
  cases on seeded random detector maps and text features.
- `tracker.npz` (test_parity): its interactive tracker's `SAM3InteractiveImagePredictor` outputs
  (`benchmarks.parity.official_outputs`) on TRACKER_IMAGES, by image, label and output index.
The export's graphs match these only if both built the same weights: the parity tests prove that too.

Usage: python tests/export/sam3_reference.py DIRECTORY SEED
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from benchmarks.fixtures import unpinned  # the checkout's: run_reference puts it on the path
from benchmarks.parity import official_outputs, parity_images
from triton_sam.concepts import Tokenizer
from triton_sam.export import sam3_concepts_onnx, sam3_detector_onnx, sam3_onnx
from triton_sam.registry import get_model

PHRASE = "mitotic cell"
POSITIVE = [0.30, 0.40, 0.20, 0.12]  # cx, cy, w, h in [0, 1], add_geometric_prompt's format
NEGATIVE = [0.70, 0.55, 0.15, 0.30]
CASES = ("phrase", "positive", "negative")
EXEMPLAR_LABELS = {"phrase": [], "positive": [True], "negative": [False]}
DETECTOR_IMAGE_HW = (300, 700)  # only the detector's post-processing reads it (boxes in pixels, masks resized)
MASKS_SAVED = 20  # the best-scoring queries' masks (the test's threshold keeps fewer)
TRACKER_IMAGES = ("gray_coins",)  # upscaled 3x to 1008 px: where SAM3 is most sensitive to its input
TRACKER_FILE = "tracker.npz"
PHRASES = ["nucleus", "mitotic cell", "a very long description of dividing nuclei next to debris and dust " * 2]


def images(seed: int) -> dict[str, np.ndarray]:
    """A grayscale 300 x 700 and an RGB 517 x 211 image: smooth random blobs over noise."""
    rng = np.random.default_rng(seed)

    def blobs(height: int, width: int) -> np.ndarray:
        y, x = np.mgrid[:height, :width]
        picture = rng.normal(60, 10, (height, width))
        for cy, cx, radius in zip(rng.uniform(0, height, 12), rng.uniform(0, width, 12), rng.uniform(10, 40, 12)):
            picture += 120 * np.exp(-((y - cy) ** 2 + (x - cx) ** 2) / radius**2)
        return np.clip(picture, 0, 255).astype(np.uint8)

    return {"gray": blobs(300, 700), "rgb": np.stack([blobs(517, 211) for _ in range(3)], axis=-1)}


def run_processor(model: torch.nn.Module, given: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per image and case: `Sam3Processor`'s scores and boxes of every query (threshold 0), and the
    masks of the best-scoring ones with their query indices."""
    from sam3.model.sam3_image_processor import Sam3Processor

    processor = Sam3Processor(model, device="cpu", confidence_threshold=0.0)
    saved = {}
    for name, image in given.items():
        start = time.perf_counter()
        state = processor.set_image(Image.fromarray(image).convert("RGB"))  # sam3 takes RGB (PIL) only
        print(f"{name}: set_image {time.perf_counter() - start:.0f} s")
        for case in CASES:
            if case == "phrase":
                state = processor.set_text_prompt(PHRASE, state)
            else:
                state["geometric_prompt"] = model._get_dummy_prompt()  # one box alone each time
                state = processor.add_geometric_prompt(POSITIVE if case == "positive" else NEGATIVE, case == "positive", state)
            scores = state["scores"].numpy()
            best = np.argsort(-scores)[:MASKS_SAVED]
            saved[f"{name}/{case}/scores"] = scores
            saved[f"{name}/{case}/boxes"] = state["boxes"].numpy()
            saved[f"{name}/{case}/best"] = best
            saved[f"{name}/{case}/masks"] = state["masks"][best, 0].numpy()
    return saved


def text_features(text_encoder: torch.nn.Module) -> dict[str, np.ndarray]:
    """sam3's padding mask and features (batch first) of each of PHRASES, by index, as
    `Sam3Processor.set_text_prompt` runs its text encoder (tokenizer included)."""
    arrays = {}
    with torch.no_grad():
        for index, phrase in enumerate(PHRASES):
            mask, features, _ = text_encoder([phrase], device="cpu")  # sequence first, as sam3 keeps them
            arrays[f"mask{index}"], arrays[f"features{index}"] = mask.numpy(), features.transpose(0, 1).numpy()
    return arrays


def detector_inputs(seed: int) -> dict[str, np.ndarray]:
    """Detector maps (random, seeded: they stand for a backbone's) and a phrase's padding with
    random features (the text encoder has its own parity test)."""
    generator = torch.Generator().manual_seed(seed)
    maps = [torch.randn(1, 256, side, side, generator=generator) for side in sam3_detector_onnx.DETECTOR_SIZES]
    tokens = Tokenizer(sam3_concepts_onnx.vocab_file())(PHRASE)
    text = torch.randn(1, tokens.shape[1], 256, generator=generator)
    named = {f"map{i}": m.numpy() for i, m in enumerate(maps)}
    return {**named, "text": text.numpy(), "text_mask": tokens == 0}


def run_detector(model: torch.nn.Module, given: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """sam3's detector outputs, as `Sam3Processor` computes them from `given` maps and text: the
    phrase alone (what `set_text_prompt` runs after the text encoder), then with a positive box
    added, then with a negative box alone; each case's inputs and raw outputs (before the
    threshold, recorded from `forward_grounding`)."""
    from sam3.model.sam3_image_processor import Sam3Processor

    processor = Sam3Processor(model, device="cpu", confidence_threshold=0.0)
    maps = [torch.from_numpy(given[f"map{i}"]) for i in range(3)]
    text, text_mask = torch.from_numpy(given["text"]), torch.from_numpy(given["text_mask"])
    state = {"original_height": DETECTOR_IMAGE_HW[0], "original_width": DETECTOR_IMAGE_HW[1]}
    state["backbone_out"] = sam3_detector_onnx.backbone_out(model, maps, text, text_mask)
    saved = {}

    def record(case: str, boxes: list, out: dict) -> None:
        saved[f"{case}/boxes_in"] = np.array(boxes, np.float32).reshape(1, -1, 4)
        saved[f"{case}/labels_in"] = np.array([[int(label) for label in EXEMPLAR_LABELS[case]]], np.int64).reshape(1, -1)
        raw = {"boxes": out["pred_boxes"], "logits": out["pred_logits"][..., 0], "masks": out["pred_masks"]}
        raw["presence"] = out["presence_logit_dec"]
        saved.update({f"{case}/{key}": value.numpy() for key, value in raw.items()})

    grounding = model.forward_grounding
    outputs = []
    model.forward_grounding = lambda *args, **kwargs: outputs.append(grounding(*args, **kwargs)) or outputs[-1]
    try:
        state["geometric_prompt"] = model._get_dummy_prompt()
        state = processor._forward_grounding(state)
        record("phrase", [], outputs[-1])
        state = processor.add_geometric_prompt(POSITIVE, True, state)
        record("positive", [POSITIVE], outputs[-1])
        state["geometric_prompt"] = model._get_dummy_prompt()
        state = processor.add_geometric_prompt(NEGATIVE, False, state)
        record("negative", [NEGATIVE], outputs[-1])
    finally:
        del model.forward_grounding
    return saved


def tracker_outputs(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """`official_outputs` of the model's interactive tracker on each of TRACKER_IMAGES, flat."""
    from sam3.model.sam1_task_predictor import SAM3InteractiveImagePredictor

    predictor = SAM3InteractiveImagePredictor(sam3_onnx.tracker_of(model))
    with torch.no_grad():
        found = {name: official_outputs(predictor, parity_images()[name]) for name in TRACKER_IMAGES}
    return {
        f"{name}/{label}/{index}": np.asarray(array)
        for name, outputs in found.items()
        for label, output in outputs.items()
        for index, array in enumerate(output)
    }


def main(directory: Path, seed: int) -> None:
    start = time.perf_counter()
    model = sam3_onnx.build_model(get_model("sam3_tracker"), seed=seed)
    print(f"build: {time.perf_counter() - start:.0f} s")
    given = images(seed)
    with unpinned(), torch.inference_mode():
        saved = run_processor(model, given)
    np.savez(directory / "reference.npz", **given, **saved)
    start = time.perf_counter()
    np.savez(directory / "text.npz", **text_features(model.backbone.language_backbone))
    given = detector_inputs(seed)
    with unpinned(), torch.inference_mode():
        saved = run_detector(model, given)
    np.savez(directory / "detector.npz", **given, **saved)
    print(f"text and detector references: {time.perf_counter() - start:.0f} s")
    start = time.perf_counter()
    np.savez(directory / TRACKER_FILE, **tracker_outputs(model))
    print(f"tracker references: {time.perf_counter() - start:.0f} s")
    print(f"peak memory: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GB")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
