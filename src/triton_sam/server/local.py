"""`triton-sam serve`: a real Triton server on this machine, from nvidia-pytriton's binary.

PyTriton pins numpy<2 and the plugin must work with numpy 2, so the server may live in its own
environment (`triton-sam server-env` creates one). Its Triton has only the python backend, so the
served repository is a *view* of the exported one: ONNX Runtime backend models become python
models running the same ONNX file (`models/python_model.py`) under the same name, tensors and
batching; python models (the session model) keep their files, and keep their dynamic batcher only
where they run on a GPU or are asked to (measured slower on a CPU, see `LocalTritonServer`).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import venv
from collections.abc import Collection, Iterator
from importlib import resources
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from ..contract import (
    API_KEY_GRPC_HEADER,
    API_KEY_NAME,
    DEVICE_DECODED_METRIC,
    DEVICE_ENCODED_METRIC,
    ENCODE_BATCH_PARAMETER,
    SESSION_REQUESTS_METRIC,
)
from ..errors import ServerUnavailableError, TritonSamError
from ..gpu import cuda_device_count
from ..repository import read_metadata
from .models import write_python_model

ENV_SERVER_PYTHON = "TRITON_SAM_SERVER_PYTHON"
CONFIG_FILE = "config.pbtxt"
RESTRICTED_PROTOCOLS = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)


def server_packages(gpu: bool) -> list[str]:
    """What the server environment installs. On a GPU machine ONNX Runtime also needs the CUDA and
    cuDNN of its build (without them it runs on the CPU); its extras bring them from pip."""
    return ["nvidia-pytriton==0.7.0", "numpy<2", f"onnxruntime-gpu{'[cuda,cudnn]' if gpu else ''}==1.31.1"]


SERVER_PACKAGES = tuple(server_packages(gpu=False))


def default_server_env() -> Path:
    from platformdirs import user_data_dir

    return Path(user_data_dir("triton-sam")) / "server-env"


def _server_python_candidates(explicit: str | Path | None) -> Iterator[tuple[str | Path | None, str]]:
    """Where `find_server_python` looks, in order: the python there (None: nothing to look at) and
    the place in words."""
    yield explicit, f"--server-python {explicit or '(not given)'}"
    named = os.environ.get(ENV_SERVER_PYTHON)
    yield named, f"${ENV_SERVER_PYTHON} {named or '(not set)'}"
    if importlib.util.find_spec("pytriton") is not None:
        yield sys.executable, sys.executable
    else:
        yield None, f"this python {sys.executable} (no pytriton)"
    yield Path(".venv-server/bin/python").absolute(), "in the current directory"
    if sys.prefix != sys.base_prefix:  # a virtual environment: scripts/install.sh makes .venv-server beside .venv
        yield Path(sys.prefix).parent / ".venv-server" / "bin" / "python", "beside this python's environment"
    yield default_server_env() / "bin" / "python", "`triton-sam server-env`'s default"


def find_server_python(explicit: str | Path | None = None) -> Path:
    """The interpreter of an environment with nvidia-pytriton (see module docstring): the first of
    `explicit` (`serve --server-python`), $TRITON_SAM_SERVER_PYTHON, this interpreter if it has
    pytriton, `.venv-server` in the current directory, `.venv-server` beside the virtual
    environment this runs in (where scripts/install.sh makes it: found whatever directory `serve`
    starts in), and the environment `triton-sam server-env` makes by default."""
    looked = []
    for candidate, place in _server_python_candidates(explicit):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
        looked.append(place if candidate is None or str(candidate) in place else f"{candidate} ({place})")
    raise TritonSamError(
        "No environment with nvidia-pytriton found. Create one with `triton-sam server-env` "
        f"(or point ${ENV_SERVER_PYTHON} at the python of an environment that has {', '.join(SERVER_PACKAGES)}). "
        "Looked at: " + "; ".join(looked) + "."
    )


def session_models_on_gpu(server_python: Path) -> bool:
    """Whether the session models of a server run by `server_python` will run on a GPU: the driver
    sees one and that environment's ONNX Runtime has its CUDA provider (asked of it: the
    environment of `serve` may have another ONNX Runtime, or none)."""
    if cuda_device_count() == 0:
        return False
    probe = "import onnxruntime; print('CUDAExecutionProvider' in onnxruntime.get_available_providers())"
    try:
        answer = subprocess.run([str(server_python), "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return answer.stdout.strip() == "True"


def create_server_env(path: Path | None = None, progress=print) -> Path:
    """Create a virtual environment with the server's packages; returns its interpreter."""
    path = Path(path) if path is not None else default_server_env()
    progress(f"Creating the Triton server environment in {path} ...")
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    python = path / "bin" / "python"
    packages = server_packages(gpu=cuda_device_count() > 0)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *packages], check=True)
    return python


