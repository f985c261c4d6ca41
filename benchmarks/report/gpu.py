"""The report's GPU section, from a directory of `benchmarks/bench-gpu.sh` results: the local engine
against the official predictor, their agreement, hover, where `predict`'s time goes, and the
suite's benchmarks run through Triton there.
"""

from __future__ import annotations

import json
from pathlib import Path

from .sections import SECTIONS, batching_goal
from .tables import markdown_table, ms, verdict


def _gpu_predictor(runs: dict[str, dict]) -> str:
    rows = []
    for r in runs.values():
        model = _engine(r)
        for step, goal, reference in (("encode", "<= bf16", "ref_bf16"), ("decode", "<= 0.5x fp32", "ref")):
            ratio = r[f"ours_{step}"]["median_ms"] / r[f"{reference}_{step}"]["median_ms"]
            outcome = verdict(ratio, 1.0 if step == "encode" else 0.5)
            rows.append(
                [
                    model,
                    "`set_image`" if step == "encode" else "`predict`",
                    ms(r[f"ref_{step}"]["median_ms"]),
                    ms(r[f"ref_bf16_{step}"]["median_ms"]),
                    ms(r[f"ours_{step}"]["median_ms"]),
                    f"{ratio:.2f}",
                    goal,
                    outcome,
                ]
            )
    return markdown_table(
        ["model", "call", "official fp32", "official bf16", "ours", "ours / goal's reference", "goal", ""], rows
    )


def _engine(r: dict) -> str:
    """A predictor run's model, encoder precision and whether its decodes were CUDA graphs."""
    graphs = ", CUDA-graph decodes" if "CUDA-graph decodes" in r.get("engine", "") else ""
    return f"{r['model']} ({r['encoder_precision']} encoder{graphs})"


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
    return markdown_table(["model", "masks from", "min IoU", "lowest median IoU", "max score diff", "masks"], rows)


def gpu_section(directory: Path) -> str:
    """The GPU section from a directory of `benchmarks/bench-gpu.sh` results and its machine.json
    (the machine, the command, what the misses come from as far as the run shows, what was not measured)."""
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
    hovers = [
        _hover(load[name], backend)
        for name, backend in (("hover-local", "local"), ("hover-triton", "triton"), ("hover-triton-no-batching", "triton"))
        if name in load
    ]
    if hovers:
        text.append("### Hover on the GPU\n\n" + markdown_table(HOVER_HEADER, hovers))
    suite = load.get("suite-triton-results", {}).get("results", {})  # `bench all` through Triton on the GPU
    goals = _goals(predictor, parity, load.get("hover-triton", {}).get("triton"), suite.get("triton"), suite.get("annotators"))
    if goals:
        findings = "".join(f"- {line}\n" for line in about.get("findings", []))
        text.append(
            "### The GPU goals (#38)\n\n" + markdown_table(["goal", "measured", ""], goals) + (findings and f"\n{findings}")
        )
    probe = load.get("decoder-probe")
    if probe:
        text.append(_decoder_probe(probe))
    for name, (title, section) in SECTIONS.items():
        if name in suite:
            text.append(f"### On the GPU: {title}\n\n{section(suite[name])}")
    text.append("### Not measured\n\n" + "\n".join(f"- {line}" for line in about["not_measured"]) + "\n")
    return "\n".join(text)


HOVER_HEADER = ["engine", "one preview decode, median ms", "trace", "event to mask p50 / p95 ms", "decodes sent", "stale"]


def _hover(trace: dict, backend: str) -> list[str]:
    """`python -m benchmarks hover --backends BACKEND`: one preview decode (mask at full size, as
    shown) and our session on the mouse trace."""
    run = trace[backend]
    ours = run["ours"]
    batcher = {True: ", batcher on", False: ", no batcher"}.get(run.get("session_batching"), "")
    return [
        "local ONNX Runtime" if backend == "local" else f"Triton (loopback{batcher})",
        ms(run["single_decode"]["median_ms"]),
        f"{trace['duration_s']:.0f} s at {trace['rate_hz']:.0f} Hz, {trace['events']} events",
        f"{ms(ours['latency_ms']['p50'])} / {ms(ours['latency_ms']['p95'])}",
        str(ours["requests_sent"]),
        str(ours["stale_delivered"]),
    ]


