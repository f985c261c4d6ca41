"""Run in a process of its own by test_sam3_processor_parity.py (sam3's image model takes gigabytes):
build sam3's image model (with its tracker) from the parity seed's random weights, export from it
the encoder (tracker features and detector maps), the tracker's decoder, the text encoder and the
detector into DIRECTORY, and save in `reference.npz` what `Sam3Processor` finds on two images for a
phrase, a phrase + a positive box and a phrase + a negative box.

Usage: python tests/export/sam3_processor_reference.py DIRECTORY SEED
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from sam3_detector_reference import unpinned

from triton_sam import contract
from triton_sam.export import sam3_concepts_onnx, sam3_detector_onnx, sam3_onnx
from triton_sam.export.quiet import SAM3_BUILD, ignoring
from triton_sam.registry import get_model

PHRASE = "mitotic cell"
POSITIVE = [0.30, 0.40, 0.20, 0.12]  # cx, cy, w, h in [0, 1], add_geometric_prompt's format
NEGATIVE = [0.70, 0.55, 0.15, 0.30]
CASES = ("phrase", "positive", "negative")
MASKS_SAVED = 20  # the best-scoring queries' masks (the test's threshold keeps fewer)


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


def build(seed: int) -> torch.nn.Module:
    """sam3's image model with its interactive tracker, random weights drawn from `seed`."""
    with ignoring(SAM3_BUILD):
        from sam3.model_builder import build_sam3_image_model

        torch.manual_seed(seed)
        with sam3_onnx.cpu_safe_build():
            model = build_sam3_image_model(
                bpe_path=str(sam3_concepts_onnx.vocab_file()),
                device="cpu",
                checkpoint_path=None,
                load_from_HF=False,
                enable_inst_interactivity=True,
            )
    sam3_concepts_onnx.fill_uninitialised(model.backbone.language_backbone)
    model.position_encoding = model.backbone.vision_backbone.position_encoding  # for the detector's export
    return model.eval()


def export(model: torch.nn.Module, directory: Path) -> None:
    """encoder.onnx and decoder.onnx (the tracker on the image model's backbone) and the concept graphs."""
    spec = get_model("sam3_tracker")
    tracker = model.inst_interactive_predictor.model
    tracker.backbone = model.backbone  # as Sam3Processor.set_image runs it: one backbone for both
    start = time.perf_counter()
    with torch.no_grad():
        sam3_onnx.export_encoder(tracker, spec, directory / "encoder.onnx", external_data=True)
        sam3_onnx.export_decoder(tracker, spec, directory / "decoder.onnx")
    concepts = directory / contract.CONCEPTS_DIR
    sam3_concepts_onnx.export_text_encoder(model.backbone.language_backbone, concepts)
    sam3_detector_onnx.export_detector(model, concepts)
    tracker.backbone = None
    print(f"exports: {time.perf_counter() - start:.0f} s")


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


def main(directory: Path, seed: int) -> None:
    model = build(seed)
    export(model, directory)
    given = images(seed)
    with unpinned(), torch.inference_mode():
        saved = run_processor(model, given)
    np.savez(directory / "reference.npz", **given, **saved)
    print(f"peak memory: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GB")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
