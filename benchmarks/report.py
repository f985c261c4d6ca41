"""`python -m benchmarks report`: plots (PNG) and BENCHMARKS.md from the JSON of `python -m benchmarks all`.

Every figure in the Markdown comes from the results file; goals are those of the project's
issues, and each row says whether the run met them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import plots

REPRODUCE = (
    "python -m benchmarks all && python -m benchmarks all --only memory --soak-minutes 10 "
    "--output bench-results/soak.json && python -m benchmarks report bench-results/results.json bench-results/soak.json "
    "--gpu docs/benchmarks/gpu-h100"
)


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def _verdict(value: float | None, goal: float, higher_is_better: bool = False) -> str:
    if value is None:
        return "not measured"
    met = value >= goal if higher_is_better else value <= goal
    return "met" if met else "**missed**"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def _describe(m: dict) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    gpu = f"{m['cuda_devices']} CUDA device(s)" if m["cuda_devices"] else "no GPU"
    return f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {gpu}; Python {m['python']}; {versions}"


def _machine(results: dict) -> str:
    """The machine, or each machine with the benchmarks run on it where merged runs had several."""
    benchmarks_on: dict[str, list[str]] = {}
    for name in results["results"]:
        benchmarks_on.setdefault(_describe(results.get("machines", {}).get(name, results["machine"])), []).append(name)
    if len(benchmarks_on) == 1:
        return f"{next(iter(benchmarks_on))}."
    return "; ".join(f"{', '.join(names)}: {machine}" for machine, names in benchmarks_on.items()) + "."


def _predictor(r: dict) -> str:
    decode = r["decode_ratio"]
    rows = [
        [
            "encode (`set_image`)",
            _ms(r["ref_encode"]["median_ms"]),
            _ms(r["ours_encode"]["median_ms"]),
            f"{r['encode_ratio']:.2f}",
            "<= 0.7",
            _verdict(r["encode_ratio"], 0.7),
        ],
        [
            "decode (`predict`)",
            _ms(r["ref_decode"]["median_ms"]),
            _ms(r["ours_decode"]["median_ms"]),
            f"{decode:.2f}",
            "<= 0.5 (#16); <= 0.3 (first wave)",
            f"{_verdict(decode, 0.5)}; {_verdict(decode, 0.3)}",
        ],
    ]
    return _table(["median ms", "official PyTorch", "ours (local ORT)", "ratio", "goal", ""], rows)


def _gpu_predictor(runs: dict[str, dict]) -> str:
    rows = []
    for r in runs.values():
        model = f"{r['model']} ({r['encoder_precision']} encoder)"
        for step, goal, reference in (("encode", "<= bf16", "ref_bf16"), ("decode", "<= 0.5x fp32", "ref")):
            ratio = r[f"ours_{step}"]["median_ms"] / r[f"{reference}_{step}"]["median_ms"]
            verdict = _verdict(ratio, 1.0 if step == "encode" else 0.5)
            rows.append(
                [
                    model,
                    "`set_image`" if step == "encode" else "`predict`",
                    _ms(r[f"ref_{step}"]["median_ms"]),
                    _ms(r[f"ref_bf16_{step}"]["median_ms"]),
                    _ms(r[f"ours_{step}"]["median_ms"]),
                    f"{ratio:.2f}",
                    goal,
                    verdict,
                ]
            )
    return _table(["model", "call", "official fp32", "official bf16", "ours", "ours / goal's reference", "goal", ""], rows)


def _gpu_parity(runs: dict[str, dict]) -> str:
    rows = []
    for r in runs.values():
        images = {k: v for k, v in r.items() if isinstance(v, dict)}
        for candidate, label in (
            ("ours", f"ours, {r['encoder_precision']} encoder"),
            ("official_bf16", "official, bf16 autocast"),
        ):
            if candidate == "official_bf16" and r["encoder_precision"] != "fp32":
                continue  # the same official run as next to the fp32 export
            worst = min(images.values(), key=lambda v: v[candidate]["min_iou"])[candidate]
            rows.append(
                [
                    r["model"],
                    label,
                    f"{worst['min_iou']:.4f}",
                    f"{min(v[candidate]['median_iou'] for v in images.values()):.4f}",
                    f"{max(v[candidate]['max_score_diff'] for v in images.values()):.1e}",
                    str(sum(v[candidate]["masks"] for v in images.values())),
                ]
            )
    return _table(["model", "masks from", "min IoU", "lowest median IoU", "max score diff", "masks"], rows)


def gpu_section(directory: Path) -> str:
    """The GPU section from a directory of `benchmarks/bench-gpu.sh` results and its machine.json."""
    about = json.loads((directory / "machine.json").read_text())
    load = {p.stem: json.loads(p.read_text()) for p in sorted(directory.glob("*.json")) if p.name != "machine.json"}
    predictor = {k: v for k, v in load.items() if k.startswith("predictor-")}
    parity = {k: v for k, v in load.items() if k.startswith("parity-")}
    text = [
        f"## GPU\n\nMeasured on: {about['machine']}. Command: `{about['command']}`; 977x1531 RGB, one point, multimask; "
        "the official predictor runs on the same GPU, calls alternate.\n",
        "### Local engine vs the official predictor\n\n" + _gpu_predictor(predictor),
        "### Agreement with the official float32 predictor on the GPU (parity images and prompts)\n\n" + _gpu_parity(parity),
    ]
    hover = load.get("hover-local", {}).get("local")
    if hover:
        ours, single, trace = hover["ours"]["latency_ms"], hover["single_decode"], load["hover-local"]
        text.append(
            "### Hover, local engine on the GPU\n\n"
            f"One preview decode (mask at full size) {single['median_ms']:.1f} ms median; our session on the "
            f"{trace['duration_s']:.0f} s, {trace['rate_hz']:.0f} Hz trace: event to mask "
            f"p50 {ours['p50']:.1f} / p95 {ours['p95']:.1f} ms, {hover['ours']['stale_delivered']} stale.\n"
        )
    probe = load.get("decoder-probe")
    if probe:
        text.append(_decoder_probe(probe))
    suite = load.get("suite-triton-results", {}).get("results", {})  # `bench all` through Triton on the GPU
    for name, (title, section) in SECTIONS.items():
        if name in suite:
            text.append(f"### On the GPU: {title}\n\n{section(suite[name])}")
    text.append("### Not measured\n\n" + "\n".join(f"- {line}" for line in about["not_measured"]) + "\n")
    return "\n".join(text)


PROBED = {
    "predict": "`Predictor.predict` as it is",
    "decode": "its decoder run alone (dynamic shapes)",
    "resize": "its mask resize alone (three masks)",
    "static": "the decoder with batch and point count fixed",
    "graph": "that, replayed as a CUDA graph",
}


def _decoder_probe(probe: dict) -> str:
    """`python -m benchmarks.gpu_decoder_probe`: where a one-point predict's time goes, and shorter decoder paths."""
    rows = [
        [PROBED.get(name, name), _ms(median), _ms(probe["p95_ms"][name]), _diff(probe["max_abs_logit_diff_vs_decode"].get(name))]
        for name, median in probe["median_ms"].items()
    ]
    rows += [[PROBED.get(name, name), "could not run", why, ""] for name, why in probe["not_run"].items()]
    header = ["one point, multimask", "median ms", "p95 ms", "max logit diff vs the decoder"]
    return (
        f"### Where `predict`'s time goes ({probe['model']}, {probe['provider']}; `python -m benchmarks.gpu_decoder_probe`)\n\n"
        + _table(header, rows)
    )


