"""The report's sections, one a benchmark (`SECTIONS`, in the page's order): each renders a
benchmark's results as Markdown, its goals' verdicts included. Those run in napari are in `in_napari`,
micro-sam's models and its instance segmentation in `microsam`, SAM3's concept prompts in `concepts`,
several servers in `servers`.
"""

from __future__ import annotations

from .concepts import concepts
from .in_napari import gui, large, series_gui
from .microsam import instance, microsam
from .servers import servers
from .tables import markdown_table, ms, verdict


def _predictor(r: dict) -> str:
    decode = r["decode_ratio"]
    rows = [
        [
            "encode (`set_image`)",
            ms(r["ref_encode"]["median_ms"]),
            ms(r["ours_encode"]["median_ms"]),
            f"{r['encode_ratio']:.2f}",
            "<= 0.7",
            verdict(r["encode_ratio"], 0.7),
        ],
        [
            "decode (`predict`)",
            ms(r["ref_decode"]["median_ms"]),
            ms(r["ours_decode"]["median_ms"]),
            f"{decode:.2f}",
            "<= 0.5 (#16); <= 0.3 (first wave)",
            f"{verdict(decode, 0.5)}; {verdict(decode, 0.3)}",
        ],
    ]
    return markdown_table(["median ms", "official PyTorch", "ours (local ORT)", "ratio", "goal", ""], rows)


def _triton(r: dict) -> str:
    b = r["bytes_per_call"]
    rows = [
        [
            "encode",
            ms(r["local_encode"]["median_ms"]),
            ms(r["triton_encode"]["median_ms"]),
            f"{b['encode_up']:,} B up, {b['encode_down']:,} B down",
        ],
        [
            "hover decode (one point, one mask)",
            ms(r["local_decode"]["median_ms"]),
            ms(r["triton_decode"]["median_ms"]),
            f"{b['decode_up']:,} B up, {b['decode_down']:,} B down",
        ],
    ]
    if "triton_refine" in r:  # runs before 2026-11-25 did not time refinements
        rows.append(
            [
                "refinement decode (two points and the previous mask, three masks)",
                ms(r["local_refine"]["median_ms"]),
                ms(r["triton_refine"]["median_ms"]),
                f"{b['refine_up']:,} B up, {b['refine_down']:,} B down",
            ]
        )
    text = markdown_table(["median ms", "local engine", "through Triton (loopback)", "bytes per call"], rows)
    for call in ("encode", "decode"):  # runs before 2026-12-04 did not read the server's statistics
        inside = r.get(f"server_{call}_ms")
        if inside:
            stages = ", ".join(f"{stage.replace('_', ' ')} {ms(inside[stage])}" for stage in inside if stage != "success")
            text += (
                f"\nA{'n encode' if call == 'encode' else ' hover decode'} inside the server (Triton's statistics, mean): "
                f"{ms(inside['success'])} ms ({stages}); the rest of the round trip is the client, gRPC and the counting proxy.\n"
            )
    throughput = [
        [mode.replace("throughput_", "").replace("_", " ")] + [f"{row['decodes_per_s']:.1f}" for row in r[mode]]
        for mode in ("throughput_dynamic_batching", "throughput_no_batching")
    ]
    clients = [f"{row['clients']} clients, decodes/s" for row in r["throughput_dynamic_batching"]]
    text += "\nBack-to-back decodes (each client waits for its answer, then asks again):\n\n" + markdown_table(
        ["session model", *clients], throughput
    )
    tiles = r.get("tile_encodes")  # runs before 2026-11-26 did not encode tiles together
    if tiles:
        batched, alone = tiles["batched"], tiles["one_by_one"]
        text += (
            f"\nA large plane's tiles ({tiles['batched']['tiles']} new ones of the model's input size, as `TiledPredictor` "
            f"sends them): {batched['encode_batch']} to a request, encoded together by the session model, "
            f"{ms(batched['per_tile_ms'])} ms a tile; one by one (the server without batching), "
            f"{ms(alone['per_tile_ms'])} ms a tile ({tiles['ratio']:.2f}x).\n"
        )
    lock = r.get("lock_held")
    if lock:
        text += (
            f"\nAn encode request of a {lock['plane'][0]}x{lock['plane'][1]} grey plane "
            f"({lock['plane'][0] * lock['plane'][1] / 2**20:.0f} MiB) going out on a worker "
            "thread: the longest another thread ticking every 1 ms waited (Python's lock held by the copies), median of "
            f"{lock['ours']['n']} alternating calls: ours {ms(lock['ours']['median_ms'])} ms, tritonclient's `infer` "
            f"{ms(lock['tritonclient']['median_ms'])} ms ({lock['ratio']:.2f}x). A GUI thread waits as long.\n"
        )
    return text


def _click(r: dict) -> str:
    rows = [
        [
            "official `SAM2ImagePredictor.predict`",
            ms(r["reference_ms"]["median_ms"]),
            ms(r["reference_ms"]["p95_ms"]),
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
                    ms(b["click_to_commit_ms"]["median_ms"]),
                    ms(b["click_to_commit_ms"]["p95_ms"]),
                    f"{b['ratio_to_reference']:.2f}",
                    f"{b['min_iou_to_reference']:.4f}" if b["min_iou_to_reference"] is not None else "–",
                ]
            )
    return markdown_table(["click to full-size mask", "median ms", "p95 ms", "ratio", "min IoU vs official"], rows)


