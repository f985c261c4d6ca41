"""The report's sections of the benchmarks run in napari: mouse move to preview on screen, a
series' commits saved, and a large plane (Start, hover, pan, zoom out), with the GUI thread's
stalls told apart from drawing and from waiting for a CPU.
"""

from __future__ import annotations

from .tables import markdown_table, ms, verdict


def _decode_ms(scheduler: dict) -> str:
    """The decodes' own time (runs from before it was recorded have none)."""
    if "run_ms" not in scheduler:
        return "-"
    return f"{ms(scheduler['run_ms']['p50'])} / {ms(scheduler['run_ms']['p95'])}"


def gui(r: dict) -> str:
    """The `gui` benchmark: real mouse moves to their preview on screen, and the GUI thread's stalls."""
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
                    f"{ms(e2e['median_ms'])} / {ms(e2e['p95_ms'])} / {ms(e2e['p99_ms'])}",
                    f"{goals[backend]:.0f} ({verdict(e2e['p95_ms'], goals[backend])})",
                    _decode_ms(h["scheduler"]),
                    str(e2e["n"]),
                    ms(h["max_stall_ms"]),
                    ms(h.get("max_stall_besides_drawing_ms")),
                    ms(h.get("max_stall_besides_drawing_and_cpu_wait_ms")),
                    ms(r[backend]["encode"]["max_stall_ms"]),
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
    long_session = _long_session(r["long_session"]) if "long_session" in r else ""
    table = markdown_table(
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
    return text + table + long_session


def _long_session(s: dict) -> str:
    """The long session: hover and commit at the first objects committed on a plane and the last (goal: within 1.2x)."""
    window = s["window"]

    def row(name: str, span: dict) -> list[str]:
        hover, commit = span["hover"], span["commit"]
        return [
            name,
            f"{ms(hover['p50_ms'])} / {ms(hover['p95_ms'])}",
            f"{ms(commit['median_ms'])} / {ms(commit['p95_ms'])}",
            ms(span["commit_gui_ms"]),
        ]

    hundreds = [row(f"{100 * i + 1}-{min(100 * (i + 1), s['objects'])}", span) for i, span in enumerate(s["per_hundred"])]
    ratio = s["ratio"]
    rows = [
        row(f"first {window}", s["first"]),
        *(hundreds if len(hundreds) > 1 else []),
        row(f"last {window}", s["last"]),
        [
            "last / first (goal <= 1.2)",
            f"p95 {ratio['hover_p95']:.2f} ({verdict(ratio['hover_p95'], 1.2)})",
            f"median {ratio['commit_median']:.2f} ({verdict(ratio['commit_median'], 1.2)})",
            f"{ratio['commit_gui_median']:.2f}",
        ],
    ]
    text = (
        f"\nA long session: {s['objects']} objects committed one after another on one {s['plane'][0]} x {s['plane'][1]} "
        "plane through the panel (local engine, the tests' synthetic model: a click on one of the plane's small blobs "
        "makes that blob the object), each with three mouse moves near its blob, a click on it and the commit key, "
        "as real Qt events. A hover is timed from the move to its preview written to the layer, a commit from the key "
        "to the object written to the objects layer; the GUI thread's work during a commit is its longest stall less "
        "window drawing."
        + (f" Measured on {s['machine']['cpu']}, {s['machine']['cores']} cores." if "machine" in s else "")
        + "\n\n"
    )
    return text + markdown_table(
        ["objects", "hover p50 / p95 ms", "commit median / p95 ms", "GUI thread in a commit (median) ms"], rows
    )


def series_gui(s: dict) -> str:
    """The `series_gui` benchmark: commits of a series' large plane saved while napari runs, the GUI
    thread's longest stall meanwhile (goal: 50 ms)."""
    if "skipped" in s or "failed" in s:
        return f"Not measured: {s.get('skipped') or s.get('stderr_tail')}\n"
    return (
        f"A series' commits saved: {s['commits']} objects (disks of 20 to 150 px radius) committed on a {s['side']} x "
        f"{s['side']} plane of a series (labels in {s['labels']}) and saved by the panel on its worker threads, each "
        "asked for once napari has drawn its commit: the commit at once, then the layer's change once it rests 300 ms "
        "(from the commit's save request to all saved: "
        f"median {ms(s['save_s']['median_ms'])} ms, p95 {ms(s['save_s']['p95_ms'])} ms). "
        f"The GUI thread's longest stall meanwhile: {ms(s['max_stall_ms'])} ms (goal <= 50 ms: "
        f"{verdict(s['max_stall_ms'], 50)}), median over the commits {ms(s['median_max_stall_ms'])} ms; less window "
        f"drawing {ms(s['max_stall_besides_drawing_ms'])} ms, and less waiting for a CPU "
        f"{ms(s['max_stall_besides_drawing_and_cpu_wait_ms'])} ms.\n"
    )


def large(r: dict) -> str:
    """The `large` benchmark: a large plane's Start, hover, pan and zoom out, against encoding every tile first."""
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
                f"{ms(e2e['median_ms'])} / {ms(e2e['p95_ms'])}",
                _stalls("max_stall_ms", start, hover, pan),
                _stalls("max_stall_besides_drawing_ms", start, hover, pan),
                _stalls("max_stall_besides_drawing_and_cpu_wait_ms", start, hover, pan),
                ms(max(phase.get("max_frame_ms", 0.0) for phase in (start, hover, pan)) or None),
                ms(hover["p99_gap_ms"]),
                f"{memory['client_peak_mib']:.0f}{server}",
                f"{run['tiles']['encode_s']:.2f}",
                f"{run['reference_encode_all_s'] / 60:.0f} ({run['tiles']['plane']} tiles)",
            ]
        )
    table = markdown_table(
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
                ms(z["max_stall_ms"]),
                ms(z.get("max_stall_besides_drawing_ms")),
                ms(z.get("max_stall_besides_drawing_and_cpu_wait_ms")),
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
            "waited up to ~300 ms for it on these 2 cores.\n\n" + markdown_table(headers, rows)
        )
    return text


def _stalls(key: str, *phases: dict) -> str:
    """`key` of each phase, in ms, joined by slashes ("–" where a run did not measure it)."""
    return " / ".join(ms(phase.get(key)) for phase in phases)