def _diff(value: float | None) -> str:
    return "" if value is None else f"{value:.1e}"


def _triton(r: dict) -> str:
    b = r["bytes_per_call"]
    rows = [
        [
            "encode",
            _ms(r["local_encode"]["median_ms"]),
            _ms(r["triton_encode"]["median_ms"]),
            f"{b['encode_up']:,} B up, {b['encode_down']:,} B down",
        ],
        [
            "hover decode (one point, one mask)",
            _ms(r["local_decode"]["median_ms"]),
            _ms(r["triton_decode"]["median_ms"]),
            f"{b['decode_up']:,} B up, {b['decode_down']:,} B down",
        ],
    ]
    if "triton_refine" in r:  # runs before 2026-11-25 did not time refinements
        rows.append(
            [
                "refinement decode (two points and the previous mask, three masks)",
                _ms(r["local_refine"]["median_ms"]),
                _ms(r["triton_refine"]["median_ms"]),
                f"{b['refine_up']:,} B up, {b['refine_down']:,} B down",
            ]
        )
    text = _table(["median ms", "local engine", "through Triton (loopback)", "bytes per call"], rows)
    throughput = [
        [mode.replace("throughput_", "").replace("_", " ")] + [f"{row['decodes_per_s']:.1f}" for row in r[mode]]
        for mode in ("throughput_dynamic_batching", "throughput_no_batching")
    ]
    clients = [f"{row['clients']} clients, decodes/s" for row in r["throughput_dynamic_batching"]]
    text += "\nBack-to-back decodes (each client waits for its answer, then asks again):\n\n" + _table(
        ["session model", *clients], throughput
    )
    tiles = r.get("tile_encodes")  # runs before 2026-11-26 did not encode tiles together
    if tiles:
        batched, alone = tiles["batched"], tiles["one_by_one"]
        text += (
            f"\nA large plane's tiles ({tiles['batched']['tiles']} new ones of the model's input size, as `TiledPredictor` "
            f"sends them): {batched['encode_batch']} to a request, encoded together by the session model, "
            f"{_ms(batched['per_tile_ms'])} ms a tile; one by one (the server without batching), "
            f"{_ms(alone['per_tile_ms'])} ms a tile ({tiles['ratio']:.2f}x).\n"
        )
    lock = r.get("lock_held")
    if lock:
        text += (
            f"\nAn encode request of a {lock['plane'][0]}x{lock['plane'][1]} grey plane "
            f"({lock['plane'][0] * lock['plane'][1] / 2**20:.0f} MiB) going out on a worker "
            "thread: the longest another thread ticking every 1 ms waited (Python's lock held by the copies), median of "
            f"{lock['ours']['n']} alternating calls: ours {_ms(lock['ours']['median_ms'])} ms, tritonclient's `infer` "
            f"{_ms(lock['tritonclient']['median_ms'])} ms ({lock['ratio']:.2f}x). A GUI thread waits as long.\n"
        )
    return text


