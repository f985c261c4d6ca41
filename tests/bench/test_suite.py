"""`python -m benchmarks all` on its smoke settings: every benchmark runs and the report is written."""

from __future__ import annotations

import json

import pytest

from conftest import PARITY_SEED, require_server_env

pytest.importorskip("matplotlib")
pytest.importorskip("napari")


def test_every_benchmark_runs_and_the_report_shows_its_figures(sam2_tiny_repository, tmp_path):
    from benchmarks import microsam, report, suite
    from benchmarks.report.tables import ms

    require_server_env()
    workdir = tmp_path / "bench"
    workdir.mkdir()
    (workdir / "model_repository").symlink_to(sam2_tiny_repository, target_is_directory=True)
    microsam.exported("vit_t_lm", PARITY_SEED, workdir)  # as the model above: exported before, not timed with its benchmark
    output = tmp_path / "results.json"

    results = suite.run_all(output, "smoke", seed=PARITY_SEED, workdir=workdir, progress=lambda message: None)

    r = results["results"]
    assert json.loads(output.read_text()) == results
    assert set(r) == set(suite.PROFILES["smoke"])
    assert r["predictor"]["ours_decode"]["n"] == 2 and r["predictor"]["ref_decode"]["n"] == 2
    assert r["click"]["local"]["committed"] == 2 and r["click"]["local"]["min_iou_to_reference"] > 0.9
    for backend in ("local", "triton"):
        assert r["hover"][backend]["ours"]["stale_delivered"] == 0
        assert r["hover"][backend]["ours"]["delivered"] >= 1
        ideal = r["hover"][backend]["ideal"]  # one decode per rest of the trace, each shown
        assert ideal["delivered"] == ideal["requests_sent"] >= 1 and ideal["latency_ms"]["p50"] > 0
        assert r["gui"][backend]["hover"]["previews_on_screen"] >= 1, r["gui"]
    assert r["hover"]["triton"]["ours"]["server_executed"] >= 1
    inside = r["triton"]["server_decode_ms"]  # Triton's statistics: the hover decodes' time in the server, by stage
    assert 0 < inside["compute_infer"] <= inside["success"] and r["triton"]["server_encode_ms"]["success"] > 0
    large = r["large"]["multiscale_local"]  # a tiled plane: the tiles in view encoded, then previews
    assert 0 < large["start"]["first_preview_s"] and 0 < large["start"]["view_encoded_s"] and large["tiles"]["encoded"] >= 1
    assert large["hover"]["previews_on_screen"] >= 1 and large["memory"]["client_peak_mib"] > 0
    assert 0 < large["hover"]["max_stall_besides_drawing_ms"] <= large["hover"]["max_stall_ms"]
    assert 0 < large["hover"]["max_stall_besides_drawing_and_cpu_wait_ms"] <= large["hover"]["max_stall_besides_drawing_ms"]
    zoomed_out = large["zoom_out"]  # the whole plane in view: coarse tiles, a preview of one
    assert zoomed_out["tile_step"] > 1 and zoomed_out["first_preview_s"] > 0 and zoomed_out["view_encoded_s"] > 0
    volume = r["volume"]  # all propagated the 2 planes and agree
    assert volume["official"]["planes_per_s"] > 0
    assert volume["local"]["planes_per_s"] > 0 and volume["local"]["min_iou_vs_official"] >= 0.99
    automatic = r["automatic"]  # every object in a small image, same masks as the official generator
    assert automatic["official"]["seconds_median"] > 0 and automatic["local"]["same_count"]
    assert automatic["local"]["min_iou_vs_official"] >= 0.99
    for mode in ("dynamic_batching", "no_batching"):
        assert [row["annotators"] for row in r["annotators"][mode]] == [1, 2]
        assert all(row["errors"] == 0 and row["decodes_per_s"] > 0 for row in r["annotators"][mode])
    vit_t = r["microsam"]["by_model"]["vit_t_lm"]["512x512"]  # micro-sam's own functions and ours, same masks
    assert vit_t["encode"]["micro_sam"]["n"] == vit_t["encode"]["local"]["n"] == 1 and vit_t["encode"]["ratio"]["local"] > 0
    assert vit_t["predict"]["iou_vs_micro_sam"]["local"] >= 0.99 and 0 < vit_t["predict"]["micro_sam_mask_fraction"] < 1
    client = r["memory"]["client"]["rows"]
    assert [row["cached"] for row in client] == [1, 3] and client[1]["cache_mib"] > client[0]["cache_mib"]
    assert r["memory"]["server"]["rows"][0]["rss_mib"] > 0 and r["memory"]["soak"]["samples"]

    written = report.write(results, tmp_path / "plots", tmp_path / "BENCHMARKS.md")
    for png in (p for p in written if p.suffix == ".png"):
        assert png.read_bytes()[:4] == b"\x89PNG"
    markdown = (tmp_path / "BENCHMARKS.md").read_text()
    for title in (
        "Click to committed mask",
        "In napari",
        "A 20000 x 20000 plane in napari",
        "Propagating through a stack",
        "Segment all (automatic mask generation)",
        "micro-sam models side by side",
        "Many annotators",
        "Memory",
    ):
        assert f"## {title}" in markdown
    assert f"{r['click']['local']['ratio_to_reference']:.2f}" in markdown
    assert "(plots/annotators.png)" in markdown
    assert f"A hover decode inside the server (Triton's statistics, mean): {ms(inside['success'])} ms" in markdown


def test_the_smoke_profile_s_shared_servers_are_handed_out_only_for_their_settings(tmp_path, monkeypatch):
    from benchmarks import wire
    from triton_sam.server.local import LocalTritonServer

    require_server_env()

    def stand_in(pid: int, **settings) -> LocalTritonServer:  # as if running: neither started nor stopped here
        server = LocalTritonServer(tmp_path, models=("sam2.1_hiera_tiny",), **wire.loopback_ports(), **settings)
        server._process = type("Process", (), {"pid": pid})()
        return server

    running = stand_in(4321)
    monkeypatch.setenv(*wire.shared_servers("sam2.1_hiera_tiny", running).popitem())
    with wire.loopback_server(tmp_path, "sam2.1_hiera_tiny") as shared:
        assert (shared.grpc_url, shared.pid) == (running.grpc_url, 4321)
    batching = running.session_batching  # the default's: off
    assert wire.loopback_server(tmp_path, "sam2.1_hiera_tiny", session_batching=batching).pid == 4321
    assert wire.loopback_server(tmp_path, "sam2.1_hiera_tiny", session_batching=not batching).pid is None  # its own
    assert wire.loopback_server(tmp_path / "other", "sam2.1_hiera_tiny").pid is None
    assert wire.loopback_server(tmp_path, "mobile_sam").pid is None

    other = stand_in(4322, session_batching=not batching)  # and a second one, batching the other way
    monkeypatch.setenv(*wire.shared_servers("sam2.1_hiera_tiny", running, other).popitem())
    assert wire.loopback_server(tmp_path, "sam2.1_hiera_tiny").pid == 4321
    assert wire.loopback_server(tmp_path, "sam2.1_hiera_tiny", session_batching=batching).pid == 4321
    assert wire.loopback_server(tmp_path, "sam2.1_hiera_tiny", session_batching=not batching).pid == 4322
    assert wire.loopback_server(tmp_path, "sam2.1_hiera_tiny", session_batching=not batching, log_verbose=1).pid is None
