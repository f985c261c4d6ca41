"""The PNG plots of BENCHMARKS.md (`python -m benchmarks report`)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after choosing the non-interactive backend)


def annotators(r: dict, path: Path) -> Path:
    figure, (throughput, latency) = plt.subplots(1, 2, figsize=(9, 3.5))
    for mode in ("dynamic_batching", "no_batching"):
        rows = r.get(mode, [])
        counts = [row["annotators"] for row in rows]
        throughput.plot(counts, [row["decodes_per_s"] for row in rows], marker="o", label=mode.replace("_", " "))
        latency.plot(counts, [row["latency_ms"]["p95"] or 0 for row in rows], marker="o", label=mode.replace("_", " "))
    throughput.set(xlabel="annotators", ylabel="decodes/s", xscale="log", title="server throughput")
    latency.set(xlabel="annotators", ylabel="p95 ms", xscale="log", yscale="log", title="event to preview")
    throughput.legend()
    return _save(figure, path)


def hover(hover: dict, gui: dict, path: Path) -> Path:
    figure, axis = plt.subplots(figsize=(7, 3.5))
    labels, values = [], []
    for backend in ("local", "triton"):
        if backend in hover:
            labels += [f"{backend}\nnaive", f"{backend}\nours"]
            values += [hover[backend]["naive"]["latency_ms"]["p95"], hover[backend]["ours"]["latency_ms"]["p95"]]
        if backend in gui and "hover" in gui[backend]:
            labels.append(f"{backend}\nnapari")
            values.append(gui[backend]["hover"]["event_to_screen_ms"]["p95_ms"] or 0)
    axis.bar(labels, values, color=["tab:red" if "naive" in label else "tab:blue" for label in labels])
    axis.set(yscale="log", ylabel="p95 ms, event to preview", title="hover latency (log scale)")
    return _save(figure, path)


def soak(soak: dict, path: Path) -> Path:
    figure, axis = plt.subplots(figsize=(7, 3.5))
    minutes, client, server = zip(*soak["samples"])
    axis.plot(minutes, client, label="client (napari side)")
    axis.plot(minutes, server, label="Triton server + models")
    axis.set(xlabel="minutes of hovering", ylabel="resident MiB", title="memory during the soak", ylim=(0, None))
    axis.legend()
    return _save(figure, path)


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