def _click(r: dict) -> str:
    rows = [
        [
            "official `SAM2ImagePredictor.predict`",
            _ms(r["reference_ms"]["median_ms"]),
            _ms(r["reference_ms"]["p95_ms"]),
            "1.00",
            "–",
        ]
    ]
    for backend in ("local", "triton"):
        if backend in r:
            b = r[backend]
            rows.append(
                [
                    f"ours, {backend}: click + commit",
                    _ms(b["click_to_commit_ms"]["median_ms"]),
                    _ms(b["click_to_commit_ms"]["p95_ms"]),
                    f"{b['ratio_to_reference']:.2f}",
                    f"{b['min_iou_to_reference']:.4f}" if b["min_iou_to_reference"] is not None else "–",
                ]
            )
    return _table(["click to full-size mask", "median ms", "p95 ms", "ratio", "min IoU vs official"], rows)


def _hover(r: dict) -> str:
    rows = []
    for backend in ("local", "triton"):
        if backend not in r:
            continue
        b, ours, naive = r[backend], r[backend]["ours"], r[backend]["naive"]
        server = "server_executed" in ours  # the 5x goal is for the server's work
        executed = "server_executed" if server else "requests_sent"
        verdict = _verdict(b["executed_ratio_naive_over_ours"], 5, True) if server else "no goal: local"
        rows.append(
            [
                backend,
                _ms(b["single_decode"]["median_ms"]),
                f"{_ms(ours['latency_ms']['p50'])} / {_ms(ours['latency_ms']['p95'])}",
                f"{_ms(b['p95_goal_ms'])} ({_verdict(ours['latency_ms']['p95'], b['p95_goal_ms'])})",
                _ideal_ms(b),
                f"{_ms(naive['latency_ms']['p50'])} / {_ms(naive['latency_ms']['p95'])}",
                f"{ours['stale_delivered']} / {naive['stale_delivered']}",
                f"{ours[executed]} / {naive[executed]} ({b['executed_ratio_naive_over_ours']:.1f}x; {verdict})",
            ]
        )
    header = [
        "engine",
        "single decode ms (median, each after a 0.4 s rest)",
        "ours p50 / p95 ms",
        "p95 goal ms",
        "ideal client p50 / p95 ms (one decode per rest)",
        "naive p50 / p95 ms",
        "stale shown ours / naive",
        "decodes started ours / naive (goal: 5x fewer on the server)",
    ]
    return _table(header, rows)


