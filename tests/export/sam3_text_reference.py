"""Run as a script by test_sam3_concepts_parity: export sam3's text encoder with seeded random
weights and write sam3's own features for the given phrases to an .npz file.

In a process of its own, as `cli_export` runs the other exports: sam3's encoder, its tracing and
the export took ~6.7 GB that the test process kept for the rest of the run.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch

from triton_sam.export.sam3_concepts_onnx import build_text_encoder, export_text_encoder


def write_reference(seed: int, directory: Path, reference: Path, phrases: list[str]) -> None:
    """The export into `directory`; sam3's mask and features (batch first) of each phrase, by index,
    into `reference`."""
    official = build_text_encoder(seed)
    start = time.perf_counter()
    written = export_text_encoder(official, directory)
    sizes = ", ".join(f"{path.name} {path.stat().st_size / 2**20:.0f} MiB" for path in written)
    print(f"text encoder export: {time.perf_counter() - start:.1f} s ({sizes})")
    arrays = {}
    with torch.no_grad():
        for index, phrase in enumerate(phrases):
            mask, features, _ = official([phrase], device="cpu")  # sequence first, as sam3 keeps them
            arrays[f"mask{index}"], arrays[f"features{index}"] = mask.numpy(), features.transpose(0, 1).numpy()
    np.savez(reference, **arrays)


if __name__ == "__main__":
    write_reference(int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:])
