"""The `triton-sam` command: a thin shell over the library."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from .bench.fixtures import BENCH_SHAPE
from .errors import TritonSamError
from .registry import DEFAULT_MODEL, MODELS, get_model
from .repository import default_model_repository, exported_models, locate


class _ProgressBar:
    """A byte progress bar that appears with the first bytes (none when the download cannot start)."""

    def __init__(self, description: str) -> None:
        self.description = description
        self.bar = None

    def __call__(self, done: int, total: int | None) -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(desc=self.description, total=total, unit="B", unit_scale=True, unit_divisor=1024)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _download(args) -> Path:
    from .download import download_checkpoint

    spec = get_model(args.model)
    progress = _ProgressBar(spec.checkpoint_filename)
    try:
        path = download_checkpoint(spec, args.dir, url=args.url, progress=progress)
    finally:
        progress.close()
    print(f"Checkpoint verified: {path}")
    return path


def _export(args, checkpoint: Path | None = None) -> None:
    checkpoint = checkpoint or args.checkpoint
    seed = None if checkpoint else args.seed
    try:
        from .export import export_model

        paths = export_model(
            get_model(args.model), args.output, checkpoint=checkpoint, seed=seed, tensorrt=args.tensorrt, half=args.fp16
        )
    except ImportError as error:
        raise TritonSamError(
            f"Export needs PyTorch and the model's official package ({error}). Install them with: "
            "pip install 'triton-sam[export]' (see README: sam2 is built with --no-build-isolation)."
        ) from error
    for path in paths:
        print(f"Wrote {path}")


def _cmd_models(args) -> None:
    exported = set(exported_models(args.model_repository))
    for model_id, spec in MODELS.items():
        state = "not exported"
        if model_id in exported:
            found = locate(spec, args.model_repository)
            state = "exported (random weights: the interface works, masks are noise)" if found.random_weights else "exported"
        print(f"{model_id:28s} {state}")


def _cmd_cache(args) -> None:
    from .features import default_disk_dir, default_disk_mb, disk_files

    directory = args.dir or default_disk_dir()
    files = disk_files(directory)
    if args.clear:
        for path in files:
            path.unlink(missing_ok=True)
        print(f"Removed {len(files)} files of image features from {directory}.")
        return
    size = sum(path.stat().st_size for path in files) / 2**30
    print(f"{len(files)} files of image features, {size:.2f} GB of at most {default_disk_mb() / 1024:g} GB, in {directory}")


def _cmd_setup(args) -> None:
    _export(args, checkpoint=_download(args))


def _cmd_bench_triton(args) -> None:
    from .bench import triton

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
    from .bench import hover

    result = hover.run(
        args.model, rate_hz=args.rate, duration_s=args.duration, shape=tuple(args.shape), backends=tuple(args.backends)
    )
    print(json.dumps(result, indent=2))


def _cmd_bench_gui(args) -> None:
    from .bench import gui

    result = gui.run(
        args.model,
        shape=tuple(args.shape),
        hover_s=args.duration,
        backends=tuple(args.backends),
        seed=args.seed,
        workdir=args.workdir,
    )
    print(json.dumps(result, indent=2))


def _cmd_bench_large(args) -> None:
    from .bench import large

    result = large.run(
        args.model,
        planes=tuple(args.planes),
        backends=tuple(args.backends),
        hover_s=args.duration,
        seed=args.seed,
        workdir=args.workdir,
    )
    print(json.dumps(result, indent=2))


def _cmd_bench(args) -> None:
    from .bench import predictor

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
    from .bench import parity

    print(json.dumps(parity.run(args.model, device=args.device, half=args.fp16), indent=2))


def _cmd_bench_json(args) -> None:
    """`bench click|annotators|memory|volume|automatic`: the benchmark with the options given, its result as JSON."""
    from importlib import import_module

    options = {name: value for name, value in vars(args).items() if name in _BENCH_OPTIONS and value is not None}
    if "soak_minutes" in options:
        options["soak_s"] = options.pop("soak_minutes") * 60.0
    for name in ("counts", "client_counts", "shape"):
        if name in options:
            options[name] = tuple(options[name])
    print(json.dumps(import_module(f"triton_sam.bench.{args.kind}").run(args.model, **options), indent=2))


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
)


def _cmd_bench_all(args) -> None:
    from .bench import suite

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
        print(f"Results in {args.output}; `triton-sam bench report {args.output}` makes plots and BENCHMARKS.md.")


def _cmd_bench_report(args) -> None:
    from .bench import report

    results = report.merge([json.loads(path.read_text()) for path in args.results])
    written = report.write(results, args.plots, args.markdown, gpu=args.gpu)
    print("Wrote " + ", ".join(str(path) for path in written))


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _cmd_serve(args) -> None:
    from .engines.connection import ENV_API_KEY
    from .server.local import LocalTritonServer

    server = LocalTritonServer(
        args.model_repository,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        server_python=args.server_python,
        api_key=os.environ.get(ENV_API_KEY),
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        session_batching=args.session_batching,
        models=args.models,
    )
    if not server.api_key and args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: anyone who can reach {args.host} can use this server; set ${ENV_API_KEY} to require a key.")
    print(f"Starting Triton on {args.host} (gRPC {args.grpc_port}, HTTP {args.http_port}) for {args.model_repository} ...")
    signal.signal(signal.SIGTERM, _interrupt)  # `kill`, systemd, docker stop: stop Triton as Ctrl-C does
    with server:
        served = [m for m in exported_models(args.model_repository) if args.models is None or m in args.models]
        models = ", ".join(served) or "none exported yet"
        key = f" (clients need ${ENV_API_KEY})" if server.api_key else ""
        print(f"Ready. Models: {models}. Point the plugin at {server.grpc_url}{key}. Ctrl-C stops the server.", flush=True)
        try:
            code = server.wait()
        except KeyboardInterrupt:
            print("Stopping Triton ...", flush=True)
            return
    if code:
        raise TritonSamError(f"Triton exited with code {code}.")


def _cmd_server_env(args) -> None:
    from .server.local import create_server_env

    python = create_server_env(args.path)
    print(f"Server environment ready: {python}")


def _add_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", choices=sorted(MODELS), metavar="MODEL", help=f"one of: {', '.join(MODELS)}")


def _add_download_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, default=None, help="where checkpoints are kept (default: user cache)")
    parser.add_argument("--url", default=None, help="download from this mirror instead of the official URL")


def _add_export_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", type=Path, default=default_model_repository(), help="Triton model repository")
    parser.add_argument("--tensorrt", action="store_true", help="add the TensorRT FP16 accelerator to config.pbtxt")
    parser.add_argument("--fp16", action="store_true", help="encoder backbone in float16: for GPUs (see BENCHMARKS.md)")


def _add_bench_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS))
    parser.add_argument("--encodes", type=int, default=3)
    parser.add_argument("--decodes", type=int, default=30)
    parser.add_argument("--shape", type=int, nargs=2, default=BENCH_SHAPE, metavar=("H", "W"))
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="triton-sam", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    models = commands.add_parser("models", help="list known models and whether they are exported")
    models.add_argument("--model-repository", type=Path, default=default_model_repository())
    models.set_defaults(func=_cmd_models)

    cache = commands.add_parser("cache", help="the image features napari keeps on disk: how much, where; --clear removes them")
    cache.add_argument("--dir", type=Path, default=None, help="the disk cache (default: the napari panel's)")
    cache.add_argument("--clear", action="store_true", help="remove every file of image features")
    cache.set_defaults(func=_cmd_cache)

    download = commands.add_parser("download", help="download and verify an official checkpoint")
    _add_model(download)
    _add_download_options(download)
    download.set_defaults(func=_download)

    export = commands.add_parser("export", help="export a model to ONNX into a Triton model repository")
    _add_model(export)
    weights = export.add_mutually_exclusive_group(required=True)
    weights.add_argument("--checkpoint", type=Path, help="an official checkpoint file as its authors publish it")
    weights.add_argument("--random-init", action="store_true", help="random weights (tests and benchmarks only)")
    export.add_argument("--seed", type=int, default=0, help="seed for --random-init")
    _add_export_options(export)
    export.set_defaults(func=_export)

    setup = commands.add_parser("setup", help="download the checkpoint and export it (the one command to run)")
    _add_model(setup)
    _add_download_options(setup)
    _add_export_options(setup)
    setup.set_defaults(func=_cmd_setup)

    serve = commands.add_parser("serve", help="run a Triton server on this machine (nvidia-pytriton's binary)")
    serve.add_argument("--model-repository", type=Path, default=default_model_repository())
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: this machine only)")
    serve.add_argument("--http-port", type=int, default=8000)
    serve.add_argument("--grpc-port", type=int, default=8001)
    serve.add_argument("--metrics-port", type=int, default=8002)
    serve.add_argument("--server-python", type=Path, default=None, help="python of the server environment")
    serve.add_argument("--tls-cert", type=Path, default=None, help="serve gRPC over TLS with this certificate (PEM)")
    serve.add_argument("--tls-key", type=Path, default=None, help="private key of --tls-cert (PEM)")
    serve.add_argument(
        "--session-batching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="dynamic batching of the session models and images encoded together "
        "(default: on with a GPU, off on a CPU where they only add delay)",
    )
    serve.add_argument(
        "--models",
        nargs="+",
        default=None,
        choices=sorted(MODELS),
        metavar="MODEL",
        help="serve only these of the repository's models (default: all)",
    )
    serve.set_defaults(func=_cmd_serve)

    server_env = commands.add_parser("server-env", help="create the environment `serve` runs in (nvidia-pytriton)")
    server_env.add_argument("--path", type=Path, default=None, help="where to create it (default: user data dir)")
    server_env.set_defaults(func=_cmd_server_env)

    bench = commands.add_parser("bench", help="benchmarks, side by side with the reference")
    kinds = bench.add_subparsers(dest="kind", required=True)
    bench_predictor = kinds.add_parser("predictor", help="local engine vs the model's official predictor")
    _add_bench_options(bench_predictor)
    bench_predictor.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the official predictor runs")
    bench_predictor.add_argument("--fp16", action="store_true", help="ours with a float16 encoder backbone")
    bench_predictor.set_defaults(func=_cmd_bench)
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
    bench_hover.set_defaults(func=_cmd_bench_hover)
    bench_gui = kinds.add_parser("gui", help="napari: mouse move to preview on screen, event-loop stalls (needs a display; JSON)")
    bench_gui.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS))
    bench_gui.add_argument("--duration", type=float, default=20.0, help="seconds of hovering (about one preview a second)")
    bench_gui.add_argument("--backends", nargs="+", default=["local", "triton"], choices=["local", "triton"])
    bench_gui.add_argument("--shape", type=int, nargs=2, default=BENCH_SHAPE, metavar=("H", "W"))
    bench_gui.add_argument("--seed", type=int, default=0, help="seed of the random-init weights")
    bench_gui.add_argument("--workdir", type=Path, default=Path(".bench"), help="where the exported model is kept")
    bench_gui.set_defaults(func=_cmd_bench_gui)
    bench_large = kinds.add_parser(
        "large", help="napari on a 20000x20000 uint16 plane: first preview, view encoded, stalls, memory (needs a display; JSON)"
    )
    bench_large.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS))
    bench_large.add_argument("--planes", nargs="+", default=["multiscale", "numpy"], choices=["multiscale", "numpy"])
    bench_large.add_argument("--backends", nargs="+", default=["local", "triton"], choices=["local", "triton"])
    bench_large.add_argument("--duration", type=float, default=10.0, help="seconds of hovering over the view")
    bench_large.add_argument("--seed", type=int, default=0, help="seed of the random-init weights")
    bench_large.add_argument("--workdir", type=Path, default=Path(".bench"), help="where the exported model is kept")
    bench_large.set_defaults(func=_cmd_bench_large)
    bench_click = kinds.add_parser("click", help="click to committed mask vs the official predict (JSON)")
    bench_click.add_argument("--clicks", type=int, default=None, help="clicks (default 20)")
    bench_click.add_argument("--device", default=None, choices=["cpu", "cuda"], help="where the official predictor runs")
    bench_annotators = kinds.add_parser(
        "annotators", help="1-32 simulated users on one local server, with and without batching (JSON)"
    )
    bench_annotators.add_argument("--counts", type=int, nargs="+", default=None, help="numbers of annotators (default 1 4 16 32)")
    bench_annotators.add_argument("--duration", dest="duration_s", type=float, default=None, help="seconds of hovering per round")
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
    bench_memory = kinds.add_parser("memory", help="client and server memory as image features pile up, and a hover soak (JSON)")
    bench_memory.add_argument("--client-counts", type=int, nargs="+", default=None, help="images encoded (default 1 10 100)")
    bench_memory.add_argument("--soak-minutes", type=float, default=None, help="minutes of hovering through Triton (default 10)")
    for kind in (bench_click, bench_annotators, bench_memory, bench_volume, bench_automatic):
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
    bench_report = kinds.add_parser("report", help="plots (PNG) and a Markdown table from `bench all` results")
    bench_report.add_argument(
        "results", type=Path, nargs="+", help="results files; a later one's benchmarks replace an earlier one's"
    )
    bench_report.add_argument("--plots", type=Path, default=Path("docs/benchmarks"))
    bench_report.add_argument("--markdown", type=Path, default=Path("BENCHMARKS.md"))
    bench_report.add_argument(
        "--gpu", type=Path, default=None, help="a directory of `scripts/bench-gpu.sh` results (GPU section)"
    )
    bench_report.set_defaults(func=_cmd_bench_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except TritonSamError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