def _goals(predictor: dict, parity: dict, hover: dict | None, triton: dict | None, annotators: dict | None) -> list[list[str]]:
    """Issue #38's goals, each with what this run measured: predict against the official fp32
    predictor, agreement, the hover decode through Triton, what dynamic batching gives a saturated
    server (annotators at their own pace ask the same with or without it) and its p95 at 16 annotators."""
    rows = [
        [
            f"`predict` <= 0.5x official fp32, {_engine(r)}",
            f"{r['decode_ratio']:.2f}x",
            verdict(r["decode_ratio"], 0.5),
        ]
        for r in predictor.values()
    ]
    if parity:
        worst = min(v["ours"]["min_iou"] for r in parity.values() for v in r.values() if isinstance(v, dict))
        rows.append(
            ["min IoU >= 0.995 vs official fp32 (every model, image and precision)", f"{worst:.4f}", verdict(worst, 0.995, True)]
        )
    if triton:  # the decode's round trip, through the benchmark's counting proxy
        alone = triton["triton_decode"]["median_ms"]
        rows.append(["hover decode through Triton <= 8 ms median (loopback, the decode)", f"{alone:.1f} ms", verdict(alone, 8.0)])
    if hover:
        single = hover["single_decode"]["median_ms"]
        rows.append(["the same, with the mask resized to full size on the client", f"{single:.1f} ms", verdict(single, 8.0)])
    if triton:  # back-to-back clients load the server to saturation; annotators (below) do not
        batched, plain = (
            max(runs, key=lambda r: r["clients"])
            for runs in (triton["throughput_dynamic_batching"], triton["throughput_no_batching"])
        )
        gain = batched["decodes_per_s"] / plain["decodes_per_s"]
        rows.append(
            [
                f"dynamic batching >= 2x the decodes/s without it ({batched['clients']} back-to-back clients)",
                f"{gain:.2f}x",
                verdict(gain, 2.0, True),
            ]
        )
    goal = batching_goal(annotators) if annotators else None
    if goal is not None:
        rows.append(["with it, p95 at 16 annotators <= 2x a single annotator's", f"{goal[1]:.2f}x", verdict(goal[1], 2.0)])
    return rows


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
        [PROBED.get(name, name), ms(median), ms(probe["p95_ms"][name]), _diff(probe["max_abs_logit_diff_vs_decode"].get(name))]
        for name, median in probe["median_ms"].items()
    ]
    rows += [[PROBED.get(name, name), "could not run", why, ""] for name, why in probe["not_run"].items()]
    header = ["one point, multimask", "median ms", "p95 ms", "max logit diff vs the decoder"]
    text = (
        f"### Where `predict`'s time goes ({probe['model']}, {probe['provider']}; `python -m benchmarks.gpu_decoder_probe`)\n\n"
        + markdown_table(header, rows)
    )
    return text + _session_batch(probe["session_batch"]) if "session_batch" in probe else text


SESSIONS = {
    "default": "ONNX Runtime's CUDA options",
    "product": "`contract.CUDA_PROVIDER_OPTIONS`",
    "per_size": "a session per batch size",
}


def _session_batch(probe: dict) -> str:
    """The probe's "session_batch" part: the session model's batched decodes, stage by stage, in
    each order and with each kind of decoder session."""
    rows = []
    for variant, orders in probe["variants"].items():
        for kind, by_size in orders["steady"].items():
            for batch, stages in by_size.items():
                rows.append([SESSIONS.get(variant, variant), f"steady, {kind.replace('_', ' ')}", batch, *_stages(stages), ""])
        for batch, runs in orders["alternating"].items():
            single = ms(runs["single"]["total"])
            rows.append([SESSIONS.get(variant, variant), "alternating with 1", batch, *_stages(runs["batch"]), single])
    header = ["decoder sessions", "order, rows", "batch", "bind", "run", "copy", "answer", "total", "the run of 1 between"]
    encodes = ", ".join(f"{SESSIONS.get(name, name)} {ms(value)} ms" for name, value in probe["encode_ms"].items())
    return (
        f"\n\n#### The session model's batched decodes, median ms per stage ({probe['provider']}, features in "
        f"{probe['buffers']} buffers)\n\n" + markdown_table(header, rows) + f"\nOne image's encode: {encodes}.\n"
    )


def _stages(stages: dict) -> list:
    return [ms(stages[name]) for name in ("bind", "run", "copy", "answer", "total")]


def _diff(value: float | None) -> str:
    return "" if value is None else f"{value:.1e}"
