"""`python -m benchmarks`: the benchmarks, side by side with the reference, run from a checkout.

`all` runs every one of them into one JSON file, `report` makes BENCHMARKS.md and its plots from
such files; each benchmark also runs alone (`python -m benchmarks KIND --help`). They need the
`bench` extra (`pip install -e ".[bench]"`), and the export extra for the official predictors.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from triton_sam.errors import TritonSamError
from triton_sam.registry import DEFAULT_MODEL, MICRO_SAM_MODELS, MODELS

from .fixtures import BENCH_SHAPE
from .microsam import MODELS as MICROSAM_MODELS


def _cmd_bench_triton(args) -> None:
    from . import triton

    result = triton.run(
        args.model,
        encodes=args.encodes,
        decodes=args.decodes,
        clients=tuple(args.clients),
        duration_s=args.duration,
        tiles=args.tiles,
        shape=tuple(args.shape),
    )
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for key in ("local_encode", "triton_encode", "local_decode", "triton_decode"):
        print(f"{key:14s} median {result[key]['median_ms']:8.1f} ms   p95 {result[key]['p95_ms']:8.1f} ms")
    print("bytes per call: " + ", ".join(f"{k} {v}" for k, v in result["bytes_per_call"].items()))
    for mode in ("throughput_dynamic_batching", "throughput_no_batching"):
        rows = ", ".join(f"{r['clients']} clients {r['decodes_per_s']:.1f}/s" for r in result[mode])
        print(f"{mode}: {rows}")


def _cmd_bench_hover(args) -> None:
    from . import hover

    result = hover.run(
        args.model,
        rate_hz=args.rate,
        duration_s=args.duration,
        shape=tuple(args.shape),
        backends=tuple(args.backends),
        session_batching=args.session_batching,
    )
    print(json.dumps(result, indent=2))


def _cmd_bench_predictor(args) -> None:
    from . import predictor

    result = predictor.run(
        args.model,
        encodes=args.encodes,
        decodes=args.decodes,
        shape=tuple(args.shape),
        device=args.device,
        half=args.fp16,
    )
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for key in (k for k in result if k.endswith(("_encode", "_decode"))):
        print(f"{key:16s} median {result[key]['median_ms']:8.1f} ms   p95 {result[key]['p95_ms']:8.1f} ms")
    for key in (k for k in result if "_ratio" in k):
        print(f"{key} (ours/official) {result[key]:.2f}")


def _cmd_bench_parity(args) -> None:
    from . import parity

    print(json.dumps(parity.run(args.model, device=args.device, half=args.fp16), indent=2))


def _cmd_bench_microsam(args) -> None:
    from . import microsam

    result = microsam.run(
        models=tuple(args.models),
        shapes=tuple((size, size) for size in args.sizes),
        repeats={"encode": args.encodes, "predict": args.predicts},
        seed=args.seed,
        workdir=args.workdir,
        backends=tuple(args.backends),
        device=args.device,
    )
    print(json.dumps(result, indent=2))


def _cmd_bench_instance(args) -> None:
    from . import instance

    result = instance.run(
        shapes=tuple((size, size) for size in args.sizes),
        repeats={"encode": args.encodes, "predict": args.predicts, "instance": args.repeats},
        seed=args.seed,
        workdir=args.workdir,
        backends=tuple(args.backends),
        device=args.device,
    )
    print(json.dumps(result, indent=2))


def _cmd_bench_json(args) -> None:
    """`click|annotators|servers|memory|volume|automatic|gui|series_gui|large|concepts`: the benchmark with the
    options given, its result as JSON."""
    from importlib import import_module

    options = {name: value for name, value in vars(args).items() if name in _BENCH_OPTIONS and value is not None}
    if "soak_minutes" in options:
        options["soak_s"] = options.pop("soak_minutes") * 60.0
    for name in ("counts", "client_counts", "shape", "backends"):
        if name in options:
            options[name] = tuple(options[name])
    print(json.dumps(import_module(f"benchmarks.{args.kind}").run(args.model, **options), indent=2))


_BENCH_OPTIONS = (
    "clicks",
    "device",
    "counts",
    "duration_s",
    "client_counts",
    "soak_minutes",
    "shape",
    "planes",
    "repeats",
    "points_per_side",
    "hover_s",
    "backends",
    "objects",
    "commits",
    "seed",
    "workdir",
    "images",
    "prompts",
)


def _cmd_bench_all(args) -> None:
    from . import suite

    progress = (lambda message: print(message, file=sys.stderr)) if args.json else print
    results = suite.run_all(
        args.output,
        args.profile,
        args.model,
        seed=args.seed,
        workdir=args.workdir,
        only=args.only,
        soak_s=None if args.soak_minutes is None else args.soak_minutes * 60.0,
        progress=progress,
    )
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"Results in {args.output}; `python -m benchmarks report {args.output}` makes plots and BENCHMARKS.md.")


def _cmd_bench_report(args) -> None:
    from . import report

    results = report.merge([json.loads(path.read_text()) for path in args.results])
    options = [*map(str, args.results), "--plots", str(args.plots), "--markdown", str(args.markdown)]
    command = shlex.join(["python", "-m", "benchmarks", "report", *options, *(["--gpu", str(args.gpu)] if args.gpu else [])])
    written = report.write(results, args.plots, args.markdown, gpu=args.gpu, made_with=command)
    print("Wrote " + ", ".join(str(path) for path in written))


def _add_bench_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS))
    parser.add_argument("--encodes", type=int, default=3)
    parser.add_argument("--decodes", type=int, default=30)
    parser.add_argument("--shape", type=int, nargs=2, default=BENCH_SHAPE, metavar=("H", "W"))
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def _add_microsam_options(parser: argparse.ArgumentParser, encodes: int, predicts: int) -> None:
    """The options of the benchmarks side by side with micro-sam's own functions (`microsam`, `instance`)."""
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048], help="square planes of these sizes")
    parser.add_argument("--encodes", type=int, default=encodes)
    parser.add_argument("--predicts", type=int, default=predicts)
    parser.add_argument("--backends", nargs="+", default=["local", "triton"], choices=["local", "triton"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where micro-sam runs")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random-init weights")
    parser.add_argument("--workdir", type=Path, default=Path(".bench"), help="where the checkpoints and exports are kept")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    kinds = parser.add_subparsers(dest="kind", required=True)
    bench_predictor = kinds.add_parser("predictor", help="local engine vs the model's official predictor")
    _add_bench_options(bench_predictor)
    bench_predictor.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the official predictor runs")
    bench_predictor.add_argument("--fp16", action="store_true", help="ours with a float16 encoder backbone")
    bench_predictor.set_defaults(func=_cmd_bench_predictor)
    bench_parity = kinds.add_parser("parity", help="masks and scores vs the official predictor on the parity images (JSON)")
    bench_parity.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS))
    bench_parity.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the official predictor runs")
    bench_parity.add_argument("--fp16", action="store_true", help="ours with a float16 encoder backbone")
    bench_parity.set_defaults(func=_cmd_bench_parity)
    bench_triton = kinds.add_parser("triton", help="Triton (local server) vs local engine: latency, bytes, throughput")
    _add_bench_options(bench_triton)
    bench_triton.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    bench_triton.add_argument("--duration", type=float, default=3.0, help="seconds per throughput run")
    bench_triton.add_argument("--tiles", type=int, default=8, help="tiles of a large plane encoded with and without batching")
    bench_triton.set_defaults(func=_cmd_bench_triton)
    bench_hover = kinds.add_parser("hover", help="mouse trace through our session and a naive client (JSON)")
    bench_hover.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS))
    bench_hover.add_argument("--rate", type=float, default=120.0, help="mouse events per second")
    bench_hover.add_argument("--duration", type=float, default=10.0, help="trace length in seconds")
    bench_hover.add_argument("--shape", type=int, nargs=2, default=BENCH_SHAPE, metavar=("H", "W"))
    bench_hover.add_argument("--backends", nargs="+", default=["local", "triton"], choices=["local", "triton"])
    bench_hover.add_argument(
        "--session-batching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the Triton server's session batcher (default: as `triton-sam serve`: on where it runs on a GPU)",
    )
    bench_hover.set_defaults(func=_cmd_bench_hover)
    bench_gui = kinds.add_parser("gui", help="napari: mouse move to preview on screen, event-loop stalls (needs a display; JSON)")
    bench_gui.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS))
    bench_gui.add_argument(
        "--duration", dest="hover_s", type=float, default=20.0, help="seconds of hovering (about one preview a second)"
    )
    bench_gui.add_argument(
        "--backends", nargs="*", default=["local", "triton"], choices=["local", "triton"], help="none: the long session alone"
    )
    bench_gui.add_argument(
        "--objects", type=int, default=1000, help="objects committed one after another on one plane (0: no long session)"
    )
    bench_gui.add_argument("--shape", type=int, nargs=2, default=BENCH_SHAPE, metavar=("H", "W"))
    bench_gui.add_argument("--seed", type=int, default=0, help="seed of the random-init weights")
    bench_gui.add_argument("--workdir", type=Path, default=Path(".bench"), help="where the exported model is kept")
    bench_gui.set_defaults(func=_cmd_bench_json)
    bench_series = kinds.add_parser(
        "series_gui",
        help="napari: GUI-thread stalls while commits on a 4096 x 4096 series plane are saved (needs a display; JSON)",
    )
    bench_series.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS))
    bench_series.add_argument("--commits", type=int, default=20, help="objects committed and saved one after another")
    bench_series.add_argument("--seed", type=int, default=0, help="seed of the objects' places and sizes")
    bench_series.add_argument("--workdir", type=Path, default=Path(".bench"), help="where the series is made (then removed)")
    bench_series.set_defaults(func=_cmd_bench_json)
    bench_large = kinds.add_parser(
        "large", help="napari on a 20000x20000 uint16 plane: first preview, view encoded, stalls, memory (needs a display; JSON)"
    )
    bench_large.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS))
    bench_large.add_argument("--planes", nargs="+", default=["multiscale", "numpy"], choices=["multiscale", "numpy"])
    bench_large.add_argument("--backends", nargs="+", default=["local", "triton"], choices=["local", "triton"])
    bench_large.add_argument("--duration", dest="hover_s", type=float, default=10.0, help="seconds of hovering over the view")
    bench_large.add_argument("--seed", type=int, default=0, help="seed of the random-init weights")
    bench_large.add_argument("--workdir", type=Path, default=Path(".bench"), help="where the exported model is kept")
    bench_large.set_defaults(func=_cmd_bench_json)
    bench_click = kinds.add_parser("click", help="click to committed mask vs the official predict (JSON)")
    bench_click.add_argument("--clicks", type=int, default=None, help="clicks (default 20)")
    bench_click.add_argument("--device", default=None, choices=["cpu", "cuda"], help="where the official predictor runs")
    bench_annotators = kinds.add_parser(
        "annotators", help="1-32 simulated users on one local server, with and without batching (JSON)"
    )
    bench_annotators.add_argument("--counts", type=int, nargs="+", default=None, help="numbers of annotators (default 1 4 16 32)")
    bench_annotators.add_argument("--duration", dest="duration_s", type=float, default=None, help="seconds of hovering per round")
    bench_servers = kinds.add_parser(
        "servers", help="simulated users through HAProxy and three local servers: affinity vs round-robin, one killed (JSON)"
    )
    bench_servers.add_argument("--counts", type=int, nargs="+", default=None, help="numbers of annotators (default 16 32)")
    bench_servers.add_argument("--duration", dest="duration_s", type=float, default=None, help="seconds of hovering per round")
    bench_volume = kinds.add_parser("volume", help="planes per second propagated through a stack vs SAM2VideoPredictor (JSON)")
    bench_volume.add_argument("--planes", type=int, default=None, help="planes in the stack (default 20)")
    bench_volume.add_argument("--repeats", type=int, default=None, help="runs of each (default 2)")
    bench_volume.add_argument("--device", default=None, choices=["cpu", "cuda"], help="where the official predictor runs")
    bench_automatic = kinds.add_parser(
        "automatic", help="seconds to segment everything in an image vs SAM2AutomaticMaskGenerator (JSON)"
    )
    bench_automatic.add_argument("--repeats", type=int, default=None, help="runs of each (default 2)")
    bench_automatic.add_argument("--points-per-side", type=int, default=None, help="prompt grid (default 32)")
    bench_automatic.add_argument("--device", default=None, choices=["cpu", "cuda"], help="where the official generator runs")
    bench_instance = kinds.add_parser(
        "instance",
        help="vit_b_lm: encode, predict and instance segmentation, ours vs micro-sam's InstanceSegmentationWithDecoder (JSON)",
    )
    bench_instance.add_argument("--repeats", type=int, default=2, help="instance segmentations of each plane")
    _add_microsam_options(bench_instance, encodes=1, predicts=5)
    bench_instance.set_defaults(func=_cmd_bench_instance)
    bench_microsam = kinds.add_parser(
        "microsam", help="micro-sam's models: encode and one-point predict, ours vs micro-sam's own functions (JSON)"
    )
    microsam_ids = [spec.model_id for spec in MICRO_SAM_MODELS]
    bench_microsam.add_argument("--models", nargs="+", default=list(MICROSAM_MODELS), choices=microsam_ids, metavar="MODEL")
    _add_microsam_options(bench_microsam, encodes=3, predicts=10)
    bench_microsam.set_defaults(func=_cmd_bench_microsam)
    bench_concepts = kinds.add_parser(
        "concepts", help="SAM3's concept prompts: set_image, a phrase, an exemplar box, ours vs sam3's Sam3Processor (JSON)"
    )
    bench_concepts.add_argument("--images", type=int, default=2, help="images timed (after a warm-up one)")
    bench_concepts.add_argument("--prompts", type=int, default=2, help="each prompt timed this often on each image")
    bench_concepts.add_argument("--shape", type=int, nargs=2, default=BENCH_SHAPE, metavar=("H", "W"))
    bench_concepts.add_argument("--backends", nargs="+", default=["local", "triton"], choices=["local", "triton"])
    bench_concepts.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where sam3 runs")
    bench_concepts.add_argument("--seed", type=int, default=0, help="seed of the random-init weights")
    bench_concepts.add_argument("--workdir", type=Path, default=Path(".bench"), help="where the export is kept")
    bench_concepts.set_defaults(func=_cmd_bench_json, model="sam3_tracker")
    bench_memory = kinds.add_parser("memory", help="client and server memory as image features pile up, and a hover soak (JSON)")
    bench_memory.add_argument("--client-counts", type=int, nargs="+", default=None, help="images encoded (default 1 10 100)")
    bench_memory.add_argument("--soak-minutes", type=float, default=None, help="minutes of hovering through Triton (default 10)")
    for kind in (bench_click, bench_annotators, bench_servers, bench_memory, bench_volume, bench_automatic):
        kind.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS))
        kind.add_argument("--shape", type=int, nargs=2, default=None, metavar=("H", "W"))
        kind.set_defaults(func=_cmd_bench_json)
    bench_all = kinds.add_parser("all", help="every benchmark, results in one JSON file (full profile: ~45 min on 2 cores)")
    bench_all.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS))
    bench_all.add_argument("--profile", default="full", choices=["full", "smoke"], help="smoke: tiny settings, to check it runs")
    bench_all.add_argument("--only", nargs="+", default=None, help="run only these benchmarks")
    bench_all.add_argument("--output", type=Path, default=Path("bench-results/results.json"))
    bench_all.add_argument("--seed", type=int, default=0, help="seed of the random-init weights")
    bench_all.add_argument("--workdir", type=Path, default=Path(".bench"), help="where the exported model is kept")
    bench_all.add_argument("--soak-minutes", type=float, default=None, help="length of the memory soak (full profile: 2.5)")
    bench_all.add_argument("--json", action="store_true", help="also print the results")
    bench_all.set_defaults(func=_cmd_bench_all)
    bench_report = kinds.add_parser("report", help="plots (PNG) and a Markdown table from `all` results")
    bench_report.add_argument(
        "results", type=Path, nargs="+", help="results files; a later one's benchmarks replace an earlier one's"
    )
    bench_report.add_argument("--plots", type=Path, default=Path("docs/benchmarks"))
    bench_report.add_argument("--markdown", type=Path, default=Path("BENCHMARKS.md"))
    bench_report.add_argument(
        "--gpu", type=Path, default=None, help="a directory of `benchmarks/bench-gpu.sh` results (GPU section)"
    )
    bench_report.set_defaults(func=_cmd_bench_report)
    return parser


if __name__ == "__main__":
    arguments = build_parser().parse_args()
    try:
        arguments.func(arguments)
    except TritonSamError as error:  # a model not exported, no server environment: say so, no traceback
        sys.exit(f"error: {error}")
