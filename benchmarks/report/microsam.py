"""The report's section on micro-sam's models (`benchmarks.microsam`): a table a measure, a row a
model and plane, micro-sam's median next to ours on each backend, the ratio and, where masks were
compared, their IoU to micro-sam's."""

from __future__ import annotations

from .tables import markdown_table, ms

BACKENDS = {"local": "ours, local", "triton": "ours, Triton (loopback)"}
TITLES = {  # measure -> what its table compares
    "encode": "Encode: micro-sam's `precompute_image_embeddings` vs our `set_image`",
    "predict": "One positive point (`segment_from_points`: the best of three masks) vs our `predict`, the best kept",
}


def _cells(figures: dict, backend: str) -> list[str]:
    """A backend's median, ratio to micro-sam's and (where compared) mask IoU to micro-sam's."""
    cells = [ms(figures[backend]["median_ms"]), f"{figures['ratio'][backend]:.2f}"]
    if "iou_vs_micro_sam" in figures:
        cells.append(f"{figures['iou_vs_micro_sam'][backend]:.4f}")
    return cells


def _table(r: dict, measure: str) -> str:
    """One measure's table: its medians on every model and plane."""
    backends = [b for b in BACKENDS if b in r["backends"]]
    compared = any("iou_vs_micro_sam" in plane[measure] for planes in r["by_model"].values() for plane in planes.values())
    per_backend = ["median ms", "ratio"] + (["mask IoU"] if compared else [])
    header = ["model", "plane", "micro-sam, median ms"] + [f"{BACKENDS[b]}: {what}" for b in backends for what in per_backend]
    rows = [
        [f"`{model}`", name, ms(plane[measure]["micro_sam"]["median_ms"])]
        + [cell for b in backends for cell in _cells(plane[measure], b)]
        for model, planes in r["by_model"].items()
        for name, plane in planes.items()
    ]
    return f"{TITLES.get(measure, measure)}:\n\n" + markdown_table(header, rows)


def microsam(r: dict) -> str:
    """The section: how it was measured, then a table for each measure."""
    measures = list(next(iter(next(iter(r["by_model"].values())).values())))
    repeats = ", ".join(f"{r['repeats'][m]} {m}s" for m in measures)
    device = r.get("reference_device", "cpu").upper()
    intro = (
        "micro-sam's fine-tunes with random weights written in micro-sam's checkpoint format, run by micro-sam's own "
        f"functions (`get_sam_model`, `precompute_image_embeddings`, `segment_from_points`; PyTorch on the {device}) "
        "and by ours from our export of the same file. The plane is an RGB image whose channels span 0..255 (micro-sam "
        "stretches them so), the same pixels to both; each encode gets it shifted by a few pixels (a Triton server "
        f"answers a plane it has seen from its cache). Calls alternate; medians of {repeats} on each plane"
        + (", after an untimed encode and predict of each. " if r.get("warm_up") else ". ")
        + "Ratio: ours / micro-sam's; mask IoU: ours to micro-sam's mask.\n"
    )
    if "load_average" in r:
        before, after = r["load_average"]
        intro += (
            f"\nThe machine's 1-minute load average was {before:.1f} before the run and {after:.1f} after it "
            "(above its count of cores, other processes shared them: the medians carry that noise).\n"
        )
    return intro + "\n" + "\n".join(_table(r, measure) for measure in measures)