def _ideal_ms(backend: dict) -> str:
    """The ideal client's latency (runs from before it existed have none)."""
    if "ideal" not in backend:
        return "-"
    latency = backend["ideal"]["latency_ms"]
    return f"{_ms(latency['p50'])} / {_ms(latency['p95'])}"


def _decode_ms(scheduler: dict) -> str:
    """The decodes' own time (runs from before it was recorded have none)."""
    if "run_ms" not in scheduler:
        return "-"
    return f"{_ms(scheduler['run_ms']['p50'])} / {_ms(scheduler['run_ms']['p95'])}"


def _gui(r: dict) -> str:
    if "skipped" in r or "failed" in r:
        return f"Not measured: {r.get('skipped') or r.get('stderr_tail')}\n"
    goals = {"local": 60.0, "triton": 80.0}
    rows = []
    for backend in ("local", "triton"):
        if backend in r:
            h = r[backend]["hover"]
            e2e = h["event_to_screen_ms"]
            rows.append(
                [
                    backend,
                    f"{_ms(e2e['median_ms'])} / {_ms(e2e['p95_ms'])} / {_ms(e2e['p99_ms'])}",
                    f"{goals[backend]:.0f} ({_verdict(e2e['p95_ms'], goals[backend])})",
                    _decode_ms(h["scheduler"]),
                    str(e2e["n"]),
                    _ms(h["max_stall_ms"]),
                    _ms(h.get("max_stall_besides_drawing_ms")),
                    _ms(h.get("max_stall_besides_drawing_and_cpu_wait_ms")),
                    _ms(r[backend]["encode"]["max_stall_ms"]),
                    f"{r[backend]['start']['seconds']:.2f}",
                ]
            )
    text = (
        "Real Qt mouse moves along a scripted 120 Hz path, timed to the first frame on screen that shows their "
        'preview. A stall is the longest the GUI thread answered no timer; "less window drawing" subtracts the time '
        'from a repaint\'s start to its frame on screen (software OpenGL here); "waiting for a CPU" further '
        "subtracts the time outside drawing that the GUI thread was ready to run while other processes had the "
        "cores (the kernel's run-queue wait; through Triton, mostly the server on the same 2 cores).\n\n"
    )
    return text + _table(
        [
            "engine",
            "move to pixels p50 / p95 / p99 ms",
            "p95 goal ms",
            "decode p50 / p95 ms (of those previews)",
            "previews",
            "max stall hovering ms",
            "the same less window drawing ms",
            "less drawing and waiting for a CPU ms",
            "max stall encoding ms",
            "Start s",
        ],
        rows,
    )