def _as_python_model(config: model_config_pb2.ModelConfig) -> None:
    """Rewrite an onnxruntime-backend model config for the python backend (same name and tensors)."""
    config.platform = ""
    config.backend = "python"
    config.ClearField("optimization")  # TensorRT accelerator settings mean nothing here
    for group in config.instance_group:
        group.kind = model_config_pb2.ModelInstanceGroup.KIND_CPU  # the model picks its ORT device
        del group.gpus[:]


def serving_repository(
    model_repository: Path,
    view: Path,
    session_batching: bool = False,
    models: Collection[str] | None = None,
    batched_encodes: bool | None = None,
) -> Path:
    """Write into `view` the python-backend view of `model_repository` (of its `models` only, if given).

    Files are linked, configs rewritten. Without `session_batching` the session models lose their
    dynamic batcher; without `batched_encodes` (by default as `session_batching`) they encode one
    image at a time (see `LocalTritonServer`).
    """
    batched_encodes = session_batching if batched_encodes is None else batched_encodes
    view.mkdir(parents=True, exist_ok=True)
    for model_dir in sorted(Path(model_repository).resolve().iterdir()):
        config_file = model_dir / CONFIG_FILE
        if not config_file.is_file():
            continue
        if models is not None and (read_metadata(model_dir) or {}).get("model_id") not in models:
            continue
        config = text_format.Parse(config_file.read_text(), model_config_pb2.ModelConfig())
        runs_onnx = config.backend != "python"
        target = view / model_dir.name
        target.mkdir()
        for item in (i for i in model_dir.iterdir() if i.name != CONFIG_FILE):
            if runs_onnx and item.is_dir() and item.name.isdigit():
                (target / item.name).mkdir()
                for file in item.iterdir():
                    (target / item.name / file.name).symlink_to(file)
                write_python_model(target / item.name)
            else:
                (target / item.name).symlink_to(item, target_is_directory=item.is_dir())
        if runs_onnx:
            _as_python_model(config)
        else:
            if not session_batching:
                config.ClearField("dynamic_batching")
            if not batched_encodes and ENCODE_BATCH_PARAMETER in config.parameters:
                config.parameters[ENCODE_BATCH_PARAMETER].string_value = "1"
        (target / CONFIG_FILE).write_text(text_format.MessageToString(config))
    return view


def metric_counts(text: str, metric: str, model_name: str, label: str) -> dict[str, int]:
    """Counter `metric` of model `model_name` by the value of its `label`, from Triton's Prometheus
    metrics text."""
    counts = {}
    for line in text.splitlines():
        if line.startswith(metric + "{") and f'model="{model_name}"' in line:
            labels, value = line.rsplit(" ", 1)
            counts[labels.split(f'{label}="', 1)[1].split('"', 1)[0]] = int(float(value))
    return counts


def session_request_counts(text: str, model_name: str) -> dict[str, int]:
    """The session model's request counters by outcome, from Triton's Prometheus metrics text."""
    return metric_counts(text, SESSION_REQUESTS_METRIC, model_name, "outcome")


