"""`python -m benchmarks report`: plots (PNG) and BENCHMARKS.md from the JSON of `python -m benchmarks all`.

Every figure in the Markdown comes from the results file; goals are those of the project's
issues, and each row says whether the run met them. This module makes the page; `sections` (and
`in_napari`, for the benchmarks run in napari) and `gpu` render its sections, from `tables`' cells.
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import plots
from .gpu import gpu_section
from .sections import SECTIONS

REPRODUCE = (
    "python -m benchmarks all && python -m benchmarks all --only memory --soak-minutes 10 "
    "--output bench-results/soak.json && python -m benchmarks report bench-results/results.json bench-results/soak.json "
    "--gpu docs/benchmarks/gpu-h200"
)


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