def _large(r: dict) -> str:
    if "skipped" in r or "failed" in r:
        return f"Not measured: {r.get('skipped') or r.get('stderr_tail')}\n"
    rows = []
    for name, run in r.items():
        if not isinstance(run, dict) or "start" not in run:
            continue
        start, hover, pan, memory = run["start"], run["hover"], run["pan"], run["memory"]
        e2e = hover["event_to_screen_ms"]
        server = f" + {memory['server_peak_mib']:.0f}" if "server_peak_mib" in memory else ""
        rows.append(
            [
                name.replace("_", ", "),
                f"{start['first_preview_s']:.1f}",
                f"{start['view_encoded_s']:.1f} ({start['tiles_in_view']} tiles)",
                f"{pan['view_encoded_s']:.1f}",
                f"{_ms(e2e['median_ms'])} / {_ms(e2e['p95_ms'])}",
                _stalls("max_stall_ms", start, hover, pan),
                _stalls("max_stall_besides_drawing_ms", start, hover, pan),
                _stalls("max_stall_besides_drawing_and_cpu_wait_ms", start, hover, pan),
                _ms(max(phase.get("max_frame_ms", 0.0) for phase in (start, hover, pan)) or None),
                _ms(hover["p99_gap_ms"]),
                f"{memory['client_peak_mib']:.0f}{server}",
                f"{run['tiles']['encode_s']:.2f}",
                f"{run['reference_encode_all_s'] / 60:.0f} ({run['tiles']['plane']} tiles)",
            ]
        )
    table = _table(
        [
            "plane, engine",
            "Start to first preview s",
            "view encoded s",
            "pan: new view encoded s",
            "move to pixels p50 / p95 ms",
            "max stall start / hover / pan ms (goal 50)",
            "the same less window drawing ms",
            "less drawing and waiting for a CPU ms",
            "longest frame ms",
            "hover: p99 gap ms",
            "memory peak MiB (client + server)",
            "tile encode s",
            "reference: every tile first, min",
        ],
        rows,
    )
    text = (
        f"A {r['plane_shape'][0]}x{r['plane_shape'][1]} {r['dtype']} plane of synthetic cells, viewed at native "
        "resolution (napari window 1600x1000): tiles of the model's input, encoded where the view is. The reference "
        "is encoding every tile before the first prompt (as tools that tile do), estimated as the tile count times "
        "the tile encode time above. Start's stall includes napari creating the plugin's first layers, as on "
        'small planes. A stall is the longest the GUI thread answered no timer; "less window drawing" subtracts '
        "the time inside it from a repaint's start to its frame on screen (the canvas, or any widget: Qt then "
        "composes the whole window with OpenGL), which this machine's software renderer (llvmpipe) makes long; "
        '"waiting for a CPU" further subtracts the time outside drawing that the GUI thread was ready to run but '
        "other processes had the cores (the kernel's run-queue wait: through Triton, mostly the server on the same "
        "2 cores instead of a GPU machine of its own): the rest is the plugin's and napari's own work. "
        "Memory is the resident peak of the run's process (each plane and engine runs in a process of its own: "
        "napari, the plane and the plugin) and of the server.\n\n" + table
    )
    zoomed = [(name, run["zoom_out"]) for name, run in r.items() if isinstance(run, dict) and "zoom_out" in run]
    if zoomed:
        rows = [
            [
                name.replace("_", ", "),
                f"{z['tile_step']} ({z['tiles_in_view']} tiles)",
                f"{z['first_preview_s']:.1f}",
                f"{z['view_encoded_s']:.1f}",
                _ms(z["max_stall_ms"]),
                _ms(z.get("max_stall_besides_drawing_ms")),
                _ms(z.get("max_stall_besides_drawing_and_cpu_wait_ms")),
            ]
            for name, z in zoomed
        ]
        headers = [
            "plane, engine",
            "tile step (tiles in view)",
            "to a coarse preview s",
            "view encoded s",
            "max stall ms",
            "less window drawing ms",
            "less drawing and waiting for a CPU ms",
        ]
        text += (
            "\nThen zoomed out to the whole plane (napari's reset view), the cursor resting at its centre: the tiles "
            "follow the zoom (a step-s tile covers s x 1024 plane pixels, read from the pyramid level of factor s or "
            "finer, or, for the numpy plane, from full resolution: a window over 4096 px a side reduced to block means "
            "while it is read), so the view takes a few tiles. A 4096-px tile's request to Triton is 16 MiB, copied once "
            "on the client: as tritonclient's `infer` sends it (three copies while Python's lock is held) the GUI thread "
            "waited up to ~300 ms for it on these 2 cores.\n\n" + _table(headers, rows)
        )
    return text


def _stalls(key: str, *phases: dict) -> str:
    """`key` of each phase, in ms, joined by slashes ("–" where a run did not measure it)."""
    return " / ".join(_ms(phase.get(key)) for phase in phases)