def _hover(r: dict) -> str:
    rows = []
    for backend in ("local", "triton"):
        if backend not in r:
            continue
        b, ours, naive = r[backend], r[backend]["ours"], r[backend]["naive"]
        server = "server_executed" in ours  # the 5x goal is for the server's work
        executed = "server_executed" if server else "requests_sent"
        outcome = verdict(b["executed_ratio_naive_over_ours"], 5, True) if server else "no goal: local"
        rows.append(
            [
                backend,
                ms(b["single_decode"]["median_ms"]),
                f"{ms(ours['latency_ms']['p50'])} / {ms(ours['latency_ms']['p95'])}",
                f"{ms(b['p95_goal_ms'])} ({verdict(ours['latency_ms']['p95'], b['p95_goal_ms'])})",
                _ideal_ms(b),
                f"{ms(naive['latency_ms']['p50'])} / {ms(naive['latency_ms']['p95'])}",
                f"{ours['stale_delivered']} / {naive['stale_delivered']}",
                f"{ours[executed]} / {naive[executed]} ({b['executed_ratio_naive_over_ours']:.1f}x; {outcome})",
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
    return markdown_table(header, rows)


def _ideal_ms(backend: dict) -> str:
    """The ideal client's latency (runs from before it existed have none)."""
    if "ideal" not in backend:
        return "-"
    latency = backend["ideal"]["latency_ms"]
    return f"{ms(latency['p50'])} / {ms(latency['p95'])}"


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
        + markdown_table(["", "planes/s", "run s", "median ms a plane", "speed vs official", "lowest IoU vs official"], rows)
    )


def _volume_cells(b: dict) -> list[str]:
    return [f"{b['planes_per_s']:.2f}", f"{b['run_s_median']:.1f}", ms(b["plane_ms_p50"])]


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
        + markdown_table(["", "seconds", "speed vs official", "masks", "lowest IoU vs official"], rows)
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
                    ms(row["latency_ms"]["p95"]),
                    str(row["errors"]),
                ]
            )
    table = markdown_table(["server", "annotators", "decodes/s", "p95 ms", "errors"], rows)
    goal = batching_goal(r)
    if goal is not None:
        gain, p95_ratio = goal
        table += (
            f"\nGoal at 16 annotators: batching >= 2x the throughput without it ({gain:.2f}x: {verdict(gain, 2.0, True)}) "
            f"with p95 <= 2x the single annotator's ({p95_ratio:.2f}x: {verdict(p95_ratio, 2.0)}).\n"
        )
    return table


def batching_goal(r: dict) -> tuple[float, float] | None:
    """The annotators benchmark at 16 annotators: decodes/s with dynamic batching over those without
    it, and its p95 over a single annotator's (None where not run)."""
    by_mode = {mode: {row["annotators"]: row for row in r.get(mode, [])} for mode in ("dynamic_batching", "no_batching")}
    if not (16 in by_mode["dynamic_batching"] and 16 in by_mode["no_batching"] and 1 in by_mode["dynamic_batching"]):
        return None
    batched, plain, single = by_mode["dynamic_batching"][16], by_mode["no_batching"][16], by_mode["dynamic_batching"][1]
    gain = batched["decodes_per_s"] / max(plain["decodes_per_s"], 1e-9)
    return gain, (batched["latency_ms"]["p95"] or 0) / max(single["latency_ms"]["p95"] or 1e-9, 1e-9)


def _local_memory(r: dict) -> str:
    """The local engine's resident memory after an encode, and Segment all's peak next to the official's."""
    text, client = "", r.get("client", {})
    if "engine_loaded_mib" in client and client["rows"]:
        after = client["rows"][0]["rss_mib"]
        text += (
            f"\nLocal engine ({r['model']}): {client['engine_loaded_mib']:.0f} MiB resident with its sessions loaded, "
            f"{after:.0f} MiB after the first encode (goal <= 1536: {verdict(after, 1536)}).\n"
        )
    runs = r.get("segment_all", {})
    ours, theirs = runs.get("local", {}).get("peak_mib"), runs.get("official", {}).get("peak_mib")
    if ours and theirs:
        height, width = runs["shape"]
        text += (
            f"\nSegment all on a {height} x {width} px image ({runs['points_per_side']}^2 points, batches of 64), "
            f"each in a process of its own: peak resident {ours:.0f} MiB ours (local engine), {theirs:.0f} MiB the "
            f"official `SAM2AutomaticMaskGenerator` (goal: ours <= theirs: {verdict(ours, theirs)}).\n"
        )
    return text


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
    text = markdown_table(["process", "embeddings", "resident MiB"], rows) + _local_memory(r)
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
    "gui": ("In napari: mouse move to preview on screen", gui),
    "series_gui": ("In napari: a series' commits saved on a 4096 x 4096 plane", series_gui),
    "large": ("A 20000 x 20000 plane in napari", large),
    "volume": ("Propagating through a stack", _volume),
    "automatic": ("Segment all (automatic mask generation)", _automatic),
    "microsam": ("micro-sam models side by side", microsam),
    "instance": ("Instance segmentation with micro-sam's decoder, side by side", instance),
    "concepts": ("Concept prompts (SAM3) next to sam3's Sam3Processor", concepts),
    "annotators": ("Many annotators on one Triton server", _annotators),
    "servers": ("Several servers", servers),
    "memory": ("Memory", _memory),
}
