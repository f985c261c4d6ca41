"""The report's sections on micro-sam's models: `microsam` (`benchmarks.microsam`), a table a
measure, a row a model and plane, micro-sam's median next to ours on each backend, the ratio and,
where masks were compared, their IoU to micro-sam's; `instance` (`benchmarks.instance`), the same
and instance segmentation's sides, the goal's verdict and the labels' check."""

from __future__ import annotations

from .tables import markdown_table, ms, verdict

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
    intro += _load_note(r)
    return intro + "\n" + "\n".join(_table(r, measure) for measure in measures)


INSTANCE_GOAL = 0.5  # #41: instance segmentation in at most half micro-sam's time


def _instance_rows(plane: str, figures: dict, backends: list[str]) -> list[list[str]]:
    """A plane's rows: micro-sam's, then each backend's with its ratio, verdict and labels' check."""
    rows = []
    for side in ["micro_sam", *backends]:
        f = figures[side]
        times = [ms(f["initialize_median_ms"]), ms(f["generate_median_ms"]), ms(f["median_ms"])]
        if side == "micro_sam":
            rows.append([plane, "micro-sam", *times, "1.00", "", "", "", ""])
            continue
        ratio, check = figures["ratio"][side], figures["labels_vs_micro_sam"][side]
        rows.append(
            [plane, BACKENDS[side], *times, f"{ratio:.2f}", verdict(ratio, INSTANCE_GOAL)]
            + [f"{check['objects']} / {check['micro_sam_objects']}", f"{check['share_matched_iou_0.99']:.4f}"]
            + ["yes" if check["identical"] else "no"]
        )
    return rows


def instance(r: dict) -> str:
    """The instance benchmark's section: how it was measured, encode and predict as in the
    micro-sam section, then instance segmentation with the goal's verdict."""
    ((model, planes),) = r["by_model"].items()
    backends = [b for b in BACKENDS if b in r["backends"]]
    device = r.get("reference_device", "cpu").upper()
    intro = (
        f"`{model}` with its instance-segmentation decoder, random weights written as micro-sam publishes them (the "
        "SAM's state dict and torch_em's UNETR in a `*_decoder.pt`), in one run: micro-sam's own functions (PyTorch on "
        f"the {device}) and ours, locally and through a local Triton server, from our export of the same files. "
        "Instance segmentation is micro-sam's `InstanceSegmentationWithDecoder` (`initialize`: encode and decoder; "
        "`generate`: the watershed) against our `InstanceSegmenter`, on the whole plane (micro-sam's untiled path, "
        "which its `automatic_instance_segmentation` takes without a tile shape); the thresholds are micro-sam's "
        "maps' medians (random weights give flat maps), the same for all. Each segmentation gets the plane shifted "
        "by a few pixels (no cached features). Medians of "
        + ", ".join(f"{r['repeats'][m]} {m}" for m in ("instance", "encode", "predict"))
        + " call(s) a plane"
        + (", after an untimed encode and predict of each." if r.get("warm_up") else ".")
        + " Labels: our object count / micro-sam's, the share of our objects whose best-overlapping micro-sam "
        "object has IoU >= 0.99, and whether the label images are identical.\n"
    )
    intro += _load_note(r)
    header = ["plane", "side", "initialize ms", "generate ms", "total ms", "ratio", f"goal <= {INSTANCE_GOAL}"]
    header += ["objects (ours / micro-sam's)", "matched IoU >= 0.99", "identical"]
    rows = [row for name, plane in planes.items() for row in _instance_rows(name, plane["instance"], backends)]
    tables = [_table(r, measure) for measure in ("encode", "predict")]
    return intro + "\n" + "\n".join(tables) + "\nInstance segmentation:\n\n" + markdown_table(header, rows)


def _load_note(r: dict) -> str:
    """What the machine's load was around the run (recorded since results carry `load_average`)."""
    if "load_average" not in r:
        return ""
    before, after = r["load_average"]
    return (
        f"\nThe machine's 1-minute load average was {before:.1f} before the run and {after:.1f} after it (the "
        "second counts the run's own work; above the count of cores before it, other processes shared them and "
        "the medians carry that noise).\n"
    )
