"""The report's section on SAM3's concept prompts (`benchmarks.concepts`): each step's median for
sam3's `Sam3Processor` and ours on each backend, the ratios, our answers' distance from sam3's and
the bytes of a concept request through Triton."""

from __future__ import annotations

from .tables import markdown_table, ms

STEPS = {
    "set_image": "`set_image` (one 1008 px encode)",
    "phrase": "a phrase (`set_text_prompt`)",
    "exemplar": "the phrase and an exemplar box (`add_geometric_prompt`)",
}
BACKENDS = {"local": "ours, local", "triton": "ours, Triton (loopback)"}


def concepts(r: dict) -> str:
    backends = [b for b in BACKENDS if b in r["by_side"]]
    header = ["median ms", "sam3 `Sam3Processor`"] + [f"{BACKENDS[b]}{what}" for b in backends for what in ("", ": ratio")]
    rows = [
        [label, ms(r["by_side"]["sam3"][step]["median_ms"])]
        + [cell for b in backends for cell in (ms(r["by_side"][b][step]["median_ms"]), f"{r['ratio'][b][step]:.2f}")]
        for step, label in STEPS.items()
    ]
    h, w = r["shape"]
    text = [
        f"SAM3 (`{r['model']}`, random weights) on a {h} x {w} RGB image, sam3 on the {r['device'].upper()}; "
        f"threshold 0 (every query's instance made). Medians of {r['repeats']['images']} images x "
        f"{r['repeats']['prompts']} prompts, after a warm-up image. Ours keeps a phrase's text features; "
        "sam3 encodes the phrase at every call.\n",
        markdown_table(header, rows),
        "Our answers next to sam3's (every query, the last exemplar case): "
        + "; ".join(
            f"{BACKENDS[b]}: scores within {r['vs_sam3'][b]['max_score_difference']:.1e}, boxes within "
            f"{r['vs_sam3'][b]['max_box_difference_px']:.1e} px"
            for b in backends
        )
        + ".\n",
    ]
    wire = r.get("bytes_per_request")
    if wire:
        rows = [
            [
                f"every query's mask (threshold 0: {wire['every_mask_masks']} crops)",
                f"{wire['every_mask_up']:,}",
                f"{wire['every_mask_down']:,}",
            ],
            ["boxes and scores alone (threshold 1)", f"{wire['no_mask_up']:,}", f"{wire['no_mask_down']:,}"],
        ]
        text.append(
            "Bytes of one phrase request through Triton, on the wire (gRPC, both ways); the server keeps the "
            f"image's detector maps. Full-size masks would be {wire['full_size_masks']:,} B ({wire['queries']} "
            "queries of float32 logits at the image's size).\n\n"
            + markdown_table(["one phrase request", "bytes up", "bytes down"], rows)
        )
    return "\n".join(text)
