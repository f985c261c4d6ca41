"""Start the Triton server binary shipped in `nvidia-pytriton`, in the environment that has it.

Run as a script by that environment's interpreter (`triton-sam serve` does this): it imports
nothing from triton-sam, so the server environment needs only nvidia-pytriton, numpy<2 and
onnxruntime. It assembles a backend directory with the python backend stub built for this
interpreter, puts this interpreter's libpython first on LD_LIBRARY_PATH (the stub otherwise picks
up a system libpython of another build and fails in model initialisation) and a `python3` that
sees this interpreter's packages first on PATH (see `stub_interpreter`), then replaces itself with
`tritonserver`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import sysconfig
from pathlib import Path


def _pytriton_dirs() -> tuple[Path, Path]:
    """The tritonserver distribution inside pytriton and its bundled shared libraries.

    Found, not imported: importing pytriton needs its client's packages (zmq, tritonclient, ...),
    which serving a repository does not, so nvidia-pytriton installed without them serves too."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{sys.executable} has no nvidia-pytriton (searched {sys.path})")
    package = Path(next(iter(spec.submodule_search_locations))).resolve()
    dist = package / "tritonserver"
    libs = package.parent / "nvidia_pytriton.libs"
    if not libs.is_dir():  # editable installs keep them inside the package
        libs = dist / "external_libs"
    return dist, libs


def prepare_backends(dist: Path, workdir: Path) -> Path:
    """A backend directory whose python backend uses the stub built for this interpreter."""
    backends = workdir / "backends"
    if backends.exists():
        shutil.rmtree(backends)
    shutil.copytree(dist / "backends", backends)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise SystemExit(f"nvidia-pytriton has no python backend stub for Python {version}")
    shutil.copy2(stub, backends / "python" / "triton_python_backend_stub")
    return backends


def stub_interpreter(workdir: Path) -> Path:
    """A bin/ folder whose `python3` gives the stub this interpreter's import path; returns the folder.

    The stub embeds Python in isolated mode (PYTHONPATH and the user's site-packages are ignored) and
    takes its prefix from the `python3` it finds on PATH. So packages that reach this interpreter only
    through PYTHONPATH (`pip install --target`) or the user site were missing in the models
    ("No module named ..."). A virtual environment over this interpreter's base, whose .pth file lists
    this interpreter's sys.path, makes the stub import exactly what this interpreter imports.
    """
    env = workdir / "stub-python"
    if env.exists():
        shutil.rmtree(env)
    base = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    site = env / "lib" / f"python{version}" / "site-packages"
    site.mkdir(parents=True)
    (env / "bin").mkdir()
    (env / "bin" / "python3").symlink_to(base)
    (env / "pyvenv.cfg").write_text(f"home = {base.parent}\ninclude-system-site-packages = false\nversion = {version}\n")
    paths = [os.path.abspath(p) for p in sys.path[1:] if p and Path(p).exists()]  # [0]: this script's folder
    (site / "server-environment.pth").write_text("".join(f"{p}\n" for p in paths))
    return env / "bin"


def cuda_library_dirs(paths: list[str]) -> list[str]:
    """The lib/ folders of pip's nvidia-* packages (CUDA, cuDNN) among `paths`' packages.

    ONNX Runtime looks for them only beside itself (`preload_dlls`), then by library name: where
    onnxruntime-gpu and the CUDA libraries (torch's, say) lie in different places, the session models
    would run on the CPU. On the library path the models' processes find them.
    """
    return [str(lib) for path in paths for lib in sorted(Path(path).glob("nvidia/*/lib")) if lib.is_dir()]


def server_environment(libs: Path, stub_bin: Path) -> dict[str, str]:
    env = dict(os.environ)
    library_path = [
        sysconfig.get_config_var("LIBDIR") or "",
        os.path.join(sys.base_prefix, "lib"),  # relocated builds (uv's, conda's) report their build's LIBDIR
        str(libs),
        *cuda_library_dirs(sys.path[1:]),
        env.get("LD_LIBRARY_PATH", ""),
    ]
    env["LD_LIBRARY_PATH"] = ":".join(p for p in library_path if p)
    env["PATH"] = f"{stub_bin}:{env.get('PATH', '')}"
    return env


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-repository", required=True)
    parser.add_argument("--workdir", required=True, help="scratch directory for the backend files")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--log-verbose", type=int, default=0)
    args, server_args = parser.parse_known_args(argv)  # the rest goes to tritonserver as it is

    dist, libs = _pytriton_dirs()
    backends = prepare_backends(dist, Path(args.workdir))
    command = [
        str(dist / "bin" / "tritonserver"),
        f"--model-repository={args.model_repository}",
        f"--backend-directory={backends}",
        f"--http-address={args.host}",
        f"--http-port={args.http_port}",
        f"--grpc-address={args.host}",
        f"--grpc-port={args.grpc_port}",
        f"--metrics-address={args.host}",
        f"--metrics-port={args.metrics_port}",
        "--allow-metrics=true",
        "--exit-on-error=false",
        "--strict-readiness=false",
        f"--log-verbose={args.log_verbose}",
        *server_args,
    ]
    sys.stdout.flush()
    os.execve(command[0], command, server_environment(libs, stub_interpreter(Path(args.workdir))))


if __name__ == "__main__":
    main()