def _volume(r: dict) -> str:
    rows = [[f"official `SAM2VideoPredictor` ({r['reference_device']})", *_volume_cells(r["official"]), "1.00", "–"]]
    for backend, label in (("local", "ours, `VolumePredictor`, local engine"), ("triton", "ours, through Triton (loopback)")):
        if backend in r:
            b = r[backend]
            rows.append([label, *_volume_cells(b), f"{b['speedup']:.2f}", f"{b['min_iou_vs_official']:.4f}"])
    return (
        f"One object clicked on the first of {r['planes']} planes of {r['plane_shape'][0]} x {r['plane_shape'][1]} px "
        f"(uint16, objects that move and change size) and tracked to the last; no plane encoded before a run; "
        f"median of {r['repeats']} alternating runs, each on a new stack"
        + ("" if r.get("holes_filled", True) else "; small holes not filled by either (no sam2 CUDA extension here)")
        + ".\n\n"
        + _table(["", "planes/s", "run s", "median ms a plane", "speed vs official", "lowest IoU vs official"], rows)
    )


def _volume_cells(b: dict) -> list[str]:
    return [f"{b['planes_per_s']:.2f}", f"{b['run_s_median']:.1f}", _ms(b["plane_ms_p50"])]


def _automatic(r: dict) -> str:
    official = r["official"]
    name = f"official `SAM2AutomaticMaskGenerator` ({r['reference_device']})"
    rows = [[name, f"{official['seconds_median']:.1f}", "1.00", str(official["masks"]), "–"]]
    for backend, label in (("local", "ours, local engine"), ("triton", "ours, through Triton (loopback)")):
        if backend in r:
            b = r[backend]
            count = f"{b['masks']}" + ("" if b["same_count"] else " (differs)")
            rows.append([label, f"{b['seconds_median']:.1f}", f"{b['speedup']:.2f}", count, f"{b['min_iou_vs_official']:.4f}"])
    p = r["parameters"]
    sizes = ", ".join(f"{n} x {size}" for size, n in r.get("server_batch_sizes", {}).items()) or "–"
    return (
        f"Every object in a {r['image_shape'][0]} x {r['image_shape'][1]} px RGB image: {p['points_per_side']}^2 points, "
        f"{r['decoder_calls']} decoder calls of {r['prompt_sets_per_call']} points (through Triton each call goes as "
        f"requests of the server's batch size, sent together; executions by batch size on the server: {sizes}); "
        f"thresholds that keep most of random weights' masks (predicted IoU > {p['pred_iou_thresh']}, mask logit "
        f"> {p['mask_threshold']}), so both sides upsample and score nearly every mask; median of {r['repeats']} "
        "alternating runs, each encoding the image anew.\n\n"
        + _table(["", "seconds", "speed vs official", "masks", "lowest IoU vs official"], rows)
    )


def _annotators(r: dict) -> str:
    rows = []
    for mode in ("dynamic_batching", "no_batching"):
        for row in r.get(mode, []):
            rows.append(
                [
                    mode.replace("_", " "),
                    str(row["annotators"]),
                    f"{row['decodes_per_s']:.1f}",
                    _ms(row["latency_ms"]["p95"]),
                    str(row["errors"]),
                ]
            )
    table = _table(["server", "annotators", "decodes/s", "p95 ms", "errors"], rows)
    by_mode = {mode: {row["annotators"]: row for row in r.get(mode, [])} for mode in ("dynamic_batching", "no_batching")}
    if 16 in by_mode["dynamic_batching"] and 16 in by_mode["no_batching"] and 1 in by_mode["dynamic_batching"]:
        batched, plain, single = by_mode["dynamic_batching"][16], by_mode["no_batching"][16], by_mode["dynamic_batching"][1]
        gain = batched["decodes_per_s"] / max(plain["decodes_per_s"], 1e-9)
        p95_ratio = (batched["latency_ms"]["p95"] or 0) / max(single["latency_ms"]["p95"] or 1e-9, 1e-9)
        table += (
            f"\nGoal at 16 annotators: batching >= 2x the throughput without it ({gain:.2f}x: {_verdict(gain, 2.0, True)}) "
            f"with p95 <= 2x the single annotator's ({p95_ratio:.2f}x: {_verdict(p95_ratio, 2.0)}).\n"
        )
    return table


