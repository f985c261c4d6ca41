"""`python -m benchmarks report` on merged runs: a rerun's benchmarks replace the earlier ones and say where they ran."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import report
from benchmarks.report.tables import ms

COMMITTED = Path(__file__).parents[2] / "docs" / "benchmarks" / "cpu" / "results.json"


def _run(results: dict, names: tuple[str, ...], cpu: str) -> dict:
    """A `bench all` run of `names` (their figures from the committed results) on a machine with `cpu`."""
    return {
        "profile": results["profile"],
        "model": results["model"],
        "machine": {**results["machine"], "cpu": cpu},
        "results": {name: results["results"][name] for name in names},
        "seconds": {name: results["seconds"][name] for name in names},
    }


def test_a_rerun_on_another_machine_replaces_its_benchmarks_and_says_where_each_ran(tmp_path):
    committed = json.loads(COMMITTED.read_text())
    first = _run(committed, ("predictor", "click"), "First CPU")
    rerun = _run(committed, ("click",), "Second CPU")
    click = rerun["results"]["click"]
    rerun["results"]["click"] = {**click, "reference_ms": {**click["reference_ms"], "median_ms": 123456.0}}

    merged = report.merge([first, rerun])
    assert {name: m["cpu"] for name, m in merged["machines"].items()} == {"predictor": "First CPU", "click": "Second CPU"}
    report.write(merged, tmp_path / "plots", tmp_path / "BENCHMARKS.md")
    markdown = (tmp_path / "BENCHMARKS.md").read_text()
    assert "| official `SAM2ImagePredictor.predict` | 123456 |" in markdown
    measured_on = markdown.splitlines()[2]
    assert measured_on.startswith("Measured on: predictor: First CPU, 2 cores")
    assert "; click: Second CPU, 2 cores" in measured_on

    report.write(report.merge([merged]), tmp_path / "plots", tmp_path / "again.md")  # a merged file merges as it is
    assert (tmp_path / "again.md").read_text() == (tmp_path / "BENCHMARKS.md").read_text()

    alone = report.merge([first])
    report.write(alone, tmp_path / "plots", tmp_path / "alone.md")
    assert (tmp_path / "alone.md").read_text().splitlines()[2].startswith("Measured on: First CPU, 2 cores")


def test_the_gpu_section_shows_the_triton_benchmarks_run_there(tmp_path):
    """`benchmarks/bench-gpu.sh`'s Triton part (`all` into suite-triton-results.json) lands in the
    GPU section under the same tables as on the CPU, the tiles encoded together among them."""
    committed = json.loads(COMMITTED.read_text())
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    for source in (COMMITTED.parents[1] / "gpu-h200").glob("*.json"):
        if source.name != "suite-triton-results.json":
            (gpu / source.name).write_text(source.read_text())
    without = report.gpu_section(gpu)
    suite = _run(committed, ("triton", "annotators"), "GPU host CPU")
    batched, alone = {"encode_batch": 4, "tiles": 8, "per_tile_ms": 12.5}, {"encode_batch": 1, "tiles": 8, "per_tile_ms": 25.0}
    suite["results"]["triton"]["tile_encodes"] = {"batched": batched, "one_by_one": alone, "ratio": 0.5}
    (gpu / "suite-triton-results.json").write_text(json.dumps(suite))
    section = report.gpu_section(gpu)
    assert "On the GPU" not in without
    assert "### On the GPU: Triton next to the local engine" in section
    assert "### On the GPU: Many annotators on one Triton server" in section
    assert "4 to a request, encoded together by the session model, 12.5 ms a tile" in section and "(0.50x)" in section


def test_the_gpu_goals_are_judged_from_the_run_s_own_figures(tmp_path):
    """The goals table of the GPU section (#38) reads each goal's figure off the results next to it:
    a faster Triton hover decode or a batching gain turns its verdict, a missing benchmark drops its row."""
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    for source in (COMMITTED.parents[1] / "gpu-h200").glob("*.json"):
        (gpu / source.name).write_text(source.read_text())

    def goal(name: str) -> str:
        section = report.gpu_section(gpu)
        return next((line for line in section.splitlines() if line.startswith(f"| {name}")), "")

    hover = json.loads((gpu / "hover-triton.json").read_text())
    hover["triton"]["single_decode"]["median_ms"] = 9.0
    (gpu / "hover-triton.json").write_text(json.dumps(hover))
    assert goal("the same, with the mask resized").endswith("| 9.0 ms | **missed** |")
    hover["triton"]["single_decode"]["median_ms"] = 7.5
    (gpu / "hover-triton.json").write_text(json.dumps(hover))
    assert goal("the same, with the mask resized").endswith("| 7.5 ms | met |")

    suite = json.loads((gpu / "suite-triton-results.json").read_text())
    triton = suite["results"]["triton"]
    for figure, outcome in ((8.5, "**missed**"), (5.5, "met")):
        triton["triton_decode"]["median_ms"] = figure
        (gpu / "suite-triton-results.json").write_text(json.dumps(suite))
        assert goal("hover decode through Triton <= 8 ms median (loopback, the decode)").endswith(f"| {figure} ms | {outcome} |")
    triton["throughput_dynamic_batching"][-1]["decodes_per_s"] = 2.5 * triton["throughput_no_batching"][-1]["decodes_per_s"]
    (gpu / "suite-triton-results.json").write_text(json.dumps(suite))
    assert goal("dynamic batching >= 2x").endswith("| 2.50x | met |")
    rows = {row["annotators"]: row for row in suite["results"]["annotators"]["dynamic_batching"]}
    for ratio, outcome in ((2.5, "**missed**"), (1.5, "met")):
        rows[16]["latency_ms"]["p95"] = ratio * rows[1]["latency_ms"]["p95"]
        (gpu / "suite-triton-results.json").write_text(json.dumps(suite))
        assert goal("with it, p95 at 16 annotators").endswith(f"| {ratio:.2f}x | {outcome} |")
    (gpu / "suite-triton-results.json").unlink()
    assert goal("dynamic batching") == goal("with it") == "" and goal("`predict` <= 0.5x")


def test_the_gpu_section_shows_where_predict_s_time_goes_when_probed(tmp_path):
    """`benchmarks/gpu_decoder_probe.py`'s output (a CPU run here as stand-in) gets its own table; a
    variant that could not run says why."""
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    (gpu / "machine.json").write_text((COMMITTED.parents[1] / "gpu-h200" / "machine.json").read_text())
    probe = {
        "model": "sam2.1_hiera_tiny",
        "provider": "CUDAExecutionProvider",
        "points": 1,
        "median_ms": {"predict": 4.4, "decode": 3.1, "resize": 0.9, "static": 2.0},
        "p95_ms": {"predict": 4.6, "decode": 3.3, "resize": 1.0, "static": 2.2},
        "max_abs_logit_diff_vs_decode": {"predict": 0.0, "decode": 0.0, "static": 3.3e-07},
        "not_run": {"graph": "Fail: not all nodes on CUDA"},
    }
    assert "Where `predict`" not in report.gpu_section(gpu)
    (gpu / "decoder-probe.json").write_text(json.dumps(probe))
    section = report.gpu_section(gpu)
    assert "### Where `predict`'s time goes (sam2.1_hiera_tiny, CUDAExecutionProvider" in section
    assert "| the decoder with batch and point count fixed | 2.0 | 2.2 | 3.3e-07 |" in section
    assert "| that, replayed as a CUDA graph | could not run | Fail: not all nodes on CUDA |  |" in section


def test_the_gpu_section_shows_the_probed_session_batch_stage_by_stage(tmp_path):
    """The probe's "session_batch" part (issue #38): a row per decoder session, order and batch size,
    an alternating batch beside the run of 1 between, and the encoder with each option."""
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    (gpu / "machine.json").write_text((COMMITTED.parents[1] / "gpu-h200" / "machine.json").read_text())
    stages = {"bind": 0.2, "run": 70.0, "copy": 0.3, "answer": 0.4, "total": 70.9}
    single = {**stages, "total": 72.5}
    orders = {"steady": {"one_slot": {"3": stages}}, "alternating": {"15": {"batch": stages, "single": single}}}
    probe = {
        "model": "sam2.1_hiera_tiny",
        "provider": "CUDAExecutionProvider",
        "median_ms": {},
        "p95_ms": {},
        "max_abs_logit_diff_vs_decode": {},
        "not_run": {},
        "session_batch": {
            "provider": "CUDAExecutionProvider",
            "buffers": "cuda",
            "encode_ms": {"default": 8.6, "product": 8.4},
            "variants": {"default": orders, "per_size": orders},
        },
    }
    (gpu / "decoder-probe.json").write_text(json.dumps(probe))
    section = report.gpu_section(gpu)
    assert "#### The session model's batched decodes, median ms per stage (CUDAExecutionProvider, features in cuda" in section
    assert "| ONNX Runtime's CUDA options | steady, one slot | 3 | 0.2 | 70.0 | 0.3 | 0.4 | 70.9 |  |" in section
    assert "| a session per batch size | alternating with 1 | 15 | 0.2 | 70.0 | 0.3 | 0.4 | 70.9 | 72.5 |" in section
    assert "One image's encode: ONNX Runtime's CUDA options 8.6 ms, `contract.CUDA_PROVIDER_OPTIONS` 8.4 ms." in section


def test_the_micro_sam_section_shows_every_model_and_plane_with_ours_next_to_micro_sams(tmp_path):
    run = json.loads((COMMITTED.parent / "microsam.json").read_text())
    report.write(run, tmp_path / "plots", tmp_path / "BENCHMARKS.md")
    section = (tmp_path / "BENCHMARKS.md").read_text().split("## micro-sam models side by side")[1]

    figures = run["results"]["microsam"]
    for model, planes in figures["by_model"].items():
        for plane, measured in planes.items():
            rows = [line for line in section.splitlines() if line.startswith(f"| `{model}` | {plane} |")]
            assert len(rows) == 2, rows  # one in the encode table, one in the predict table
            encode, predict = (row.split(" | ") for row in rows)
            assert encode[4] == f"{measured['encode']['ratio']['local']:.2f}"
            assert predict[-1].rstrip(" |") == f"{measured['predict']['iou_vs_micro_sam']['triton']:.4f}"


def test_the_series_saves_section_comes_from_the_committed_series_gui_run(tmp_path):
    """`python -m benchmarks all --only series_gui` stored next to the full run: the report merges it
    in and renders its figures and the 50 ms goal's verdict under a heading of its own."""
    committed = json.loads(COMMITTED.read_text())
    series = json.loads((COMMITTED.parent / "series_gui.json").read_text())
    report.write(report.merge([committed, series]), tmp_path / "plots", tmp_path / "BENCHMARKS.md")
    page = (tmp_path / "BENCHMARKS.md").read_text()
    section = page.split("## In napari: a series' commits saved on a 4096 x 4096 plane\n\n")[1].split("\n## ")[0]

    s = series["results"]["series_gui"]
    assert section.startswith(f"A series' commits saved: {s['commits']} objects")
    verdict = "met" if s["max_stall_ms"] <= 50 else "**missed**"
    assert f"The GUI thread's longest stall meanwhile: {ms(s['max_stall_ms'])} ms (goal <= 50 ms: {verdict})" in section
    seconds = next(line for line in page.splitlines() if "seconds per benchmark" in line)
    assert f"series_gui {series['seconds']['series_gui']:.0f}" in seconds
