"""`triton-sam serve`: the python-backend view of a repository, and the real command end to end."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from conftest import require_server_env
from synthetic import disk_image, write_repository
from triton_sam import Predictor
from triton_sam.contract import ENCODE_BATCH_PARAMETER
from triton_sam.errors import ServerUnavailableError, TritonSamError
from triton_sam.export.triton_config import encoder_config
from triton_sam.registry import get_model
from triton_sam.server.local import (
    LocalTritonServer,
    find_server_python,
    free_ports,
    loopback_ports,
    server_packages,
    serving_repository,
)

TINY = get_model("sam2.1_hiera_tiny")


def test_the_view_serves_onnx_models_with_the_python_backend_under_the_same_contract(synthetic_repository, tmp_path):
    view = serving_repository(synthetic_repository, tmp_path / "view", session_batching=True)
    original = text_format.Parse(encoder_config(TINY), model_config_pb2.ModelConfig())
    encoder_dir = view / TINY.encoder_name
    served = text_format.Parse((encoder_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert served.backend == "python" and not served.platform
    assert served.input == original.input and served.output == original.output
    assert served.max_batch_size == original.max_batch_size and served.dynamic_batching == original.dynamic_batching
    assert served.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert not served.HasField("optimization")
    assert (encoder_dir / "1" / "model.onnx").resolve() == (synthetic_repository / TINY.encoder_name / "1" / "model.onnx")
    assert (encoder_dir / "1" / "model.py").is_file()
    session_dir = view / TINY.session_name
    assert (session_dir / "1" / "model.py").resolve() == synthetic_repository / TINY.session_name / "1" / "model.py"
    assert (session_dir / "config.pbtxt").read_text() == text_format.MessageToString(
        text_format.Parse((synthetic_repository / TINY.session_name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    )


def test_without_session_batching_only_the_session_model_loses_its_batcher(synthetic_repository, tmp_path):
    view = serving_repository(synthetic_repository, tmp_path / "view", session_batching=False)

    def config(name: str) -> model_config_pb2.ModelConfig:
        return text_format.Parse((view / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())

    assert not config(TINY.session_name).HasField("dynamic_batching")
    assert config(TINY.session_name).max_batch_size > 1  # clients may still send several rows
    assert config(TINY.session_name).parameters[ENCODE_BATCH_PARAMETER].string_value == "1"  # and images
    assert config(TINY.decoder_name).HasField("dynamic_batching")


def test_a_gpu_s_default_keeps_the_session_batcher_and_encodes_one_image_at_a_time(synthetic_repository, tmp_path, monkeypatch):
    """Where the session models run on a GPU, `serve` keeps their batcher (measured faster there from 4
    clients on) but not images encoded together (measured slower there too); asked for, both; on a
    CPU, neither (#38)."""
    from triton_sam.server import local

    def served(**settings) -> tuple[bool, str]:
        server = LocalTritonServer(synthetic_repository, **settings)
        view = serving_repository(
            synthetic_repository,
            tmp_path / str(len(list(tmp_path.iterdir()))),
            server.session_batching,
            None,
            server.batched_encodes,
        )
        config = text_format.Parse((view / TINY.session_name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
        return config.HasField("dynamic_batching"), config.parameters[ENCODE_BATCH_PARAMETER].string_value

    exported = text_format.Parse(
        (synthetic_repository / TINY.session_name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    batch = exported.parameters[ENCODE_BATCH_PARAMETER].string_value
    assert batch != "1"
    for on_gpu, default in ((True, (True, "1")), (False, (False, "1"))):
        monkeypatch.setattr(local, "session_models_on_gpu", lambda python, on_gpu=on_gpu: on_gpu)
        assert served() == default
        assert served(session_batching=True) == (True, batch) and served(session_batching=False) == (False, "1")


def test_whether_the_session_models_run_on_a_gpu_is_asked_of_the_server_s_python(monkeypatch):
    """The server's environment may have another ONNX Runtime than the client's: its own answer counts,
    and without a driver nothing is asked."""
    import onnxruntime

    from triton_sam.server import local

    monkeypatch.setattr(local, "cuda_device_count", lambda: 0)
    assert not local.session_models_on_gpu(Path("/no/such/python"))
    monkeypatch.setattr(local, "cuda_device_count", lambda: 1)
    assert local.session_models_on_gpu(Path(sys.executable)) == ("CUDAExecutionProvider" in onnxruntime.get_available_providers())
    assert not local.session_models_on_gpu(Path("/no/such/python"))


def test_the_view_can_hold_only_some_models(tmp_path):
    repository = write_repository(TINY, tmp_path / "repo")
    write_repository(get_model("sam2.1_hiera_small"), repository)
    view = serving_repository(repository, tmp_path / "view", models=["sam2.1_hiera_small"])
    assert sorted(p.name for p in view.iterdir()) == [f"sam2.1_hiera_small_{c}" for c in ("decoder", "encoder", "session")]


def test_tensorrt_settings_are_dropped_from_the_view(tmp_path):
    repository = write_repository(TINY, tmp_path / "repo")
    (repository / TINY.encoder_name / "config.pbtxt").write_text(encoder_config(TINY, tensorrt=True))
    served = (serving_repository(repository, tmp_path / "view") / TINY.encoder_name / "config.pbtxt").read_text()
    assert "tensorrt" not in served and "KIND_GPU" not in served


def _no_server_python_but_beside(monkeypatch, tmp_path, environment):
    """Run from an empty directory in `environment` (a virtual environment's path), without
    pytriton here or `triton-sam server-env`'s default."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRITON_SAM_SERVER_PYTHON", raising=False)
    monkeypatch.setattr("triton_sam.server.local.default_server_env", lambda: tmp_path / "none")
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    monkeypatch.setattr(sys, "prefix", str(environment))


def test_a_missing_server_environment_says_how_to_create_one_and_where_it_looked(monkeypatch, tmp_path):
    _no_server_python_but_beside(monkeypatch, tmp_path, tmp_path / "project" / ".venv")
    monkeypatch.setenv("TRITON_SAM_SERVER_PYTHON", str(tmp_path / "nope"))
    with pytest.raises(TritonSamError, match="triton-sam server-env") as missing:
        find_server_python()
    looked = str(missing.value).split("Looked at: ", 1)[1]
    assert looked.split("; ") == [
        "--server-python (not given)",
        f"$TRITON_SAM_SERVER_PYTHON {tmp_path / 'nope'}",
        f"this python {sys.executable} (no pytriton)",
        f"{tmp_path / '.venv-server/bin/python'} (in the current directory)",
        f"{tmp_path / 'project/.venv-server/bin/python'} (beside this python's environment)",
        f"{tmp_path / 'none/bin/python'} (`triton-sam server-env`'s default).",
    ]


def test_the_server_environment_beside_this_ones_is_found_from_any_directory(monkeypatch, tmp_path):
    """scripts/install.sh makes .venv-server beside .venv: `serve` finds it wherever it starts."""
    server_python = tmp_path / "project" / ".venv-server" / "bin" / "python"
    server_python.parent.mkdir(parents=True)
    server_python.touch()
    (tmp_path / "elsewhere").mkdir()
    _no_server_python_but_beside(monkeypatch, tmp_path / "elsewhere", tmp_path / "project" / ".venv")
    assert find_server_python() == server_python
    assert find_server_python(tmp_path / "chosen") == server_python  # a missing explicit python: the next place
    (tmp_path / "chosen").touch()
    monkeypatch.setenv("TRITON_SAM_SERVER_PYTHON", str(tmp_path / "chosen"))
    assert find_server_python() == tmp_path / "chosen"  # --server-python and $TRITON_SAM_SERVER_PYTHON come first


def test_the_checkouts_server_environment_is_found_from_another_directory(monkeypatch, tmp_path):
    """As scripts/install.sh leaves a checkout (CI's): .venv-server beside the .venv running the tests."""
    checkout_server = Path(sys.prefix).parent / ".venv-server" / "bin" / "python"
    if not checkout_server.is_file():
        missing = f"no server environment beside this one ({checkout_server})"
        pytest.fail(missing) if os.environ.get("CI") else pytest.skip(missing)
    _no_server_python_but_beside(monkeypatch, tmp_path, sys.prefix)
    assert find_server_python() == checkout_server


def test_on_a_gpu_the_server_environment_also_gets_onnx_runtimes_cuda_libraries():
    """Without the CUDA and cuDNN of its build ONNX Runtime runs the session models on the CPU: on a
    GPU machine `server-env` asks pip for them through extras onnxruntime-gpu really has."""
    from importlib.metadata import metadata

    from packaging.requirements import Requirement

    plain, gpu = ([Requirement(p) for p in server_packages(g)] for g in (False, True))
    assert [r.name for r in gpu] == [r.name for r in plain] and [r.specifier for r in gpu] == [r.specifier for r in plain]
    (runtime,) = (r for r in gpu if r.name == "onnxruntime-gpu")
    assert runtime.extras == {"cuda", "cudnn"} <= set(metadata("onnxruntime-gpu").get_all("Provides-Extra"))
    assert all(not r.extras for r in plain)


def test_a_port_in_use_is_refused_before_starting(synthetic_server, synthetic_repository):
    taken = int(synthetic_server.grpc_url.rsplit(":", 1)[1])
    http_port, metrics_port = free_ports(2)
    clash = LocalTritonServer(synthetic_repository, http_port=http_port, grpc_port=taken, metrics_port=metrics_port)
    with pytest.raises(TritonSamError, match=f"The grpc port {taken} on 127.0.0.1 is already in use"):
        clash.start()
    assert not clash.is_running()


def test_one_port_given_twice_is_refused_before_starting(synthetic_repository):
    http_port, grpc_port = free_ports(2)
    twice = LocalTritonServer(synthetic_repository, http_port=http_port, grpc_port=grpc_port, metrics_port=http_port)
    expected = f"three different ports, got http {http_port}, grpc {grpc_port}, metrics {http_port}"
    with pytest.raises(TritonSamError, match=expected):
        twice.start()
    assert not twice.is_running()


def test_a_server_that_fails_reports_its_log(tmp_path):
    require_server_env()
    server = LocalTritonServer(tmp_path, **loopback_ports())
    server.server_python = tmp_path / "no-python"
    (tmp_path / "no-python").write_text("#!/bin/sh\necho launcher broke >&2\nexit 3\n")
    (tmp_path / "no-python").chmod(0o755)
    with pytest.raises(ServerUnavailableError, match="(?s)exited with code 3.*launcher broke"):
        server.start(timeout_s=30)


def _as_in_a_terminal() -> None:
    """Ctrl-C reaches a command run in a terminal; a job that a script started in the background
    (as CI may start these tests) ignores SIGINT, and so would the command it runs."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "kill"])
def test_triton_sam_serve_serves_the_plugin_and_stops_on_ctrl_c_or_kill(synthetic_repository, stop):
    server_python = require_server_env()
    http_port, grpc_port, metrics_port = free_ports(3)
    command = [sys.executable, "-m", "triton_sam.cli", "serve", "--model-repository", str(synthetic_repository)]
    command += ["--grpc-port", str(grpc_port), "--http-port", str(http_port), "--metrics-port", str(metrics_port)]
    command += ["--server-python", str(server_python)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=_as_in_a_terminal)
    triton = []  # the server's processes: a session of their own, so killing `serve` would not end them
    try:
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(line.startswith("Ready.") for line in lines):
            lines.append(process.stdout.readline())
        assert f"127.0.0.1:{grpc_port}" in lines[-1] and TINY.model_id in lines[-1], lines
        assert not any("warning" in line for line in lines)
        triton = psutil.Process(process.pid).children(recursive=True)
        listening = [
            ipaddress.ip_address(c.laddr.ip)
            for child in triton
            for c in child.net_connections("inet")
            if c.status == psutil.CONN_LISTEN
        ]
        assert listening and all(
            (getattr(ip, "ipv4_mapped", None) or ip).is_loopback for ip in listening
        )  # unless told otherwise
        with Predictor(backend="triton", url=f"127.0.0.1:{grpc_port}") as predictor:
            predictor.set_image(disk_image(200, 200, [(100, 100, 30)]))
            masks, _, _ = predictor.predict(point_coords=np.array([[100, 100]]), point_labels=np.array([1]))
            assert masks[1][100, 100] and not masks[1][10, 10]
        process.send_signal(stop)
        try:
            code = process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            pytest.fail(f"serve still running 60 s after {stop.name}; its output after Ready: {process.stdout.read()[-3000:]!r}")
        assert code == 0 and process.stdout.read().startswith("Stopping Triton")
        _, alive = psutil.wait_procs(triton, timeout=30)
        assert not alive, f"left running after serve stopped: {[p.name() for p in alive]}"
    finally:
        for leftover in [process, *triton]:
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                leftover.kill()
    with pytest.raises(ServerUnavailableError):  # the server went with it
        Predictor(backend="triton", url=f"127.0.0.1:{grpc_port}", timeout_s=2.0)


def test_binding_wider_without_an_api_key_warns(tmp_path):
    command = [sys.executable, "-m", "triton_sam.cli", "serve", "--host", "0.0.0.0", "--model-repository", str(tmp_path / "none")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, env={**os.environ, "TRITON_SAM_API_KEY": ""})
    assert "warning: anyone who can reach 0.0.0.0 can use this server; set $TRITON_SAM_API_KEY" in result.stdout
    assert result.returncode != 0 and "does not exist" in result.stderr  # and nothing was served


def test_an_api_key_locks_every_endpoint_and_the_client_sends_it(synthetic_repository):
    require_server_env()
    server = LocalTritonServer(synthetic_repository, **loopback_ports(), api_key="s3cret")
    with server:
        with pytest.raises(ServerUnavailableError, match="restricted"):
            Predictor(backend="triton", url=server.grpc_url)
        with pytest.raises(ServerUnavailableError, match="restricted"):
            Predictor(backend="triton", url=server.grpc_url, api_key="wrong")
        with Predictor(backend="triton", url=server.grpc_url, api_key="s3cret") as predictor:
            predictor.set_image(disk_image(200, 200, [(100, 100, 30)]))
            masks, _, _ = predictor.predict(point_coords=np.array([[100, 100]]), point_labels=np.array([1]))
            assert masks[1][100, 100]
        status = urllib.request.urlopen(  # HTTP clients send the key under its plain name
            urllib.request.Request(
                f"http://127.0.0.1:{server.ports['http']}/v2/health/ready", headers={"triton-sam-key": "s3cret"}
            )
        ).status
        assert status == 200
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{server.ports['http']}/v2/health/ready")


def test_a_partially_exported_repository_still_serves_what_is_there(tmp_path):
    require_server_env()
    repository = write_repository(TINY, tmp_path / "repo")
    large = get_model("sam2.1_hiera_large")
    broken = repository / large.encoder_name
    (broken / "1").mkdir(parents=True)
    (broken / "1" / "model.onnx").write_bytes(b"not an onnx file")  # an export that was cut short
    (broken / "config.pbtxt").write_text(encoder_config(large))
    with LocalTritonServer(repository, **loopback_ports()) as server:
        with Predictor(backend="triton", url=server.grpc_url) as predictor:
            predictor.set_image(disk_image(200, 200, [(100, 100, 30)]))
            masks, _, _ = predictor.predict(point_coords=np.array([[100, 100]]), point_labels=np.array([1]))
        assert masks[1][100, 100]
        assert f"failed to load '{large.encoder_name}'" in server.log_tail(400)


def test_sessions_only_loads_the_session_model_alone_and_it_serves_the_plugin(synthetic_repository):
    """`serve --sessions-only`: the session model runs the encoder and decoder files itself; the
    plain models are not loaded beside it."""
    require_server_env()
    with LocalTritonServer(synthetic_repository, sessions_only=True, **loopback_ports()) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            ready = {name: client.is_model_ready(name) for name in (TINY.session_name, TINY.encoder_name, TINY.decoder_name)}
        finally:
            client.close()
        with Predictor(backend="triton", url=server.grpc_url) as predictor:
            predictor.set_image(disk_image(200, 200, [(100, 100, 30)]))
            masks, _, _ = predictor.predict(point_coords=np.array([[100, 100]]), point_labels=np.array([1]))
    assert ready == {TINY.session_name: True, TINY.encoder_name: False, TINY.decoder_name: False}
    assert masks[1][100, 100]


PROBE_CONFIG = """
name: "path_probe"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def test_the_models_import_what_the_server_python_imports_through_pythonpath(tmp_path, monkeypatch):
    """As on the GPU machine, where packages go in with `pip install --target` and PYTHONPATH: Triton's
    python backend stub runs its interpreter isolated (PYTHONPATH ignored), so the models could not
    import them ("No module named onnxruntime"). Here the server runs on the base interpreter of the
    server environment with its packages, and a module a probe model needs, on PYTHONPATH only. CUDA
    libraries from pip (nvidia/*/lib) found there are on the models' library path, for ONNX Runtime.
    pytriton's client packages are not needed (installed with --no-deps): here zmq cannot be imported."""
    server_python = require_server_env()
    query = "import sys, sysconfig; print(sys._base_executable); print(sysconfig.get_path('purelib'))"
    base, site = subprocess.run([server_python, "-c", query], capture_output=True, text=True, check=True).stdout.split()
    marker = tmp_path / "on_pythonpath"
    marker.mkdir()
    cuda_libs = marker / "nvidia" / "cu13" / "lib"
    cuda_libs.mkdir(parents=True)
    (marker / "stub_path_marker.py").write_text(f"CUDA_LIBS = {str(cuda_libs)!r}\n")
    (marker / "zmq").mkdir()
    (marker / "zmq" / "__init__.py").write_text("raise ImportError('not installed')\n")
    monkeypatch.setenv("PYTHONPATH", f"{marker}{os.pathsep}{site}")
    repository = write_repository(TINY, tmp_path / "repo")
    (repository / "path_probe" / "1").mkdir(parents=True)
    (repository / "path_probe" / "config.pbtxt").write_text(PROBE_CONFIG)
    (repository / "path_probe" / "1" / "model.py").write_text(
        "import os\n\nimport stub_path_marker\n\n"
        "assert stub_path_marker.CUDA_LIBS in os.environ['LD_LIBRARY_PATH'].split(':')\n\n"
        "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
    )
    with LocalTritonServer(repository, server_python=base, **loopback_ports()) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert client.is_model_ready("path_probe"), server.log_tail(80)
        client.close()
        with Predictor(backend="triton", url=server.grpc_url) as predictor:
            predictor.set_image(disk_image(200, 200, [(100, 100, 30)]))
            masks, _, _ = predictor.predict(point_coords=np.array([[100, 100]]), point_labels=np.array([1]))
        assert masks[1][100, 100]


def test_the_stub_finds_the_python_library_of_a_relocated_interpreter(monkeypatch, tmp_path):
    """uv's and conda's interpreters report the LIBDIR of the machine they were built on; their
    libpython, which the stub links, lies in their own prefix's lib/."""
    from triton_sam.server import launch_tritonserver

    monkeypatch.setattr(launch_tritonserver.sysconfig, "get_config_var", lambda name: "/install/lib")
    monkeypatch.setattr(launch_tritonserver.sys, "base_prefix", str(tmp_path))
    env = launch_tritonserver.server_environment(tmp_path / "pytriton.libs", tmp_path / "bin")
    assert env["LD_LIBRARY_PATH"].split(":")[:3] == ["/install/lib", str(tmp_path / "lib"), str(tmp_path / "pytriton.libs")]
    assert env["PATH"].startswith(f"{tmp_path / 'bin'}:")


def _self_signed(tmp_path):
    """A certificate for 127.0.0.1 made on the spot (openssl), and its key."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_grpc_over_tls_with_a_self_signed_certificate(tmp_path, synthetic_repository):
    require_server_env()
    cert, key = _self_signed(tmp_path)
    server = LocalTritonServer(
        synthetic_repository,
        **loopback_ports(),
        tls_cert=cert,
        tls_key=key,
    )
    with server:
        with Predictor(backend="triton", url=server.grpc_url, ssl=True, root_certificates=str(cert)) as predictor:
            predictor.set_image(disk_image(200, 200, [(100, 100, 30)]))
            masks, _, _ = predictor.predict(point_coords=np.array([[100, 100]]), point_labels=np.array([1]))
            assert masks[1][100, 100]
        with pytest.raises(ServerUnavailableError):  # a plain-text client cannot talk to it
            Predictor(backend="triton", url=server.grpc_url, timeout_s=3.0)
        (tmp_path / "other").mkdir()
        other_cert, _ = _self_signed(tmp_path / "other")
        with pytest.raises(ServerUnavailableError):  # nor one that does not trust its certificate
            Predictor(backend="triton", url=server.grpc_url, ssl=True, root_certificates=str(other_cert), timeout_s=3.0)
