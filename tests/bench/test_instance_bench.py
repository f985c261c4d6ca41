"""`python -m benchmarks instance`: its measure against micro-sam's own segmenter, its label check,
and the report's section from the committed run (docs/benchmarks/cpu/instance.json)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import report
from benchmarks.instance import matched_ious, measure_instance, micro_sams_segmenter
from triton_sam.instance import InstanceSegmenter
from triton_sam.predictor import Predictor

COMMITTED = Path(__file__).parents[2] / "docs" / "benchmarks" / "cpu" / "instance.json"


def test_matched_ious_take_each_object_s_largest_overlap_background_included():
    ours = np.array([[1, 1, 2, 2], [1, 1, 2, 2], [3, 0, 0, 0]])
    theirs = np.array([[5, 5, 5, 0], [5, 5, 0, 0], [0, 0, 0, 7]])
    # 1: all four pixels in 5 (of five): 0.8; 2: three of four in the background: 0; 3: background only.
    assert matched_ious(ours, theirs).tolist() == [0.8, 0.0, 0.0]


def test_the_measure_times_both_segmenters_and_compares_their_labels(vit_b_lm_export):
    checkpoint, decoder, repository = vit_b_lm_export
    plane = np.random.default_rng(0).integers(0, 256, (128, 160), dtype=np.uint8)
    with Predictor("vit_b_lm", model_repository=repository) as predictor:
        segmenters = {"micro_sam": micro_sams_segmenter(checkpoint, decoder), "local": InstanceSegmenter(predictor)}
        figures = measure_instance(segmenters, plane, repeats=1)

    for side in ("micro_sam", "local"):
        assert figures[side]["n"] == 1
        assert figures[side]["median_ms"] == pytest.approx(
            figures[side]["initialize_median_ms"] + figures[side]["generate_median_ms"]
        )
    assert figures["ratio"]["local"] == pytest.approx(figures["local"]["median_ms"] / figures["micro_sam"]["median_ms"], 1e-3)
    check = figures["labels_vs_micro_sam"]["local"]  # random weights' flat maps: a seed or two may move (tests/instance)
    assert check["micro_sam_objects"] > 10 and abs(check["objects"] - check["micro_sam_objects"]) <= 0.02 * check["objects"]
    assert check["share_matched_iou_0.99"] >= 0.9


def test_the_section_shows_each_plane_s_sides_with_the_goal_s_verdict(tmp_path):
    run = json.loads(COMMITTED.read_text())
    report.write(run, tmp_path / "plots", tmp_path / "BENCHMARKS.md")
    section = (tmp_path / "BENCHMARKS.md").read_text().split("## Instance segmentation with micro-sam's decoder")[1]

    figures = run["results"]["instance"]
    for plane, measured in figures["by_model"]["vit_b_lm"].items():
        rows = [line.split(" | ") for line in section.splitlines() if line.startswith(f"| {plane} | ")]
        assert [row[1] for row in rows] == ["micro-sam", *(report.microsam.BACKENDS[b] for b in figures["backends"])]
        for row, backend in zip(rows[1:], figures["backends"], strict=True):
            ratio = measured["instance"]["ratio"][backend]
            assert row[5:7] == [f"{ratio:.2f}", "met" if ratio <= 0.5 else "**missed**"]
            check = measured["instance"]["labels_vs_micro_sam"][backend]
            assert row[7] == f"{check['objects']} / {check['micro_sam_objects']}"
    assert section.count("| `vit_b_lm` |") == 2 * len(figures["by_model"]["vit_b_lm"])  # the encode and predict tables
