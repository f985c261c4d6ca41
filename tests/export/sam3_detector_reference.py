"""Run in a process of its own by test_sam3_concepts_parity.py (sam3 takes gigabytes): build sam3's
detector with the parity seed's weights, export it to `detector.onnx`, and save in `reference.npz`
the inputs of each case and what sam3 computes from them through `Sam3Processor`.

Usage: python tests/export/sam3_detector_reference.py DIRECTORY SEED
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from triton_sam.concepts import Tokenizer
from triton_sam.export import sam3_detector_onnx as detector_onnx
from triton_sam.export.sam3_concepts_onnx import vocab_file

IMAGE_HW = (300, 700)  # only the post-processing reads it (boxes in pixels, masks resized)
PHRASE = "mitotic cell"
POSITIVE = [0.30, 0.40, 0.20, 0.12]  # cx, cy, w, h in [0, 1], add_geometric_prompt's format
NEGATIVE = [0.70, 0.55, 0.15, 0.30]
CASES = {"phrase": [], "positive": [True], "negative": [False]}  # exemplar labels
THRESHOLD = 0.0  # random weights: every query; the test applies its own threshold


@contextmanager
def unpinned() -> Iterator[None]:
    """Let sam3's geometry encoder run without CUDA: it pins a 4-value tensor before moving it
    (`Tensor.pin_memory` needs a GPU; `Sam3Processor` fails on a CPU without this); a no-op here."""
    pin = torch.Tensor.pin_memory
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.Tensor.pin_memory = pin


def inputs(seed: int) -> dict[str, np.ndarray]:
    """Detector maps (random, seeded: they stand for a backbone's) and a phrase's padding with
    random features (the text encoder has its own parity test)."""
    generator = torch.Generator().manual_seed(seed)
    maps = [torch.randn(1, 256, side, side, generator=generator) for side in detector_onnx.DETECTOR_SIZES]
    tokens = Tokenizer(vocab_file())(PHRASE)
    text = torch.randn(1, tokens.shape[1], 256, generator=generator)
    named = {f"map{i}": m.numpy() for i, m in enumerate(maps)}
    return {**named, "text": text.numpy(), "text_mask": tokens == 0}


def run_processor(model, given: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """sam3's outputs, as `Sam3Processor` computes them: the phrase alone (what `set_text_prompt`
    runs after the text encoder), then with a positive box added, then with a negative box alone;
    each case's raw outputs (before the threshold, recorded from `forward_grounding`) and the
    processor's boxes and scores."""
    from sam3.model.sam3_image_processor import Sam3Processor

    processor = Sam3Processor(model, device="cpu", confidence_threshold=THRESHOLD)
    maps = [torch.from_numpy(given[f"map{i}"]) for i in range(3)]
    text, text_mask = torch.from_numpy(given["text"]), torch.from_numpy(given["text_mask"])
    state = {"original_height": IMAGE_HW[0], "original_width": IMAGE_HW[1]}
    state["backbone_out"] = detector_onnx.backbone_out(model, maps, text, text_mask)
    saved = {}

    def record(case: str, boxes: list, out: dict) -> None:
        saved[f"{case}/boxes_in"] = np.array(boxes, np.float32).reshape(1, -1, 4)
        saved[f"{case}/labels_in"] = np.array([[int(label) for label in CASES[case]]], np.int64).reshape(1, -1)
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


def main(directory: Path, seed: int) -> None:
    model = detector_onnx.build_detector(seed)
    start = time.perf_counter()
    path = detector_onnx.export_detector(model, directory)
    print(f"detector export: {time.perf_counter() - start:.1f} s, {path.stat().st_size / 2**20:.0f} MiB")
    given = inputs(seed)
    with unpinned(), torch.inference_mode():
        saved = run_processor(model, given)
    np.savez(directory / "reference.npz", **given, **saved)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
