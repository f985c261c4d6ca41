"""The report's "Several servers" section: `python -m benchmarks servers`, header affinity vs
round-robin at the balancer, then one server killed mid-run, with the goals of #43."""

from __future__ import annotations

from .tables import markdown_table, ms, verdict

BALANCING = {"affinity": "header hash (shipped)", "round_robin": "round-robin"}


def _row(balancing: str, row: dict) -> list[str]:
    spread = ", ".join(str(n) for n in row["images_per_server"].values())
    return [
        balancing,
        str(row["annotators"]),
        spread,
        f"{row['reencodes_per_1000_decodes']:.1f}",
        f"{row['decodes_per_s']:.1f}",
        ms(row["latency_ms"]["p50"]),
        ms(row["latency_ms"]["p95"]),
        str(row["errors"]),
    ]


def _kill(k: dict) -> str:
    """The kill round's sentence, its goals' verdicts in it."""
    only_killed = "met" if k["reencoded_only_killed_servers_images"] else "**missed**"
    return (
        f"\nOne server ({k['killed']}) killed (SIGKILL) halfway through a round of {k['annotators']} annotators with "
        f"the header hash, then each annotator clicks once more on its object in progress: errors shown to "
        f"annotators {k['errors']} (goal 0: {verdict(k['errors'], 0)}), objects in progress lost {k['objects_lost']} "
        f"(goal 0: {verdict(k['objects_lost'], 0)}); images encoded again {len(k['images_reencoded'])}, "
        f"{len(k['images_on_killed_server'])} images lived on the killed server (goal: only those: {only_killed}); "
        f"{k['reencodes']} re-encodes, {k['reencodes_per_1000_decodes']:.1f} per 1000 decodes, "
        f"{k['decodes_per_s']:.1f} decodes/s, p95 {ms(k['latency_ms']['p95'])} ms.\n"
    )


def servers(r: dict) -> str:
    rows = [_row(BALANCING[config], row) for config in BALANCING for row in r.get(config, [])]
    header = ["balancer", "annotators", "images per server (first encode)", "re-encodes per 1000 decodes", "decodes/s"]
    text = (
        f"{r['servers']} Triton servers on loopback behind HAProxy (the shipped configuration, `balance` as "
        f"in the first column), one simulated annotator an image ({r['image_shape'][0]}x{r['image_shape'][1]}), "
        f"each with an object in progress, hovering {r['duration_s']:.0f} s; model: {r['model']}, so the figures "
        f"are of routing and re-encodes, not of a network's compute. Load average at the start "
        f"{r['load_average']:.1f} (a shared machine): compare the rows with each other.\n\n"
    )
    text += markdown_table([*header, "p50 ms", "p95 ms", "errors"], rows)
    by_count = {config: {row["annotators"]: row for row in r.get(config, [])} for config in BALANCING}
    for count in sorted(set(by_count["affinity"]) & set(by_count["round_robin"])):
        ours, spread = (by_count[c][count]["reencodes_per_1000_decodes"] for c in BALANCING)
        fewer = "met" if ours < spread else "**missed**"
        text += f"\nGoal at {count} annotators: fewer re-encodes with the header hash than round-robin ({fewer}).\n"
    for config, balancing in BALANCING.items():
        for row in (row for row in r.get(config, []) if row["first_error"]):
            text += f"\nThe first error shown with {balancing} at {row['annotators']} annotators: {row['first_error']}\n"
    return text + (_kill(r["kill"]) if "kill" in r else "")