class LocalTritonServer:
    """A Triton server process on this machine serving `model_repository`; a context manager."""

    def __init__(
        self,
        model_repository: str | Path,
        *,
        host: str = "127.0.0.1",
        http_port: int = 8000,
        grpc_port: int = 8001,
        metrics_port: int = 8002,
        server_python: str | Path | None = None,
        log_verbose: int = 0,
        api_key: str | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
        session_batching: bool | None = None,
        models: Collection[str] | None = None,
        sessions_only: bool = False,
        batched_encodes: bool | None = None,
    ) -> None:
        self.model_repository = Path(model_repository)
        self.models = models  # serve only these model ids (None: every exported model)
        # Load only the session models (all that triton-sam's clients call): the encoder and decoder
        # files they run are not loaded a second time as models of their own (SAM3's encoder: 1.8 GB
        # and a 1008 px warm-up encode, minutes of a CPU server's start).
        self.sessions_only = sessions_only
        self.host = host
        self.ports = {"http": http_port, "grpc": grpc_port, "metrics": metrics_port}
        self.server_python = find_server_python(server_python)
        self.log_verbose = log_verbose
        self.api_key = api_key
        if (tls_cert is None) != (tls_key is None):
            raise TritonSamError("TLS needs both a certificate and its private key.")
        self.tls_cert, self.tls_key = tls_cert, tls_key
        # The session models' dynamic batcher, by default where they run on a GPU; measured both
        # ways. On a CPU decodes run one by one anyway, Triton's batcher delays the request after a
        # cancelled one (docs/serving.md) and tiles encoded together take longer (4 of SAM2.1 tiny:
        # 5.0 s against 4.2 s on 2 cores). On an H200, with a decoder session per batch size, it
        # paid from 4 back-to-back clients on (BENCHMARKS.md, GPU; #38), but tiles encoded 4 to a
        # request did not: images are encoded together only where `batched_encodes` (by default
        # where `session_batching` is asked for).
        self.session_batching = session_models_on_gpu(self.server_python) if session_batching is None else session_batching
        self.batched_encodes = bool(session_batching) if batched_encodes is None else batched_encodes
        self._workdir: Path | None = None
        self._process: subprocess.Popen | None = None

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.ports['grpc']}"

    def session_requests(self, model_name: str) -> dict[str, int]:
        """What the session model `model_name` did with its requests so far, by outcome."""
        return session_request_counts(self.metrics(), model_name)

    def device_work(self, model_name: str) -> dict[str, dict[str, int]]:
        """What each device of the session model `model_name` did so far: images "encoded" and
        prompt sets "decoded", by device index."""
        text = self.metrics()
        return {
            work: metric_counts(text, metric, model_name, "device")
            for work, metric in (("encoded", DEVICE_ENCODED_METRIC), ("decoded", DEVICE_DECODED_METRIC))
        }

    def metrics(self) -> str:
        """Triton's Prometheus metrics text."""
        url = f"http://{self.host}:{self.ports['metrics']}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.read().decode()
        except urllib.error.URLError as error:
            state = "is running" if self.is_running() else f"exited with code {self._process and self._process.returncode}"
            message = f"Triton's metrics at {url} did not answer ({error.reason}); the server {state}."
            raise ServerUnavailableError(f"{message}\n{self.log_tail()}") from None

    @property
    def pid(self) -> int | None:
        """Process id of the running Triton server (its model processes are its children)."""
        return self._process.pid if self._process is not None else None

    @property
    def client_headers(self) -> dict[str, str]:
        """gRPC headers a client must send to this server (the API key, if one is set)."""
        return {API_KEY_GRPC_HEADER: self.api_key} if self.api_key else {}

    @property
    def log_path(self) -> Path | None:
        return self._workdir / "tritonserver.log" if self._workdir else None

    def start(self, timeout_s: float = 120.0) -> LocalTritonServer:
        """Start the server and wait until it answers ready; raise with its log if it does not."""
        if not self.model_repository.is_dir():
            raise TritonSamError(
                f"Model repository {self.model_repository} does not exist; export a model into it first: "
                f"`triton-sam setup MODEL --output {self.model_repository}`."
            )
        self._check_ports_free()
        self._workdir = Path(tempfile.mkdtemp(prefix="triton-sam-serve-"))
        view = serving_repository(
            self.model_repository, self._workdir / "models", self.session_batching, self.models, self.batched_encodes
        )
        launcher = resources.files("triton_sam.server").joinpath("launch_tritonserver.py")
        command = [
            str(self.server_python),
            str(launcher),
            f"--model-repository={view}",
            f"--workdir={self._workdir}",
            f"--host={self.host}",
            f"--http-port={self.ports['http']}",
            f"--grpc-port={self.ports['grpc']}",
            f"--metrics-port={self.ports['metrics']}",
            f"--log-verbose={self.log_verbose}",
            *self._sessions_only(view),
            *self._restrictions(),
            *self._tls(),
        ]
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready(timeout_s)
        return self

    def _sessions_only(self, view: Path) -> list[str]:
        """Where only the session models are served, Triton loads just those (the others stay in the
        view: the session models read their files)."""
        if not self.sessions_only:
            return []
        sessions = [d.name for d in sorted(view.iterdir()) if (read_metadata(d) or {}).get("component") == "session"]
        return ["--model-control-mode=explicit", *(f"--load-model={name}" for name in sessions)]

    def _restrictions(self) -> list[str]:
        """With an API key, every gRPC and HTTP endpoint wants it in a header (see `API_KEY_NAME`)."""
        if not self.api_key:
            return []
        rule = f"{','.join(RESTRICTED_PROTOCOLS)}:{API_KEY_NAME}={self.api_key}"
        return [f"--grpc-restricted-protocol={rule}", f"--http-restricted-api={rule}"]

    def _tls(self) -> list[str]:
        """gRPC over TLS with the given certificate (HTTP stays plain: put a proxy in front for that)."""
        if self.tls_cert is None:
            return []
        return ["--grpc-use-ssl=true", f"--grpc-server-cert={self.tls_cert}", f"--grpc-server-key={self.tls_key}"]

    def _check_ports_free(self) -> None:
        """Refuse ports in use (the readiness check would otherwise find the other server) or given twice."""
        if len(set(self.ports.values())) < len(self.ports):
            given = ", ".join(f"{kind} {port}" for kind, port in self.ports.items())
            raise TritonSamError(f"The server needs three different ports, got {given}.")
        for kind, port in self.ports.items():
            with socket.socket() as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Triton does: ignore TIME_WAIT
                try:
                    sock.bind((self.host, port))
                except OSError as error:
                    raise TritonSamError(
                        f"The {kind} port {port} on {self.host} is already in use ({error.strerror}); "
                        f"stop what uses it or choose another with --{kind}-port."
                    ) from None

    def _wait_ready(self, timeout_s: float) -> None:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        tls = {"ssl": True, "root_certificates": str(self.tls_cert)} if self.tls_cert else {}
        client = grpcclient.InferenceServerClient(self.grpc_url, **tls)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if self._process.poll() is not None:
                    raise ServerUnavailableError(f"Triton server exited with code {self._process.returncode}.\n{self.log_tail()}")
                try:
                    if client.is_server_ready(headers=self.client_headers, client_timeout=1.0):
                        return
                except InferenceServerException:  # not listening yet
                    pass
                time.sleep(0.2)
        finally:
            client.close()
        tail = self.log_tail()
        self.stop()
        raise ServerUnavailableError(f"Triton server not ready after {timeout_s:.0f} s.\n{tail}")

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def wait(self) -> int:
        """Block until the server exits; returns its exit code."""
        return self._process.wait()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove its scratch files."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def __enter__(self) -> LocalTritonServer:
        return self.start() if self._process is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` different TCP ports on `host` that nothing listens on right now (asked one by one,
    the system may hand out the same port twice)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def loopback_ports() -> dict[str, int]:
    """`LocalTritonServer`'s three port arguments: different free loopback ports, for a server
    started beside others on one machine (tests, benchmarks)."""
    return dict(zip(("http_port", "grpc_port", "metrics_port"), free_ports(3), strict=True))
