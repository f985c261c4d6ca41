"""The `triton-sam` command: a thin shell over the library."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from . import __version__
from .errors import TritonSamError
from .registry import DEFAULT_MODEL, MODELS, get_model
from .repository import default_model_repository, exported_models, locate, setup_hint, working_folder_note

REPOSITORY_DEFAULT = (
    "default: $TRITON_SAM_MODEL_REPOSITORY, else ./model_repository if it holds exported models, "
    "else the user's own (`triton-sam models` prints which)"
)


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


def _fetch(download, spec, description: str, args) -> Path | None:
    """`download(spec, args.dir, progress=...)` with a progress bar named `description`."""
    progress = _ProgressBar(description)
    try:
        return download(spec, args.dir, progress=progress)
    finally:
        progress.close()


def _download(args) -> tuple[Path, Path | None]:
    """The verified checkpoint of `args.model`, and its instance-segmentation decoder if it has one."""
    from functools import partial

    from .download import download_checkpoint, download_decoder

    spec = get_model(args.model)
    checkpoint = _fetch(partial(download_checkpoint, url=args.url), spec, spec.checkpoint_filename, args)
    print(f"Checkpoint verified: {checkpoint}")
    decoder = _fetch(download_decoder, spec, spec.decoder_filename, args) if spec.decoder_url else None
    if decoder is not None:
        print(f"Instance-segmentation decoder verified: {decoder}")
    return checkpoint, decoder


def _repository(given: Path | None) -> Path:
    """The repository a command works on: the one given, else the default (with a note when that is
    the working folder's)."""
    if given is not None:
        return given
    repository = default_model_repository()
    if (note := working_folder_note(repository)) is not None:
        print(note)
    return repository


def _export(args, checkpoint: Path | None = None, decoder: Path | None = None) -> None:
    checkpoint = checkpoint or args.checkpoint
    decoder = decoder or getattr(args, "decoder", None)
    seed = None if checkpoint else args.seed
    output = _repository(args.output)
    try:
        from .export import export_model

        paths = export_model(
            get_model(args.model),
            output,
            checkpoint=checkpoint,
            seed=seed,
            decoder=decoder,
            tensorrt=args.tensorrt,
            half=args.fp16,
            concepts=not args.no_concepts,
        )
    except ImportError as error:
        raise TritonSamError(
            f"Export needs PyTorch and the model's official package ({error}). Install them with: "
            "pip install 'triton-sam[export]' (see docs/development.md: sam2 is built with --no-build-isolation)."
        ) from error
    for path in paths:
        print(f"Wrote {path}")


def _cmd_models(args) -> None:
    repository = _repository(args.model_repository)
    print(f"Model repository: {repository}")
    exported = set(exported_models(repository))
    random = False
    for model_id, spec in MODELS.items():
        state = "not exported"
        if model_id in exported:
            random_weights = locate(spec, repository).random_weights
            random |= random_weights
            state = "exported, random weights" if random_weights else "exported"
        print(f"{model_id:24s} {state:26s} {spec.description}")
    if random:
        print("Random weights: the interface works, the masks are noise.")
    if not exported:
        print("None exported yet. " + setup_hint(get_model(DEFAULT_MODEL), repository))


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
    checkpoint, decoder = _download(args)
    _export(args, checkpoint=checkpoint, decoder=decoder)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _cmd_serve(args) -> None:
    from .engines.connection import ENV_API_KEY
    from .server.local import LocalTritonServer

    repository = _repository(args.model_repository)
    server = LocalTritonServer(
        repository,
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
        sessions_only=args.sessions_only,
    )
    if not server.api_key and args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: anyone who can reach {args.host} can use this server; set ${ENV_API_KEY} to require a key.")
    print(f"Starting Triton on {args.host} (gRPC {args.grpc_port}, HTTP {args.http_port}) for {repository} ...")
    signal.signal(signal.SIGTERM, _interrupt)  # `kill`, systemd, docker stop: stop Triton as Ctrl-C does
    with server:
        served = [m for m in exported_models(repository) if args.models is None or m in args.models]
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
    parser.add_argument("--output", type=Path, default=None, help=f"Triton model repository ({REPOSITORY_DEFAULT})")
    parser.add_argument("--tensorrt", action="store_true", help="add the TensorRT FP16 accelerator to config.pbtxt")
    parser.add_argument("--fp16", action="store_true", help="encoder backbone in float16: for GPUs (see BENCHMARKS.md)")
    parser.add_argument(
        "--no-concepts",
        action="store_true",
        help="sam3_tracker: leave out the concept graphs that Find needs (text encoder, 1.4 GB; detector, 0.1 GB)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="triton-sam", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    models = commands.add_parser("models", help="list known models and whether they are exported")
    models.add_argument("--model-repository", type=Path, default=None, help=REPOSITORY_DEFAULT)
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
    export.add_argument(
        "--decoder", type=Path, default=None, help="micro-sam's instance-segmentation decoder file (*_decoder.pt)"
    )
    _add_export_options(export)
    export.set_defaults(func=_export)

    setup = commands.add_parser("setup", help="download the checkpoint and export it (the one command to run)")
    _add_model(setup)
    _add_download_options(setup)
    _add_export_options(setup)
    setup.set_defaults(func=_cmd_setup)

    serve = commands.add_parser("serve", help="run a Triton server on this machine (nvidia-pytriton's binary)")
    serve.add_argument("--model-repository", type=Path, default=None, help=REPOSITORY_DEFAULT)
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
        help="dynamic batching of the session models' decodes, and images encoded together (default: "
        "decodes batched where the session models run on a GPU, images encoded one at a time; "
        "off on a CPU, where it is slower: BENCHMARKS.md)",
    )
    serve.add_argument(
        "--models",
        nargs="+",
        default=None,
        choices=sorted(MODELS),
        metavar="MODEL",
        help="serve only these of the repository's models (default: all)",
    )
    serve.add_argument(
        "--sessions-only",
        action="store_true",
        help="load only the session models, which are all the plugin and Predictor call (the plain encoder "
        "and decoder models are for other clients; SAM3's encoder loaded once, not twice)",
    )
    serve.set_defaults(func=_cmd_serve)

    server_env = commands.add_parser("server-env", help="create the environment `serve` runs in (nvidia-pytriton)")
    server_env.add_argument("--path", type=Path, default=None, help="where to create it (default: user data dir)")
    server_env.set_defaults(func=_cmd_server_env)

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
