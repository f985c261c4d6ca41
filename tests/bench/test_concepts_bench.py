"""`python -m benchmarks concepts`: our side of it on the synthetic concept graphs (locally and
through a real Triton server behind the counting proxy), and the report's section from the
committed run against sam3's `Sam3Processor` (docs/benchmarks/cpu/concepts.json)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks import concepts, report
from conftest import require_server_env
from synthetic_concepts import BRIGHT, MEDIUM, blob_image

COMMITTED = Path(__file__).parents[2] / "docs" / "benchmarks" / "cpu" / "concepts.json"


def test_our_sides_time_each_step_count_the_wire_and_agree(concepts_repository):
    require_server_env()
    images = [np.roll(blob_image(240, {(0, 0): BRIGHT, (2, 3): MEDIUM}), 16 * i, axis=1) for i in range(3)]

    figures, last, wire = concepts.measure_ours(concepts_repository, images, repeats=2, backends=("local", "triton"))

    for side in ("local", "triton"):  # the first image is a warm-up
        assert [figures[side][step]["n"] for step in ("set_image", "phrase", "exemplar")] == [2, 4, 4]
        assert all(figures[side][step]["median_ms"] > 0 for step in figures[side])
    same = concepts.agreement(last["triton"], last["local"])
    assert same["max_score_difference"] < 1e-6 and same["max_box_difference_px"] < 1e-3
    assert len(last["local"]["scores"]) == wire["queries"] > 0  # threshold 0: every query
    assert wire["no_mask_masks"] == 0 < wire["every_mask_masks"] <= wire["queries"]
    assert 0 < wire["no_mask_down"] < wire["every_mask_down"] < wire["full_size_masks"]
    assert 0 < wire["no_mask_up"] < 2000 and 0 < wire["every_mask_up"] < 2000  # token ids and a floor, no image


def test_the_report_shows_the_committed_run_against_sam3(tmp_path):
    results = json.loads(COMMITTED.read_text())
    r = results["results"]["concepts"]
    assert set(r["by_side"]) == {"sam3", "local", "triton"}
    assert all(figures["n"] > 0 for side in r["by_side"].values() for figures in side.values())
    for side in ("local", "triton"):  # the same answers as sam3's before any speed figure counts
        assert r["vs_sam3"][side]["max_score_difference"] < 1e-3 and r["vs_sam3"][side]["max_box_difference_px"] < 1

    report.write(results, tmp_path / "plots", tmp_path / "BENCHMARKS.md")
    markdown = (tmp_path / "BENCHMARKS.md").read_text()
    section = markdown.split("## Concept prompts")[1].split("\n## ")[0]
    assert f"{r['ratio']['local']['phrase']:.2f}" in section and f"{r['bytes_per_request']['every_mask_down']:,}" in section