def _memory(r: dict) -> str:
    client = r["client"]
    rows = [
        [
            f"client, {row['images']} images",
            f"{row['cached']} cached, {row['cache_mib']:.0f} MiB (bound {client['cache_bound_mib']:.0f})",
            f"{row['rss_mib']:.0f}",
        ]
        for row in client["rows"]
    ]
    server = r["server"]
    rows += [
        [
            f"server, {row['images']} images",
            f"keeps {min(row['images'], server['session_cache_size'])} (cache_size {server['session_cache_size']})",
            f"{row['rss_mib']:.0f}",
        ]
        for row in server["rows"]
    ]
    text = _table(["process", "embeddings", "resident MiB"], rows)
    soak = r.get("soak")
    if soak:
        text += (
            f"\nSoak: {soak['seconds'] / 60:.1f} min of hovering through Triton "
            f"({soak['hover_events']} moves, {soak['previews']} previews): "
            f"client {soak['client_rss_mib']['first']:.0f} -> {soak['client_rss_mib']['last']:.0f} MiB, server "
            f"{soak['server_rss_mib']['first']:.0f} -> {soak['server_rss_mib']['last']:.0f} MiB; growth over the second half "
            f"{soak['client_growth_mib_per_min_second_half'] or 0:.2f} / "
            f"{soak['server_growth_mib_per_min_second_half'] or 0:.2f} MiB/min (client / server).\n"
        )
    return text


SECTIONS = {  # benchmark -> (title, its Markdown)
    "predictor": ("Local engine vs the official predictor", _predictor),
    "triton": ("Triton next to the local engine", _triton),
    "click": ("Click to committed mask", _click),
    "hover": ("Hover scheduling (Qt-free session vs a naive client)", _hover),
    "gui": ("In napari: mouse move to preview on screen", _gui),
    "large": ("A 20000 x 20000 plane in napari", _large),
    "volume": ("Propagating through a stack", _volume),
    "automatic": ("Segment all (automatic mask generation)", _automatic),
    "annotators": ("Many annotators on one Triton server", _annotators),
    "memory": ("Memory", _memory),
}


def merge(runs: list[dict]) -> dict:
    """One results dict from several `bench all` runs: a later run's benchmarks replace earlier ones,
    each keeping the machine it ran on (`machines`)."""
    merged = {**runs[0], "results": {}, "seconds": {}, "machines": {}}
    for run in runs:
        merged["results"].update(run["results"])
        merged["seconds"].update(run["seconds"])
        merged["machines"].update({name: run.get("machines", {}).get(name, run["machine"]) for name in run["results"]})
    return merged


def write(results: dict, plot_dir: Path, markdown: Path, gpu: Path | None = None, made_with: str | None = None) -> list[Path]:
    """Write the plots into `plot_dir` and the tables into `markdown` (with the GPU results in `gpu`,
    see `gpu_section`; `made_with`: the report command, said on the page); returns what was written."""
    r = results["results"]
    plot_dir.mkdir(parents=True, exist_ok=True)
    written = []
    link = Path(os.path.relpath(plot_dir, markdown.parent)).as_posix()
    if "annotators" in r:
        written.append(plots.annotators(r["annotators"], plot_dir / "annotators.png"))
    if "hover" in r:
        written.append(plots.hover(r["hover"], r.get("gui", {}), plot_dir / "hover.png"))
    if r.get("memory", {}).get("soak"):
        written.append(plots.soak(r["memory"]["soak"], plot_dir / "soak.png"))
    text = [
        "# Benchmarks\n",
        f"Measured on: {_machine(results)}\n",
        f"Model {results['model']} with random-init weights (same compute as the released weights). "
        f"Profile `{results['profile']}`; seconds per benchmark: "
        + ", ".join(f"{k} {v:.0f}" for k, v in results["seconds"].items())
        + f". Reproduce: `{REPRODUCE}`.\n",
    ]
    if made_with:
        text.append(f"This page is generated from the results files by `{made_with}`; edit that, not this.\n")
    for name, (title, section) in SECTIONS.items():
        if name in r:
            text.append(f"## {title}\n\n{section(r[name])}")
    if gpu is not None:
        text.append(gpu_section(Path(gpu)))
    text.append("## Plots\n\n" + "\n".join(f"![{p.stem}]({link}/{p.name})" for p in written) + "\n")
    markdown.write_text("\n".join(text))
    return [*written, markdown]
